"""Every step's gradient norm kept on the device, logged at a cadence, diagnosed.

``update`` copies the device scalar that ``total_norm`` or ``clip_`` returned
into a preallocated device buffer of ``log_every_n_steps`` slots: a device-side
copy, never a read, so the training loop does not wait for the device. When
the buffer is full, the whole window (and the latest per-layer norms, which
share the buffer) crosses to the host in one transfer; the loggers then
receive plain floats and the diagnosis reads them.

On CUDA that transfer is asynchronous: the window is copied into pinned host
memory with ``non_blocking=True`` and an event is recorded, so the cadence
step does not stall either; the window is logged at the first ``update`` after
the copy has landed (usually the next step), or at ``close``. Elsewhere the
transfer is a plain ``tolist()``, which on the CPU costs nothing to wait for.
"""

from __future__ import annotations

import atexit
import functools
import math
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fastnorm.monitoring.diagnosis import Diagnoser, Diagnosis
from fastnorm.monitoring.loggers import Logger, Window, window_stats
from fastnorm.norm import tensor_norms


class UnstableGradientWarning(UserWarning):
    """The gradient-norm diagnosis turned unstable (exploding, vanishing or nonfinite)."""


@dataclass
class _InFlight:
    """A window whose asynchronous copy to pinned memory may not have landed yet."""

    event: Any  # torch.cuda.Event
    host: Tensor
    steps: list[int]
    layers_step: int | None


def _close_at_exit(ref: weakref.ref) -> None:
    monitor = ref()
    if monitor is not None:
        monitor.close()


class GradNormMonitor:
    r"""Records the gradient norm of every step on the device; logs and diagnoses it at a cadence.

    Replaces calling ``.item()`` on the norm each step (a host sync that stalls
    the device) or sampling one step per logging tick (which misses every spike
    between ticks): every step is kept, and the device is read once per window.

    Args:
        log_every_n_steps (int): the window, in updates: one transfer to the
            host and one call of each logger per window. The device buffer
            holds this many values and never grows. Default: 50.
        loggers (sequence of Logger): where the windows go (see
            :mod:`fastnorm.monitoring.loggers`). Closed by :meth:`close`.
        max_norm (float, optional): the clipping threshold given to
            ``clip_``; with it each window reports the fraction of its steps
            that were clipped.
        layer_names (sequence of str, optional): the names of the per-layer
            norms passed to :meth:`update` (e.g. :attr:`LayerNorms.names`).
        diagnose (bool or Diagnoser): diagnose the series at each window
            (default), with a :class:`~fastnorm.Diagnoser` of your thresholds,
            or not at all (False).
        warn (bool): emit an :class:`UnstableGradientWarning` when the verdict
            turns unstable (once per verdict). Default: True.

    Example::

        >>> logger = fastnorm.JsonlLogger("run/metrics.jsonl")
        >>> monitor = fastnorm.GradNormMonitor(50, loggers=[logger], max_norm=1.0)
        >>> with monitor:
        ...     for batch in loader:
        ...         loss = model(batch).mean()
        ...         loss.backward()
        ...         monitor.update(fastnorm.clip_(model.parameters(), 1.0))
        ...         optimizer.step()
        ...         optimizer.zero_grad()
    """

    def __init__(
        self,
        log_every_n_steps: int = 50,
        loggers: Sequence[Logger] = (),
        *,
        max_norm: float | None = None,
        layer_names: Sequence[str] | None = None,
        diagnose: bool | Diagnoser = True,
        warn: bool = True,
    ) -> None:
        if int(log_every_n_steps) != log_every_n_steps or log_every_n_steps < 1:
            raise ValueError(
                f"GradNormMonitor: log_every_n_steps must be a positive integer, got {log_every_n_steps!r}"
            )
        if max_norm is not None and not (max_norm >= 0):
            raise ValueError(f"GradNormMonitor: max_norm must be >= 0, got {max_norm!r}")
        self.log_every_n_steps = int(log_every_n_steps)
        self.loggers = list(loggers)
        self.max_norm = None if max_norm is None else float(max_norm)
        self.layer_names = list(layer_names or ())
        if isinstance(diagnose, Diagnoser):
            self._diagnoser: Diagnoser | None = diagnose
        else:
            self._diagnoser = Diagnoser() if diagnose else None
        self.warn = warn
        self.diagnosis: Diagnosis | None = None  # of everything logged so far
        self.transfers = 0  # device-to-host transfers so far: one per window
        self._buffer: Tensor | None = None  # log_every_n_steps values, then the layers
        self._host: Tensor | None = None  # pinned, for the asynchronous copy
        self._steps: list[int] = [0] * self.log_every_n_steps
        self._count = 0
        self._next_step = 0
        self._layers_step: int | None = None
        self._in_flight: _InFlight | None = None
        self._warned: set[str] = set()
        self._closed = False
        # Nothing recorded is lost when the program ends without close(); the weak
        # reference lets a forgotten monitor be collected.
        self._at_exit = functools.partial(_close_at_exit, weakref.ref(self))
        atexit.register(self._at_exit)

    # -- recording -----------------------------------------------------------

    @property
    def due(self) -> bool:
        """True when the next :meth:`update` completes a window: the step at
        which per-layer norms, if computed only then, are logged."""
        return self._count == self.log_every_n_steps - 1

    def update(self, norm: Tensor | float, step: int | None = None, *, layers: Tensor | None = None) -> None:
        """Records one step's norm; never reads a device value.

        Args:
            norm (Tensor or float): the total norm, e.g. what :func:`~fastnorm.total_norm`
                or :func:`~fastnorm.clip_` returned (a one-element tensor).
            step (int, optional): the step to log it at. Default: one past the
                previous step (0 first).
            layers (Tensor, optional): per-layer norms, one per ``layer_names``,
                e.g. from :class:`LayerNorms`. The latest given in a window is
                logged with it, at the step it was given.
        """
        if self._closed:
            raise RuntimeError("GradNormMonitor: update() after close()")
        step = self._next_step if step is None else int(step)
        device = norm.device if isinstance(norm, Tensor) else None
        if self._buffer is None or (device is not None and device != self._buffer.device):
            self._allocate(norm)
        slot = self._buffer[self._count]
        if isinstance(norm, Tensor):
            if norm.numel() != 1:
                raise ValueError(
                    f"GradNormMonitor.update: norm must hold one value, got shape {tuple(norm.shape)}"
                )
            slot.copy_(norm.detach().reshape(()))
        else:
            slot.fill_(float(norm))
        if layers is not None:
            if layers.shape != (len(self.layer_names),):
                raise ValueError(
                    f"GradNormMonitor.update: layers must have shape ({len(self.layer_names)},) to match "
                    f"layer_names, got {tuple(layers.shape)}"
                )
            self._buffer[self.log_every_n_steps :].copy_(layers.detach())
            self._layers_step = step
        self._steps[self._count] = step
        self._count += 1
        self._next_step = step + 1
        if self._in_flight is not None and self._in_flight.event.query():
            self._land()
        if self._count == self.log_every_n_steps:
            self.flush()

    def _allocate(self, norm: Tensor | float) -> None:
        """The buffer, on the norm's device: at the first update, or when the device changes."""
        self.flush()
        if isinstance(norm, Tensor):
            device, dtype = norm.device, (torch.float64 if norm.dtype == torch.float64 else torch.float32)
        else:
            device, dtype = torch.device("cpu"), torch.float64
        size = self.log_every_n_steps + len(self.layer_names)
        self._buffer = torch.zeros(size, dtype=dtype, device=device)
        self._host = torch.empty(size, dtype=dtype, pin_memory=True) if device.type == "cuda" else None

    # -- the transfer ----------------------------------------------------------

    def flush(self) -> None:
        """Moves what the current window holds to the host (one transfer) and logs it.

        Called at each cadence; call it yourself to log a partial window. On
        CUDA the transfer is asynchronous and the window is logged once it has
        landed: at the next :meth:`update` that finds it there, or at :meth:`close`.
        """
        if self._count == 0:
            return
        steps = self._steps[: self._count]
        layers_step = self._layers_step
        self._count = 0
        self._layers_step = None
        self.transfers += 1
        if self._host is None:
            self._emit(steps, self._buffer.tolist(), layers_step)
            return
        if self._in_flight is not None:
            self._land()  # its pinned memory is about to be overwritten
        self._host.copy_(self._buffer, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self._buffer.device))  # the stream the copy went on
        self._in_flight = _InFlight(event, self._host, steps, layers_step)

    def _land(self) -> None:
        """Logs the window in flight, waiting for its copy if it has not landed."""
        flight, self._in_flight = self._in_flight, None
        if not flight.event.query():
            flight.event.synchronize()
        self._emit(flight.steps, flight.host.tolist(), flight.layers_step)

    def _emit(self, steps: list[int], host: list[float], layers_step: int | None) -> None:
        values = host[: len(steps)]
        layers = {}
        if layers_step is not None:
            layers = dict(zip(self.layer_names, host[self.log_every_n_steps :]))
        if self._diagnoser is not None:
            self._diagnoser.update(steps, values)
            self.diagnosis = self._diagnoser.result()
            self._maybe_warn(self.diagnosis)
        window = Window(
            tuple(steps),
            tuple(values),
            window_stats(values, self.max_norm),
            layers,
            layers_step,
            self.diagnosis,
        )
        for logger in self.loggers:
            logger.log_window(window)

    def _maybe_warn(self, diagnosis: Diagnosis) -> None:
        if not (self.warn and diagnosis.unstable) or diagnosis.verdict in self._warned:
            return
        self._warned.add(diagnosis.verdict)
        warnings.warn(
            f"fastnorm: the gradient norm is {diagnosis.verdict}.\n{diagnosis.report()}",
            UnstableGradientWarning,
            stacklevel=5,
        )

    # -- the end ---------------------------------------------------------------

    def close(self) -> None:
        """Logs what remains (a partial window, a window in flight) and closes the loggers.

        Called on leaving a ``with`` block, also when it raises, and at
        interpreter exit for a monitor never closed. Closing twice is harmless.
        """
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        try:
            self.flush()
            if self._in_flight is not None:
                self._land()
        finally:
            for logger in self.loggers:
                logger.close()

    def __enter__(self) -> GradNormMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LayerNorms:
    r"""Per-layer gradient norms and the total norm, from one fused pass.

    Groups the parameters of a module by the module that owns them (or by the
    first ``depth`` parts of their names), computes every parameter's norm and
    the total with :func:`fastnorm.tensor_norms`, and combines each group's
    norms on the device (p=2: root of the sum of squares; inf: max; p:
    ``(sum n^p)^(1/p)``), so nothing is read on the host.

    Args:
        named_parameters (nn.Module or iterable of (str, Tensor)): the
            parameters, e.g. ``model`` or ``model.named_parameters()``.
        depth (int, optional): group by the first ``depth`` dot-separated parts
            of each name (``depth=1``: ``encoder``, ``decoder``). Default: by
            owning module (the name without its last part).
        norm_type (float or str): the p of the p-norm. Default: 2.0.

    Example::

        >>> layers = fastnorm.LayerNorms(model)
        >>> monitor = fastnorm.GradNormMonitor(50, loggers, layer_names=layers.names)
        >>> total, per_layer = layers()  # after backward
        >>> fastnorm.clip_(layers.parameters, 1.0, total_norm=total)
        >>> monitor.update(total, layers=per_layer)
    """

    def __init__(self, named_parameters: Any, depth: int | None = None, norm_type: float | str = 2.0) -> None:
        if isinstance(named_parameters, torch.nn.Module):
            named_parameters = named_parameters.named_parameters()
        if depth is not None and (int(depth) != depth or depth < 1):
            raise ValueError(f"LayerNorms: depth must be a positive integer, got {depth!r}")
        self.norm_type = float(norm_type)
        self.parameters: list[Tensor] = []
        self.names: list[str] = []
        group_of: dict[str, int] = {}
        index: list[int] = []
        for name, param in named_parameters:
            parts = name.split(".")
            group = ".".join(parts[:depth] if depth is not None else parts[:-1]) or name
            index.append(group_of.setdefault(group, len(group_of)))
            self.parameters.append(param)
        self.names = list(group_of)
        if not self.parameters:
            raise ValueError("LayerNorms: no parameters given")
        self._index = torch.tensor(index)

    def __call__(self) -> tuple[Tensor, Tensor]:
        """The total norm and the per-layer norms, both on the device, without a sync.

        Returns:
            (Tensor, Tensor): the total norm (as :func:`fastnorm.total_norm`)
            and a 1-D tensor with one norm per name in :attr:`names`.
        """
        total, per_item = tensor_norms(self.parameters, self.norm_type)
        if self._index.device != per_item.device:
            self._index = self._index.to(per_item.device)  # once: it stays there
        return total, combine(per_item, self._index, len(self.names), self.norm_type)


def combine(norms: Tensor, index: Tensor, groups: int, norm_type: float) -> Tensor:
    """Combines p-norms of parts into the p-norm of each group of parts, on the device.

    Args:
        norms (Tensor): 1-D, the norm of each part.
        index (Tensor): 1-D, the group of each part, on the device of ``norms``.
        groups (int): the number of groups.
        norm_type (float): the p of the norms.

    Returns:
        Tensor: 1-D, one norm per group, in the dtype of ``norms``.
    """
    # float64, so that squares (or p-th powers) of large norms do not overflow.
    n = norms.to(torch.float64)
    out = torch.zeros(groups, dtype=torch.float64, device=norms.device)
    if math.isinf(norm_type):
        out.scatter_reduce_(0, index, n, "amax")
    elif norm_type == 1.0:
        out.index_add_(0, index, n)
    else:
        out = out.index_add_(0, index, n.pow(norm_type)).pow(1.0 / norm_type)
    return out.to(norms.dtype)
