"""Where :class:`~fastnorm.GradNormMonitor` sends its numbers.

Every logger receives a :class:`Window` at each cadence: plain floats already on
the host, every step's norm under the key ``gradient_norm`` at its own step
(and the loss and skip flag given to ``update``, as ``gradient_norm_loss`` and
``gradient_norm_skipped``), and at the window's last step its statistics
(``gradient_norm_min``, ``_max``, ``_mean``, ``_nonfinite_steps``, with skip
flags given also ``_skipped_steps``, with ``max_norm`` known also
``_clipped_fraction`` and ``_max_norm``), plus per-layer norms
(``gradient_norm_layer/<name>``) when they were recorded, and what the monitor
was told of the run (``gradient_norm_lr``, ``_weight_decay``, ``_eps``, ``_beta1``,
``_beta2``, ``_momentum`` from the optimizer; ``gradient_norm_precision/<name>``). No key is a prefix
of another followed by ``/``: MLflow's file store keeps each metric in a file
named after its key, so ``gradient_norm`` and ``gradient_norm/min`` would clash.

A logger is a :class:`Logger` with ``log_metrics(metrics, step)``; the other
methods have defaults. A logger may raise: the monitor reports it once and
carries on with the others. Loggers of optional packages import them only when
built, and say which extra to install when they are missing.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from fastnorm.monitoring.diagnosis import Diagnosis
from fastnorm.monitoring.diagnosis.robust import mean_of_shares
from fastnorm.monitoring.diagnosis.skips import SPIKE_CODE
from fastnorm.monitoring.layer_stats import LayerWindow
from fastnorm.monitoring.series import KEY, LAYER_PREFIX, LOSS_KEY, LR_KEY, REWARD_KEY, SKIPPED_KEY


@dataclass(frozen=True)
class Window:
    """One cadence's worth of gradient norms, on the host.

    Attributes:
        steps (tuple of int): the step of each value.
        values (tuple of float): the gradient norm of each step.
        stats (dict): ``min``, ``max`` and ``mean`` over the finite values
            (NaN when there is none), ``nonfinite_steps``, with skip flags
            given ``skipped_steps`` (the steps the optimizer skipped) and, where
            a spike guard skipped some, ``spike_skipped_steps``, and with
            ``max_norm`` known ``clipped_fraction`` (the share of the applied
            steps, those not skipped, whose norm the clip scaled down) and
            ``max_norm``.
        layers (dict): per-layer norms by name, empty when none was recorded.
        layers_step (int, optional): the step the per-layer norms belong to.
        diagnosis (Diagnosis, optional): the diagnosis of the run so far.
        losses (tuple of float or None): the loss of each step, None where
            none was given; empty when no step of the window had one.
        skipped (tuple of bool or None): whether the optimizer skipped each
            step, None where no flag was given; empty when no step of the
            window had one.
        settings (dict): what the monitor knows of the run at the window's
            last step: the optimizer's ``lr``, ``weight_decay``, ``eps``,
            ``beta1``, ``beta2``, ``momentum`` (those it has) and
            ``precision/<name>`` (1.0); logged as ``gradient_norm_<name>``.
        lrs (dict): step -> the learning rate, at the steps where it changed
            (the first update's included); logged there as ``gradient_norm_lr``.
        spiked (tuple of bool): whether each step was skipped for a spike alone
            (:class:`~fastnorm.SpikeGuard`); empty when none was. Such a step
            is logged with ``gradient_norm_skipped`` 2.
        layer_window (LayerWindow, optional): each layer's gradient statistics
            over the window's steps that gave them (``GradNormMonitor.update(...,
            layer_stats=)``); None where none did. Its notable keys are in ``settings``.
        rewards (tuple of float or None): a reward-driven run's reward at each step, None where none
            was given; empty when no step of the window had one. Logged as ``gradient_norm_reward``.
    """

    steps: tuple[int, ...]
    values: tuple[float, ...]
    stats: dict[str, float]
    layers: dict[str, float] = field(default_factory=dict)
    layers_step: int | None = None
    diagnosis: Diagnosis | None = None
    losses: tuple[float | None, ...] = ()
    skipped: tuple[bool | None, ...] = ()
    settings: dict[str, float] = field(default_factory=dict)
    lrs: dict[int, float] = field(default_factory=dict)
    spiked: tuple[bool, ...] = ()
    layer_window: LayerWindow | None = None
    rewards: tuple[float | None, ...] = ()

    def metrics(self) -> Iterator[tuple[int, dict[str, float]]]:
        """``(step, metrics)`` in step order: each step's norm, the statistics
        at the last step, the per-layer norms at their own step."""
        last = len(self.steps) - 1
        for i, (step, value) in enumerate(zip(self.steps, self.values)):
            metrics = {KEY: value}
            if self.losses and self.losses[i] is not None:
                metrics[LOSS_KEY] = self.losses[i]
            if self.rewards and self.rewards[i] is not None:
                metrics[REWARD_KEY] = self.rewards[i]
            if self.skipped and self.skipped[i] is not None:
                spike = bool(self.spiked) and self.spiked[i]
                metrics[SKIPPED_KEY] = SPIKE_CODE if spike else float(self.skipped[i])
            if step in self.lrs:
                metrics[LR_KEY] = self.lrs[step]
            if step == self.layers_step:
                metrics.update({f"{LAYER_PREFIX}{name}": v for name, v in self.layers.items()})
            if i == last:
                metrics.update({f"{KEY}_{name}": v for name, v in self.stats.items()})
                metrics.update({f"{KEY}_{name}": v for name, v in self.settings.items()})
            yield step, metrics


def window_stats(
    values: list[float],
    max_norm: float | None,
    skipped: Sequence[bool | None] = (),
    spiked: Sequence[bool] = (),
) -> dict[str, float]:
    """The statistics of a window (see :class:`Window`).

    Args:
        values (list of float): the norm of each step.
        max_norm (float, optional): the clipping threshold, when known.
        skipped (sequence of bool or None): whether the optimizer skipped each
            step (None: no flag given); empty when no step had a flag.
        spiked (sequence of bool): whether each step was skipped for a spike
            alone; empty when none was.

    Returns:
        dict: name -> value, the names as :attr:`Window.stats` lists them.
    """
    finite = [v for v in values if math.isfinite(v)]
    stats = {
        "min": min(finite, default=math.nan),
        "max": max(finite, default=math.nan),
        # Each term divided first (a sum of norms near the float range would overflow); the shares' own
        # rounding can still pass the largest float, which mean_of_shares absorbs.
        "mean": mean_of_shares(finite) if finite else math.nan,
        "nonfinite_steps": float(len(values) - len(finite)),
    }
    if any(s is not None for s in skipped):
        stats["skipped_steps"] = float(sum(s is True for s in skipped))
    if any(spiked):
        stats["spike_skipped_steps"] = float(sum(spiked))
    if max_norm is not None:
        # A skipped step clipped nothing: it is left out, of the count and of the share.
        applied = [v for i, v in enumerate(values) if not (i < len(skipped) and skipped[i])]
        # The condition under which clip_'s coefficient max_norm / (norm + 1e-6) is below 1.
        clipped = sum(max_norm < v + 1e-6 for v in applied)
        stats["clipped_fraction"] = clipped / len(applied) if applied else 0.0
        stats["max_norm"] = float(max_norm)
    return stats


def _require(module: str, logger: str, extra: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{logger} needs the '{module.split('.')[0]}' package: pip install 'torch-fastnorm[{extra}]'"
        ) from exc


class Logger:
    """The interface of every logger: receives windows, flushes, closes."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def log_window(self, window: Window) -> None:
        """Logs every metric of ``window`` at its step, then flushes."""
        for step, metrics in window.metrics():
            self.log_metrics(metrics, step)
        self.flush()

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Logs ``metrics`` (name -> value) at ``step``."""
        raise NotImplementedError

    def flush(self) -> None:
        """Makes what was logged durable (called after each window)."""

    def close(self) -> None:
        """Flushes and releases what the logger opened."""
        self.flush()


class JsonlLogger(Logger):
    r"""Writes ``metrics.jsonl``: one JSON object per step, flushed at each cadence.

    Each line is ``{"step": 12, "gradient_norm": 0.53}``; the last step of a
    window also carries the window's statistics. Non-finite values are written
    as ``NaN`` and ``Infinity``, as Python's ``json`` module reads them.
    ``fastnorm diagnose`` reads these files.

    A new run never inherits an old one's values: the file is truncated by
    default. Append only to resume a run: the reader keeps the last value of a
    step logged twice, and a step sequence that starts over from the file's
    first step is read as a new run, which replaces the earlier one.

    Args:
        path (str or PathLike): the file; its folder is created.
        mode (str): ``"w"`` (default) starts the file afresh; ``"a"``
            appends, to continue a resumed run.
    """

    def __init__(self, path: str | os.PathLike, mode: str = "w") -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"JsonlLogger: path must be a str or PathLike, got {path!r}")
        if mode not in ("a", "w"):
            raise ValueError(f"JsonlLogger: mode must be 'w' or 'a', got {mode!r}")
        self.path = os.fspath(path)
        folder = os.path.dirname(self.path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        self._file: TextIO | None = open(self.path, mode, encoding="utf-8")

    def __repr__(self) -> str:
        return f"JsonlLogger({self.path!r})"

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self._file is None:
            raise RuntimeError(f"JsonlLogger: {self.path} is closed")
        self._file.write(json.dumps({"step": step, **metrics}) + "\n")

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            file.close()  # closed even when its last flush fails (and then raises)


class TensorBoardLogger(Logger):
    r"""Writes scalars through TensorBoard's ``SummaryWriter``.

    Args:
        log_dir (str, optional): where the event files go (``SummaryWriter``'s
            default when None). Ignored when ``writer`` is given.
        writer (SummaryWriter, optional): an open writer to log into; it is
            flushed but not closed, since its owner may still use it.

    Raises:
        ImportError: tensorboard is not installed (``pip install 'torch-fastnorm[tensorboard]'``).
    """

    def __init__(self, log_dir: str | None = None, *, writer: Any = None) -> None:
        if writer is None:
            _require("tensorboard", "TensorBoardLogger", "tensorboard")
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(log_dir=log_dir)
            self._owned = True
        else:
            self._owned = False
        self.writer = writer

    def __repr__(self) -> str:
        return f"TensorBoardLogger({getattr(self.writer, 'log_dir', None)!r})"

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        if self._owned:
            self.writer.close()
        else:
            self.writer.flush()


class MLflowLogger(Logger):
    r"""Logs to MLflow, one ``log_batch`` request per window.

    Args:
        run_id (str, optional): the run to log into. Default: the active run,
            or a new one started here (and ended by :meth:`close`).

    Raises:
        ImportError: mlflow is not installed (``pip install 'torch-fastnorm[mlflow]'``).
    """

    _BATCH = 1000  # MLflow's limit on metrics per log_batch request

    def __init__(self, run_id: str | None = None) -> None:
        self._mlflow = _require("mlflow", "MLflowLogger", "mlflow")
        self._ended_here = False
        if run_id is None:
            run = self._mlflow.active_run()
            if run is None:
                run = self._mlflow.start_run()
                self._ended_here = True
            run_id = run.info.run_id
        self.run_id = run_id
        self._client = self._mlflow.MlflowClient()

    def __repr__(self) -> str:
        return f"MLflowLogger({self.run_id!r})"

    def log_window(self, window: Window) -> None:
        batch = [m for step, metrics in window.metrics() for m in self._metrics(metrics, step)]
        for i in range(0, len(batch), self._BATCH):
            self._client.log_batch(self.run_id, metrics=batch[i : i + self._BATCH])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self._client.log_batch(self.run_id, metrics=self._metrics(metrics, step))

    @staticmethod
    def _metrics(metrics: dict[str, float], step: int) -> list:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        return [Metric(name, value, now, step) for name, value in metrics.items()]

    def close(self) -> None:
        if self._ended_here:
            self._mlflow.end_run()
            self._ended_here = False


class WandbLogger(Logger):
    r"""Logs to Weights & Biases.

    A window reaches W&B after its steps, so the metrics carry their own step
    axis, ``gradient_norm_step`` (declared with ``define_metric``, as
    Lightning's ``WandbLogger`` does with ``trainer/global_step``), rather than
    W&B's ``step=``, which must only grow. Do not pass ``step=`` to
    ``wandb.log`` elsewhere in the same run.

    Args:
        run (wandb Run, optional): the run to log into. Default: ``wandb.run``,
            or a new one from ``wandb.init()`` (finished by :meth:`close`).

    Raises:
        ImportError: wandb is not installed (``pip install 'torch-fastnorm[wandb]'``).
    """

    def __init__(self, run: Any = None) -> None:
        wandb = _require("wandb", "WandbLogger", "wandb")
        self._finish = False
        if run is None:
            run = wandb.run
            if run is None:
                run = wandb.init()
                self._finish = True
        self.run = run
        run.define_metric(f"{KEY}_step")
        run.define_metric(f"{KEY}*", step_metric=f"{KEY}_step")

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.run.log({**metrics, f"{KEY}_step": step})

    def close(self) -> None:
        if self._finish:
            self.run.finish()
            self._finish = False


class ConsoleLogger(Logger):
    r"""Prints one line per window: ``step 499: grad_norm=0.8123 (...)``.

    The line shows the last step's norm, the window's min, mean and max, the
    non-finite count, the steps the optimizer skipped when there are any, the
    clipped share when known, and the verdict when it is not stable.

    Args:
        stream (file, optional): where to print. Default: ``sys.stdout``.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream

    def log_window(self, window: Window) -> None:
        print(self.line(window), file=self.stream or sys.stdout, flush=True)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        value = metrics.get(KEY)
        if value is not None:
            print(f"step {step}: grad_norm={value:.4g}", file=self.stream or sys.stdout, flush=True)

    @staticmethod
    def line(window: Window) -> str:
        """The line printed for ``window``."""
        s = window.stats
        parts = [
            f"{len(window.values)} steps: min {s['min']:.4g}, mean {s['mean']:.4g}, max {s['max']:.4g}",
            f"{int(s['nonfinite_steps'])} non-finite",
        ]
        if s.get("skipped_steps"):
            spikes = int(s.get("spike_skipped_steps", 0))
            parts.append(f"{int(s['skipped_steps'])} skipped" + (f" ({spikes} for a spike)" if spikes else ""))
        if "clipped_fraction" in s:
            parts.append(f"{s['clipped_fraction']:.0%} clipped at {s['max_norm']:g}")
        text = f"step {window.steps[-1]}: grad_norm={window.values[-1]:.4g} ({'; '.join(parts)})"
        d = window.diagnosis
        if d is not None and d.unstable:
            first = next(e for e in d.events if e.kind == d.verdict)
            text += f" [{d.verdict} since step {first.start_step}]"
        return text
