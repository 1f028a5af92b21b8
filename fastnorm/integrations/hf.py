"""HF Trainer: clip with fastnorm and log every step's norm, with the loss and learning rate the Trainer has.

Needs transformers (``pip install 'fastnorm[hf]'``); ``import fastnorm``
never imports this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

try:
    from transformers import TrainerCallback
except ImportError as exc:
    raise ImportError("fastnorm.integrations.hf needs transformers: pip install 'fastnorm[hf]'") from exc

from fastnorm import checks
from fastnorm.integrations.patch import Patch, patch
from fastnorm.monitoring.diagnosis import Diagnoser
from fastnorm.monitoring.loggers import Logger
from fastnorm.monitoring.monitor import GradNormMonitor


class _StepNorm:
    """What ``patch`` hands the callback: the step's norm, kept until the step ends."""

    def __init__(self) -> None:
        self.norm: Tensor | None = None

    def update(self, norm: Tensor) -> None:
        self.norm = norm

    def take(self) -> Tensor | None:
        norm, self.norm = self.norm, None
        return norm


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
    logs it), and the learning rate the step used at every step, read by the
    diagnosis (warmups and schedule changes). The diagnosis warns when the run
    turns unstable. Only the main process logs; every process clips with
    fastnorm.

    Keep ``max_grad_norm`` as the Trainer's clip threshold (default 1.0; 0
    turns clipping off). The patch is undone, and the monitor closed, at the
    end of training; if ``train()`` raises, call :meth:`close`.

    Args:
        loggers (sequence of Logger): where the windows go, e.g.
            ``[fastnorm.JsonlLogger("run/norms.jsonl")]`` for ``fastnorm diagnose``.
        log_every_n_steps (int, optional): the monitor's window. Default: the
            Trainer's ``logging_steps``.
        diagnose (bool or Diagnoser): as for :class:`~fastnorm.GradNormMonitor`.

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
    ) -> None:
        owner = "GradNormCallback"
        self.loggers = checks.loggers(loggers, owner)
        self.log_every_n_steps = (
            None
            if log_every_n_steps is None
            else checks.positive_int(log_every_n_steps, "log_every_n_steps", owner)
        )
        checks.diagnoser(diagnose, owner, Diagnoser)
        self.diagnose = diagnose
        self.monitor: GradNormMonitor | None = None
        self._diagnoser: Diagnoser | None = None
        self._patch: Patch | None = None
        self._step = _StepNorm()
        self._lr: float | None = None
        self._pending: tuple | None = None  # (norm, step, lr) waiting for the step's logs

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close()  # a previous train() that raised
        if not state.is_world_process_zero:
            self._patch = patch()
            return
        if isinstance(self.diagnose, Diagnoser):
            self._diagnoser = self.diagnose
        else:
            self._diagnoser = Diagnoser() if self.diagnose else None
        window = self.log_every_n_steps or max(1, int(state.logging_steps or args.logging_steps))
        self.monitor = GradNormMonitor(
            window,
            self.loggers,
            max_norm=args.max_grad_norm if args.max_grad_norm and args.max_grad_norm > 0 else None,
            diagnose=self._diagnoser if self._diagnoser is not None else False,
        )
        self._patch = patch(monitor=self._step)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # After the optimizer's step, before the scheduler's: the rate this step used.
        scheduler = kwargs.get("lr_scheduler")
        lr = scheduler.get_last_lr()[0] if scheduler is not None else None
        self._lr = float(lr) if lr is not None else None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._record()
        norm = self._step.take()
        if norm is not None and self.monitor is not None:
            self._pending = (norm, state.global_step, self._lr)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        pending = self._pending
        if pending is not None and pending[1] == state.global_step and logs and "loss" in logs:
            self._record(float(logs["loss"]))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close()

    def _record(self, loss: float | None = None) -> None:
        if self._pending is None:
            return
        norm, step, lr = self._pending
        self._pending = None
        if lr is not None and self._diagnoser is not None:
            self._diagnoser.update_lr([step], [lr])
        self.monitor.update(norm, step=step, loss=loss)

    def close(self) -> None:
        """Logs what is pending, undoes the patch and closes the monitor (and its loggers).
        Called at the end of training; twice is harmless."""
        if self._patch is not None:
            self._patch.undo()
            self._patch = None
        if self.monitor is not None:
            self._record()
            self.monitor.close()
