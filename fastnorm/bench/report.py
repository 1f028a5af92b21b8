"""What a run leaves behind: a table on the terminal, JSON, CSV rows, Markdown.

A run is one JSON document::

    {"schema": 1, "timestamp", "command", "environment": {device, device_name,
     cpu, cores, threads, torch, triton, fastnorm, python, platform, backend},
     "settings": {...}, "workloads": [record, ...], "goals": [...]}

where each record (see ``harness.run_workload``) holds the workload's size, its
measured roofline and one result per contender. The CSV file gets one row per
workload and contender and is appended to, so that runs on several machines
(or before and after a change) accumulate in one data file; the JSON and the
Markdown hold the latest run of each device.
"""

from __future__ import annotations

import csv
import datetime
import json
import os
import platform
import re
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from fastnorm.bench import goals, locate, step
from fastnorm.bench.contenders import STEPS
from fastnorm.bench.harness import disturbed

SCHEMA = 1

# The training-step table's columns: contender, heading.
STEP_COLUMNS = (
    (step.BARE, "bare fused AdamW step"),
    (step.CLIP_THEN_STEP, "`clip_` + step"),
    (step.FOLDED, "folded (with its norm)"),
    (step.SCALE_THEN_STEP, "`clip_(total_norm=)` + step"),
    (step.FOLDED_STEP, "folded step alone (norm computed before)"),
    (step.GUARDED, "folded with the spike guard (x folded)"),
)

# The watched training step's columns: contender, heading.
WATCH_COLUMNS = (
    (locate.PLAIN, "forward and backward"),
    (locate.LOCATOR, "with `fastnorm.Locator`"),
    (locate.HF_DEBUG, "with HF's `DebugUnderflowOverflow`"),
    (locate.ANOMALY, "in `torch.autograd.detect_anomaly`"),
)

CSV_FIELDS = [
    "timestamp",
    "device",
    "device_name",
    "cores",
    "threads",
    "torch",
    "triton",
    "fastnorm",
    "backend",
    "workload",
    "dtype",
    "quick",
    "tensors",
    "numel",
    "bytes",
    "contender",
    "kind",
    "ms",
    "ms_min",
    "spread_pct",
    "host_us",
    "gbps",
    "roofline_pct",
    "roofline_read_gbps",
    "roofline_read_kernel",
    "speedup",
    "baseline",
    "paired_ratio",
    "extra_bytes",
    "cpp_isa",
    "host_us_per_tensor",
    "elements_per_cycle",
    "disturbed",
]


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _cpu_name() -> str:
    """The CPU's model name, with its family and model numbers where Linux gives them
    (a virtual machine often names only the vendor)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if not key.strip():
                    break  # the first processor is enough
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name


def environment(device: torch.device) -> dict[str, Any]:
    """The machine and the software a run measured."""
    import fastnorm
    from fastnorm.backends import cpp

    row = next((r for r in fastnorm.backend_report([device])), {})
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    env = {
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name(),
        "cpu": _cpu_name(),
        "cores": cores,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "fastnorm": fastnorm.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "backend": row.get("selected"),
        "cpp_isa": cpp.isa(),
        "cpp_isas": cpp._C.supported_isas() if cpp._C is not None else [],
    }
    if device.type == "cuda":
        env["cuda"] = torch.version.cuda
        env["gpu_memory_bytes"] = torch.cuda.get_device_properties(device).total_memory
    return env


def new_run(device: torch.device, settings: dict[str, Any], command: str) -> dict[str, Any]:
    """An empty run; ``command`` repeats it (every setting spelled out)."""
    return {
        "schema": SCHEMA,
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "argv": sys.argv,
        "environment": environment(device),
        "settings": settings,
        "workloads": [],
        "skipped_workloads": [],
        "goals": [],
    }


# ----------------------------------------------------------------------------
# Formatting
# ----------------------------------------------------------------------------


def fmt_time(ms: float) -> str:
    if ms >= 100:
        return f"{ms:.0f} ms"
    if ms >= 1:
        return f"{ms:.3g} ms"
    return f"{ms * 1e3:.3g} us"


def fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def _opt(value: float | None, fmt: str, missing: str = "-") -> str:
    return missing if value is None else format(value, fmt)


def is_step(record: dict[str, Any]) -> bool:
    """Whether the record times optimizer steps (against the bare step, not the roofline)."""
    return any(r["kind"] in STEPS for r in record["results"])


def headline(record: dict[str, Any]) -> str:
    """One line: the workload, its size and its roofline."""
    roof = record["roofline"]
    parts = [
        f"{record['workload']} {record['dtype']}: {record['tensors']} tensors"
        + (f" in {record['groups']} groups" if record.get("groups", 1) > 1 else "")
        + f", {record['numel'] / 1e6:.4g}M elements, {fmt_bytes(record['bytes'])}"
    ]
    if record.get("threads") == 1:
        parts.append("1 thread")
    if is_step(record):
        parts.append("torch's fused AdamW, every call clipping to half the norm")
    if roof["read"]:
        parts.append(f"read roofline {roof['read']['gbps']:.1f} GB/s ({roof['read']['kernel']})")
    if roof["read_write"]:
        parts.append(f"read+write {roof['read_write']['gbps']:.1f} GB/s ({roof['read_write']['kernel']})")
    if record.get("clock_hz"):
        parts.append(f"core clock {record['clock_hz'] / 1e9:.2f} GHz")
    line = "; ".join(parts)
    rounds, short = record.get("rounds"), rounds_short(record)
    if record.get("disturbed"):
        line += (
            f"\n  DISTURBED: {record['disturbed']}; too few quiet rounds, so these figures are not "
            "results: rerun on a quiet machine"
        )
    if short is not None:
        line += f"\n  ({short})"
    elif rounds and rounds["timed"] > rounds["kept"]:
        line += (
            f"\n  ({rounds['timed'] - rounds['kept']} of {rounds['timed']} rounds replaced: other "
            f"processes kept more than {rounds['quiet_cores']:g} cores busy)"
        )
    return line


def rounds_short(record: dict[str, Any]) -> str | None:
    """Why a record has fewer quiet rounds than it wanted (None when it has enough)."""
    rounds = record.get("rounds") or {}
    stopped = rounds.get("stopped")
    if stopped is None:
        return None
    quiet, wanted, timed = rounds["quiet"], rounds["wanted"], rounds["timed"]
    busy = timed - quiet
    text = f"{quiet} quiet round{'s' * (quiet != 1)} of the {wanted} wanted: "
    if stopped == "time":
        share = f"{rounds['max_time_s']:.1f} s"
        if rounds.get("run_budget_s") is not None:
            share += f", its share of the run's {rounds['run_budget_s']:.0f} s budget,"
        text += f"the rounds stopped when their {share} ran out"
        if busy:
            text += f"; other processes kept the CPUs busy in {busy} of the {timed} timed"
    else:
        text += (
            f"other processes kept the CPUs busy in {busy} of the {timed} timed, and {timed} is the most "
            f"there may be for {wanted}"
        )
    return text


def table(record: dict[str, Any]) -> str:
    """The terminal table of one workload. Disturbed figures are named, not shown.

    Optimizer steps show ``x step`` (the paired ratio to the bare step) where
    the others show the roofline and the speedup over torch.
    """
    steps = is_step(record)
    per_tensor = any(r.get("host_us_per_tensor") is not None for r in record["results"])
    per_cycle = any(r.get("elements_per_cycle") is not None for r in record["results"])
    header = ["contender", "time", "spread"]
    header += ["x step", "GB/s"] if steps else ["GB/s", "% roof", "vs base"]
    header += ["host"] + ["host/tensor"] * per_tensor + ["elem/cycle"] * per_cycle + ["extra mem", "norm err"]
    if record.get("disturbed"):
        names = ", ".join(r["contender"] for r in record["results"])
        return f"{headline(record)}\n  (timed: {names}; the figures are in the JSON, marked disturbed)"
    rows = [header]
    for r in record["results"]:
        if disturbed(record, r) is not None:
            rows.append([r["contender"], "disturbed"] + [""] * (len(header) - 2))
            continue
        row = [r["contender"], fmt_time(r["ms"]), f"{r['spread_pct']:.0f}%"]
        if steps:
            ratio = r.get("paired_ratio")
            row += ["-" if ratio is None else f"{ratio:.3f}x", f"{r['gbps']:.3g}"]
        else:
            row += [
                f"{r['gbps']:.3g}",
                _opt(r["roofline_pct"], ".0f"),
                _opt(r["speedup"], ".2f") + ("x" if r["speedup"] is not None else ""),
            ]
        row.append(fmt_time(r["host_us"] / 1e3))
        if per_tensor:
            value = r.get("host_us_per_tensor")
            row.append("-" if value is None else f"{value * 1e3:.0f} ns")
        if per_cycle:
            row.append(_opt(r.get("elements_per_cycle"), ".2f"))
        extra = "-" if r["extra_bytes"] is None else fmt_bytes(r["extra_bytes"])
        row += [extra, _opt(r["norm_error"], ".0e")]
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [headline(record)]
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [cell.rjust(w) for cell, w in zip(row[1:], widths[1:])]
        lines.append("  " + "  ".join(cells).rstrip())
    for r in record["results"]:
        if r.get("disturbed") and not record.get("disturbed"):
            lines.append(f"  ({r['contender']}: not a result, {r['disturbed']})")
    for name, reasons in record.get("skipped", {}).items():
        lines.append(f"  (skipped {name}: {'; '.join(reasons)})")
    if steps:
        lines.append(
            "  (x step: the median over rounds of the time over the bare step's in the same round; "
            "GB/s over the least bytes: the step's, and the norm's read where the call computes it)"
        )
    return "\n".join(lines)


def _result(record: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((r for r in record["results"] if r["contender"] == name), None)


def _time_cell(record: dict[str, Any], name: str) -> str:
    r = _result(record, name)
    if r is None:
        return "-"
    return "disturbed" if disturbed(record, r) else fmt_time(r["ms"])


def markdown(run: dict[str, Any]) -> str:
    """The tables for docs/benchmarks.md: fastnorm against torch and the roofline, the
    single-core kernels, and the host cost."""
    env = run["environment"]
    isa = f", C++ kernels {env['cpp_isa']}" if env.get("cpp_isa") else ""
    lines = [
        f"{env['device_name']} ({env['device']}, {env['cores']} cores, {env['threads']} threads{isa}), "
        f"torch {env['torch']}, fastnorm {env['fastnorm']} ({env['backend']} backend), "
        f"{run['timestamp'][:10]}: `{run['command']}`. Median of interleaved rounds; GB/s over one "
        "read of the gradients, % of the read roofline (the fastest plain torch read of the same "
        "bytes, same run). `disturbed`: too few rounds free of other processes, or faster than the "
        "roofline, so not a result.",
        "",
    ]
    if run.get("load_before"):
        lines[0] += f" Before the run: {run['load_before']['message']}"
    main = [
        rec
        for rec in run["workloads"]
        if rec["workload"] != "kernel-1t" and rec.get("groups", 1) == 1 and not is_step(rec)
    ]
    if main:
        lines += [
            "| workload | dtype | read roofline GB/s | fastnorm total_norm | torch get_total_norm | "
            "speedup | fastnorm clip_ (no clip / clips) | torch clip_grad_norm_ (no clip / clips) |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]

    def cell(record: dict[str, Any], name: str) -> str:
        r = _result(record, name)
        if r is None or disturbed(record, r):
            return _time_cell(record, name)
        text = fmt_time(r["ms"])
        # Below a megabyte the time is the per-call host cost: GB/s means nothing.
        if record["bytes"] >= 1e6 and r["roofline_pct"] is not None:
            text += f", {r['gbps']:.3g} GB/s ({r['roofline_pct']:.0f}%)"
        elif r.get("host_us_per_tensor") is not None:
            text += f" ({r['host_us_per_tensor'] * 1e3:.0f} ns/tensor)"
        return text

    for rec in main:
        roof = rec["roofline"]["read"]
        fast = _result(rec, "fastnorm.total_norm")
        ok = fast is not None and fast["speedup"] and not disturbed(rec, fast)
        speedup = f"{fast['speedup']:.2f}x" if ok else "-"
        clip_f = " / ".join(_time_cell(rec, n) for n in ("fastnorm.clip_/noop", "fastnorm.clip_/clips"))
        clip_t = " / ".join(
            _time_cell(rec, n) for n in ("torch.clip_grad_norm_/noop", "torch.clip_grad_norm_/clips")
        )
        lines.append(
            f"| {rec['workload']} | {rec['dtype']} | {roof['gbps']:.1f} | "
            f"{cell(rec, 'fastnorm.total_norm')} | {cell(rec, 'torch.get_total_norm')} | {speedup} | "
            f"{clip_f} | {clip_t} |"
        )

    kernel = [rec for rec in run["workloads"] if rec["workload"] == "kernel-1t"]
    if kernel:
        lines += [
            "",
            "One core (`kernel-1t`: one flat tensor, 1 thread), each instruction set of the C++ "
            "kernels against `torch.sum` of the same tensor; elements per cycle at the core clock "
            "measured in the same run:",
            "",
            "| dtype | kernels | time | GB/s | elements/cycle | vs torch.sum |",
            "| --- | --- | ---: | ---: | ---: | ---: |",
        ]
        for rec in kernel:
            for r in rec["results"]:
                if r["group"] == "reference" and r["contender"] != "roofline.read/sum":
                    continue
                label = r["contender"].rsplit("/", 1)[-1] if r["group"] == "fastnorm" else "torch.sum"
                if disturbed(rec, r):
                    lines.append(f"| {rec['dtype']} | {label} | disturbed | | | |")
                    continue
                speedup = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
                lines.append(
                    f"| {rec['dtype']} | {label} | {fmt_time(r['ms'])} | {r['gbps']:.3g} | "
                    f"{_opt(r.get('elements_per_cycle'), '.2f')} | {speedup} |"
                )

    grouped = [rec for rec in run["workloads"] if rec.get("groups", 1) > 1]
    if grouped:
        lines += [
            "",
            "Per-group clipping (one call per group, every step; host cost per tensor):",
            "",
            "| workload | dtype | fastnorm clip_ (clips) | torch clip_grad_norm_ (clips) | speedup |",
            "| --- | --- | ---: | ---: | ---: |",
        ]
        for rec in grouped:
            fast = _result(rec, "fastnorm.clip_/clips")
            ok = fast is not None and fast["speedup"] and not disturbed(rec, fast)
            speedup = f"{fast['speedup']:.2f}x" if ok else "-"
            lines.append(
                f"| {rec['workload']} | {rec['dtype']} | {cell(rec, 'fastnorm.clip_/clips')} | "
                f"{cell(rec, 'torch.clip_grad_norm_/clips')} | {speedup} |"
            )

    watched = [rec for rec in run["workloads"] if _result(rec, locate.PLAIN) is not None]
    steps = [rec for rec in run["workloads"] if is_step(rec) and rec not in watched]

    def step_cell(record: dict[str, Any], name: str) -> str:
        r = _result(record, name)
        if r is None or disturbed(record, r) or r.get("paired_ratio") is None:
            return _time_cell(record, name)
        return f"{r['paired_ratio']:.2f}x ({fmt_time(r['ms'])})"

    if steps:
        lines += [
            "",
            "The training step without backward (`step-*`): torch's fused AdamW step on real "
            "parameters, every call clipping to half the norm, the gradients put back between "
            "calls (untimed). Each ratio is the median over rounds of the time over the bare "
            "step's in the same round:",
            "",
            "| workload | dtype | " + " | ".join(heading for _, heading in STEP_COLUMNS) + " |",
            "| --- | --- |" + " ---: |" * len(STEP_COLUMNS),
        ]

        for rec in steps:
            cells = [step_cell(rec, name) for name, _ in STEP_COLUMNS]
            lines.append(f"| {rec['workload']} | {rec['dtype']} | " + " | ".join(cells) + " |")
    if watched:
        lines += [
            "",
            "Watching a training step (`train-*`): one forward and backward pass, one thread, each watcher "
            "against the bare pass in the same round (its time over the bare one's, the median over rounds):",
            "",
            "| workload | dtype | " + " | ".join(heading for _, heading in WATCH_COLUMNS) + " |",
            "| --- | --- |" + " ---: |" * len(WATCH_COLUMNS),
        ]
        for rec in watched:
            cells = [step_cell(rec, name) for name, _ in WATCH_COLUMNS]
            lines.append(f"| {rec['workload']} | {rec['dtype']} | " + " | ".join(cells) + " |")
    if run.get("goals"):
        lines += ["", goals.markdown(run["goals"]).rstrip("\n")]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------


def write_json(run: dict[str, Any], path: Path) -> None:
    text = json.dumps(run, indent=1)
    # Lists of numbers (the samples) on one line each: a readable, small file.
    text = re.sub(r"\[\s+([-0-9.e,\s]+?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
    path.write_text(text + "\n")


def append_csv(run: dict[str, Any], path: Path, records: list[dict[str, Any]] | None = None) -> None:
    """One row per workload and contender of ``records`` (default: all of the run's),
    appended; the header once. A file with an older header is rewritten with
    this one first, its rows kept."""
    env = run["environment"]
    if path.exists() and path.stat().st_size > 0:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames != CSV_FIELDS:
                old = list(reader)
                with path.open("w", newline="") as out:
                    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, extrasaction="ignore")
                    writer.writeheader()
                    writer.writerows(old)
    new = not path.exists() or path.stat().st_size == 0
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        if new:
            writer.writeheader()
        for rec in run["workloads"] if records is None else records:
            read = rec["roofline"]["read"] or {}
            for r in rec["results"]:
                writer.writerow(
                    {
                        **{k: env.get(k) for k in CSV_FIELDS if k in env},
                        "timestamp": run["timestamp"],
                        **{k: rec[k] for k in ("workload", "dtype", "quick", "tensors", "numel", "bytes")},
                        **{k: _round(r.get(k)) for k in CSV_FIELDS if k in r},
                        "roofline_read_gbps": _round(read.get("gbps")),
                        "roofline_read_kernel": read.get("kernel"),
                        "disturbed": disturbed(rec, r),
                    }
                )


def write(run: dict[str, Any], out: Path, new_records: list[dict[str, Any]]) -> list[Path]:
    """Writes the run so far under ``out``: DEVICE.json and DEVICE.md anew, the rows
    of ``new_records`` appended to results.csv. Returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    stem = out / run["environment"]["device"]
    write_json(run, stem.with_suffix(".json"))
    stem.with_suffix(".md").write_text(markdown(run))
    append_csv(run, out / "results.csv", new_records)
    return [stem.with_suffix(".json"), stem.with_suffix(".md"), out / "results.csv"]


def _round(value: Any) -> Any:
    return float(f"{value:.6g}") if isinstance(value, float) else value


def main(argv: list[str] | None = None) -> int:
    """``python -m fastnorm.bench.report RUN.json``: judges a run's targets again with
    this version of goals.py and rewrites the JSON's goals and the Markdown beside it."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m fastnorm.bench.report RUN.json", file=sys.stderr)
        return 2
    path = Path(args[0])
    run = json.loads(path.read_text())
    run["goals"] = goals.evaluate(run)
    write_json(run, path)
    path.with_suffix(".md").write_text(markdown(run))
    print(f"{path}, {path.with_suffix('.md')}: targets {goals.counts(run['goals'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
