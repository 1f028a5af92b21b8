"""``fastnorm diagnose PATH``: reads a run's metrics, prints the diagnosis, draws it."""

from __future__ import annotations

import argparse
import json
import sys

from fastnorm.monitoring import plot
from fastnorm.monitoring.diagnosis import Diagnosis, diagnose
from fastnorm.monitoring.series import Series, read_series


def diagnose_series(series: Series, max_norm: float | None = None) -> Diagnosis:
    """Diagnoses what :func:`~fastnorm.read_series` read: the norm with every other signal found.

    Args:
        series (Series): the run.
        max_norm (float, optional): the clipping threshold; default: the one the file records.

    Returns:
        Diagnosis: as :func:`~fastnorm.diagnose`.
    """
    return diagnose(
        series.steps,
        series.values,
        loss=series.loss.pair() if series.loss else None,
        lr=series.lr.pair() if series.lr else None,
        scale=series.scale.pair() if series.scale else None,
        layers=series.layers,
        skipped=series.skipped.pair() if series.skipped else None,
        optimizer={name: track.pair() for name, track in series.optimizer.items()},
        precision=series.precision,
        max_norm=max_norm if max_norm is not None else series.max_norm,
    )


def _read(series: Series) -> str:
    """What was read, for the first line of the report."""
    text = f"{series.source}: {len(series.values)} values of '{series.key}'"
    tracks = (series.loss, series.lr, series.scale, series.skipped)
    others = [f"'{t.key}'" for t in tracks if t is not None]
    if series.layers:
        others.append(f"per-layer norms at {len(series.layers)} steps")
    if others:
        text += ", with " + ", ".join(others)
    if series.runs > 1:
        text += f" (the last of {series.runs} runs in the file: its steps started over)"
    return text


def _run(args: argparse.Namespace) -> int:
    try:
        series = read_series(args.path, key=args.key)
    except (OSError, ValueError, ImportError) as exc:
        print(f"fastnorm diagnose: {exc}", file=sys.stderr)
        return 2
    diagnosis = diagnose_series(series, args.max_norm)
    max_norm = args.max_norm if args.max_norm is not None else series.max_norm
    if args.json:
        out = {"source": series.source, "key": series.key, "runs": series.runs, **diagnosis.to_dict()}
        print(json.dumps(out, indent=2))
    else:
        print(_read(series))
        print(diagnosis.report())
    if args.plot:
        plot.plot(
            series.steps,
            series.values,
            diagnosis,
            args.plot,
            max_norm=max_norm,
            title=args.title,
            loss=series.loss.pair() if series.loss else None,
        )
        if not args.json:
            print(f"plot: {args.plot}")
    return 1 if args.fail_on_unstable and diagnosis.unstable else 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Registers ``fastnorm diagnose``."""
    parser = subparsers.add_parser(
        "diagnose",
        help="diagnose a run's gradient norm (and loss): stable, or what went wrong and what to do",
        description="Reads the gradient norm, and the loss, learning rate, loss scale, per-layer norms and "
        "the optimizer's skip flags where logged, from a metrics.jsonl or .csv, a Hugging Face "
        "trainer_state.json, TensorBoard event files, or a run folder holding one; prints the verdict, "
        "each event and its actions.",
    )
    parser.add_argument(
        "path", help="a metrics file or a run folder (its newest file holding a gradient norm is read)"
    )
    parser.add_argument(
        "--key", help="the metric or tag to read (default: gradient_norm, grad_norm, train/grad_norm, ...)"
    )
    parser.add_argument("--plot", metavar="PNG", help="draw the series and its events into this PNG")
    parser.add_argument("--title", help="the plot's title, before the verdict")
    parser.add_argument(
        "--max-norm", type=float, help="the run's clipping threshold (default: from the file)"
    )
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    parser.add_argument(
        "--fail-on-unstable", action="store_true", help="exit with 1 when the verdict is not stable (for CI)"
    )
    parser.set_defaults(func=_run)
