"""``fastnorm bench``: check, time and report every contender on every workload.

A run is a list of steps (a workload in one dtype). Before the first, the
machine is watched for a moment: other processes' work disturbs the rounds,
and the run says at once what the load it sees will do to its figures. The
default run is held to a time budget, its setup included: each step's timed
rounds get their share of what the budget leaves once the remaining steps'
setup is paid for. :class:`Estimate` predicts every step's time from what it
moves, at rates that it learns from the finished steps, and the progress line
shows what is left.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from fastnorm.bench.harness import MIN_QUIET_ROUNDS, ROUND_BUDGET
from fastnorm.checks import number_argument

DEFAULT_REPEATS, FULL_REPEATS, QUICK_REPEATS = 7, 15, 5
DEFAULT_WARMUP, FULL_WARMUP, QUICK_WARMUP = 1, 2, 1
# Timed rounds of one workload stop after this long (once a few are done), so
# that a machine busy with other work cannot stretch a run without end.
STEP_BUDGET_S, FULL_STEP_BUDGET_S = 15.0, 60.0
MIN_STEP_BUDGET_S = 2.0
# The default run's budget, from its first step to its last file: the time it
# is said to take, at most, in --help, on the progress line and in the docs.
RUN_BUDGET_S = 120.0
# How long the machine is watched before the run.
LOAD_LOOK_S = 0.5

# The default run: a subset that speaks to every target, the cheapest first, so
# that a machine too slow for the budget leaves out the costliest; --full runs
# every workload and contender.
DEFAULT_CPU = (
    "kernel-1t",
    "tiny",
    "tiny-groups-24",
    "many-small",
    "gpt2-small",
    "step-gpt2-small",
    "llama-300m",
)
DEFAULT_CONTENDERS = (
    "fastnorm.total_norm",
    "fastnorm.clip_/noop",
    "fastnorm.clip_/clips",
    "fastnorm.tensor_stats",
    "torch.get_total_norm",
    "torch.clip_grad_norm_/clips",
    "roofline.read/sum",
    "roofline.read/dot",
    "roofline.rw/mul_",
)


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


def _out_folder(text: str) -> Path:
    """``--out``: a folder that is, or can be made, writable, checked when the arguments are read,
    before any workload runs (a run that found out at its first write would lose what it measured)."""
    out = Path(text)
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir():
        where = text if existing == out else f"{text}: {existing}"
        raise argparse.ArgumentTypeError(f"{where} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{text}: cannot write in {existing} ({exc.strerror})") from None
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declares the arguments of ``fastnorm bench``."""
    parser.description = (
        "Checks every contender against a float64 reference, then times them interleaved on gradient "
        "lists shaped like real models, against a roofline measured in the same run; the step-* "
        "workloads time torch's fused AdamW step, clipping through it or by clip_ first, against the "
        "bare step. The default run is a representative subset held to a budget of "
        f"{RUN_BUDGET_S / 60:.0f} minutes from the command on, setup included: it takes at most about "
        f"{RUN_BUDGET_S / 60:.0f} minutes on 2 cores, less on an idle machine, and on a busy one leaves "
        "out, costliest first, the workloads the budget cannot hold. --full runs every "
        "workload (many minutes). Before the run the machine's load is measured: other processes' "
        "work marks figures as disturbed, and the run says so at once, with the most memory it will "
        "hold. Ends with a verdict of a few "
        "lines (what was compared, where, how much faster than torch, at what share of the memory "
        "limit, whether the load left the figures trustworthy, the peak memory); --details adds a "
        "table per workload and every target. Writes DEVICE.json, DEVICE.md (the tables and "
        "targets) and results.csv under --out after each workload, and DEVICE.png at the end; "
        "Ctrl-C keeps what is done and draws it."
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when present, else cpu")
    parser.add_argument(
        "--workloads", type=_csv, help="comma list (default: the device's defaults; see --list)"
    )
    parser.add_argument(
        "--full", action="store_true", help=f"every workload, {FULL_REPEATS} rounds each (many minutes)"
    )
    parser.add_argument(
        "--dtypes",
        type=_csv,
        help="comma list of fp32, bf16, fp16, fp64 (default: fp32,bf16; the single-core workload "
        "also runs fp16)",
    )
    parser.add_argument(
        "--contenders",
        type=_csv,
        help="comma list of name prefixes, e.g. fastnorm,torch.get (the roofline always runs)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small shapes and few repeats: a smoke run of seconds"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        help=f"timed rounds, at least (default {DEFAULT_REPEATS}, {FULL_REPEATS} with --full, "
        f"{QUICK_REPEATS} with --quick); quick workloads get more, to fill a second",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        help=f"untimed rounds first (default {DEFAULT_WARMUP}, {FULL_WARMUP} with --full)",
    )
    parser.add_argument(
        "--budget",
        type=number_argument(0, above=True),
        metavar="SECONDS",
        help=f"the run's time budget, setup included (default {RUN_BUDGET_S:.0f} for the default run; "
        "none with --full, --quick or --workloads)",
    )
    parser.add_argument(
        "--threads", type=int, help="torch.set_num_threads (fastnorm's CPU kernels use as many)"
    )
    parser.add_argument(
        "--out", type=_out_folder, default="bench-results", help="results folder (default: bench-results)"
    )
    parser.add_argument("--no-plot", action="store_true", help="do not draw the PNG")
    parser.add_argument(
        "--details", action="store_true", help="after the verdict, print every table and every target"
    )
    parser.add_argument("--list", action="store_true", help="list the workloads and contenders, and exit")
    parser.set_defaults(func=main)


def _list(device: Any) -> int:
    from fastnorm.bench.contenders import CONTENDERS
    from fastnorm.bench.workloads import WORKLOADS

    defaults = _default_workloads(device)
    print(f"workloads (* = in the default run on {device.type}; --full runs all of its device's):")
    for w in WORKLOADS.values():
        mark = "*" if w.name in defaults else " "
        print(f" {mark} {w.name:15s} {w.description} [{', '.join(w.devices)}]")
    print(f"contenders (* = default on {device.type}):")
    for c in CONTENDERS.values():
        mark = "*" if device.type in c.default_on else " "
        reasons = c.reasons(device)
        only = [w.name for w in WORKLOADS.values() if w.contenders and c.name in w.contenders]
        note = f" (on {', '.join(only)} only)" if c.only_listed else ""
        print(
            f" {mark} {c.name:32s} {c.kind:10s}{note}"
            + (f" unavailable: {'; '.join(reasons)}" if reasons else "")
        )
    return 0


def _default_workloads(device: Any) -> list[str]:
    from fastnorm.bench.workloads import WORKLOADS, defaults

    if device.type == "cpu":
        return [name for name in DEFAULT_CPU if name in WORKLOADS]
    return defaults(device)


def _full_workloads(device: Any) -> list[str]:
    from fastnorm.bench.workloads import WORKLOADS

    return [w.name for w in WORKLOADS.values() if not w.not_supported_reasons(device)]


# ----------------------------------------------------------------------------
# What a run will take
# ----------------------------------------------------------------------------

# A call's cost per tensor, in bytes of memory traffic (about 1 us of host time
# at 30 GB/s): what the tiny workloads are made of. And a step's own, whatever
# its size (the clock read twice, the files written): about 0.3 s.
TENSOR_BYTES = 3e4
STEP_BYTES = 5e8
# The machine's pace before any step has finished, in seconds per byte (a
# 2-core machine: the setup, and the timed calls with their restores).
PRIOR_SETUP_S_PER_BYTE = 1 / 2e9
PRIOR_TIMING_S_PER_BYTE = 1 / 30e9
# How much the prior weighs against what the finished steps took: as much as
# this fraction of the run's bytes.
PRIOR_WEIGHT = 0.15


@dataclass(frozen=True)
class Cost:
    """What one step moves, in bytes: ``setup`` (preparing its gradients and the
    correctness check of every contender) and ``round`` (one call of every
    contender, with the restores that follow the ones that write)."""

    setup: float
    round: float


def step_cost(workload: Any, dtype: Any, contenders: list[Any], quick: bool = False) -> Cost:
    """The :class:`Cost` of ``workload`` in ``dtype`` with ``contenders``."""
    import torch

    numel = workload.numel(quick)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    per_call = len(workload.shapes(quick)) * TENSOR_BYTES
    calls = [nbytes * (c.passes + 2 * c.restores) + per_call for c in contenders]
    clipping = sum(c.restores for c in contenders)
    # The arrays drawn and copied, the float64 reference and, where a contender
    # writes, the element-by-element comparison: work per element, whatever the
    # dtype (counted as float32 bytes); and two calls of each contender.
    setup = 4 * numel * (3 * workload.copies + 14 * clipping) + 2 * sum(calls) + STEP_BYTES
    return Cost(setup=setup, round=sum(calls))


class Estimate:
    """The run's time, step by step: predicted from what each step moves, learned as steps finish.

    A step takes ``a * setup + b * round * (warmup + rounds)`` seconds, where
    ``a`` and ``b`` are the machine's seconds per byte of setup and of timed
    work: the prior (``PRIOR_*``, slowed by the load seen before the run)
    blended with what the finished steps took, the prior counting as
    ``PRIOR_WEIGHT`` of the run's bytes; so the estimate moves toward the
    machine's own pace as the run goes, without jumping on the first step. The
    rounds are the ones asked for, more where they are quick (at least
    ``min_time_s`` in all), and as many again as were replaced on a busy
    machine. With a run budget, each step's timed rounds get their share of
    what the budget leaves once the remaining steps' setup is paid for, between
    ``MIN_STEP_BUDGET_S`` and ``step_budget_s``.
    """

    def __init__(
        self,
        costs: list[Cost],
        *,
        repeats: int,
        warmup: int,
        min_time_s: float,
        step_budget_s: float | None,
        run_budget_s: float | None = None,
        slowdown: float = 1.0,
    ) -> None:
        self.costs = costs
        self.repeats, self.warmup, self.min_time_s = repeats, warmup, min_time_s
        self.step_budget_s, self.run_budget_s = step_budget_s, run_budget_s
        self._prior = (
            PRIOR_WEIGHT * sum(c.setup for c in costs),
            PRIOR_WEIGHT * sum(c.round * (warmup + repeats) for c in costs),
        )
        self._seconds = [self._prior[0] * PRIOR_SETUP_S_PER_BYTE * slowdown]
        self._seconds.append(self._prior[1] * PRIOR_TIMING_S_PER_BYTE * slowdown)
        self._bytes = list(self._prior)
        self._rounds = [0.0, 0.0]  # timed, wanted: in steps whose rounds were not cut short by time
        self._ran = False  # whether a step has run (the first always does)

    def _rates(self) -> tuple[float, float]:
        return self._seconds[0] / max(self._bytes[0], 1.0), self._seconds[1] / max(self._bytes[1], 1.0)

    def _timing(self, index: int, rate: float) -> float:
        """The seconds step ``index``'s warm-up and rounds take when no budget stops them."""
        one = rate * self.costs[index].round
        wanted = self.repeats
        if one > 0 and self.min_time_s > 0:
            wanted = max(self.repeats, min(10 * self.repeats, math.ceil(self.min_time_s / one)))
        replaced = self._rounds[0] / self._rounds[1] if self._rounds[1] else 1.0
        return one * (self.warmup + wanted * replaced)

    def least(self, index: int) -> float:
        """The seconds step ``index`` takes at the least: its setup, warm-up and the
        rounds that run whatever the budget (``MIN_QUIET_ROUNDS``)."""
        a, b = self._rates()
        rounds = self.warmup + min(self.repeats, MIN_QUIET_ROUNDS)
        return a * self.costs[index].setup + b * self.costs[index].round * rounds

    def _plan(self, start: int, elapsed: float) -> list[tuple[float, float | None] | None]:
        """(setup seconds, timed rounds' budget) of every step from ``start``; None for
        a step the run's budget cannot hold (at its least, after the earlier steps at
        theirs; the run's first step always runs)."""
        a, b = self._rates()
        setups = [a * cost.setup for cost in self.costs[start:]]
        if self.run_budget_s is None:
            return [(s, self.step_budget_s) for s in setups]
        runs, spent = [], elapsed
        for index in range(start, len(self.costs)):
            fits = spent + self.least(index) <= self.run_budget_s or not (self._ran or any(runs))
            spent += self.least(index) if fits else 0.0
            runs.append(fits)
        timings = [self._timing(start + i, b) for i, fits in enumerate(runs) if fits]
        spare = max(0.0, self.run_budget_s - elapsed - sum(s for s, fits in zip(setups, runs) if fits))
        cap = self.step_budget_s if self.step_budget_s is not None else math.inf
        plan: list[tuple[float, float | None] | None] = []
        for i, (setup, fits) in enumerate(zip(setups, runs)):
            share = spare * self._timing(start + i, b) / (sum(timings) or 1.0)
            plan.append((setup, min(cap, max(MIN_STEP_BUDGET_S, share))) if fits else None)
        return plan

    def runs(self, index: int, elapsed: float) -> bool:
        """Whether step ``index``, starting ``elapsed`` into the run, fits in its budget."""
        return self._plan(index, elapsed)[0] is not None

    def step_budget(self, index: int, elapsed: float) -> float | None:
        """The seconds step ``index``'s timed rounds may take, starting ``elapsed`` into the run."""
        step = self._plan(index, elapsed)[0]
        return None if step is None else step[1]

    def left(self, index: int, elapsed: float, in_step: float = 0.0, rest: float | None = None) -> float:
        """Seconds left: the rest of step ``index`` (``in_step`` seconds into it; ``rest``
        where its rounds have told) and the steps after that the budget holds."""
        if index >= len(self.costs):
            return 0.0
        _, b = self._rates()
        times = [
            0.0 if step is None else step[0] + min(self._timing(index + i, b), step[1] or math.inf)
            for i, step in enumerate(self._plan(index, elapsed - in_step))
        ]
        current = max(0.0, times[0] - in_step) if rest is None else rest
        return current + sum(times[1:])

    def learn(self, index: int, seconds: float, record: dict[str, Any] | None) -> None:
        """What step ``index`` took: ``seconds`` in all, the record's timing and rounds."""
        self._ran = self._ran or record is not None
        timing = (record or {}).get("seconds", {}).get("timing", 0.0)
        rounds = (record or {}).get("rounds") or {}
        self._seconds[0] += max(0.0, seconds - timing)
        self._bytes[0] += self.costs[index].setup
        if timing and rounds.get("timed"):
            self._seconds[1] += timing
            self._bytes[1] += self.costs[index].round * (self.warmup + rounds["timed"])
            if rounds.get("stopped") != "time" and rounds.get("wanted"):
                self._rounds[0] += rounds["timed"]
                self._rounds[1] += rounds["wanted"]


class Progress:
    """One line on stderr: done/total, the current step and round, the time spent and left.

    On a terminal the line is redrawn; elsewhere (a log, a CI job) a line is
    written when a step begins and, while its rounds run, at most every
    ``interval_s`` seconds, with the round.
    """

    def __init__(
        self,
        estimate: Estimate,
        labels: list[str],
        stream: TextIO | None = None,
        interval_s: float = 10.0,
        start: float | None = None,
    ) -> None:
        # sys.stderr as it is now (None), not as it was at import: a replaced
        # stream (pytest's capture, a redirect) may since have been closed.
        stream = sys.stderr if stream is None else stream
        self.estimate, self.labels, self.stream = estimate, labels, stream
        self.tty = stream.isatty()
        self.interval_s = 0.2 if self.tty else interval_s
        self.start = time.monotonic() if start is None else start  # what elapsed counts from
        self.step = 0
        self.step_start = self.start
        self.last = 0.0
        self.max_time_s: float | None = None  # the current step's rounds' budget
        self._rounds: tuple[int, int, int, float, float] | None = None  # its last round, and when

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def _rest(self, now: float) -> float | None:
        """The seconds the current step's rounds still take, from what they told; None before."""
        if self._rounds is None:
            return None
        quiet, wanted, timed, seconds, at = self._rounds
        per = seconds / max(1, timed)
        rest = min(wanted - quiet, ROUND_BUDGET * wanted - timed) * per
        if self.max_time_s is not None:  # at least the rounds every step gets, and the one running
            rest = min(rest, max(self.max_time_s - seconds, (MIN_QUIET_ROUNDS - timed) * per) + per)
        return max(0.0, rest - (now - at))

    def _draw(self, detail: str = "", final: bool = False) -> None:
        now = time.monotonic()
        total = len(self.labels)
        label = self.labels[self.step] if self.step < total else "done"
        left = self.estimate.left(self.step, now - self.start, now - self.step_start, self._rest(now))
        budget = self.estimate.run_budget_s
        filled = int(20 * self.step / max(1, total))
        line = (
            f"[{'#' * filled}{'.' * (20 - filled)}] {self.step}/{total} {label}"
            + (f" {detail}" if detail else "")
            + f" · {_clock(now - self.start)} elapsed"
            + ("" if final else f", about {_clock(left)} left")
            + (f" (budget {_clock(budget)})" if budget is not None else "")
        )
        if self.tty:
            self.stream.write("\r\033[K" + line + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self.last = now

    def begin(self, index: int, max_time_s: float | None = None) -> None:
        self.step, self.step_start, self.max_time_s, self._rounds = index, time.monotonic(), max_time_s, None
        self._draw()

    def round(self, quiet: int, wanted: int, timed: int, seconds: float) -> None:
        """After each timed round (``harness.time_rounds``' ``on_round``)."""
        self._rounds = (quiet, wanted, timed, seconds, time.monotonic())
        if time.monotonic() - self.last >= self.interval_s:
            self._draw(f"(round {timed}: {quiet} of {wanted} quiet)")

    def end(self, record: dict[str, Any] | None = None) -> None:
        self.estimate.learn(self.step, time.monotonic() - self.step_start, record)
        if self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def close(self) -> None:
        self.step = len(self.labels)
        self._draw(final=True)


# ----------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------


def process_age() -> float:
    """Seconds since this process started (Linux's /proc; 0 elsewhere): a run's
    budget counts the interpreter's start and torch's import too."""
    try:
        with open("/proc/self/stat") as f:
            started = float(f.read().rsplit(")", 1)[1].split()[19])  # starttime, in ticks since boot
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, IndexError, ValueError):
        return 0.0
    return max(0.0, uptime - started / os.sysconf("SC_CLK_TCK"))


def _draw(run: dict[str, Any], out: Path, device: str) -> list[Path]:
    """The PNG of what the run has so far, or the one command that draws it."""
    from fastnorm.bench import plot

    try:
        return [plot.draw(run, out / f"{device}.png")]
    except ImportError:  # matplotlib comes with the bench extra
        print(
            "(no plot: matplotlib is not installed; pip install 'torch-fastnorm[bench]', then "
            f"python -m fastnorm.bench.plot {out / device}.json)"
        )
        return []


def main(args: argparse.Namespace) -> int:
    import torch

    from fastnorm.backends import cpp, requested
    from fastnorm.bench import distributed, goals, report, verdict
    from fastnorm.bench.contenders import by_prefix, default_wanted, for_workload
    from fastnorm.bench.harness import (
        MIN_TIMING_S,
        CorrectnessError,
        OutOfTime,
        measure_load,
        memory_needed,
        peak_memory_bytes,
        run_workload,
        too_big,
    )
    from fastnorm.bench.workloads import DTYPES, WORKLOADS

    def fail(message: str) -> int:
        print(f"fastnorm bench: error: {message}", file=sys.stderr)
        return 2

    if args.device == "cuda" and not torch.cuda.is_available():
        return fail("--device cuda, but torch sees no CUDA device")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    if args.list:
        return _list(device)
    if device.type == "cpu" and requested() == "auto" and cpp._C is None:
        # Timing the torch fallback would pass for fastnorm's numbers.
        return fail(f"the C++ kernels are not available: {cpp._IMPORT_ERROR}")
    if args.threads is not None:
        if args.threads < 1:
            return fail("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    default_run = not (args.quick or args.full or args.workloads)
    if args.quick:
        repeats, warmup, step_budget = QUICK_REPEATS, QUICK_WARMUP, None
    elif args.full:
        repeats, warmup, step_budget = FULL_REPEATS, FULL_WARMUP, FULL_STEP_BUDGET_S
    else:
        repeats, warmup, step_budget = DEFAULT_REPEATS, DEFAULT_WARMUP, STEP_BUDGET_S
    repeats = args.repeats if args.repeats is not None else repeats
    warmup = args.warmup if args.warmup is not None else warmup
    run_budget = args.budget if args.budget is not None else (RUN_BUDGET_S if default_run else None)
    if repeats < 1 or warmup < 0:
        return fail("--repeats must be >= 1 and --warmup >= 0")

    names = args.workloads or (_full_workloads(device) if args.full else _default_workloads(device))
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        return fail(f"unknown workload(s) {', '.join(unknown)}; known: {', '.join(WORKLOADS)}")
    for name in names:
        reasons = WORKLOADS[name].not_supported_reasons(device)
        if reasons:
            return fail("; ".join(reasons))
    bad = [d for d in args.dtypes or [] if d not in DTYPES]
    if bad or args.dtypes == []:
        return fail(f"unknown dtype(s) {', '.join(bad)}; known: {', '.join(DTYPES)}")

    if args.contenders:
        wanted = by_prefix(args.contenders)
    elif not default_run or device.type != "cpu":
        wanted = default_wanted(device)
    else:  # the default run: fewer contenders, so that it stays short
        wanted = lambda c: c.name in DEFAULT_CONTENDERS or c.only_listed  # noqa: E731
    steps: list[tuple[str, str, list[Any], dict[str, list[str]]]] = []
    for name in names:
        workload = WORKLOADS[name]
        chosen, skipped = for_workload(workload, device, wanted)
        if not any(c.group != "reference" for c in chosen):
            if args.contenders:
                continue  # none of the contenders asked for applies to this workload
            return fail(f"no contender runs {name} on {device.type}: {skipped}")
        for dtype in args.dtypes or workload.dtypes or ["fp32", "bf16"]:
            steps.append((name, dtype, chosen, skipped))
    if not steps:
        return fail(f"no contender matches {args.contenders} on {device.type}")

    settings = {
        "device": str(device),
        "workloads": names,
        "dtypes": args.dtypes,
        "full": args.full,
        "quick": args.quick,
        "repeats": repeats,
        "warmup": warmup,
        "budget_s": step_budget,
        "run_budget_s": run_budget,
        "contenders": sorted({c.name for _, _, chosen, _ in steps for c in chosen}),
    }
    command = " ".join(
        ["fastnorm bench", f"--device {device.type}"]
        + (["--full"] if args.full else [])
        + ([f"--workloads {','.join(names)}"] if args.workloads else [])
        + ([f"--dtypes {','.join(args.dtypes)}"] if args.dtypes else [])
        + ([f"--contenders {','.join(args.contenders)}"] if args.contenders else [])
        + (["--quick"] if args.quick else [])
        + [f"--repeats {repeats}", f"--warmup {warmup}", f"--threads {torch.get_num_threads()}"]
        + ([f"--budget {run_budget:g}"] if run_budget is not None else [])
    )
    run = report.new_run(device, settings, command)
    env = run["environment"]
    isa = f", C++ kernels {env['cpp_isa']}" if env.get("cpp_isa") else ""
    print(
        f"fastnorm {env['fastnorm']} ({env['backend']} backend{isa}), torch {env['torch']}, "
        f"on {env['device_name']}, {env['threads']} threads; {repeats} interleaved rounds after "
        f"{warmup} warm-up, medians. Results go to {args.out}/ after each workload.",
        flush=True,
    )
    load = measure_load(LOAD_LOOK_S)
    run["load_before"] = {
        "other_cores_busy": load.other_cores_busy,
        "processes": load.processes,
        "load_average": load.load_average,
        "message": load.message(),
    }
    print(load.message(), flush=True)
    costs = [step_cost(WORKLOADS[n], DTYPES[d], c, args.quick) for n, d, c, _ in steps]
    busy = load.other_cores_busy or 0.0
    estimate = Estimate(
        costs,
        repeats=repeats,
        warmup=warmup,
        min_time_s=0.0 if args.quick else MIN_TIMING_S,
        step_budget_s=step_budget,
        run_budget_s=run_budget,
        # this process's share of the cores while the others' work goes on
        slowdown=1.0 + busy / max(1, env["threads"]),
    )
    # The budget's clock started with the command: the interpreter, torch's import and the look at the load.
    started = time.monotonic() - process_age() if run_budget is not None else None
    progress = Progress(estimate, [f"{n} {d}" for n, d, _, _ in steps], start=started)
    first = progress.elapsed + estimate.left(0, progress.elapsed)
    limit = f"; its budget is {_clock(run_budget)}, from the command on" if run_budget is not None else ""
    what = f"{len(steps)} step{'s' * (len(steps) != 1)} (a workload in one dtype each)"
    sizes = [(memory_needed(WORKLOADS[n], DTYPES[d], args.quick), f"{n} {d}") for n, d, _, _ in steps]
    need, largest = max(sizes)
    now = peak_memory_bytes() or 0
    print(
        f"{what}: about {_clock(first)} in all{limit}. It holds up to about "
        f"{report.fmt_bytes(now + need)} of memory ({largest}'s arrays, {report.fmt_bytes(need)}, beside "
        f"the {report.fmt_bytes(now)} of torch and this process).\n",
        flush=True,
    )
    written: list[Path] = []
    try:
        for index, (name, dtype, chosen, skipped) in enumerate(steps):
            workload = WORKLOADS[name]
            max_time_s = estimate.step_budget(index, progress.elapsed)
            progress.begin(index, max_time_s)
            reason = too_big(workload, DTYPES[dtype], device, args.quick)
            if reason is None and not estimate.runs(index, progress.elapsed):
                left = max(0.0, run_budget - progress.elapsed)
                reason = (
                    f"the run's {_clock(run_budget)} budget has {_clock(left)} left, and this workload needs "
                    f"about {_clock(estimate.least(index))} at this machine's pace so far (--budget SECONDS, "
                    "or an idle machine, runs it)"
                )
            if reason is not None:
                progress.end()
                print(f"(skipped {name} {dtype}: {reason})\n", flush=True)
                run["skipped_workloads"].append({"workload": name, "dtype": dtype, "reason": reason})
                continue
            runner = distributed.run if workload.ranks > 1 else run_workload
            extra = {} if workload.ranks > 1 else {"max_time_s": max_time_s, "on_round": progress.round}
            if workload.ranks == 1 and run_budget is not None and run["workloads"]:
                extra["deadline"] = progress.start + run_budget
            try:
                record = runner(
                    workload,
                    dtype=DTYPES[dtype],
                    device=device,
                    contenders=chosen,
                    repeats=repeats,
                    warmup=warmup,
                    quick=args.quick,
                    min_time_s=0.0 if args.quick else MIN_TIMING_S,
                    skipped=skipped,
                    dtype_name=dtype,
                    **extra,
                )
            except OutOfTime as exc:
                progress.end()
                reason = f"{exc} (the run's budget is {_clock(run_budget)}; --budget SECONDS runs it)"
                print(f"(left out {name} {dtype}: {reason})\n", flush=True)
                run["skipped_workloads"].append({"workload": name, "dtype": dtype, "reason": reason})
                continue
            if run_budget is not None:
                record["rounds"]["run_budget_s"] = run_budget
            run["workloads"].append(record)
            run["goals"] = goals.evaluate(run)
            written = report.write(run, args.out, [record])
            progress.end(record)
    except CorrectnessError as exc:
        progress.end()
        print(f"fastnorm bench: correctness check failed, nothing reported: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        progress.end()
        done = len(run["workloads"])
        kept = f"kept in {args.out}/" if done else "nothing written"
        if done and not args.no_plot:
            kept += "; drew " + ", ".join(map(str, _draw(run, args.out, device.type)))
        print(
            f"\nfastnorm bench: interrupted after {done} of {len(steps)} workloads; {kept}", file=sys.stderr
        )
        return 130
    progress.close()
    run["seconds"] = round(progress.elapsed, 1)
    run["peak_memory_bytes"] = peak_memory_bytes()
    run["goals"] = goals.evaluate(run)
    written = report.write(run, args.out, [])

    print(verdict.verdict(run) + "\n")
    if run["skipped_workloads"]:
        names = ", ".join(f"{s['workload']} {s['dtype']}" for s in run["skipped_workloads"])
        print(f"Not run: {names} (the reason is under each one's name above).\n")
    if args.details:
        for record in run["workloads"]:
            print(report.table(record) + "\n")
        if run["goals"]:
            print(goals.summary(run["goals"]) + "\n")
    else:
        print(f"Every workload's table and every target: {args.out / device.type}.md, or --details.\n")
    if not args.no_plot and run["workloads"]:
        written += _draw(run, args.out, device.type)
    if written:
        print("wrote " + ", ".join(str(p) for p in written))
    return 0
