"""Reads a gradient-norm series from the files trainers write.

* JSON lines (``metrics.jsonl``): fastnorm's :class:`~fastnorm.JsonlLogger`,
  and any trainer writing one object per line with the norm under one of
  :data:`KEYS` and the step under ``step``, ``global_step``, ``_step`` or
  ``trainer/global_step`` (the line's position otherwise).
* CSV with a header row (Lightning's ``CSVLogger`` writes ``metrics.csv``),
  read like JSON lines; empty cells are missing values.
* A Hugging Face ``trainer_state.json``: its ``log_history`` (``grad_norm``).
* TensorBoard event files (``events.out.tfevents.*``) with scalars under one
  of :data:`KEYS`, as ``SummaryWriter`` (torch, tensorboardX, Lightning,
  Hugging Face) writes them; needs the ``tensorboard`` package.

A folder stands for the newest such file in it (searched recursively); for
TensorBoard, for all the event files beside that one. Steps are sorted, and a
step logged twice (a resumed run) keeps its last value.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

KEY = "gradient_norm"  # what GradNormMonitor logs each step's norm as
KEYS = (KEY, "grad_norm", "train/grad_norm", "train/gradient_norm", "grad_2.0_norm_total")
STEP_KEYS = ("step", "global_step", "_step", "trainer/global_step")
MAX_NORM_KEY = f"{KEY}_max_norm"

_TFEVENTS = "events.out.tfevents"


@dataclass(frozen=True)
class Series:
    """A gradient-norm series and where it came from.

    Attributes:
        steps (tuple of int): sorted, each once.
        values (tuple of float): the norm at each step.
        key (str): the metric or tag it was read from.
        source (str): the file (or TensorBoard folder) read.
        max_norm (float, optional): the clipping threshold, when the file records it.
    """

    steps: tuple[int, ...]
    values: tuple[float, ...]
    key: str
    source: str
    max_norm: float | None = None


def read_series(path: str | os.PathLike, key: str | None = None) -> Series:
    """Reads the gradient-norm series of a metrics file or a run folder.

    Args:
        path (str or PathLike): a ``.jsonl`` or ``.csv`` file, a
            ``trainer_state.json``, a TensorBoard event file, or a folder
            holding any of them.
        key (str, optional): the metric or tag to read. Default: the first of
            :data:`KEYS` present.

    Returns:
        Series: the steps and values, sorted by step.

    Raises:
        FileNotFoundError: nothing readable at ``path``.
        ValueError: the file holds no gradient norm (the message lists what it holds).
    """
    path = Path(path)
    if path.is_dir():
        path = _newest(path)
    elif not path.exists():
        raise FileNotFoundError(f"no such file or folder: {path}")
    if _TFEVENTS in path.name:
        return _read_tensorboard(path.parent, key)
    if path.suffix == ".json":
        return _read_trainer_state(path, key)
    if path.suffix == ".csv":
        return _read_csv(path, key)
    return _read_jsonl(path, key)


def _newest(folder: Path) -> Path:
    found = [
        p
        for p in folder.rglob("*")
        if p.is_file()
        and (p.suffix in (".jsonl", ".csv") or p.name == "trainer_state.json" or _TFEVENTS in p.name)
    ]
    if not found:
        raise FileNotFoundError(
            f"no metrics file in {folder} (looked for *.jsonl, *.csv, trainer_state.json and {_TFEVENTS}.*)"
        )
    return max(found, key=lambda p: p.stat().st_mtime)


def _choose(key: str | None, present: Iterable[str], source: Path) -> str:
    present = set(present)
    if key is not None:
        if key in present:
            return key
    else:
        for candidate in KEYS:
            if candidate in present:
                return candidate
    missing = f"no {key!r}" if key is not None else "none of " + ", ".join(KEYS)
    raise ValueError(f"{source}: {missing}; it holds: {', '.join(sorted(present)) or 'nothing'}")


def _series(pairs: Iterable[tuple[int, float]], key: str, source: Path, max_norm: float | None) -> Series:
    by_step = dict(pairs)  # a repeated step keeps its last value
    steps = sorted(by_step)
    return Series(tuple(steps), tuple(by_step[s] for s in steps), key, str(source), max_norm)


def _from_records(records: list[dict], key: str | None, source: Path) -> Series:
    key = _choose(key, (k for r in records for k in r), source)
    pairs, max_norm = [], None
    for position, record in enumerate(records):
        if record.get(MAX_NORM_KEY) is not None:
            max_norm = float(record[MAX_NORM_KEY])
        value = record.get(key)
        if value is None:
            continue
        step = next((record[k] for k in STEP_KEYS if record.get(k) is not None), position)
        pairs.append((int(float(step)), float(value)))
    return _series(pairs, key, source, max_norm)


def _read_jsonl(path: Path, key: str | None) -> Series:
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
            if isinstance(record, dict):
                records.append(record)
    return _from_records(records, key, path)


def _read_csv(path: Path, key: str | None) -> Series:
    with open(path, newline="", encoding="utf-8") as f:
        records = [{k: v for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]
    return _from_records(records, key, path)


def _read_trainer_state(path: Path, key: str | None) -> Series:
    with open(path, encoding="utf-8") as f:
        state = json.load(f)
    if not isinstance(state, dict) or not isinstance(state.get("log_history"), list):
        raise ValueError(f"{path}: not a trainer_state.json (no 'log_history' list)")
    return _from_records([r for r in state["log_history"] if isinstance(r, dict)], key, path)


def _read_tensorboard(folder: Path, key: str | None) -> Series:
    try:
        from tensorboard.backend.event_processing import event_accumulator
    except ImportError as exc:
        raise ImportError(
            "reading TensorBoard files needs the 'tensorboard' package: pip install 'fastnorm[tensorboard]'"
        ) from exc
    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    tags = acc.Tags()[event_accumulator.SCALARS]
    key = _choose(key, tags, folder)
    max_norm = acc.Scalars(MAX_NORM_KEY)[-1].value if MAX_NORM_KEY in tags else None
    pairs = [(e.step, float(e.value)) for e in acc.Scalars(key)]
    return _series(pairs, key, folder, max_norm)
