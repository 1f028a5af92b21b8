"""The CPU backend's targets, checked against a run's numbers.

The targets say where the CPU kernels stand against the memory-bandwidth limit
(one read of the gradients for the norm, one more read and write when
clipping). Each check is evaluated only when the run measured what it needs;
the outcome is printed after the tables and stored in the JSON. A missed target
is information, not an error: the exit code does not change.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

Record = dict[str, Any]

# (workload, dtype): total_norm must reach this fraction of the read roofline.
ROOFLINE_FRACTION = {("gpt2-small", "fp32"): 0.85, ("resnet50", "fp32"): 0.85, ("many-small", "fp32"): 0.85}
# (workload, dtype): total_norm must be this many times faster than torch.
SPEEDUP = {("gpt2-small", "fp32"): 2.0, ("many-small", "fp32"): 5.0, ("tiny", "fp32"): 10.0}
CLIP_OVERHEAD = 1.1
# A copy of the gradients would be 100%; a per-tensor plan is far below 1%.
EXTRA_MEMORY_FRACTION = 0.01
EXTRA_MEMORY_MIN_BYTES = 64e6  # below this the resident-set measure is mostly noise


def _ms(record: Record, name: str) -> float | None:
    r = next((r for r in record["results"] if r["contender"] == name), None)
    return None if r is None else r["ms"]


def _goal(text: str, record: Record, value: float, threshold: float, higher_is_better: bool) -> Record:
    ok = value >= threshold if higher_is_better else value <= threshold
    return {
        "goal": text,
        "workload": record["workload"],
        "dtype": record["dtype"],
        "value": value,
        "compare": ">=" if higher_is_better else "<=",
        "threshold": threshold,
        "pass": ok,
    }


def _per_record(record: Record) -> Iterator[Record]:
    key = (record["workload"], record["dtype"])
    norm = _ms(record, "fastnorm.total_norm")
    if norm is None:
        return
    read = record["roofline"]["read"]
    if key in ROOFLINE_FRACTION and read:
        yield _goal("total_norm / read roofline", record, read["ms"] / norm, ROOFLINE_FRACTION[key], True)
    torch_norm = _ms(record, "torch.get_total_norm")
    if key in SPEEDUP and torch_norm is not None:
        yield _goal("speedup over torch.get_total_norm", record, torch_norm / norm, SPEEDUP[key], True)
    noop = _ms(record, "fastnorm.clip_/noop")
    if noop is not None:
        yield _goal("clip_ (no clip) / total_norm", record, noop / norm, CLIP_OVERHEAD, False)
    clips = _ms(record, "fastnorm.clip_/clips")
    rw = record["roofline"]["read_write"]
    if clips is not None and rw:
        yield _goal(
            "clip_ (clips) / (total_norm + read-write roofline)",
            record,
            clips / (norm + rw["ms"]),
            CLIP_OVERHEAD,
            False,
        )
    if record["bytes"] >= EXTRA_MEMORY_MIN_BYTES:
        for r in record["results"]:
            if r["group"] == "fastnorm" and r["extra_bytes"] is not None:
                yield _goal(
                    f"extra memory of {r['contender']} / gradient bytes",
                    record,
                    r["extra_bytes"] / record["bytes"],
                    EXTRA_MEMORY_FRACTION,
                    False,
                )


def evaluate(run: dict[str, Any]) -> list[Record]:
    """Every target the run can speak to (CPU runs only: the targets are the CPU's)."""
    if run["environment"]["device"] != "cpu":
        return []
    records = [rec for rec in run["workloads"] if not rec["quick"]]
    goals = [goal for rec in records for goal in _per_record(rec)]
    by_key = {(rec["workload"], rec["dtype"]): rec for rec in records}
    for (name, dtype), rec in by_key.items():
        fp32 = by_key.get((name, "fp32"))
        if dtype != "bf16" or fp32 is None:
            continue
        bf16_ms, fp32_ms = _ms(rec, "fastnorm.total_norm"), _ms(fp32, "fastnorm.total_norm")
        if bf16_ms is not None and fp32_ms is not None:
            # elements/s of bf16 over those of fp32: the same elements, so a ratio of times
            goals.append(_goal("bf16 / fp32 elements per second", rec, fp32_ms / bf16_ms, 1.0, True))
    return goals


def summary(goals: list[Record]) -> str:
    if not goals:
        return ""
    lines = [f"CPU targets: {sum(g['pass'] for g in goals)} of {len(goals)} met"]
    for g in goals:
        lines.append(
            f"  {'ok  ' if g['pass'] else 'MISS'} {g['workload']} {g['dtype']}: {g['goal']} = "
            f"{g['value']:.3g} (target {g['compare']} {g['threshold']:g})"
        )
    return "\n".join(lines)
