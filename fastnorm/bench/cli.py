"""``fastnorm bench``: check, time and report every contender on every workload."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, TextIO

DEFAULT_REPEATS, FULL_REPEATS, QUICK_REPEATS = 7, 15, 5
DEFAULT_WARMUP, FULL_WARMUP, QUICK_WARMUP = 1, 2, 1
# Timed rounds of one workload stop after this long (once a few are done), so
# that a machine busy with other work cannot stretch a run without end.
DEFAULT_BUDGET_S, FULL_BUDGET_S = 15.0, 60.0
MIN_STEP_BUDGET_S = 2.0

# The default run: a subset that speaks to every target in under three minutes
# on 2 cores (the timed rounds share DEFAULT_RUN_BUDGET_S); --full runs every
# workload and contender.
DEFAULT_CPU = (
    "kernel-1t",
    "gpt2-small",
    "llama-300m",
    "many-small",
    "tiny",
    "tiny-groups-24",
    "step-gpt2-small",
)
DEFAULT_CONTENDERS = (
    "fastnorm.total_norm",
    "fastnorm.clip_/noop",
    "fastnorm.clip_/clips",
    "torch.get_total_norm",
    "torch.clip_grad_norm_/clips",
    "roofline.read/sum",
    "roofline.read/dot",
    "roofline.rw/mul_",
)
DEFAULT_RUN_BUDGET_S = 90.0


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark fastnorm against torch and the memory-bandwidth roofline",
        description=(
            "Checks every contender against a float64 reference, then times them interleaved "
            "on gradient lists shaped like real models, against a roofline measured in the same "
            "run; the step-* workloads time torch's fused AdamW step, clipping through it or by "
            "clip_ first, against the bare step. The default run is a representative subset "
            "(about two minutes on 2 cores); --full runs every workload. Prints a table per "
            "workload and writes DEVICE.json, DEVICE.md and results.csv under --out after each "
            "one (Ctrl-C keeps what is done), and DEVICE.png at the end."
        ),
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
        "--threads", type=int, help="torch.set_num_threads (fastnorm's CPU kernels use as many)"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("bench-results"), help="results folder (default: bench-results)"
    )
    parser.add_argument("--no-plot", action="store_true", help="do not draw the PNG")
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


class Progress:
    """One line on stderr, redrawn: done/total, the current workload and round,
    the time spent and an estimate of the time left.

    The estimate weighs each step by its bytes and contenders, rescaled by how
    long the finished steps took against their weight. Off a terminal, one
    line per step instead of a redrawn one.
    """

    def __init__(self, weights: list[float], stream: TextIO = sys.stderr) -> None:
        self.weights = weights
        self.stream = stream
        self.tty = stream.isatty()
        self.start = time.monotonic()
        self.done_weight = 0.0
        self.done_seconds = 0.0
        self.step = 0
        self.label = ""
        self.step_start = self.start
        self.last = 0.0

    def _left(self) -> float | None:
        if self.done_weight <= 0:
            return None
        rate = self.done_seconds / self.done_weight
        remaining = sum(self.weights[self.step :]) * rate
        return max(0.0, remaining - (time.monotonic() - self.step_start))

    def _draw(self, detail: str = "", final: bool = False) -> None:
        elapsed = time.monotonic() - self.start
        left = self._left()
        total = len(self.weights)
        width = 20
        filled = int(width * self.step / max(1, total))
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] {self.step}/{total} {self.label}"
            + (f" {detail}" if detail else "")
            + f" · {_clock(elapsed)} elapsed"
            + (f", about {_clock(left)} left" if left is not None else "")
        )
        if self.tty:
            self.stream.write("\r\033[K" + line + ("\n" if final else ""))
        elif not detail:
            self.stream.write(line + "\n")
        self.stream.flush()

    def begin(self, index: int, label: str) -> None:
        self.step, self.label, self.step_start = index, label, time.monotonic()
        self._draw()

    def round(self, done: int, wanted: int) -> None:
        now = time.monotonic()
        if self.tty and now - self.last > 0.2:
            self.last = now
            self._draw(f"(round {done}/{wanted})")

    def end(self) -> None:
        self.done_weight += self.weights[self.step]
        self.done_seconds += time.monotonic() - self.step_start
        if self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def close(self) -> None:
        self.step = len(self.weights)
        self.label = "done"
        self._draw(final=True)


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


def _weight(workload: Any, dtype: Any, contenders: int, repeats: int, quick: bool) -> float:
    """A step's expected cost in arbitrary units: the bytes a call moves (a floor
    for small ones, whose rounds are repeated to fill a second) times its
    contenders and rounds, and the bytes it prepares."""
    import torch

    nbytes = workload.numel(quick) * torch.empty((), dtype=dtype).element_size()
    return max(nbytes * workload.passes, 64e6) * contenders * (repeats + 2) + workload.copies * nbytes


def main(args: argparse.Namespace) -> int:
    import torch

    from fastnorm.backends import cpp, requested
    from fastnorm.bench import distributed, goals, report
    from fastnorm.bench.contenders import by_prefix, default_wanted, for_workload
    from fastnorm.bench.harness import MIN_TIMING_S, CorrectnessError, run_workload, too_big
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
    if args.quick:
        repeats, warmup, budget, run_budget = QUICK_REPEATS, QUICK_WARMUP, None, None
    elif args.full:
        repeats, warmup, budget, run_budget = FULL_REPEATS, FULL_WARMUP, FULL_BUDGET_S, None
    else:
        repeats, warmup, budget, run_budget = (
            DEFAULT_REPEATS,
            DEFAULT_WARMUP,
            DEFAULT_BUDGET_S,
            DEFAULT_RUN_BUDGET_S,
        )
    repeats = args.repeats if args.repeats is not None else repeats
    warmup = args.warmup if args.warmup is not None else warmup
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
    elif args.full or args.workloads or device.type != "cpu":
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
        "budget_s": budget,
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
    )
    run = report.new_run(device, settings, command)
    env = run["environment"]
    isa = f", C++ kernels {env['cpp_isa']}" if env.get("cpp_isa") else ""
    print(
        f"fastnorm {env['fastnorm']} ({env['backend']} backend{isa}), torch {env['torch']}, "
        f"on {env['device_name']}, {env['threads']} threads; {repeats} interleaved rounds after "
        f"{warmup} warm-up, medians. Results go to {args.out}/ after each workload.\n",
        flush=True,
    )
    progress = Progress(
        [_weight(WORKLOADS[n], DTYPES[d], len(c), repeats, args.quick) for n, d, c, _ in steps]
    )
    written: list[Path] = []
    try:
        for index, (name, dtype, chosen, skipped) in enumerate(steps):
            workload = WORKLOADS[name]
            progress.begin(index, f"{name} {dtype}")
            reason = too_big(workload, DTYPES[dtype], device, args.quick)
            if reason is not None:
                progress.end()
                print(f"(skipped {name} {dtype}: {reason})\n", flush=True)
                run["skipped_workloads"].append({"workload": name, "dtype": dtype, "reason": reason})
                continue
            runner = distributed.run if workload.ranks > 1 else run_workload
            step_budget = budget
            if run_budget is not None:  # this step's share of what is left of the run's budget
                left = max(0.0, run_budget - (time.monotonic() - progress.start))
                share = left * progress.weights[index] / sum(progress.weights[index:])
                step_budget = min(budget, max(MIN_STEP_BUDGET_S, share))
            extra = {} if workload.ranks > 1 else {"max_time_s": step_budget, "on_round": progress.round}
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
            progress.end()
            run["workloads"].append(record)
            print(report.table(record) + "\n", flush=True)
            run["goals"] = goals.evaluate(run)
            written = report.write(run, args.out, [record])
    except CorrectnessError as exc:
        progress.end()
        print(f"fastnorm bench: correctness check failed, nothing reported: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        progress.end()
        done = len(run["workloads"])
        where = f"kept in {args.out}/" if done else "nothing written"
        print(
            f"\nfastnorm bench: interrupted after {done} of {len(steps)} workloads; {where}", file=sys.stderr
        )
        return 130
    progress.close()
    run["goals"] = goals.evaluate(run)
    written = report.write(run, args.out, [])

    if run["goals"]:
        print(goals.summary(run["goals"]) + "\n")
    if not args.no_plot and not all(map(report.is_step, run["workloads"])):
        from fastnorm.bench import plot

        try:
            written.append(plot.draw(run, args.out / f"{device.type}.png"))
        except ImportError:  # pragma: no cover - matplotlib comes with the bench extra
            print("(no plot: matplotlib is not installed; pip install 'fastnorm[bench]')")
    if written:
        print("wrote " + ", ".join(str(p) for p in written))
    return 0
