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

SCHEMA = 1

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
    "extra_bytes",
]


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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


def headline(record: dict[str, Any]) -> str:
    """One line: the workload, its size and its roofline."""
    roof = record["roofline"]
    parts = [
        f"{record['workload']} {record['dtype']}: {record['tensors']} tensors, "
        f"{record['numel'] / 1e6:.4g}M elements, {fmt_bytes(record['bytes'])}"
    ]
    if roof["read"]:
        parts.append(f"read roofline {roof['read']['gbps']:.1f} GB/s ({roof['read']['kernel']})")
    if roof["read_write"]:
        parts.append(f"read+write {roof['read_write']['gbps']:.1f} GB/s ({roof['read_write']['kernel']})")
    line = "; ".join(parts)
    rounds = record.get("rounds")
    if rounds and rounds["timed"] > rounds["kept"]:
        line += (
            f"\n  ({rounds['timed'] - rounds['kept']} of {rounds['timed']} rounds dropped: other processes "
            f"kept more than {rounds['quiet_cores']:g} cores busy)"
        )
    elif rounds and any(b is not None and b > rounds["quiet_cores"] for b in rounds["others_busy"]):
        line += (
            f"\n  WARNING: other processes kept the CPUs busy in most rounds (up to "
            f"{max(b for b in rounds['others_busy'] if b is not None):.2f} cores): parallel kernels waited "
            "for the scheduler; rerun on a quiet machine"
        )
    return line


def table(record: dict[str, Any]) -> str:
    """The terminal table of one workload."""
    header = ("contender", "time", "spread", "GB/s", "% roof", "vs base", "host", "extra mem", "norm err")
    rows = [header]
    for r in record["results"]:
        rows.append(
            (
                r["contender"],
                fmt_time(r["ms"]),
                f"{r['spread_pct']:.0f}%",
                f"{r['gbps']:.3g}",
                _opt(r["roofline_pct"], ".0f"),
                _opt(r["speedup"], ".2f") + ("x" if r["speedup"] is not None else ""),
                fmt_time(r["host_us"] / 1e3),
                "-" if r["extra_bytes"] is None else fmt_bytes(r["extra_bytes"]),
                _opt(r["norm_error"], ".0e"),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [headline(record)]
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [cell.rjust(w) for cell, w in zip(row[1:], widths[1:])]
        lines.append("  " + "  ".join(cells))
    for name, reasons in record.get("skipped", {}).items():
        lines.append(f"  (skipped {name}: {'; '.join(reasons)})")
    return "\n".join(lines)


def _result(record: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((r for r in record["results"] if r["contender"] == name), None)


def markdown(run: dict[str, Any]) -> str:
    """The short table for the README: fastnorm against torch and the roofline."""
    env = run["environment"]
    lines = [
        f"{env['device_name']} ({env['device']}, {env['threads']} threads), torch {env['torch']}, "
        f"fastnorm {env['fastnorm']} ({env['backend']} backend), {run['timestamp'][:10]}: "
        f"`{run['command']}`. Median of interleaved rounds; GB/s over one read of the gradients, "
        "% of the read roofline (the fastest plain torch read of the same bytes, same run).",
        "",
        "| workload | dtype | read roofline GB/s | fastnorm total_norm | torch get_total_norm | "
        "speedup | fastnorm clip_ (no clip / clips) | torch clip_grad_norm_ (no clip / clips) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def cell(record: dict[str, Any], name: str) -> str:
        r = _result(record, name)
        if r is None:
            return "-"
        text = fmt_time(r["ms"])
        # Below a megabyte the time is the per-call host cost: GB/s means nothing.
        if record["bytes"] >= 1e6 and r["roofline_pct"] is not None:
            text += f", {r['gbps']:.3g} GB/s ({r['roofline_pct']:.0f}%)"
        return text

    for rec in run["workloads"]:
        roof = rec["roofline"]["read"]
        fast = _result(rec, "fastnorm.total_norm")
        speedup = f"{fast['speedup']:.2f}x" if fast and fast["speedup"] else "-"
        clip_f = " / ".join(
            fmt_time(r["ms"]) if (r := _result(rec, n)) else "-"
            for n in ("fastnorm.clip_/noop", "fastnorm.clip_/clips")
        )
        clip_t = " / ".join(
            fmt_time(r["ms"]) if (r := _result(rec, n)) else "-"
            for n in ("torch.clip_grad_norm_/noop", "torch.clip_grad_norm_/clips")
        )
        lines.append(
            f"| {rec['workload']} | {rec['dtype']} | {roof['gbps']:.1f} | "
            f"{cell(rec, 'fastnorm.total_norm')} | {cell(rec, 'torch.get_total_norm')} | {speedup} | "
            f"{clip_f} | {clip_t} |"
        )
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------


def write_json(run: dict[str, Any], path: Path) -> None:
    text = json.dumps(run, indent=1)
    # Lists of numbers (the samples) on one line each: a readable, small file.
    text = re.sub(r"\[\s+([-0-9.e,\s]+?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
    path.write_text(text + "\n")


def append_csv(run: dict[str, Any], path: Path) -> None:
    """One row per workload and contender, appended (the header once)."""
    env = run["environment"]
    new = not path.exists() or path.stat().st_size == 0
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        if new:
            writer.writeheader()
        for rec in run["workloads"]:
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
                    }
                )


def _round(value: Any) -> Any:
    return float(f"{value:.6g}") if isinstance(value, float) else value
