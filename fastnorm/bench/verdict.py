"""The few lines a run opens its report with: what it compared, where, what it found, and how far
its figures can be trusted given the load it measured.

The tables and the targets say the same in full; this reads them from the run's
JSON document (see ``report``) and speaks only of figures that are results: a
disturbed figure is counted, never quoted.
"""

from __future__ import annotations

import textwrap
from typing import Any

from fastnorm.bench import goals, step
from fastnorm.bench.harness import QUIET_CORES, disturbed
from fastnorm.bench.report import fmt_bytes

Record = dict[str, Any]

NORM, CLIPS = "fastnorm.total_norm", "fastnorm.clip_/clips"
# The workloads a newcomer knows by name, quoted beside the range when the run has them.
HEADLINE = ("gpt2-small", "llama-300m")
# Where total_norm is held to the memory limit (the roofline targets).
STREAMING = sorted({workload for workload, _ in goals.ROOFLINE_FRACTION})
WIDTH = 100


def _ok(record: Record, name: str) -> Record | None:
    """The result of ``name`` in ``record`` when it is a result (measured, not disturbed)."""
    r = next((r for r in record["results"] if r["contender"] == name), None)
    return None if r is None or disturbed(record, r) else r


def _span(values: list[float], fmt: str, unit: str) -> str:
    low, high = min(values), max(values)
    if format(low, fmt) == format(high, fmt):
        return f"{low:{fmt}}{unit}"
    return f"{low:{fmt}}{unit} to {high:{fmt}}{unit}"


def _speedups(records: list[Record], name: str) -> list[tuple[Record, float]]:
    found = [(rec, _ok(rec, name)) for rec in records if not _is_step(rec)]
    return [(rec, r["speedup"]) for rec, r in found if r is not None and r.get("speedup")]


def _is_step(record: Record) -> bool:
    return any(r["contender"] == step.BARE for r in record["results"])


def _by_workload(pairs: list[tuple[Record, str]], parenthesized: bool = True) -> str:
    """Each workload once with its dtypes: ``gpt2-small (fp32, bf16) and llama-300m (bf16)``, or
    without parentheses ``gpt2-small fp32 1.27x, bf16 1.72x; llama-300m bf16 2.18x``."""
    grouped: dict[str, list[str]] = {}
    for rec, text in pairs:
        grouped.setdefault(rec["workload"], []).append(f"{rec['dtype']}{text}")
    if not parenthesized:
        return "; ".join(f"{workload} {', '.join(items)}" for workload, items in grouped.items())
    named = [f"{workload} ({', '.join(items)})" for workload, items in grouped.items()]
    return named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]


def _speed(records: list[Record]) -> str:
    norms = _speedups(records, NORM)
    if not norms:
        return "Speed: no figure of total_norm against torch's get_total_norm is a result in this run."
    count = f"{len(norms)} measurement{'s' * (len(norms) != 1)}"
    known = [(rec, f" {s:.2f}x") for rec, s in norms if rec["workload"] in HEADLINE]
    text = (
        f"Speed: total_norm ran {_span([s for _, s in norms], '.2f', 'x')} as fast as torch's "
        f"get_total_norm ({count}" + (f"; {_by_workload(known, False)}" if known else "") + ")"
    )
    clips = _speedups(records, CLIPS)
    if clips:
        text += f"; clip_ that clips, {_span([s for _, s in clips], '.2f', 'x')} as fast as clip_grad_norm_"
    return text + "."


def _training_step(records: list[Record]) -> str | None:
    parts = []
    for rec in records:
        folded, then = _ok(rec, step.FOLDED), _ok(rec, step.CLIP_THEN_STEP)
        if folded is None or then is None or None in (folded.get("paired_ratio"), then.get("paired_ratio")):
            continue
        parts.append(
            f"{rec['workload']} {rec['dtype']}: the step that clips itself (StepClipper) takes "
            f"{folded['paired_ratio']:.2f}x the bare step's time, clip_ then the step "
            f"{then['paired_ratio']:.2f}x"
        )
    return f"Training step (torch's fused AdamW): {'; '.join(parts)}." if parts else None


def _memory_limit(records: list[Record]) -> str:
    shares = [
        (rec, r["roofline_pct"])
        for rec in records
        if rec["workload"] in STREAMING
        for r in [_ok(rec, NORM)]
        if r is not None and r.get("roofline_pct") is not None
    ]
    if not shares:
        return (
            "Memory limit: no workload that streams from memory has a result here "
            f"({', '.join(STREAMING)})."
        )
    where = _by_workload([(rec, "") for rec, _ in shares])
    return (
        f"Memory limit: on {where}, total_norm read the gradients at "
        f"{_span([p for _, p in shares], '.0f', '%')} of the memory bandwidth this machine reached "
        "in the same rounds (its fastest plain torch read of the same bytes)."
    )


def _trust(run: dict[str, Any]) -> str:
    records = run["workloads"]
    before = (run.get("load_before") or {}).get("other_cores_busy")
    rounds = [rec.get("rounds") or {} for rec in records]
    timed = sum(r.get("timed", 0) for r in rounds)
    # Not quiet: left out and timed again, or, where too few were quiet, kept (the figures disturbed).
    busy_rounds = sum(r.get("timed", 0) - r.get("quiet", r.get("kept", 0)) for r in rounds)
    whole = [rec for rec in records if rec.get("disturbed")]
    single = [
        (rec, r)
        for rec in records
        if not rec.get("disturbed")
        for r in rec["results"]
        if r.get("disturbed") and r["group"] != "reference"
    ]
    quick = ""
    if (run.get("settings") or {}).get("quick"):
        quick = " These are --quick shapes, a smoke test: their figures say little about real models."
    if before is None and not timed:
        return "Trust: unknown: this machine's load cannot be read (no /proc/stat): no round checked." + quick
    busy = f"other processes kept more than {QUIET_CORES:g} cores busy in {busy_rounds} of {timed} rounds"
    if not whole and not single:
        if busy_rounds == 0:
            return (
                f"Trust: good: other processes kept at most {QUIET_CORES:g} cores busy in every one of the "
                f"{timed} timed rounds, so every figure is a result." + quick
            )
        return (
            f"Trust: good: {busy}; those rounds were left out and timed again, so every figure comes "
            "from quiet rounds." + quick
        )
    parts = []
    if whole:
        names = ", ".join(f"{rec['workload']} {rec['dtype']}" for rec in whole)
        share = f"all {len(records)}" if len(whole) == len(records) else f"{len(whole)} of the {len(records)}"
        listed = f" ({names})" if len(whole) <= 4 else ""
        parts.append(f"{share} workloads got too few quiet rounds{listed}")
    if single:
        plural = "s" * (len(single) != 1)
        parts.append(f"{len(single)} other figure{plural} came out faster than memory allows")
    level = "poor" if len(whole) * 2 > len(records) else "partial"
    return (
        f"Trust: {level}: {busy}, and {' and '.join(parts)}: those figures are marked disturbed, are "
        "quoted nowhere above and judge no target. Rerun on an idle machine for results." + quick
    )


def verdict(run: dict[str, Any]) -> str:
    """The verdict of ``run`` (a run's JSON document): a few lines, before any table.

    Args:
        run: the run, as ``report.new_run`` starts it and the command fills it.

    Returns:
        The lines, each wrapped to ``WIDTH`` columns.
    """
    env, records = run["environment"], run["workloads"]
    isa = f", C++ kernels {env['cpp_isa']}" if env.get("cpp_isa") else ""
    steps = any(_is_step(rec) for rec in records)
    workloads = len({rec["workload"] for rec in records})
    lines = [
        "fastnorm.total_norm and clip_ against torch.nn.utils.get_total_norm and clip_grad_norm_"
        + (", and torch's fused AdamW step with and without the clip" if steps else "")
        + f", on {workloads} workload{'s' * (workloads != 1)} shaped like real models' gradients "
        f"({len(records)} with their dtypes); "
        f"{env['device_name']}, {env['threads']} threads ({env['backend']} backend{isa}), "
        f"torch {env['torch']}.",
        _speed(records),
        _training_step(records),
        _memory_limit(records),
        _trust(run),
    ]
    if run.get("goals"):
        lines.append(f"Targets: {goals.counts(run['goals'])}.")
    if run.get("peak_memory_bytes"):
        peak = fmt_bytes(run["peak_memory_bytes"])
        lines.append(f"Memory: this process held at most {peak} (its peak resident set).")
    wrapped = [textwrap.fill(line, WIDTH, subsequent_indent="  ") for line in lines if line]
    return "\n".join(["Verdict:"] + [textwrap.indent(line, "  ") for line in wrapped])
