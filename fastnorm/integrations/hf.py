"""HF Trainer: clip with fastnorm and log every step's norm, with the loss and learning rate the Trainer has.

Needs transformers (``pip install 'torch-fastnorm[hf]'``); ``import fastnorm``
never imports this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

try:
    from transformers import TrainerCallback
except ImportError as exc:
    raise ImportError(
        "fastnorm.integrations.hf needs transformers: pip install 'torch-fastnorm[hf]'"
    ) from exc

from fastnorm import checks, distributed
from fastnorm.integrations._step_optimizer import StepOptimizer
from fastnorm.integrations.patch import Patch, patch
from fastnorm.layers import LayerGradNorms
from fastnorm.locate.locator import Locator
from fastnorm.monitoring.diagnosis import Diagnoser
from fastnorm.monitoring.loggers import Logger
from fastnorm.monitoring.monitor import GradNormMonitor
from fastnorm.norm import total_norm


class _Step:
    """What ``patch`` hands the callback: the step's norm, kept until the step ends.

    Asked first by the patched functions (``measure``), it measures the step
    itself where the tensors are the model's gradients: the callback's
    per-layer norms and statistics then come from the pass that gives the
    norm, before any clipping, and a norm that only ``get_total_norm``
    computes (accelerate 1.16 and later without clipping) is the step's too.
    """

    def __init__(self, measure: Any) -> None:
        self._measure = measure
        self.norm: Tensor | None = None
        self.measured: tuple | None = None  # (total, per-layer norms, statistics) of this step

    def measure(self, tensors: list, norm_type: Any, gradients: bool) -> Tensor | None:
        self.measured = self._measure(tensors, norm_type, gradients)
        return None if self.measured is None else self.measured[0]

    def update(self, norm: Tensor) -> None:
        self.norm = norm

    def take(self) -> tuple | None:
        """``(norm, layers, stats)`` of the step just ended (the norm handed, else the one measured), or
        None where neither came; then forgets them."""
        norm, measured = self.norm, self.measured
        self.norm = self.measured = None
        if measured is not None:
            return (measured[0] if norm is None else norm, measured[1], measured[2])
        return None if norm is None else (norm, None, None)


def _is_l2(norm_type: Any) -> bool:
    try:
        return float(norm_type) == 2.0
    except (TypeError, ValueError):
        return False


def _precision(args: Any, model: Any) -> str | None:
    """The run's precision as the Trainer knows it: fp16 or bf16 autocast (``args.fp16``, ``args.bf16``),
    else fp32 for a model whose floating-point weights are all fp32; None otherwise (pure 16-bit weights,
    which the monitor reads from the optimizer's parameters)."""
    if getattr(args, "fp16", False):
        return "fp16-mixed"
    if getattr(args, "bf16", False):
        return "bf16-mixed"
    parameters = model.parameters() if isinstance(model, torch.nn.Module) else ()
    dtypes = {p.dtype for p in parameters if p.is_floating_point()}
    return "fp32" if dtypes == {torch.float32} else None


class GradNormCallback(TrainerCallback):
    r"""Runs the Trainer's clip on fastnorm and logs every step's gradient norm.

    For the length of ``trainer.train()`` it holds a :func:`fastnorm.patch`:
    the Trainer's ``max_grad_norm`` clip (through accelerate) runs
    :func:`fastnorm.clip_`, and with ``max_grad_norm=0`` its norm-only call
    does too. Each step's norm before clipping, a device scalar, goes to a
    :class:`~fastnorm.GradNormMonitor` at the Trainer's ``global_step``: every
    step, where the Trainer itself logs one sampled ``grad_norm`` per
    ``logging_steps``. With it, where the Trainer has them: the loss at each
    logging step (the Trainer's mean over the steps since the last log, as it
    logs it), and the learning rate the step used at every step (warmups and
    schedule changes). The monitor is told what the Trainer knows: the
    precision (``args.fp16`` or ``args.bf16`` autocast, else fp32 weights) and,
    from its first step, the optimizer (its weight decay, eps and betas read
    once per window). The diagnosis warns when the run turns unstable. Only the
    main process logs; every process clips with fastnorm.

    Keep ``max_grad_norm`` as the Trainer's clip threshold (default 1.0; 0
    turns clipping off). Each ``train()`` has a monitor of its own, which the
    callback makes and closes; the patch is undone and the monitor closed at
    the end of training, or at the next ``train()`` when one raised. The loggers
    are yours: they are flushed, never closed, so one callback logs every
    ``train()`` it is given to (a second one, or a retry after a failure);
    close them when you are done with them.

    Args:
        loggers (sequence of Logger): where the windows go, e.g.
            ``[fastnorm.JsonlLogger("run/norms.jsonl")]`` for ``fastnorm diagnose``.
        log_every_n_steps (int, optional): the monitor's window. Default: the
            Trainer's ``logging_steps``.
        diagnose (bool or Diagnoser): as for :class:`~fastnorm.GradNormMonitor`.
        per_layer (bool): also log each module's gradient norm once per window
            (``gradient_norm_layer/<module>``), from the pass that gives the
            step's norm. Default: False.
        layer_depth (int, optional): with ``per_layer``, group by the first
            ``layer_depth`` parts of the parameter names instead of by module.
        layer_stats (bool): with ``per_layer``, also keep each module's gradient
            statistics over every step of the window, before clipping (the same
            fused pass as the norm, :meth:`LayerGradNorms.with_stats <fastnorm.LayerGradNorms.with_stats>`),
            which log and report the module that went non-finite first and on
            how many steps. Default: False.
        locate (bool): also watch the model with a :class:`~fastnorm.Locator`
            (on the main process): its step is closed before each optimizer
            step, with the gradients present, and each window logs where the
            run first went non-finite or overflowed. Default: False.

    The per-layer norms and statistics are computed where the Trainer's clip
    (or its norm-only call) is given the model's own gradients with the L2
    norm, as it is on one device mesh; elsewhere (several meshes, FSDP1,
    DeepSpeed) only the total is logged.

    Example::

        >>> from fastnorm.integrations.hf import GradNormCallback
        >>> callback = GradNormCallback([fastnorm.JsonlLogger("run/norms.jsonl")])
        >>> trainer = transformers.Trainer(model, args, train_dataset=data, callbacks=[callback])
    """

    def __init__(
        self,
        loggers: Sequence[Logger] = (),
        log_every_n_steps: int | None = None,
        *,
        diagnose: bool | Diagnoser = True,
        per_layer: bool = False,
        layer_depth: int | None = None,
        layer_stats: bool = False,
        locate: bool = False,
    ) -> None:
        owner = "GradNormCallback"
        self.locate = checks.boolean(locate, "locate", owner)
        self.per_layer = checks.boolean(per_layer, "per_layer", owner)
        self.layer_stats = checks.boolean(layer_stats, "layer_stats", owner)
        if self.layer_stats and not per_layer:
            raise ValueError(f"{owner}: layer_stats needs per_layer=True (the statistics are per module)")
        self.layer_depth = (
            None if layer_depth is None else checks.positive_int(layer_depth, "layer_depth", owner)
        )
        self._layers: LayerGradNorms | None = None
        self._params: list[Tensor] = []  # the model's, for telling its gradients from others
        self.locator: Any = None
        self.loggers = checks.loggers(loggers, owner)
        self.log_every_n_steps = (
            None
            if log_every_n_steps is None
            else checks.positive_int(log_every_n_steps, "log_every_n_steps", owner)
        )
        checks.diagnoser(diagnose, owner, Diagnoser)
        self.diagnose = diagnose
        self.monitor: GradNormMonitor | None = None
        self._patch: Patch | None = None
        self._step = _Step(self._measure)
        self._optimizer: StepOptimizer | None = None
        self._lrs: list = []  # the rates of the step just taken
        self._pending: tuple | None = None  # (norm, step, rates, layers, stats) waiting for the step's logs

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close()  # a previous train() that raised
        self._optimizer = None  # told to this train()'s monitor at its first step
        if not state.is_world_process_zero:
            self._patch = patch()
            return
        window = self.log_every_n_steps or max(1, int(state.logging_steps or args.logging_steps))
        model = kwargs.get("model")
        module = model if isinstance(model, torch.nn.Module) else None
        self._params = list(module.parameters()) if module is not None else []
        self._layers = None
        if self.per_layer and module is not None:
            self._layers = LayerGradNorms(module, self.layer_depth)
        if self.locate and module is not None:
            self.locator = Locator(module)
        self.monitor = GradNormMonitor(
            window,
            self.loggers,
            max_norm=args.max_grad_norm if args.max_grad_norm and args.max_grad_norm > 0 else None,
            diagnose=self.diagnose,
            precision=_precision(args, kwargs.get("model")),
            layer_names=self._layers.names if self._layers is not None else None,
            close_loggers=False,  # the user's: they outlive this train()
            locate=self.locator.reader() if self.locator is not None else None,
        )
        self._patch = patch(monitor=self._step)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.locator is not None:  # the step the monitor records at on_step_end, after the increment
            self.locator.step(state.global_step + 1)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        optimizer = kwargs.get("optimizer")
        if self.monitor is None or optimizer is None:
            return
        if self._optimizer is None or self._optimizer.optimizer is not optimizer:
            self._optimizer = StepOptimizer(optimizer)  # the Trainer's, once it exists
            self.monitor.optimizer = self._optimizer
        self._lrs = self._optimizer.rates()  # after the optimizer's step, before the scheduler's

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._record()
        taken = self._step.take()
        if taken is not None and self.monitor is not None:
            norm, layers, stats = taken
            self._pending = (norm, state.global_step, self._lrs, layers, stats)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        pending = self._pending
        if pending is not None and pending[1] == state.global_step and logs and "loss" in logs:
            self._record(float(logs["loss"]))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close()

    def _record(self, loss: float | None = None) -> None:
        if self._pending is None:
            return
        norm, step, lrs, layers, stats = self._pending
        self._pending = None
        if self._optimizer is not None:
            self._optimizer.lrs = lrs
        self.monitor.update(norm, step=step, loss=loss, layers=layers, layer_stats=stats)

    def _measure(self, tensors: list, norm_type: Any, gradients: bool) -> tuple | None:
        """The step's ``(total, layers, stats)`` where ``tensors`` are the model's gradients (or its
        parameters) and the norm is L2; None otherwise, which leaves the call as it was."""
        if self.monitor is None or not self._params or not _is_l2(norm_type):
            return None
        grads = tensors if gradients else [getattr(t, "grad", None) for t in tensors]
        mine = {id(p.grad) for p in self._params if p.grad is not None}
        present = [g for g in grads if g is not None]
        if len(present) != len(mine) or any(id(g) not in mine for g in present):
            return None  # a part of the model (one device mesh), or another model's
        if any(distributed.is_dtensor(g) for g in present):
            return None  # their norm is a collective, which the other processes (no monitor) run as is
        self._record()  # the step before's, whose logs have passed: `due` counts it
        layers = self._layers
        if layers is not None and self.layer_stats:
            return layers.with_stats()  # every step: the window counts each one
        if layers is not None and self.monitor.due:
            return (*layers(), None)
        return total_norm(present, gradients=True), None, None

    def close(self) -> None:
        """Logs what is pending, undoes the patch and closes the monitor, flushing its loggers (which stay
        open, for the next ``train()``). Called at the end of training; twice is harmless."""
        if self._patch is not None:
            self._patch.undo()
            self._patch = None
        if self.monitor is not None:
            self._record()
            self.monitor.close()
        self._params, self._layers = [], None  # the model's: not kept past its train()
