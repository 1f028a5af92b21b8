"""``fastnorm bench``: check, time and report every contender on every workload."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

DEFAULT_REPEATS, QUICK_REPEATS = 15, 5
DEFAULT_WARMUP, QUICK_WARMUP = 2, 1


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark fastnorm against torch and the memory-bandwidth roofline",
        description=(
            "Checks every contender against a float64 reference, then times them interleaved "
            "on gradient lists shaped like real models, against a roofline measured in the same "
            "run. Prints a table; writes DEVICE.json, DEVICE.md, DEVICE.png and appends to "
            "results.csv under --out."
        ),
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when present, else cpu")
    parser.add_argument(
        "--workloads", type=_csv, help="comma list (default: the device's defaults; see --list)"
    )
    parser.add_argument(
        "--dtypes",
        type=_csv,
        default=["fp32", "bf16"],
        help="comma list of fp32, bf16, fp16, fp64 (default: fp32,bf16)",
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
        help=f"timed rounds, at least (default {DEFAULT_REPEATS}; {QUICK_REPEATS} with --quick); "
        "quick workloads get more, to fill a second",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        help=f"untimed rounds first (default {DEFAULT_WARMUP}; {QUICK_WARMUP} with --quick)",
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

    print(f"workloads (* = default on {device.type}):")
    for w in WORKLOADS.values():
        mark = "*" if device.type in w.default_on else " "
        print(f" {mark} {w.name:12s} {w.description} [{', '.join(w.devices)}]")
    print(f"contenders (* = default on {device.type}):")
    for c in CONTENDERS.values():
        mark = "*" if device.type in c.default_on else " "
        reasons = c.reasons(device)
        print(
            f" {mark} {c.name:32s} {c.kind:10s}" + (f" unavailable: {'; '.join(reasons)}" if reasons else "")
        )
    return 0


def main(args: argparse.Namespace) -> int:
    import torch

    from fastnorm.bench import distributed, goals, report
    from fastnorm.bench.contenders import select
    from fastnorm.bench.harness import MIN_TIMING_S, CorrectnessError, run_workload, too_big
    from fastnorm.bench.workloads import DTYPES, WORKLOADS, defaults

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
    if args.threads is not None:
        if args.threads < 1:
            return fail("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    repeats = args.repeats if args.repeats is not None else (QUICK_REPEATS if args.quick else DEFAULT_REPEATS)
    warmup = args.warmup if args.warmup is not None else (QUICK_WARMUP if args.quick else DEFAULT_WARMUP)
    if repeats < 1 or warmup < 0:
        return fail("--repeats must be >= 1 and --warmup >= 0")

    names = args.workloads or defaults(device)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        return fail(f"unknown workload(s) {', '.join(unknown)}; known: {', '.join(WORKLOADS)}")
    for name in names:
        reasons = WORKLOADS[name].not_supported_reasons(device)
        if reasons:
            return fail("; ".join(reasons))
    bad = [d for d in args.dtypes if d not in DTYPES]
    if bad or not args.dtypes:
        return fail(f"unknown dtype(s) {', '.join(bad)}; known: {', '.join(DTYPES)}")
    contenders, skipped = select(device, args.contenders)
    if not any(c.group != "reference" for c in contenders):
        return fail(f"no contender matches {args.contenders} on {device.type}")

    settings = {
        "device": str(device),
        "workloads": names,
        "dtypes": args.dtypes,
        "quick": args.quick,
        "repeats": repeats,
        "warmup": warmup,
        "contenders": [c.name for c in contenders],
    }
    command = " ".join(
        [
            "fastnorm bench",
            f"--device {device.type}",
            f"--workloads {','.join(names)}",
            f"--dtypes {','.join(args.dtypes)}",
        ]
        + ([f"--contenders {','.join(args.contenders)}"] if args.contenders else [])
        + (["--quick"] if args.quick else [])
        + [f"--repeats {repeats}", f"--warmup {warmup}", f"--threads {torch.get_num_threads()}"]
    )
    run = report.new_run(device, settings, command)
    env = run["environment"]
    print(
        f"fastnorm {env['fastnorm']} ({env['backend']} backend), torch {env['torch']}, "
        f"on {env['device_name']}, "
        f"{env['threads']} threads; {repeats} interleaved rounds after {warmup} warm-up, medians\n"
    )
    try:
        for name in names:
            for dtype in args.dtypes:
                reason = too_big(WORKLOADS[name], DTYPES[dtype], device, args.quick)
                if reason is not None:
                    print(f"(skipped {name} {dtype}: {reason})\n")
                    run["skipped_workloads"].append({"workload": name, "dtype": dtype, "reason": reason})
                    continue
                print(f"... {name} {dtype}", file=sys.stderr, flush=True)
                runner = distributed.run if WORKLOADS[name].ranks > 1 else run_workload
                record = runner(
                    WORKLOADS[name],
                    dtype=DTYPES[dtype],
                    device=device,
                    contenders=contenders,
                    repeats=repeats,
                    warmup=warmup,
                    quick=args.quick,
                    min_time_s=0.0 if args.quick else MIN_TIMING_S,
                    skipped=skipped,
                    dtype_name=dtype,
                )
                run["workloads"].append(record)
                print(report.table(record) + "\n", flush=True)
    except CorrectnessError as exc:
        print(f"fastnorm bench: correctness check failed, nothing reported: {exc}", file=sys.stderr)
        return 1

    run["goals"] = goals.evaluate(run)
    if run["goals"]:
        print(goals.summary(run["goals"]) + "\n")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / device.type
    report.write_json(run, stem.with_suffix(".json"))
    stem.with_suffix(".md").write_text(report.markdown(run))
    report.append_csv(run, args.out / "results.csv")
    written = [stem.with_suffix(".json"), stem.with_suffix(".md"), args.out / "results.csv"]
    if not args.no_plot:
        from fastnorm.bench import plot

        try:
            written.append(plot.draw(run, stem.with_suffix(".png")))
        except ImportError:  # pragma: no cover - matplotlib comes with the bench extra
            print("(no plot: matplotlib is not installed; pip install 'fastnorm[bench]')")
    print("wrote " + ", ".join(str(p) for p in written))
    return 0
