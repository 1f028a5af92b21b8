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

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from fastnorm.bench import locate, step
from fastnorm.bench.harness import disturbed, paired_ratio

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
GUARDED_OVER_FOLDED = 1.02  # the spike guard costs at most 2% of the folded step
LOCATOR_OVER_STEP = 1.05  # the locator, always on, costs at most 5% of a training step
STATS_OVER_NORM = 1.05  # per-tensor statistics cost at most 5% over the norm-only pass
# How far the gradients a step used may be from the originals times the clip
# coefficient, relatively (a float32 coefficient; 16-bit gradients stored back).
COEF_RTOL = {"fp64": 1e-6, "fp32": 1e-5}
COEF_RTOL_DEFAULT = 1e-2


BF16_OVER_FP32 = 1.0


def _by_threshold(thresholds: dict[tuple[str, str], float], unit: str = "") -> list[tuple[str, str]]:
    """(threshold, where) per distinct threshold, the workloads each with its dtypes."""
    rows: dict[float, dict[str, list[str]]] = {}
    for (workload, dtype), value in thresholds.items():
        rows.setdefault(value, {}).setdefault(workload, []).append(dtype)
    return [
        (f"{value:g}{unit}", "; ".join(f"`{w}` {', '.join(d)}" for w, d in where.items()))
        for value, where in rows.items()
    ]


def _names(names: Iterable[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


@dataclass(frozen=True)
class Target:
    """One kind of target: its wording in the docs, and where and against what it is judged.

    ``rows()`` gives (threshold, where) pairs, one per distinct threshold;
    ``timed``: a time, so not judged where its figures were disturbed (memory
    and what a step computed are judged on a busy machine too).
    """

    text: str
    higher_is_better: bool
    rows: Callable[[], list[tuple[str, str]]]
    timed: bool = True


def _kernel_where() -> list[tuple[str, str]]:
    from fastnorm.bench.workloads import WORKLOADS

    dtypes = WORKLOADS[KERNEL_WORKLOAD].dtypes or ()
    return [(f"{KERNEL_VS_SUM:g}", f"`{KERNEL_WORKLOAD}` {', '.join(dtypes)}")]


def _host_where() -> list[tuple[str, str]]:
    from fastnorm.bench.workloads import WORKLOADS

    names = [w.name for w in WORKLOADS.values() if w.host_cost]
    return [(f"{HOST_US_PER_TENSOR:g} us", f"{_names(names)} (fp32, bf16)")]


def _coef_where() -> list[tuple[str, str]]:
    rtols = ", ".join(f"{v:g} ({k})" for k, v in COEF_RTOL.items())
    return [(f"{rtols}, {COEF_RTOL_DEFAULT:g} (16-bit)", "`step-*`")]


# Every target evaluate() judges, by the key its outcomes carry: what the docs' table lists.
TARGETS: dict[str, Target] = {
    "kernel": Target(
        "`total_norm`'s speed on one core / `torch.sum`'s on the same flat tensor", True, _kernel_where
    ),
    "roofline": Target(
        "`total_norm`'s speed on all threads / the read roofline's",
        True,
        lambda: _by_threshold(ROOFLINE_FRACTION),
    ),
    "speedup": Target(
        "speedup of `total_norm` over `torch.get_total_norm`", True, lambda: _by_threshold(SPEEDUP, "x")
    ),
    "bf16": Target(
        "bf16 elements per second / fp32's, `total_norm`",
        True,
        lambda: [(f"{BF16_OVER_FP32:g}", _names(BF16_WORKLOADS))],
    ),
    "clip": Target(
        "`clip_` that clips / (one read plus one read-write pass: the two rooflines)",
        False,
        lambda: [(f"{CLIP_OVERHEAD:g}", f"{_names(STREAMING)} (fp32, bf16)")],
    ),
    "stats": Target(
        "`tensor_stats` (the norm and every tensor's statistics) / `total_norm`, same gradients",
        False,
        lambda: [(f"{STATS_OVER_NORM:g}", f"{_names(STREAMING)} (fp32, bf16)")],
    ),
    "noop": Target(
        "`clip_` that does not clip / `total_norm`",
        False,
        lambda: [(f"{CLIP_OVERHEAD:g}", "every workload that runs both")],
    ),
    "host": Target(
        "host time per tensor of `total_norm` and of `clip_` that clips, on a cached plan", False, _host_where
    ),
    "memory": Target(
        "peak extra memory of a fastnorm call (a training loop's second) / the gradients' bytes",
        False,
        lambda: [
            (
                f"{EXTRA_MEMORY_FRACTION:g}",
                f"every workload of at least {EXTRA_MEMORY_MIN_BYTES / 1e6:.0f} MB",
            )
        ],
        timed=False,
    ),
    "folded": Target(
        "folded step / bare fused AdamW step, with its norm and alone (paired ratios)",
        False,
        lambda: [(f"{FOLDED_OVER_STEP:g}", "`step-*`")],
    ),
    "folded-vs-clip": Target(
        "folded step (with its norm) / `clip_` + step (paired ratio)",
        False,
        lambda: [(f"{FOLDED_OVER_CLIP_THEN_STEP:g}", "`step-*`")],
    ),
    "guarded": Target(
        "folded step with the spike guard / folded step (paired ratio)",
        False,
        lambda: [(f"{GUARDED_OVER_FOLDED:g}", "`step-*`")],
    ),
    "locator": Target(
        "forward and backward with the locator on / the bare forward and backward (paired ratio)",
        False,
        lambda: [(f"{LOCATOR_OVER_STEP:g}", "`train-*`")],
    ),
    "applied": Target(
        "the folded steps applied the clip: \\|coefficient in the gradients they used / "
        "(max_norm / (norm + 1e-6)) - 1\\|",
        False,
        _coef_where,
        timed=False,
    ),
}


def table() -> str:
    """The targets as a Markdown table, from the constants above (the docs hold this table)."""
    lines = [
        "| target | threshold | workloads and dtypes | judged when disturbed |",
        "| --- | --- | --- | --- |",
    ]
    for target in TARGETS.values():
        compare = ">=" if target.higher_is_better else "<="
        for threshold, where in target.rows():
            judged = "no" if target.timed else "yes"
            lines.append(f"| {target.text} | {compare} {threshold} | {where} | {judged} |")
    return "\n".join(lines) + "\n"


def _result(record: Record, name: str) -> Record | None:
    return next((r for r in record["results"] if r["contender"] == name), None)


def _goal(
    target: str,
    text: str,
    record: Record,
    value: float,
    threshold: float,
    used: list[Record | None] = (),
) -> Record:
    """One outcome of ``target`` (a key of ``TARGETS``); ``used`` are the results it was computed from.

    A figure that is not a time (memory, what a call computed) does not depend
    on other processes: it is judged whatever the rounds were.
    """
    higher_is_better, timed = TARGETS[target].higher_is_better, TARGETS[target].timed
    why = None
    if timed:
        why = disturbed(record) or next((r["disturbed"] for r in used if r and r.get("disturbed")), None)
    ok = value >= threshold if higher_is_better else value <= threshold
    return {
        "target": target,
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
    located = _result(record, locate.LOCATOR)
    if located is not None and located.get("paired_ratio") is not None:
        yield _goal(
            "locator",
            "forward and backward with the locator on / the bare forward and backward",
            record,
            located["paired_ratio"],
            LOCATOR_OVER_STEP,
            [located],
        )
    if _result(record, step.BARE) is None:
        return
    for name, what in FOLDED.items():
        folded = _result(record, name)
        if folded is not None and folded.get("paired_ratio") is not None:
            yield _goal(
                "folded",
                f"folded step ({what}) / bare fused AdamW step",
                record,
                folded["paired_ratio"],
                FOLDED_OVER_STEP,
                [folded],
            )
    folded, separate = _result(record, step.FOLDED), _result(record, step.CLIP_THEN_STEP)
    if folded is not None and separate is not None:
        yield _goal(
            "folded-vs-clip",
            "folded step (with its norm) / (clip_ + step)",
            record,
            paired_ratio(folded["samples_ms"], separate["samples_ms"]),
            FOLDED_OVER_CLIP_THEN_STEP,
            [folded, separate],
        )
    guarded = _result(record, step.GUARDED)
    if guarded is not None and guarded.get("paired_ratio") is not None:
        yield _goal(
            "guarded",
            "folded step with the spike guard / folded step (with its norm)",
            record,
            guarded["paired_ratio"],
            GUARDED_OVER_FOLDED,
            [guarded],
        )
    rtol = COEF_RTOL.get(record["dtype"], COEF_RTOL_DEFAULT)
    for r in record["results"]:
        if r["contender"] in FOLDED and r.get("applied_coef") is not None:
            yield _goal(
                "applied",
                f"{r['contender']} clipped: |coefficient applied / max_norm/(norm+1e-6) - 1|",
                record,
                abs(r["applied_coef"] / r["expected_coef"] - 1),
                rtol,
            )


def _per_record(record: Record, isa: str | None) -> Iterator[Record]:
    key = (record["workload"], record["dtype"])
    read, rw = record["roofline"]["read"], record["roofline"]["read_write"]
    if record["workload"] == KERNEL_WORKLOAD:
        fast, total = _result(record, f"fastnorm.total_norm/{isa}"), _result(record, "roofline.read/sum")
        if fast is not None and total is not None:
            yield _goal(
                "kernel",
                f"1 core: total_norm ({isa}) / torch.sum, same tensor",
                record,
                total["ms"] / fast["ms"],
                KERNEL_VS_SUM,
                [fast, total],
            )
        return
    norm = _result(record, "fastnorm.total_norm")
    if norm is not None and key in ROOFLINE_FRACTION and read:
        yield _goal(
            "roofline",
            "total_norm / read roofline",
            record,
            read["ms"] / norm["ms"],
            ROOFLINE_FRACTION[key],
            [norm],
        )
    torch_norm = _result(record, "torch.get_total_norm")
    if norm is not None and key in SPEEDUP and torch_norm is not None:
        value = torch_norm["ms"] / norm["ms"]
        yield _goal(
            "speedup", "speedup over torch.get_total_norm", record, value, SPEEDUP[key], [norm, torch_norm]
        )
    noop = _result(record, "fastnorm.clip_/noop")
    if norm is not None and noop is not None:
        yield _goal(
            "noop",
            "clip_ (no clip) / total_norm",
            record,
            noop["ms"] / norm["ms"],
            CLIP_OVERHEAD,
            [norm, noop],
        )
    stats = _result(record, "fastnorm.tensor_stats")
    if norm is not None and stats is not None and record["workload"] in STREAMING:
        yield _goal(
            "stats",
            "tensor_stats / total_norm",
            record,
            stats["ms"] / norm["ms"],
            STATS_OVER_NORM,
            [norm, stats],
        )
    clips = _result(record, "fastnorm.clip_/clips")
    if clips is not None and read and rw and record["workload"] in STREAMING:
        yield _goal(
            "clip",
            "clip_ (clips) / (read roofline + read-write roofline)",
            record,
            clips["ms"] / (read["ms"] + rw["ms"]),
            CLIP_OVERHEAD,
            [clips],
        )
    for r in record["results"]:
        if r.get("host_us_per_tensor") is not None and r["group"] == "fastnorm" and r["kind"] != "clip-noop":
            yield _goal(
                "host",
                f"host time per tensor of {r['contender']} (us)",
                record,
                r["host_us_per_tensor"],
                HOST_US_PER_TENSOR,
                [r],
            )
    # A training step's activations are its own, not a fastnorm call's: no memory target there.
    if record["bytes"] >= EXTRA_MEMORY_MIN_BYTES and _result(record, locate.PLAIN) is None:
        for r in record["results"]:
            if r["group"] == "fastnorm" and r["extra_bytes"] is not None:
                yield _goal(
                    "memory",
                    f"extra memory of {r['contender']} / gradient bytes",
                    record,
                    r["extra_bytes"] / record["bytes"],
                    EXTRA_MEMORY_FRACTION,
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
            goal = _goal(
                "bf16", "bf16 / fp32 elements per second", bf16, f["ms"] / b["ms"], BF16_OVER_FP32, [b, f]
            )
            goal["disturbed"] = goal["disturbed"] or disturbed(fp32)
            goal["pass"] = None if goal["disturbed"] else goal["pass"]
            goals.append(goal)
    return goals


def counts(goals: list[Record]) -> str:
    """How many targets were met, missed and not judged, in words."""
    judged = [g for g in goals if g["pass"] is not None]
    met = sum(g["pass"] for g in judged)
    text = f"{met} met, {len(judged) - met} missed"
    if len(judged) < len(goals):
        text += f", {len(goals) - len(judged)} not judged (their figures are disturbed)"
    return text


def outcome(goal: Record) -> str:
    """``value (target >= threshold)``, or ``not judged (disturbed)`` where a figure was disturbed."""
    target = f"target {goal['compare']} {goal['threshold']:g}"
    if goal["pass"] is None:
        return f"not judged (disturbed), {target}"
    return f"{goal['value']:.3g} ({target})"


def by_target(goals: list[Record]) -> str:
    """Per target, where it was met, missed (with the values) and not judged: a Markdown table."""
    outcomes = ("met", "missed", "not judged")
    rows: dict[str, dict[str, dict[str, list[Record]]]] = {}
    for g in goals:
        outcome = outcomes[2] if g["pass"] is None else outcomes[0] if g["pass"] else outcomes[1]
        cells = rows.setdefault(g.get("target", g["goal"]), {o: {} for o in outcomes})
        cells[outcome].setdefault(f"{g['workload']} {g['dtype']}", []).append(g)

    def cell(found: dict[str, list[Record]], outcome: str) -> str:
        if outcome != "missed":
            return ", ".join(found) or "-"
        entries = []
        for where, gs in found.items():
            values = ", ".join(format(g["value"], ".3g") for g in gs)
            entries.append(f"{where}: {values} ({gs[0]['compare']} {gs[0]['threshold']:g})")
        return "; ".join(entries) or "-"

    lines = ["| target | met | missed | not judged (disturbed) |", "| --- | --- | --- | --- |"]
    for key, cells in rows.items():
        text = TARGETS[key].text if key in TARGETS else key.replace("|", "\\|")
        lines.append(f"| {text} | " + " | ".join(cell(cells[o], o) for o in outcomes) + " |")
    return "\n".join(lines) + "\n"


def markdown(goals: list[Record]) -> str:
    """The outcome of every target, for DEVICE.md: the counts, the table by target, then every judgement."""
    lines = [
        f"Targets (`fastnorm/bench/goals.py`): {counts(goals)}.",
        "",
        by_target(goals),
        "Every judgement:",
        "",
        "| outcome | workload | dtype | target | value | threshold |",
        "| --- | --- | --- | --- | ---: | ---: |",
    ]
    for g in goals:
        word = "not judged (disturbed)" if g["pass"] is None else "met" if g["pass"] else "**missed**"
        value = "-" if g["pass"] is None else f"{g['value']:.3g}"
        text, threshold = g["goal"].replace("|", "\\|"), f"{g['compare']} {g['threshold']:g}"
        lines.append(f"| {word} | {g['workload']} | {g['dtype']} | {text} | {value} | {threshold} |")
    return "\n".join(lines) + "\n"


def summary(goals: list[Record]) -> str:
    """The lines printed after the tables: the counts, then one line per target."""
    if not goals:
        return ""
    lines = [f"Targets: {counts(goals)}"]
    if any(g["pass"] is None for g in goals):
        lines[0] += "; rerun on an idle machine to judge them"
    for g in goals:
        mark = "--  " if g["pass"] is None else "ok  " if g["pass"] else "MISS"
        lines.append(f"  {mark} {g['workload']} {g['dtype']}: {g['goal']}: {outcome(g)}")
    return "\n".join(lines)
