"""The metric names the monitor logs, and reading a run's series back from the files trainers write.

* JSON lines (``metrics.jsonl``): fastnorm's :class:`~fastnorm.JsonlLogger`,
  and any trainer writing one object per line with the norm under one of
  :data:`KEYS` and the step under ``step``, ``global_step``, ``_step`` or
  ``trainer/global_step`` (the line's position otherwise).
* CSV with a header row (Lightning's ``CSVLogger`` writes ``metrics.csv``),
  read like JSON lines; empty cells are missing values. The header says the
  delimiter (a comma; else a semicolon or a tab); in a semicolon file, as a
  spreadsheet writes it where the comma is the decimal mark, ``1,5`` is 1.5.
* A Hugging Face ``trainer_state.json``: its ``log_history`` (``grad_norm``).
* TensorBoard event files (``events.out.tfevents.*``) with scalars under one
  of :data:`KEYS`, as ``SummaryWriter`` (torch, tensorboardX, Lightning,
  Hugging Face) writes them; needs the ``tensorboard`` package.

Beside the norm, the loss (:data:`LOSS_KEYS`), the learning rate
(:data:`LR_KEYS`, or Lightning's ``lr-<Optimizer>``), a loss scaler's scale
(:data:`SCALE_KEYS`), per-layer norms (``gradient_norm_layer/<name>``, or
Lightning's ``grad_2.0_norm/<name>``) and the optimizer's skip flags
(:data:`SKIPPED_KEY`), the optimizer's settings (:data:`OPTIMIZER_KEYS`) and the
run's precision (:data:`PRECISION_PREFIX`) are read when present.

The norm is the first of :data:`KEYS` present, else a name of the same
metric in another spelling (``train/grad_norm_before_clip``, ``grad-norm``,
``gradient_norm``: see :func:`norm_key`). Text files may start with a
byte-order mark (UTF-8, as Excel writes it, or UTF-16, as PowerShell does).

A file is read alone. A folder stands for its newest file that holds a
gradient norm (searched recursively; newer files without one are passed over);
for TensorBoard, for all the event files beside that one. Steps are sorted, and
a step logged twice (a resumed run) keeps its last value. A step sequence that
starts over from the file's first step is a new run: only the last run is read.

Values that the run's settings cannot hold (a step that is not a whole number,
a negative or NaN ``max_norm``, an unknown precision), and a CSV row with more
cells than its header, raise :class:`~fastnorm.checks.InputError` naming the
file: once, here, for every consumer of the series.
"""

from __future__ import annotations

import codecs
import csv
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastnorm import checks
from fastnorm.checks import InputError

KEY = "gradient_norm"  # what GradNormMonitor logs each step's norm as
LOSS_KEY = f"{KEY}_loss"  # the loss given to GradNormMonitor.update
SKIPPED_KEY = f"{KEY}_skipped"  # 1 (2: for a spike) where the optimizer skipped the step, 0 where applied
LAYER_PREFIX = f"{KEY}_layer/"  # per-layer norms: gradient_norm_layer/<name>
# Where it broke (fastnorm.Locator): gradient_norm_locate_nonfinite/<site>, ..._frames/<offset>/<site>.
LOCATE_PREFIX = f"{KEY}_locate_"
MAX_NORM_KEY = f"{KEY}_max_norm"
# What the monitor reads from the optimizer once per window (``GradNormMonitor(optimizer=)``), logged at
# the window's last step: the largest learning rate and weight decay over the parameter groups, the
# smallest eps, and the first group's betas (Adam) or momentum (SGD).
LR_KEY = f"{KEY}_lr"
OPTIMIZER_KEYS = {name: f"{KEY}_{name}" for name in ("weight_decay", "eps", "beta1", "beta2", "momentum")}
# The run's precision (``GradNormMonitor(precision=)``, or inferred): 1 under gradient_norm_precision/<name>.
PRECISION_PREFIX = f"{KEY}_precision/"

KEYS = (KEY, "grad_norm", "train/grad_norm", "train/gradient_norm", "grad_2.0_norm_total")
LOSS_KEYS = (
    LOSS_KEY,
    "loss",
    "train_loss",
    "train/loss",
    "train_loss_step",
    "train/loss_step",
    "training_loss",
    "train/train_loss",
)
LR_KEYS = (LR_KEY, "lr", "learning_rate", "train/learning_rate", "train/lr")
SCALE_KEYS = ("loss_scale", "train/loss_scale", "grad_scale", "scaler/scale", "amp_scale", "scale")
# A reward-driven run's mean reward (TRL's GRPO and PPO log "reward", the monitor "gradient_norm_reward");
# never a preference loss's rewards/chosen.
REWARD_KEY = f"{KEY}_reward"
REWARD_KEYS = (
    REWARD_KEY,
    "reward",
    "train/reward",
    "rewards/mean",
    "reward_mean",
    "mean_reward",
    "episode_reward",
    "train/episode_reward",
    "env/reward_mean",
)
STEP_KEYS = ("step", "global_step", "_step", "trainer/global_step")

_TFEVENTS = "events.out.tfevents"
_LIGHTNING_LAYER = re.compile(r"^grad_[0-9.]+(?:inf)?_norm/(.+)$")  # lightning.pytorch.utilities.grad_norm


class NoGradientNorm(InputError):
    """A metrics file that holds no gradient norm.

    Attributes:
        likeliest (str, optional): the metric it holds that is likeliest the norm under another name.
    """

    def __init__(self, message: str, likeliest: str | None = None) -> None:
        super().__init__(message)
        self.likeliest = likeliest


# Another spelling of the norm's name: a trainer's prefix, then grad or gradient, norm, and a word that
# says it is the norm before clipping (never after: a clipped norm is capped at max_norm).
_NORM_NAME = re.compile(
    r"(?:(?:train|training|trainer|optim|optimizer)[/_.-])*(?:total[_-]?)?grad(?:ient)?[_-]?norm"
    r"(?:[_-]?(?:total|before[_-]?clip(?:ping)?|pre[_-]?clip|unclipped))?",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Track:
    """Another metric of the run, by step.

    Attributes:
        key (str): the metric or tag it was read from.
        steps (tuple of int): sorted, each once.
        values (tuple): the value at each step (floats; anything that is not a number kept as written).
    """

    key: str
    steps: tuple[int, ...]
    values: tuple[Any, ...]

    def pair(self) -> tuple[tuple[int, ...], tuple[Any, ...]]:
        """``(steps, values)``, as :func:`~fastnorm.diagnose` takes it."""
        return self.steps, self.values


@dataclass(frozen=True)
class Series:
    """A gradient-norm series, the run's other signals, and where they came from.

    Attributes:
        steps (tuple of int): sorted, each once.
        values (tuple): the norm at each step (floats; anything that is not a
            number kept as written, for the diagnosis to report).
        key (str): the metric or tag it was read from.
        source (str): the file (or TensorBoard folder) read.
        max_norm (float, optional): the clipping threshold, when the file records it.
        loss (Track, optional): the training loss.
        lr (Track, optional): the learning rate.
        scale (Track, optional): a loss scaler's scale.
        reward (Track, optional): a reward-driven run's mean reward.
        skipped (Track, optional): whether the optimizer skipped each step (1) or applied it (0).
        layers (dict): step -> {layer name: norm}, where per-layer norms were logged.
        runs (int): how many runs the file holds (a step sequence that starts
            over begins a new one); only the last is read.
        optimizer (dict): name -> Track of the optimizer's settings logged
            (``weight_decay``, ``eps``, ``beta1``, ``beta2``, ``momentum``).
        precision (str, optional): the run's precision, when logged.
        columns (tuple of str): every metric the file holds, by name (they say what the loss is: a
            ``reward`` beside it, a discriminator's loss).
        located (dict): step -> {key: value} of the locator's findings
            (``locate_nonfinite/<site>``, ...), where they were logged.
    """

    steps: tuple[int, ...]
    values: tuple[Any, ...]
    key: str
    source: str
    max_norm: float | None = None
    loss: Track | None = None
    lr: Track | None = None
    scale: Track | None = None
    reward: Track | None = None
    skipped: Track | None = None
    layers: dict[int, dict[str, Any]] = field(default_factory=dict)
    runs: int = 1
    optimizer: dict[str, Track] = field(default_factory=dict)
    precision: str | None = None
    columns: tuple[str, ...] = ()
    located: dict[int, dict[str, Any]] = field(default_factory=dict)


def read_series(path: str | os.PathLike, key: str | None = None) -> Series:
    """Reads the gradient-norm series (and the loss, learning rate, ...) of a metrics file or run folder.

    Args:
        path (str or PathLike): a ``.jsonl`` or ``.csv`` file, a
            ``trainer_state.json``, a TensorBoard event file, or a folder
            holding any of them (its newest file that holds a gradient norm is read).
        key (str, optional): the metric or tag to read as the norm. Default:
            the first of :data:`KEYS` present.

    Returns:
        Series: the steps and values, sorted by step, with the other signals found.

    Raises:
        FileNotFoundError: nothing readable at ``path``.
        ValueError: the file (or every file in the folder) holds no gradient norm (the message says
            what they hold), or is malformed.
    """
    path = Path(path)
    if path.is_dir():
        return _search(path, key)
    if not path.exists():
        raise FileNotFoundError(f"no such file or folder: {path}")
    return _read(path, key)


def _read(path: Path, key: str | None) -> Series:
    if _TFEVENTS in path.name:
        return _read_tensorboard(path, key)
    if path.suffix == ".json":
        return _read_trainer_state(path, key)
    if path.suffix == ".csv":
        return _read_csv(path, key)
    return _read_jsonl(path, key)


def _search(folder: Path, key: str | None) -> Series:
    """The newest metrics file in ``folder`` that holds a gradient norm."""
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
    passed: list[str] = []
    tensorboard_read: set[Path] = set()
    for path in sorted(found, key=lambda p: p.stat().st_mtime, reverse=True):
        if _TFEVENTS in path.name:
            if path.parent in tensorboard_read:
                continue
            tensorboard_read.add(path.parent)
        try:
            # In a folder, an event file stands for all the event files beside it (one run's).
            return _read_tensorboard(path.parent, key) if _TFEVENTS in path.name else _read(path, key)
        except (NoGradientNorm, ImportError) as exc:
            passed.append(f"  {path}: {exc}")
    raise NoGradientNorm(f"no file in {folder} holds a gradient norm:\n" + "\n".join(passed))


def norm_key(present: Iterable[str]) -> str | None:
    """The name among ``present`` that is the gradient norm: the first of :data:`KEYS`, else the
    shortest in another spelling of it (a prefix such as ``train/``, ``gradient`` or ``grad``, ``_`` or
    ``-``, a suffix such as ``_before_clip``); None when there is none."""
    present = set(present)
    found = next((k for k in KEYS if k in present), None)
    if found is None:
        spelled = [k for k in present if _NORM_NAME.fullmatch(k)]
        found = min(spelled, key=lambda k: (len(k), k), default=None)
    return found


def _likeliest(present: set[str]) -> str | None:
    """The name likeliest the norm among names that :func:`norm_key` does not know: one that says
    norm, the more so with grad; None when no name says norm or grad."""

    def score(name: str) -> int:
        low = name.lower()
        return 2 * ("norm" in low) + ("grad" in low) - low.startswith(("eval", "val", "test"))

    best = max(sorted(present), key=score, default=None)
    return best if best is not None and score(best) > 0 else None


def _choose(key: str | None, present: Iterable[str], source: Path) -> str:
    present = set(present)
    if key is not None:
        if key in present:
            return key
    else:
        found = norm_key(present)
        if found is not None:
            return found
    missing = f"no {key!r}" if key is not None else f"none of {', '.join(KEYS)} (nor another spelling)"
    raise NoGradientNorm(
        f"{source}: {missing}; it holds: {', '.join(sorted(present)) or 'nothing'}", _likeliest(present)
    )


def _first(candidates: Iterable[str], present: dict[str, None], prefix: str | None = None) -> str | None:
    found = next((k for k in candidates if k in present), None)
    if found is None and prefix is not None:
        found = next((k for k in present if k.startswith(prefix)), None)
    return found


def _value(raw: Any) -> Any:
    """A float where the text is a number (``"nan"`` and ``"inf"`` too); anything else as written."""
    if isinstance(raw, bool):
        return raw  # JSON true/false: not a number
    try:
        return float(raw)
    except (TypeError, ValueError):
        return raw


def _step_of(record: dict, source: Path) -> int | None:
    """The record's step: None where none is logged; InputError for one that is not a whole number."""
    name = next((k for k in STEP_KEYS if record.get(k) is not None), None)
    if name is None:
        return None
    value = _value(record[name])
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and abs(value) < 2**63 and value == int(value)):  # NaN and inf are not < 2**63
        raise InputError(
            f"{source}: the step {record[name]!r} (under '{name}') is not a whole number below 2**63"
        )
    return int(value)


def _last_run(records: list[dict], source: Path) -> tuple[list[dict], int]:
    """The records of the last run, and how many runs there were: a run starts over when the
    step goes back to (or before) the file's first step after having gone past it."""
    first, beyond, start, runs = None, False, 0, 1
    for i, record in enumerate(records):
        step = _step_of(record, source)
        if step is None:
            continue
        if first is None:
            first = step
        elif step > first:
            beyond = True
        elif beyond:
            first, beyond, start, runs = step, False, i, runs + 1
    return records[start:], runs


def _by_step(pairs: Iterable[tuple[int, Any]]) -> tuple[tuple[int, ...], tuple[Any, ...]]:
    by_step = dict(pairs)  # a repeated step keeps its last value
    steps = sorted(by_step)
    return tuple(steps), tuple(by_step[s] for s in steps)


def _from_records(records: list[dict], key: str | None, source: Path) -> Series:
    key = _choose(key, (k for r in records for k in r), source)
    records, runs = _last_run(records, source)
    present = dict.fromkeys(k for r in records for k in r)  # a set, in the order first seen
    tracks = {
        "loss": _first(LOSS_KEYS, present),
        "lr": _first(LR_KEYS, present, prefix="lr-"),
        "scale": _first(SCALE_KEYS, present),
        "reward": _first(REWARD_KEYS, present),
        "skipped": SKIPPED_KEY if SKIPPED_KEY in present else None,
    }
    settings = {name: k for name, k in OPTIMIZER_KEYS.items() if k in present}
    precisions = [k[len(PRECISION_PREFIX) :] for k in present if k.startswith(PRECISION_PREFIX)]
    if precisions:
        _check_precision(precisions[-1], source)
    layer_keys = {k: k[len(LAYER_PREFIX) :] for k in present if k.startswith(LAYER_PREFIX)}
    if not layer_keys:
        layer_keys = {k: m.group(1) for k in present if (m := _LIGHTNING_LAYER.match(k))}
    norm: list[tuple[int, Any]] = []
    other: dict[str, list[tuple[int, Any]]] = {name: [] for name in [*tracks, *settings]}
    layers: dict[int, dict[str, Any]] = {}
    located: dict[int, dict[str, Any]] = {}
    max_norm = None
    for position, record in enumerate(records):
        step = _step_of(record, source)
        step = position if step is None else step
        if record.get(MAX_NORM_KEY) is not None:
            max_norm = _max_norm(record[MAX_NORM_KEY], source, step)
        if record.get(key) is not None:
            norm.append((step, _value(record[key])))
        for name, track_key in [*tracks.items(), *settings.items()]:
            if track_key is not None and record.get(track_key) is not None:
                other[name].append((step, _value(record[track_key])))
        for layer_key, name in layer_keys.items():
            if record.get(layer_key) is not None:
                layers.setdefault(step, {})[name] = _value(record[layer_key])
        for k, v in record.items():
            if k.startswith(LOCATE_PREFIX) and v is not None:
                located.setdefault(step, {})[k[len(KEY) + 1 :]] = _value(v)
    steps, values = _by_step(norm)
    keys = {**tracks, **settings}
    found = {name: Track(keys[name], *_by_step(pairs)) if pairs else None for name, pairs in other.items()}
    optimizer = {name: found.pop(name) for name in settings if found[name] is not None}
    for name in settings:
        found.pop(name, None)
    return Series(
        steps,
        values,
        key,
        str(source),
        max_norm,
        layers=layers,
        runs=runs,
        optimizer=optimizer,
        precision=precisions[-1] if precisions else None,
        columns=tuple(present),
        located=located,
        **found,
    )


def _max_norm(raw: Any, source: Path, step: int) -> float:
    try:
        return checks.max_norm(_value(raw), MAX_NORM_KEY)  # type: ignore[return-value]
    except (TypeError, ValueError) as exc:
        raise InputError(f"{source}: at step {step}: {exc}") from None


def _check_precision(name: str, source: Path) -> None:
    try:
        checks.precision(name, f"{PRECISION_PREFIX}{name}")
    except ValueError as exc:
        raise InputError(f"{source}: {exc}") from None


def _encoding(path: Path) -> str:
    """The file's text encoding: UTF-16 after its byte-order mark, else UTF-8 (a mark, as Excel writes
    it, dropped: read as part of the first name, it would hide the ``step`` column)."""
    with open(path, "rb") as f:
        start = f.read(2)
    return "utf-16" if start in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE) else "utf-8-sig"


def _read_jsonl(path: Path, key: str | None) -> Series:
    records = []
    with open(path, encoding=_encoding(path)) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{number}: not JSON ({exc.msg})") from None
            if isinstance(record, dict):
                records.append(record)
    return _from_records(records, key, path)


# A number with a decimal comma, in a file whose cells a semicolon separates.
_DECIMAL_COMMA = re.compile(r"[+-]?[0-9]*,[0-9]+(?:[eE][+-]?[0-9]+)?")


def _decimal_point(cell: str | None) -> str | None:
    return cell.replace(",", ".") if cell and _DECIMAL_COMMA.fullmatch(cell) else cell


def _read_csv(path: Path, key: str | None) -> Series:
    with open(path, newline="", encoding=_encoding(path)) as f:
        header = f.readline()
        delimiter = next((d for d in ",;\t" if d in header), ",")
        f.seek(0)
        reader = csv.DictReader(f, delimiter=delimiter)
        records = []
        for row in reader:
            if None in row:  # csv's key for the cells beyond the header's
                named = len(reader.fieldnames or ())
                raise InputError(
                    f"{path}: line {reader.line_num} has {named + len(row[None])} cells, its header {named}"
                )
            if delimiter == ";":
                row = {k: _decimal_point(v) for k, v in row.items()}
            records.append({k: v for k, v in row.items() if v not in ("", None)})
    return _from_records(records, key, path)


def _read_trainer_state(path: Path, key: str | None) -> Series:
    with open(path, encoding=_encoding(path)) as f:
        state = json.load(f)
    if not isinstance(state, dict) or not isinstance(state.get("log_history"), list):
        raise NoGradientNorm(f"{path}: not a trainer_state.json (no 'log_history' list)")
    history = [r for r in state["log_history"] if isinstance(r, dict)]
    # The last record of a finished run holds the run's average train_loss: not a step's loss.
    history = [r for r in history if "train_runtime" not in r]
    return _from_records(history, key, path)


def _read_tensorboard(path: Path, key: str | None) -> Series:
    """The scalars of one event file, or of every event file in a folder."""
    try:
        from tensorboard.backend.event_processing import event_accumulator
    except ImportError as exc:
        raise ImportError(
            "reading TensorBoard files needs the 'tensorboard' package: "
            "pip install 'torch-fastnorm[tensorboard]'"
        ) from exc
    acc = event_accumulator.EventAccumulator(str(path), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    tags = acc.Tags()[event_accumulator.SCALARS]
    key = _choose(key, tags, path)
    records: dict[int, dict] = {}
    wanted = {key, MAX_NORM_KEY, SKIPPED_KEY, *LOSS_KEYS, *LR_KEYS, *SCALE_KEYS, *OPTIMIZER_KEYS.values()}
    for tag in tags:
        prefixes = ("lr-", LAYER_PREFIX, PRECISION_PREFIX)
        if tag in wanted or tag.startswith(prefixes) or _LIGHTNING_LAYER.match(tag):
            for e in acc.Scalars(tag):
                records.setdefault(e.step, {"step": e.step})[tag] = float(e.value)
    return _from_records([records[s] for s in sorted(records)], key, path)
