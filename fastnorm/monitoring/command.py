"""``fastnorm diagnose PATH``: reads a run's metrics, prints the diagnosis, draws it."""

from __future__ import annotations

import argparse
import json
import sys

from fastnorm.monitoring import plot
from fastnorm.monitoring.diagnosis import diagnose
from fastnorm.monitoring.series import read_series


def _run(args: argparse.Namespace) -> int:
    try:
        series = read_series(args.path, key=args.key)
    except (OSError, ValueError, ImportError) as exc:
        print(f"fastnorm diagnose: {exc}", file=sys.stderr)
        return 2
    diagnosis = diagnose(series.steps, series.values)
    max_norm = args.max_norm if args.max_norm is not None else series.max_norm
    if args.json:
        print(json.dumps({"source": series.source, "key": series.key, **diagnosis.to_dict()}, indent=2))
    else:
        print(f"{series.source}: {len(series.values)} values of '{series.key}'")
        print(diagnosis.report())
    if args.plot:
        plot.plot(series.steps, series.values, diagnosis, args.plot, max_norm=max_norm, title=args.title)
        if not args.json:
            print(f"plot: {args.plot}")
    return 1 if args.fail_on_unstable and diagnosis.unstable else 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Registers ``fastnorm diagnose``."""
    parser = subparsers.add_parser(
        "diagnose",
        help="diagnose a gradient-norm series: stable, exploding, vanishing or nonfinite",
        description="Reads the gradient norm from a metrics.jsonl, a Hugging Face trainer_state.json, "
        "TensorBoard event files, or a run folder holding one; prints the verdict, its events and "
        "the next actions.",
    )
    parser.add_argument("path", help="a metrics file or a run folder (its newest metrics file is read)")
    parser.add_argument(
        "--key", help="the metric or tag to read (default: gradient_norm, grad_norm, train/grad_norm, ...)"
    )
    parser.add_argument("--plot", metavar="PNG", help="draw the series and its events into this PNG")
    parser.add_argument("--title", help="the plot's title, before the verdict")
    parser.add_argument(
        "--max-norm", type=float, help="the clipping threshold to draw (default: from the file)"
    )
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    parser.add_argument(
        "--fail-on-unstable", action="store_true", help="exit with 1 when the verdict is not stable (for CI)"
    )
    parser.set_defaults(func=_run)
