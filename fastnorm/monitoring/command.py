"""``fastnorm diagnose PATH``: reads a run's metrics, prints the diagnosis, draws it.

Exit codes: 0 for a diagnosis (whatever its verdict, unless
``--fail-on-unstable``), 1 only for a verdict that is not stable under
``--fail-on-unstable``, 2 for anything that is not a diagnosis: a path that
cannot be read, a file that is empty, not text or holds no gradient norm, norms
that are mostly not numbers, a value logged out of range, a bad argument, a
``--plot`` file that cannot be written. Each error is one line on stderr that
names the file or the argument (:mod:`fastnorm.cli` prints it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from fastnorm.checks import InputError, number_argument
from fastnorm.monitoring import plot
from fastnorm.monitoring.diagnosis import Diagnosis, diagnose
from fastnorm.monitoring.series import NoGradientNorm, Series, read_series

PROG = "fastnorm diagnose"


def diagnose_series(series: Series, max_norm: float | None = None, objective: str | None = None) -> Diagnosis:
    """Diagnoses what :func:`~fastnorm.read_series` read: the norm with every other signal found.

    Args:
        series (Series): the run.
        max_norm (float, optional): the clipping threshold; default: the one the file records.
        objective (str, optional): what the loss is (see :class:`~fastnorm.Diagnoser`); default: read
            from the file's metrics and its loss.

    Returns:
        Diagnosis: as :func:`~fastnorm.diagnose`.
    """
    return diagnose(
        series.steps,
        series.values,
        loss=series.loss.pair() if series.loss else None,
        lr=series.lr.pair() if series.lr else None,
        scale=series.scale.pair() if series.scale else None,
        reward=series.reward.pair() if series.reward else None,
        layers=series.layers,
        skipped=series.skipped.pair() if series.skipped else None,
        optimizer={name: track.pair() for name, track in series.optimizer.items()},
        precision=series.precision,
        max_norm=max_norm if max_norm is not None else series.max_norm,
        objective=objective,
        keys=series.columns,
        located=series.located,
    )


def _read(series: Series) -> str:
    """What was read, for the first line of the report."""
    text = f"{series.source}: {len(series.values)} values of '{series.key}'"
    tracks = (series.loss, series.lr, series.scale, series.reward, series.skipped)
    others = [f"'{t.key}'" for t in tracks if t is not None]
    if series.layers:
        others.append(f"per-layer norms at {len(series.layers)} steps")
    if others:
        text += ", with " + ", ".join(others)
    if series.runs > 1:
        text += f" (the last of {series.runs} runs in the file: its steps started over)"
    return text


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_plot(path: str) -> None:
    """Raises InputError unless a picture can be written at ``path``, before anything is read."""
    target = Path(path)
    folder = target.parent
    if folder.exists() and not folder.is_dir():
        raise InputError(f"--plot {path}: {folder} is a file, not a folder")
    if not folder.is_dir():
        raise InputError(f"--plot {path}: there is no folder {folder}")
    if target.is_dir():
        raise InputError(f"--plot {path}: is a folder, not a file")
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise InputError(f"--plot {path}: cannot write there (permission denied)")
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise InputError(f"--plot {path}: drawing needs matplotlib: pip install matplotlib") from None
    kinds = FigureCanvasBase.get_supported_filetypes()
    if target.suffix.lstrip(".").lower() not in kinds:
        raise InputError(
            f"--plot {path}: not a picture file name (.png, or one of {', '.join(sorted(kinds))})"
        )


def _load(path: str, key: str | None) -> Series:
    """The series at ``path``, or InputError saying why there is none."""
    source = Path(path)
    try:
        if source.is_file() and source.stat().st_size < 1 << 16 and not source.read_bytes().strip():
            raise InputError(f"{path}: the file is empty")
        series = read_series(path, key=key)
    except UnicodeDecodeError as exc:
        where = "the file" if source.is_file() else "a metrics file in this folder"
        raise InputError(
            f"{path}: {where} is not text (byte {exc.object[exc.start]:#04x} at offset {exc.start} "
            "is not UTF-8)"
        ) from None
    except NoGradientNorm as exc:
        hint = f"--key '{exc.likeliest}'" if exc.likeliest else "--key NAME"
        raise InputError(f"{exc}; to read one of them as the gradient norm: {hint}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not JSON ({exc.msg}, line {exc.lineno} column {exc.colno})") from None
    except (OSError, ValueError, ImportError) as exc:
        if isinstance(exc, OSError) and exc.filename and exc.strerror:
            message = f"{exc.filename}: {exc.strerror}"
        else:
            message = str(exc)
        named = path in message or str(source) in message
        raise InputError(message if named else f"{path}: {message}") from None
    return series


def _check_values(series: Series) -> None:
    """No norm, or mostly not numbers: InputError. Some not numbers: a warning on stderr."""
    where = f"{series.source}: "
    if not series.values:
        raise InputError(f"{where}no value of '{series.key}' (every one is empty)")
    bad = [(step, value) for step, value in zip(series.steps, series.values) if not _is_number(value)]
    if not bad:
        return
    step, value = bad[0]
    verb = "is not a number" if len(bad) == 1 else "are not numbers"
    what = f"{len(bad)} of {len(series.values)} values of '{series.key}' {verb}"
    what += f" (the first, at step {step}: {value!r})"
    if 2 * len(bad) > len(series.values):
        raise InputError(f"{where}{what}: this is not a log of gradient norms")
    print(f"{PROG}: warning: {where}{what}; the diagnosis leaves them out", file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    if args.plot:
        _check_plot(args.plot)
    series = _load(args.path, args.key)
    _check_values(series)
    diagnosis = diagnose_series(series, args.max_norm, args.objective)
    max_norm = args.max_norm if args.max_norm is not None else series.max_norm
    if args.json:
        out = {"source": series.source, "key": series.key, "runs": series.runs, **diagnosis.to_dict()}
        print(json.dumps(out, indent=2))
    else:
        print(_read(series))
        print(diagnosis.report())
    if args.plot:
        try:
            plot.plot(
                series.steps,
                series.values,
                diagnosis,
                args.plot,
                max_norm=max_norm,
                title=args.title,
                loss=series.loss.pair() if series.loss else None,
            )
        except (OSError, ValueError) as exc:
            print(f"{PROG}: error: --plot {args.plot}: {exc}", file=sys.stderr)
            return 2
        if not args.json:
            print(f"plot: {args.plot}")
    return 1 if args.fail_on_unstable and diagnosis.unstable else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declares the arguments of ``fastnorm diagnose``."""
    parser.description = (
        "Reads the gradient norm, and the loss, learning rate, loss scale, per-layer norms and the "
        "optimizer's skip flags where logged, from a metrics.jsonl or .csv, a Hugging Face "
        "trainer_state.json, TensorBoard event files, or a run folder holding one; prints the verdict, "
        "each event and its actions. Exit code 0 for a diagnosis, 1 for a verdict that is not stable "
        "with --fail-on-unstable, 2 when there is nothing to diagnose (a file that cannot be read, is "
        "empty, holds no gradient norm or mostly norms that are not numbers; a --plot file that "
        "cannot be written)."
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
        "--max-norm",
        type=number_argument(0, finite=False),
        help="the run's clipping threshold, >= 0 (default: from the file)",
    )
    parser.add_argument(
        "--objective",
        choices=("minimise", "adversarial", "reinforcement", "contrastive"),
        help="what the loss is (default: read from the file: a reward or a discriminator's loss logged, "
        "a loss that goes negative; else a loss to minimise)",
    )
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    parser.add_argument(
        "--fail-on-unstable", action="store_true", help="exit with 1 when the verdict is not stable (for CI)"
    )
    parser.set_defaults(func=_run)
