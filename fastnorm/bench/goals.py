"""The targets, checked against a run's numbers.

The CPU targets say where the CPU kernels stand against the memory-bandwidth
limit (one read of the gradients for the norm, one more read and write when
clipping), against torch, and what a call costs the host. The training-step
targets (every device) say what clipping through torch's fused AdamW step
costs against the bare step and against ``clip_`` + step, and that the steps
which clip applied the clip. Each check is evaluated only when the run
measured what it needs; a figure the run marked as disturbed is reported as
such, neither met nor missed. The outcome is printed after the tables and
stored in the JSON. A missed target is information, not an error: the exit
code does not change.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastnorm.bench import step
from fastnorm.bench.harness import paired_ratio
from fastnorm.bench.report import disturbed

Record = dict[str, Any]

# (workload, dtype): total_norm on all threads must reach this fraction of the read roofline.
ROOFLINE_FRACTION = {
    (workload, dtype): 0.85 for workload in ("gpt2-small", "llama-300m") for dtype in ("fp32", "bf16")
} | {("resnet50", "fp32"): 0.85, ("many-small", "fp32"): 0.85}
# (workload, dtype): total_norm must be this many times faster than torch.get_total_norm.
SPEEDUP = {
    ("gpt2-small", "fp32"): 2.0,
    ("many-small", "fp32"): 5.0,
    ("many-small", "bf16"): 5.0,
    ("tiny", "fp32"): 8.0,
    ("tiny", "bf16"): 8.0,
}
# One core, one flat tensor: total_norm against torch.sum of the same tensor.
KERNEL_WORKLOAD = "kernel-1t"
KERNEL_VS_SUM = 1.0
# bf16 must give at least fp32's elements per second on these.
BF16_WORKLOADS = ("gpt2-small", "llama-300m", KERNEL_WORKLOAD)
# A clip that clips: within this factor of one read plus one read-write pass
# (the rooflines), on the workloads that stream from memory.
CLIP_OVERHEAD = 1.1
STREAMING = ("gpt2-small", "resnet50", "llama-300m")
# The host's time per tensor of a call on a cached plan (tiny tensors).
HOST_US_PER_TENSOR = 0.25
# A copy of the gradients would be 100%; a per-tensor plan is far below 1%.
EXTRA_MEMORY_FRACTION = 0.01
EXTRA_MEMORY_MIN_BYTES = 64e6  # below this the resident-set measure is mostly noise

# The training step (fastnorm/bench/step.py): the step that clips through
# torch's fused AdamW, with its norm and alone, against the bare step (paired
# ratios); and against clip_ + step.
FOLDED = {step.FOLDED: "with its norm", step.FOLDED_STEP: "alone, the norm computed before"}
FOLDED_OVER_STEP = 1.05
FOLDED_OVER_CLIP_THEN_STEP = 1.0
# How far the gradients a step used may be from the originals times the clip
# coefficient, relatively (a float32 coefficient; 16-bit gradients stored back).
COEF_RTOL = {"fp64": 1e-6, "fp32": 1e-5}
COEF_RTOL_DEFAULT = 1e-2


def _result(record: Record, name: str) -> Record | None:
    return next((r for r in record["results"] if r["contender"] == name), None)


def _goal(
    text: str,
    record: Record,
    value: float,
    threshold: float,
    higher_is_better: bool,
    used: list[Record | None] = (),
    timed: bool = True,
) -> Record:
    """One target's outcome; ``used`` are the results it was computed from.

    A figure that is not a time (memory, what a call computed) does not depend
    on other processes: ``timed=False`` evaluates it whatever the rounds were.
    """
    why = None
    if timed:
        why = disturbed(record) or next((r["disturbed"] for r in used if r and r.get("disturbed")), None)
    ok = value >= threshold if higher_is_better else value <= threshold
    return {
        "goal": text,
        "workload": record["workload"],
        "dtype": record["dtype"],
        "value": value,
        "compare": ">=" if higher_is_better else "<=",
        "threshold": threshold,
        "pass": None if why else ok,
        "disturbed": why,
    }


def _step(record: Record) -> Iterator[Record]:
    """The training-step targets of a step workload's record."""
    if _result(record, step.BARE) is None:
        return
    for name, what in FOLDED.items():
        folded = _result(record, name)
        if folded is not None and folded.get("paired_ratio") is not None:
            yield _goal(
                f"folded step ({what}) / bare fused AdamW step",
                record,
                folded["paired_ratio"],
                FOLDED_OVER_STEP,
                False,
                [folded],
            )
    folded, separate = _result(record, step.FOLDED), _result(record, step.CLIP_THEN_STEP)
    if folded is not None and separate is not None:
        yield _goal(
            "folded step (with its norm) / (clip_ + step)",
            record,
            paired_ratio(folded["samples_ms"], separate["samples_ms"]),
            FOLDED_OVER_CLIP_THEN_STEP,
            False,
            [folded, separate],
        )
    rtol = COEF_RTOL.get(record["dtype"], COEF_RTOL_DEFAULT)
    for r in record["results"]:
        if r["contender"] in FOLDED and r.get("applied_coef") is not None:
            yield _goal(
                f"{r['contender']} clipped: |coefficient applied / max_norm/(norm+1e-6) - 1|",
                record,
                abs(r["applied_coef"] / r["expected_coef"] - 1),
                rtol,
                False,
                timed=False,
            )


def _per_record(record: Record, isa: str | None) -> Iterator[Record]:
    key = (record["workload"], record["dtype"])
    read, rw = record["roofline"]["read"], record["roofline"]["read_write"]
    if record["workload"] == KERNEL_WORKLOAD:
        fast, total = _result(record, f"fastnorm.total_norm/{isa}"), _result(record, "roofline.read/sum")
        if fast is not None and total is not None:
            yield _goal(
                f"1 core: total_norm ({isa}) / torch.sum, same tensor",
                record,
                total["ms"] / fast["ms"],
                KERNEL_VS_SUM,
                True,
                [fast, total],
            )
        return
    norm = _result(record, "fastnorm.total_norm")
    if norm is not None and key in ROOFLINE_FRACTION and read:
        yield _goal(
            "total_norm / read roofline",
            record,
            read["ms"] / norm["ms"],
            ROOFLINE_FRACTION[key],
            True,
            [norm],
        )
    torch_norm = _result(record, "torch.get_total_norm")
    if norm is not None and key in SPEEDUP and torch_norm is not None:
        value = torch_norm["ms"] / norm["ms"]
        yield _goal(
            "speedup over torch.get_total_norm", record, value, SPEEDUP[key], True, [norm, torch_norm]
        )
    noop = _result(record, "fastnorm.clip_/noop")
    if norm is not None and noop is not None:
        yield _goal(
            "clip_ (no clip) / total_norm",
            record,
            noop["ms"] / norm["ms"],
            CLIP_OVERHEAD,
            False,
            [norm, noop],
        )
    clips = _result(record, "fastnorm.clip_/clips")
    if clips is not None and read and rw and record["workload"] in STREAMING:
        yield _goal(
            "clip_ (clips) / (read roofline + read-write roofline)",
            record,
            clips["ms"] / (read["ms"] + rw["ms"]),
            CLIP_OVERHEAD,
            False,
            [clips],
        )
    for r in record["results"]:
        if r.get("host_us_per_tensor") is not None and r["group"] == "fastnorm" and r["kind"] != "clip-noop":
            yield _goal(
                f"host time per tensor of {r['contender']} (us)",
                record,
                r["host_us_per_tensor"],
                HOST_US_PER_TENSOR,
                False,
                [r],
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
                    timed=False,
                )


def evaluate(run: dict[str, Any]) -> list[Record]:
    """Every target the run can speak to: the training step's on every device,
    the others on the CPU only (they are the CPU kernels')."""
    env = run["environment"]
    records = [rec for rec in run["workloads"] if not rec["quick"]]
    steps = [goal for rec in records for goal in _step(rec)]
    if env["device"] != "cpu":
        return steps
    goals = [goal for rec in records for goal in _per_record(rec, env.get("cpp_isa"))] + steps
    by_key = {(rec["workload"], rec["dtype"]): rec for rec in records}
    for name in BF16_WORKLOADS:
        bf16, fp32 = by_key.get((name, "bf16")), by_key.get((name, "fp32"))
        if bf16 is None or fp32 is None:
            continue
        row = (
            "fastnorm.total_norm" if name != KERNEL_WORKLOAD else f"fastnorm.total_norm/{env.get('cpp_isa')}"
        )
        b, f = _result(bf16, row), _result(fp32, row)
        if b is not None and f is not None:
            # elements/s of bf16 over those of fp32: the same elements, so a ratio of times
            goal = _goal("bf16 / fp32 elements per second", bf16, f["ms"] / b["ms"], 1.0, True, [b, f])
            goal["disturbed"] = goal["disturbed"] or disturbed(fp32)
            goal["pass"] = None if goal["disturbed"] else goal["pass"]
            goals.append(goal)
    return goals


def summary(goals: list[Record]) -> str:
    if not goals:
        return ""
    checked = [g for g in goals if g["pass"] is not None]
    lines = [f"Targets: {sum(g['pass'] for g in checked)} of {len(checked)} met"]
    if len(checked) < len(goals):
        lines[0] += f" ({len(goals) - len(checked)} not evaluated: disturbed figures)"
    for g in goals:
        mark = "DIST" if g["pass"] is None else "ok  " if g["pass"] else "MISS"
        line = (
            f"  {mark} {g['workload']} {g['dtype']}: {g['goal']} = {g['value']:.3g} "
            f"(target {g['compare']} {g['threshold']:g})"
        )
        if g["pass"] is None:
            line += f" [disturbed: {g['disturbed']}]"
        lines.append(line)
    return "\n".join(lines)
