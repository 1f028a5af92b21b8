"""Lightning: clip with fastnorm and log every step's norm through the trainer's loggers.

Needs Lightning (``pip install 'torch-fastnorm[lightning]'``); ``import fastnorm``
never imports this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

try:
    from lightning.pytorch.callbacks import Callback
except ImportError as exc:
    raise ImportError(
        "fastnorm.integrations.lightning needs Lightning: pip install 'torch-fastnorm[lightning]'"
    ) from exc

from fastnorm import checks
from fastnorm.integrations._step_optimizer import StepOptimizer
from fastnorm.layers import LayerGradNorms
from fastnorm.locate.locator import Locator
from fastnorm.monitoring.diagnosis import Diagnoser
from fastnorm.monitoring.loggers import Logger
from fastnorm.monitoring.monitor import GradNormMonitor
from fastnorm.norm import clip_, total_norm


class _TrainerLoggers(Logger):
    """Hands each window to every logger of the trainer (TensorBoard, CSV, W&B, MLflow...)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for logger in self.trainer.loggers:
            logger.log_metrics(metrics, step=step)

    def flush(self) -> None:
        for logger in self.trainer.loggers:
            logger.save()


def _precision(trainer: Any) -> str | None:
    """The trainer's precision in Lightning's names ("32-true", "16-mixed", ...); None for a plugin
    whose name the diagnosis does not know (its advice then does not assume one)."""
    try:
        return checks.precision(getattr(trainer, "precision", None), "GradNormCallback")
    except ValueError:
        return None


class GradNormCallback(Callback):
    r"""Clips with :func:`fastnorm.clip_` and logs every step's gradient norm.

    Replaces the trainer's ``gradient_clip_val`` (leave that unset): in
    ``on_before_optimizer_step`` (after the backward pass and, with mixed
    precision, after unscaling) it computes the norm of the optimizer's
    gradients in one fused pass, clips them when ``max_norm`` is given, and
    records the norm, with the batch's loss (``training_step``'s output, taken
    at the batch's end), in a :class:`~fastnorm.GradNormMonitor` whose windows
    go to the trainer's loggers (every step, at its ``global_step``) plus any
    others given. The diagnosis runs at each window and warns when the run
    turns unstable; nothing recorded is lost when training ends or raises, and
    a logger that fails never stops training (see the monitor). The monitor is
    told what Lightning knows: the trainer's precision and the optimizer (its
    learning rate, read when the step is taken and dated to that step, and its
    weight decay, eps and betas read once per window). Each ``fit()`` has a
    monitor of its own; the loggers given are flushed at its end, never closed,
    so one callback logs every ``fit()`` it is given to.

    Args:
        max_norm (float, optional): clip the gradients' total norm to this;
            None (default) only measures.
        norm_type (float or str): the p of the p-norm. Default: 2.0.
        log_every_n_steps (int, optional): the window. Default: the trainer's
            ``log_every_n_steps``.
        per_layer (bool): also log each module's norm once per window
            (``gradient_norm_layer/<module>``); the norm is then over all the
            module's parameters rather than the optimizer's. Default: False.
        layer_depth (int, optional): with ``per_layer``, group by the first
            ``layer_depth`` parts of the parameter names instead of by module.
        layer_stats (bool): with ``per_layer``, also keep each module's gradient
            statistics over every step of the window (the same fused pass as
            the norm, :meth:`LayerGradNorms.with_stats <fastnorm.LayerGradNorms.with_stats>`),
            which log and report the module that went non-finite first and on
            how many steps. ``norm_type`` 2 or inf. Default: False.
        diagnose (bool or Diagnoser): as for :class:`~fastnorm.GradNormMonitor`.
        loggers (sequence of Logger): fastnorm loggers to write to as well,
            e.g. a :class:`~fastnorm.JsonlLogger` for ``fastnorm diagnose``.
        locate (bool): also watch the module with a :class:`~fastnorm.Locator`:
            its step is closed before each optimizer step, with the gradients
            present, and each window logs where the run first went non-finite
            or overflowed. Default: False.

    Example::

        >>> from fastnorm.integrations.lightning import GradNormCallback
        >>> trainer = lightning.Trainer(callbacks=[GradNormCallback(max_norm=1.0)])
    """

    def __init__(
        self,
        max_norm: float | None = None,
        norm_type: float | str = 2.0,
        log_every_n_steps: int | None = None,
        *,
        per_layer: bool = False,
        layer_depth: int | None = None,
        layer_stats: bool = False,
        diagnose: bool | Diagnoser = True,
        loggers: Sequence[Logger] = (),
        locate: bool = False,
    ) -> None:
        owner = "GradNormCallback"
        self.locate = checks.boolean(locate, "locate", owner)
        self.locator: Any = None
        self.max_norm = checks.max_norm(max_norm, owner, optional=True)
        self.norm_type = norm_type
        self.log_every_n_steps = (
            None
            if log_every_n_steps is None
            else checks.positive_int(log_every_n_steps, "log_every_n_steps", owner)
        )
        if not isinstance(per_layer, bool):
            raise TypeError(f"{owner}: per_layer must be True or False, got {per_layer!r}")
        self.per_layer = per_layer
        self.layer_stats = checks.boolean(layer_stats, "layer_stats", owner)
        if self.layer_stats and not per_layer:
            raise ValueError(f"{owner}: layer_stats needs per_layer=True (the statistics are per module)")
        if self.layer_stats and float(checks.norm_type(norm_type, owner)) not in (2.0, float("inf")):
            raise ValueError(f"{owner}: layer_stats needs norm_type 2 or inf, got {norm_type!r}")
        self.layer_depth = (
            None if layer_depth is None else checks.positive_int(layer_depth, "layer_depth", owner)
        )
        checks.diagnoser(diagnose, owner, Diagnoser)
        self.diagnose = diagnose
        self.loggers = checks.loggers(loggers, owner)
        self.monitor: GradNormMonitor | None = None
        self._layers: LayerGradNorms | None = None
        self._pending: tuple | None = None  # (norm, step, layers, stats, rates) waiting for the batch's loss
        self._optimizer: StepOptimizer | None = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        if self.max_norm is not None and trainer.gradient_clip_val:
            raise ValueError(
                "GradNormCallback: max_norm and the Trainer's gradient_clip_val both clip; set only one"
            )
        self._layers = LayerGradNorms(pl_module, self.layer_depth, self.norm_type) if self.per_layer else None
        if self.locate:
            self.locator = Locator(pl_module)
        self.monitor = GradNormMonitor(
            self.log_every_n_steps or trainer.log_every_n_steps,
            [_TrainerLoggers(trainer), *self.loggers],
            max_norm=self.max_norm,
            layer_names=self._layers.names if self._layers is not None else None,
            diagnose=self.diagnose,
            precision=_precision(trainer),
            close_loggers=False,  # the trainer's and the user's: they outlive this fit()
            locate=self.locator.reader() if self.locator is not None else None,
        )
        self._optimizer = None

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._record()  # a step whose batch end never came (several optimizers, manual optimization)
        monitor = self.monitor
        if self._optimizer is None or self._optimizer.optimizer is not optimizer:
            # Built after setup: read from its first step, with each step's rate as the step used it (the
            # scheduler steps before the batch's end, where the step is recorded).
            self._optimizer = StepOptimizer(optimizer)
            monitor.optimizer = self._optimizer
        if self._layers is not None:
            params = self._layers.parameters
        else:
            params = [p for group in optimizer.param_groups for p in group["params"]]
        layers = stats = None
        if self._layers is not None and self.layer_stats:
            norm, layers, stats = self._layers.with_stats()  # every step: the window counts each one
        elif self._layers is not None and monitor.due:
            norm, layers = self._layers()  # the same total, with the layers from the same pass
        else:
            norm = total_norm(params, self.norm_type)
        if self.max_norm is not None:
            clip_(params, self.max_norm, self.norm_type, total_norm=norm)
        self._pending = (norm, trainer.global_step, layers, stats, self._optimizer.rates())
        if self.locator is not None:
            self.locator.step(trainer.global_step)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        self._record(loss if isinstance(loss, Tensor) and loss.numel() == 1 else None)

    def _record(self, loss: Tensor | None = None) -> None:
        if self._pending is not None:
            norm, step, layers, stats, rates = self._pending
            self._pending = None
            self._optimizer.lrs = rates
            self.monitor.update(norm, step=step, layers=layers, loss=loss, layer_stats=stats)

    def _close(self) -> None:
        if self.monitor is not None:
            self._record()
            self.monitor.close()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._close()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._close()
