"""Every step's gradient norm kept on the device, logged at a cadence, diagnosed.

``update`` copies the device scalar that ``total_norm`` or ``clip_`` returned
(and, when given, the step's loss and whether the optimizer skipped the step)
into a preallocated device buffer of
``log_every_n_steps`` slots: a device-side copy, never a read, so the training
loop does not wait for the device. When the buffer is full, the whole window
(and the latest per-layer norms, which share the buffer) crosses to the host
in one transfer; the loggers then receive plain floats and the diagnosis reads
them.

On CUDA that transfer is asynchronous: the window is copied into pinned host
memory with ``non_blocking=True`` and an event is recorded, so the cadence
step does not stall either; the window is logged at the first ``update`` after
the copy has landed (usually the next step), or at ``close``. Elsewhere the
transfer is a plain ``tolist()``, which on the CPU costs nothing to wait for.

The monitor never breaks the loop it watches: a logger that raises is reported
once (a :class:`MonitorWarning` naming it and the error) and the others still
receive every window; a diagnosis that raises is reported once and the window's
``diagnosis`` says it failed (never a verdict left from before), and the next
window is diagnosed again; a ``KeyboardInterrupt`` in a logger or in the
diagnosis is raised again only once every logger has the window; ``close``
closes every logger even when one fails; and a monitor dropped without
``close`` still delivers what it holds, when it is collected or at interpreter exit.
"""

from __future__ import annotations

import numbers
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fastnorm import checks
from fastnorm.monitoring.diagnosis import Diagnoser, Diagnosis
from fastnorm.monitoring.diagnosis.events import FAILED, TOO_FEW
from fastnorm.monitoring.diagnosis.objective import check as check_objective
from fastnorm.monitoring import layer_stats as _layer_stats  # update() has an argument of that name
from fastnorm.monitoring import values
from fastnorm.monitoring.loggers import Logger, Window, window_stats
from fastnorm.monitoring.diagnosis.skips import SPIKE_CODE
from fastnorm.monitoring.optimizer import optimizer_lr, optimizer_settings, precision_of
from fastnorm.monitoring.series import REWARD_KEY
from fastnorm.monitoring.alerts import (  # noqa: F401  (the warnings are this module's names too)
    Alerts,
    MonitorWarning,
    RecoveredWarning,
    UnstableGradientWarning,
    _warn,
    own_frames,
)

# The per-step quantities, one row of the device buffer each, all crossing in the
# window's one transfer. Another per-step quantity is one more row here, a field
# of Window and a count in window_stats.
_NORM, _LOSS, _SKIPPED, _REWARD = 0, 1, 2, 3
_ROWS = 4
# The longest window: its slots are allocated on the device at the first update, so a window of 10**9 would
# take 32 GB there (and as much in host lists) before anything is logged.
MAX_WINDOW = 1_000_000
own_frames(__file__)  # a warning points past this module's frames too, at the caller's line


def _name(logger: Any) -> str:
    text = repr(logger)
    return text if len(text) <= 200 else type(logger).__name__


# -- the recorder: everything a monitor holds, so that a finalizer can deliver it --------


@dataclass
class _InFlight:
    """A window whose asynchronous copy to pinned memory may not have landed yet."""

    event: Any  # torch.cuda.Event
    host: Tensor
    steps: list[int]
    has_loss: list[bool]
    has_skipped: list[bool]
    has_reward: list[bool]
    layers_step: int | None
    settings: dict[str, float]
    lrs: dict[int, float]
    stats_given: int


class _Recorder(Alerts):
    """The state and work of a :class:`GradNormMonitor`.

    Kept apart from the monitor so that ``weakref.finalize`` can hold it without
    holding the monitor: a monitor that is collected, or alive at interpreter
    exit, without ``close`` still has its pending steps delivered.
    """

    def __init__(
        self,
        n: int,
        loggers: list[Any],
        max_norm: float | None,
        layer_names: list[str],
        diagnoser: Diagnoser | None,
        warn: bool,
        precision: str | None = None,
        optimizer: Any = None,
        close_loggers: bool = True,
        locator: Any = None,
    ) -> None:
        self.n = n
        self.close_loggers = close_loggers
        self.locator = locator
        self.precision = precision
        self.optimizer = optimizer
        self.lr: float | None = None  # the learning rate at the last update
        self.lr_steps: dict[int, float] = {}  # the window's steps where it changed, and its value there
        self.loggers = loggers
        self.max_norm = max_norm
        self.layer_names = layer_names
        self.diagnoser = diagnoser
        self.warn = warn
        # Before the first window: nothing read yet (a verdict that says so, never None while diagnosing).
        self.diagnosis: Diagnosis | None = Diagnosis(TOO_FEW) if diagnoser is not None else None
        self.steps_read = 0  # norms handed to the diagnosis
        self.located: Any = None  # the locator's findings of the last window
        self.layer_window: _layer_stats.LayerWindow | None = None  # the layers' statistics, last window
        self.stats_given = 0  # the current window's steps that gave layer_stats
        self.transfers = 0
        self.logger_failures = [0] * len(loggers)  # windows (and closes) each logger failed
        self.buffer: Tensor | None = None  # _ROWS * n per-step values, the layers, their window statistics
        self.host: Tensor | None = None  # pinned, for the asynchronous copy
        self.steps: list[int] = [0] * n
        self.has_loss: list[bool] = [False] * n
        self.has_skipped: list[bool] = [False] * n
        self.has_reward: list[bool] = [False] * n
        self.count = 0
        self.next_step = 0
        self.layers_step: int | None = None
        self.in_flight: _InFlight | None = None
        self.warned: set[str] = set()  # the monitor's own warnings given once (a negative norm)
        # What was warned of, until the run recovers: the verdicts, each unstable event's (kind, cause), the
        # step of the last warning.
        self.alarms: list[str] = []
        self.warned_of: set[tuple[str, str]] = set()
        self.warned_at: int | None = None
        self.closed = False

    # -- recording -------------------------------------------------------------

    def update(
        self,
        norm: Tensor | float,
        step: int,
        layers: Tensor | None,
        loss: Tensor | float | None,
        skipped: Tensor | float | None,
        stats: Tensor | None = None,
        reward: Tensor | float | None = None,
    ) -> None:
        device = next((v.device for v in (norm, loss, skipped, stats, reward) if isinstance(v, Tensor)), None)
        if self.buffer is None or (device is not None and device != self.buffer.device):
            self.allocate(device, norm)
        buffer, slot = self.buffer, self.count
        for row, value in ((_NORM, norm), (_LOSS, loss), (_SKIPPED, skipped), (_REWARD, reward)):
            if isinstance(value, Tensor):
                buffer[row * self.n + slot].copy_(value.detach().reshape(()))
            elif value is not None:
                buffer[row * self.n + slot].fill_(value)
        if layers is not None:
            buffer[_ROWS * self.n : _ROWS * self.n + len(layers)].copy_(layers.detach())
            self.layers_step = step
        if stats is not None:
            _layer_stats.fold(self.region(), stats, slot, self.n)
            self.stats_given += 1
        if self.optimizer is not None:
            lr = optimizer_lr(self.optimizer)
            if lr is not None and lr != self.lr:
                self.lr = lr
                self.lr_steps[step] = lr
        if self.locator is not None:
            self.locator.step(step)
        self.steps[slot] = step
        self.has_loss[slot] = loss is not None
        self.has_skipped[slot] = skipped is not None
        self.has_reward[slot] = reward is not None
        self.count += 1
        self.next_step = step + 1
        if self.in_flight is not None and self.in_flight.event.query():
            self.land()
        if self.count == self.n:
            self.flush()

    def allocate(self, device: torch.device | None, norm: Tensor | float) -> None:
        """The buffer, on the values' device: at the first update, or when the device changes."""
        self.flush()
        if device is None:
            device, dtype = torch.device("cpu"), torch.float64
        else:
            # float32 slots for float32 norms on an accelerator; float64 where it is free or needed.
            # The layers' window counts are exact in float64 (float32 would round sums above 2**24).
            wide = not isinstance(norm, Tensor) or norm.dtype == torch.float64 or bool(self.layer_names)
            dtype = torch.float64 if wide or device.type == "cpu" else torch.float32
        size = (_ROWS * self.n) + (1 + _layer_stats.ROWS) * len(self.layer_names)
        self.buffer = torch.zeros(size, dtype=dtype, device=device)
        self.host = torch.empty(size, dtype=dtype, pin_memory=True) if device.type == "cuda" else None
        _layer_stats.reset(self.region(), self.n)

    def region(self) -> Tensor:  # the layers' window statistics: layer_stats.ROWS rows of a value per layer
        return self.buffer[_ROWS * self.n + len(self.layer_names) :].view(_layer_stats.ROWS, len(self.layer_names))

    # -- the transfer ------------------------------------------------------------

    def flush(self) -> None:
        if self.count == 0:
            return
        steps, has_loss = self.steps[: self.count], self.has_loss[: self.count]
        has_skipped = self.has_skipped[: self.count]
        has_reward = self.has_reward[: self.count]
        layers_step = self.layers_step
        settings = self.settings()
        if self.locator is not None:  # the locator's window: its own one read, at the same cadence
            self.located = self.locator.collect()
            settings.update(self.located.metrics())
        lrs, self.lr_steps = self.lr_steps, {}
        given, self.stats_given = self.stats_given, 0
        self.count = 0
        self.layers_step = None
        self.transfers += 1
        if self.host is None:
            host = self.buffer.tolist()
            _layer_stats.reset(self.region(), self.n)
            self.emit(steps, has_loss, has_skipped, has_reward, host, layers_step, settings, lrs, given)
            return
        if self.in_flight is not None:
            self.land()  # its pinned memory is about to be overwritten
        self.host.copy_(self.buffer, non_blocking=True)
        _layer_stats.reset(self.region(), self.n)  # on the copy's stream, after it
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.buffer.device))  # the stream the copy went on
        self.in_flight = _InFlight(
            event, self.host, steps, has_loss, has_skipped, has_reward, layers_step, settings, lrs, given
        )

    def land(self) -> None:
        """Logs the window in flight, waiting for its copy if it has not landed."""
        flight, self.in_flight = self.in_flight, None
        if not flight.event.query():
            flight.event.synchronize()
        self.emit(
            flight.steps,
            flight.has_loss,
            flight.has_skipped,
            flight.has_reward,
            flight.host.tolist(),
            flight.layers_step,
            flight.settings,
            flight.lrs,
            flight.stats_given,
        )

    def emit(
        self,
        steps: list[int],
        has_loss: list[bool],
        has_skipped: list[bool],
        has_reward: list[bool],
        host: list[float],
        layers_step: int | None,
        settings: dict[str, float],
        lrs: dict[int, float],
        stats_given: int = 0,
    ) -> None:
        k, n = len(steps), self.n
        values = host[:k]
        losses = tuple(host[_LOSS * n + i] if given else None for i, given in enumerate(has_loss))
        if not any(has_loss):
            losses = ()
        rewards = tuple(host[_REWARD * n + i] if given else None for i, given in enumerate(has_reward))
        if not any(has_reward):
            rewards = ()
        codes = tuple(host[_SKIPPED * n + i] if given else None for i, given in enumerate(has_skipped))
        if not any(has_skipped):
            codes = ()
        skipped = tuple(None if c is None else c != 0 for c in codes)
        spiked = tuple(c == SPIKE_CODE for c in codes) if any(c == SPIKE_CODE for c in codes) else ()
        end = _ROWS * n + len(self.layer_names)
        layers = dict(zip(self.layer_names, host[_ROWS * n : end])) if layers_step is not None else {}
        self.layer_window = _layer_stats.read(host[end:], self.layer_names, steps, stats_given)
        if self.layer_window is not None:
            settings = {**settings, **self.layer_window.metrics()}
        self.check_values(steps, values)
        interrupted: BaseException | None = None  # a Ctrl-C, raised again once every logger has the window
        if self.diagnoser is not None:
            try:
                self.diagnose(steps, values, losses, codes, layers, layers_step, settings, lrs, rewards)
            except BaseException as exc:
                interrupted = exc
        window = Window(
            tuple(steps),
            tuple(values),
            window_stats(values, self.max_norm, skipped, spiked),
            layers,
            layers_step,
            self.diagnosis,
            losses,
            skipped,
            settings,
            lrs,
            spiked,
            self.layer_window,
            rewards,
        )
        for i, logger in enumerate(self.loggers):
            try:
                logger.log_window(window)
            except Exception as exc:  # a logger never breaks the loop, nor the other loggers
                self.failed(i, exc, f"log steps {steps[0]}-{steps[-1]}")
            except BaseException as exc:
                interrupted = interrupted or exc
        if interrupted is not None:
            raise interrupted

    def check_values(self, steps: list[int], values: list[float]) -> None:
        bad = [(s, v) for s, v in zip(steps, values) if v < 0]
        if bad and "negative" not in self.warned:
            self.warned.add("negative")
            _warn(
                f"fastnorm: GradNormMonitor.update got a negative norm ({bad[0][1]!r} at step {bad[0][0]}); "
                "a norm is never negative: is the value given really the gradient norm? Such values are "
                "logged as given and reported by the diagnosis as invalid.",
                MonitorWarning,
            )

    def settings(self) -> dict[str, float]:
        """What is known of the run now: the optimizer's settings, read on the host, and the precision."""
        found = optimizer_settings(self.optimizer) if self.optimizer is not None else {}
        if self.precision is None and self.optimizer is not None:
            self.precision = precision_of(self.optimizer)
        if self.precision is not None:
            found[f"precision/{self.precision}"] = 1.0
        return found

    def diagnose(
        self, steps, values, losses, skipped, layers, layers_step, settings, lrs, rewards=()
    ) -> None:
        """Feeds the window to the diagnoser and reads its verdict; a failure leaves a verdict that says so.

        The diagnoser is kept: the next window is diagnosed again, so a failure on one input does not
        silence the run's later faults. Interrupted (a ``KeyboardInterrupt``), the verdict says so too.
        """
        self.steps_read += len(steps)
        try:
            if skipped:
                flagged = [(s, f) for s, f in zip(steps, skipped) if f is not None]
                self.diagnoser.update_skipped([s for s, _ in flagged], [f for _, f in flagged])
            if rewards:  # before the norms: a reward says their exact zeros are batches whose rewards tied
                self.diagnoser.update_keys((REWARD_KEY,))  # what the log holds, as read back offline
                given = [(s, r) for s, r in zip(steps, rewards) if r is not None]
                self.diagnoser.update_reward([s for s, _ in given], [r for _, r in given])
            self.diagnoser.update(steps, values)
            if losses:
                self.diagnoser.update_loss(
                    [s for s, v in zip(steps, losses) if v is not None], [v for v in losses if v is not None]
                )
            if layers:
                self.diagnoser.update_layers(layers_step, layers)
            if lrs:
                self.diagnoser.update_lr(list(lrs), list(lrs.values()))
            if settings:
                self.diagnoser.update_settings(steps[-1], settings)
            self.diagnosis = self.diagnoser.result()
        except Exception as exc:  # a broken (custom) diagnoser must not cost the window, nor say "stable"
            error = f"{type(exc).__name__}: {exc}"
            self.diagnosis = Diagnosis(FAILED, steps=self.steps_read, error=f"at step {steps[-1]}, {error}")
            if "diagnosis" not in self.warned:
                self.warned.add("diagnosis")
                _warn(
                    f"fastnorm: the diagnosis failed at step {steps[-1]} ({error}); GradNormMonitor.diagnosis "
                    f"says so (verdict '{FAILED}') until a later window is diagnosed again; further "
                    "failures are not reported again.",
                    MonitorWarning,
                )
            return
        except BaseException as exc:
            self.diagnosis = Diagnosis(
                FAILED, steps=self.steps_read, error=f"interrupted at step {steps[-1]} ({type(exc).__name__})"
            )
            raise
        if self.warn:
            self.alert(self.diagnosis, steps[-1])

    def failed(self, i: int, exc: Exception, doing: str) -> None:
        self.logger_failures[i] += 1
        if self.logger_failures[i] > 1:
            return  # reported once: the count says how often
        text = f"fastnorm: logger {_name(self.loggers[i])} failed to {doing} ({type(exc).__name__}: {exc})"
        if doing == "close":
            text += "; the other loggers were closed all the same."
        else:
            text += (
                "; the other loggers still receive every window. It is tried again at each window; "
                "its further failures are counted in GradNormMonitor.logger_failures, not reported again."
            )
        _warn(text, MonitorWarning)

    # -- the end -----------------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.flush()
            if self.in_flight is not None:
                self.land()
        finally:
            if self.locator is not None:
                self.locator.remove()
            for i, logger in enumerate(self.loggers):
                try:
                    logger.close() if self.close_loggers else logger.flush()
                except Exception as exc:
                    self.failed(i, exc, "close")


class GradNormMonitor:
    r"""Records the gradient norm of every step on the device; logs and diagnoses it at a cadence.

    Replaces calling ``.item()`` on the norm each step (a host sync that stalls
    the device) or sampling one step per logging tick (which misses every spike
    between ticks): every step is kept, and the device is read once per window.

    It never breaks the training loop: a logger that raises is reported once
    with a :class:`MonitorWarning` and the other loggers still receive every
    window (``update`` never raises because of a logger); the loop's own
    exception leaves a ``with monitor:`` block unchanged; :meth:`close` closes
    every logger even if one fails, and closing twice is harmless. A monitor
    dropped without :meth:`close` still delivers its pending steps, when it is
    garbage-collected or at interpreter exit.

    Args:
        log_every_n_steps (int): the window, in updates: one transfer to the
            host and one call of each logger per window. The device buffer
            holds this many values and never grows; at most ``MAX_WINDOW``
            (a million). Default: 50.
        loggers (sequence of Logger): where the windows go (see
            :mod:`fastnorm.monitoring.loggers`). Closed by :meth:`close`.
        max_norm (float, optional): the clipping threshold given to
            ``clip_`` or :class:`~fastnorm.StepClipper`; with it each window
            reports the fraction of its applied steps that were clipped, and
            the diagnosis knows the run is clipped.
        layer_names (sequence of str, optional): the names of the per-layer
            norms passed to :meth:`update` (e.g. :attr:`LayerGradNorms.names <fastnorm.LayerGradNorms>`).
        diagnose (bool or Diagnoser): diagnose the series at each window
            (default), with a :class:`~fastnorm.Diagnoser` of your thresholds,
            or not at all (False). A Diagnoser without ``max_norm`` is given the monitor's.
        warn (bool): emit an :class:`UnstableGradientWarning` when the verdict
            turns unstable, and again for each new unstable event, under the
            same verdict too: one that began after the last warning (a fault
            that comes while an earlier alarm stands) or of a kind and first
            action not warned of (a new cause); never while too few points were
            read to judge. A :class:`RecoveredWarning` once when a run warned
            about is stable again withdraws them all; :attr:`diagnosis` is
            always the current one. Default: True.
        precision (str, optional): the run's precision, for the advice:
            ``"fp32"``, ``"bf16"``, ``"fp16"`` (pure), ``"bf16-mixed"``,
            ``"fp16-mixed"`` (autocast), or Lightning's names (``"32-true"``,
            ``"16-mixed"``, ...). Logged as ``gradient_norm_precision/<name>``.
            Default: inferred from the parameters' dtype when ``optimizer`` is
            given and they are bf16 or fp16, unknown otherwise.
        optimizer (torch.optim.Optimizer, optional): read on the host, never
            a device value (no sync), from its ``param_groups``: the weight
            decay, ``eps``, betas or momentum once per window, logged at the
            window's last step as ``gradient_norm_weight_decay``, ...; the
            learning rate (a float per group) at every update, logged as
            ``gradient_norm_lr`` at the steps where it changed and at the
            window's last step, so that a schedule's jump is dated to its step.
            The diagnosis reads them (a learning-rate jump, a decay too strong,
            an ``eps`` that dominates Adam's denominator).
        close_loggers (bool): whether :meth:`close` closes the loggers (default)
            or only flushes them, for loggers that outlive the monitor (a
            trainer callback's, given by its user, serve every ``train()``).
        objective (str, optional): what the loss is, for the diagnosis:
            ``"minimise"``, ``"adversarial"`` (a GAN generator's),
            ``"reinforcement"`` (a policy gradient's) or ``"contrastive"`` (see
            :class:`~fastnorm.Diagnoser`). Default: None (read from the loss: a
            negative one is reward-driven; a loss to minimise otherwise).
        locate (Locator, optional): a :class:`~fastnorm.Locator` on the model:
            each ``update`` closes its step, each window reads it once and logs
            where the window first went non-finite or overflowed
            (``gradient_norm_locate_nonfinite/...``), which the diagnosis
            reports; :attr:`located` holds it. Removed by :meth:`close`.

    A monitor is not copied or pickled (``TypeError``): it holds a device
    buffer, open loggers and a hook that delivers at exit, which a copy
    would share or lose.

    Raises:
        TypeError: an argument of the wrong type (``max_norm='1'``, ``GradNormMonitor(True)``).
        ValueError: an argument out of range (``log_every_n_steps=0``, ``max_norm=-1``).

    Example::

        >>> logger = fastnorm.JsonlLogger("run/metrics.jsonl")
        >>> monitor = fastnorm.GradNormMonitor(50, loggers=[logger], max_norm=1.0)
        >>> with monitor:
        ...     for batch in loader:
        ...         loss = model(batch).mean()
        ...         loss.backward()
        ...         monitor.update(fastnorm.clip_(model.parameters(), 1.0), loss=loss)
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
        precision: str | None = None,
        optimizer: Any = None,
        close_loggers: bool = True,
        objective: str | None = None,
        locate: Any = None,
    ) -> None:
        owner = "GradNormMonitor"
        if locate is not None and not all(callable(getattr(locate, m, None)) for m in ("step", "collect")):
            raise TypeError(
                f"{owner}: locate must be a fastnorm.Locator (with step() and collect()), "
                f"got {type(locate).__name__}"
            )
        n = checks.positive_int(log_every_n_steps, "log_every_n_steps", owner)
        if n > MAX_WINDOW:
            raise ValueError(
                f"{owner}: log_every_n_steps must be at most {MAX_WINDOW} (its slots are allocated on the "
                f"device at the first update), got {n}"
            )
        loggers = checks.loggers(loggers, owner)
        max_norm = checks.max_norm(max_norm, owner, optional=True)
        names = checks.names(layer_names, "layer_names", owner)
        diagnoser = checks.diagnoser(diagnose, owner, Diagnoser)
        warn = checks.boolean(warn, "warn", owner)
        precision = checks.precision(precision, owner)
        optimizer = checks.optimizer(optimizer, owner)
        close_loggers = checks.boolean(close_loggers, "close_loggers", owner)
        objective = check_objective(objective, owner)
        if diagnoser is not None and diagnoser.max_norm is None:
            diagnoser.max_norm = max_norm
        if diagnoser is not None and diagnoser.objective is None:
            diagnoser.objective = objective
        self._rec = _Recorder(n, loggers, max_norm, names, diagnoser, warn, precision, optimizer, close_loggers, locate)
        # Delivers what is pending when the monitor is collected, or at exit (one
        # hook, weakref's, for every live monitor); close() runs it once and detaches it.
        self._finalizer = weakref.finalize(self, self._rec.close)

    @property
    def log_every_n_steps(self) -> int:
        """The window, in updates."""
        return self._rec.n

    @property
    def loggers(self) -> list[Logger]:
        """The loggers the windows go to."""
        return self._rec.loggers

    @property
    def max_norm(self) -> float | None:
        """The clipping threshold, when known."""
        return self._rec.max_norm

    @property
    def precision(self) -> str | None:
        """The run's precision, as given or inferred (None: not known)."""
        return self._rec.precision

    @property
    def optimizer(self) -> Any:
        """The optimizer whose settings are read once per window (None: none).

        May be set once it exists (a trainer builds it after the monitor); a value
        that is not an optimizer raises ``TypeError``.
        """
        return self._rec.optimizer

    @optimizer.setter
    def optimizer(self, value: Any) -> None:
        self._rec.optimizer = checks.optimizer(value, "GradNormMonitor")

    @property
    def layer_names(self) -> list[str]:
        """The names of the per-layer norms."""
        return self._rec.layer_names

    @property
    def diagnosis(self) -> Diagnosis | None:
        """The diagnosis of everything logged so far; None when the diagnosis is off.

        Before the first window, a ``"too few points"`` verdict that has read nothing (its
        :meth:`~fastnorm.Diagnosis.report` says so); ``"diagnosis failed"`` when the last window's
        diagnosis raised (reported once with a :class:`MonitorWarning`; the next window is tried again).
        """
        return self._rec.diagnosis

    @property
    def layer_window(self) -> _layer_stats.LayerWindow | None:
        """Each layer's gradient statistics over the last window (None before it, or where no step of
        it gave ``layer_stats``)."""
        return self._rec.layer_window

    @property
    def located(self) -> Any:
        """What the locator found in the last window (a :class:`~fastnorm.locate.Located`; None before the
        first window, or without ``locate``)."""
        return self._rec.located

    @property
    def transfers(self) -> int:
        """Device-to-host transfers so far: one per window."""
        return self._rec.transfers

    @property
    def logger_failures(self) -> dict[str, int]:
        """How many times each logger that failed did so (windows and close), by its repr."""
        rec = self._rec
        return {_name(lg): k for lg, k in zip(rec.loggers, rec.logger_failures) if k}

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran (or the monitor was finalized)."""
        return self._rec.closed

    # -- recording -----------------------------------------------------------

    @property
    def due(self) -> bool:
        """True when the next :meth:`update` completes a window: the step at
        which per-layer norms, if computed only then, are logged."""
        return self._rec.count == self._rec.n - 1

    def update(
        self,
        norm: Tensor | float,
        step: int | None = None,
        *,
        layers: Tensor | None = None,
        loss: Tensor | float | None = None,
        skipped: Tensor | bool | int | None = None,
        layer_stats: Tensor | None = None,
        reward: Tensor | float | None = None,
    ) -> None:
        """Records one step's norm (and loss, and skip flag); never reads a device value.

        Arguments are checked before anything is recorded; a logger's failure
        never makes this raise (see the class description).

        Args:
            norm (Tensor or float): the total norm, e.g. what :func:`~fastnorm.total_norm`
                or :func:`~fastnorm.clip_` returned (a one-element tensor).
            step (int, optional): the step to log it at. Default: one past the
                previous step (0 first).
            layers (Tensor, optional): per-layer norms, one per ``layer_names``,
                e.g. from :class:`~fastnorm.LayerGradNorms`. The latest given in a window is
                logged with it, at the step it was given.
            loss (Tensor or float, optional): the step's training loss, e.g. the
                tensor ``backward`` was called on: logged as ``gradient_norm_loss``
                and read by the diagnosis (divergence, stalls, loss-scaler skips).
            skipped (Tensor or bool, optional): whether the optimizer skipped
                this step, e.g. :attr:`StepClipper.skip_reason <fastnorm.StepClipper>`
                read after ``optimizer.step()`` (a device scalar, nonzero when
                skipped, 2 when skipped for a spike alone; copied on the device
                like the norm). Logged as ``gradient_norm_skipped`` (0, 1, or 2
                for a spike); each window counts the skipped steps (and those
                skipped for a spike)
                and leaves them out of the clipped share, and the diagnosis
                reads non-finite norms at skipped steps as skipped steps, not
                a collapse. The norm is still the one given: the norm before
                clipping, as :meth:`StepClipper.arm <fastnorm.StepClipper.arm>`
                returns it.
            layer_stats (Tensor, optional): each layer's gradient statistics at this step,
                ``(len(layer_names), 6)`` in the columns of ``fastnorm.stats.COLUMNS``, e.g. the
                third value of :meth:`LayerGradNorms.with_stats <fastnorm.LayerGradNorms.with_stats>`.
                Folded on the device into the window's (every step that gives them counts):
                :attr:`layer_window`, logged keys (``gradient_norm_locate_layers_...``) and a
                ``where:`` line of the diagnosis say which layer went non-finite first.
            reward (Tensor or float, optional): a reward-driven run's mean reward at this step
                (REINFORCE, PPO, GRPO): logged as ``gradient_norm_reward``; the run is then read as
                reward-driven (unless ``objective`` says otherwise), and a reward that never rose is
                a stall, one that fell well below its start a divergence.

        Raises:
            RuntimeError: after :meth:`close`.
            TypeError, ValueError: an argument that is not a number, or not of one value.
        """
        rec = self._rec
        if rec.closed:
            raise RuntimeError("GradNormMonitor: update() after close()")
        norm = values.scalar(norm, "norm")
        if loss is not None:
            loss = values.scalar(loss, "loss")
        if skipped is not None:
            skipped = values.flag(skipped)
        if reward is not None:
            reward = values.scalar(reward, "reward")
        if step is None:
            step = rec.next_step
        elif isinstance(step, bool) or not isinstance(step, numbers.Integral):
            raise TypeError(f"GradNormMonitor.update: step must be an int, got {step!r}")
        if layers is not None and (not isinstance(layers, Tensor) or layers.shape != (len(rec.layer_names),)):
            shape = tuple(layers.shape) if isinstance(layers, Tensor) else type(layers).__name__
            raise ValueError(
                f"GradNormMonitor.update: layers must be a tensor of shape ({len(rec.layer_names)},) "
                f"to match layer_names, got {shape}"
            )
        if layer_stats is not None:
            layer_stats = _layer_stats.check(layer_stats, len(rec.layer_names))
        rec.update(norm, int(step), layers, loss, skipped, layer_stats, reward)

    # -- the transfer ----------------------------------------------------------

    def flush(self) -> None:
        """Moves what the current window holds to the host (one transfer) and logs it.

        Called at each cadence; call it yourself to log a partial window. On
        CUDA the transfer is asynchronous and the window is logged once it has
        landed: at the next :meth:`update` that finds it there, or at :meth:`close`.
        """
        self._rec.flush()

    # -- the end ---------------------------------------------------------------

    def close(self) -> None:
        """Logs what remains (a partial window, a window in flight) and closes every logger.

        Called on leaving a ``with`` block, also when it raises; for a monitor
        never closed, when it is collected or at interpreter exit. Closing twice
        is harmless.
        """
        self._finalizer()

    def __enter__(self) -> GradNormMonitor:
        return self

    def __reduce__(self) -> Any:
        raise TypeError(
            "GradNormMonitor cannot be copied or pickled: it holds a device buffer, open loggers and the hook "
            "that delivers them at exit; make a new monitor (with new loggers) instead"
        )

    def __deepcopy__(self, memo: Any) -> Any:
        self.__reduce__()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except Exception as error:  # the loop's own exception is the one that matters
            _warn(
                f"fastnorm: closing the monitor failed ({type(error).__name__}: {error}) while the training "
                f"loop raised {exc_type.__name__}; that exception follows unchanged",
                MonitorWarning,
            )
