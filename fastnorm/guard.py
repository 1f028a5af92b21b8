"""A spike rule decided on the device: skip the step whose norm (or loss) leaves its recent band.

:class:`SpikeGuard` keeps the last ``window`` applied steps' log-norms (and
losses, when given) in a device ring and flags the step whose value lies more
than ``threshold`` standard deviations above their mean, once ``warmup``
applied steps are in it. Every operation is a small tensor operation on the
norm's device: no value is read on the host, the same inputs flag the same
steps on every run and thread count, and a CUDA graph can capture it.

The defaults come from the anchors: OLMo-core skips a step whose loss or
gradient norm is more than 6 standard deviations above its last 128 steps
(after 20 of them); PaLM skipped the batches around its loss spikes. A
skipped step does not enter the statistics, so a spike does not widen the
band it is measured against; ``release_after`` consecutive spike flags end the
run of skips (the level has moved for good, e.g. a schedule change): the
statistics restart from the next step, and the flags stop until ``warmup``
applied steps are in again.

:class:`fastnorm.StepClipper` takes a guard (``skip_spikes=True`` or a
:class:`SpikeGuard`) and hands its flag to torch's fused optimizer step
through ``found_inf``, beside the non-finite flag: the step returns at once,
the parameters and the optimizer state untouched.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

import torch
from torch import Tensor

from fastnorm import checks

__all__ = ["SpikeGuard"]

# The least standard deviation the rule divides by: of the log-norm (ln units,
# a 5% band: a flag needs a 1.35x rise at z = 6), and of the loss, relative to
# its mean's size (of its log, where the loss is positive: the same 1%). A
# series that barely moves would otherwise flag a rounding-sized wobble.
_MIN_LOG_STD = 0.05
_MIN_LOSS_REL_STD = 0.01
_TINY = 1e-30  # a norm of 0 is read as this: its log stays finite


class SpikeGuard:
    r"""Flags, on the device, a step whose norm or loss spikes above its recent band.

    The rule, per step: with :math:`v = \ln(\max(\text{norm}, 10^{-30}))` and
    :math:`\mu, \sigma` the mean and standard deviation of the last ``window``
    applied steps' :math:`v` (:math:`\sigma \ge 0.05`), the step is flagged when
    :math:`(v - \mu) / \sigma > \text{threshold}`, once ``warmup`` applied
    steps are in the window; the loss, when given, by the same rule on its log
    where it and the window's losses are positive (:math:`\sigma \ge 0.01`), else
    on its value (:math:`\sigma \ge 0.01\,|\mu|`; a reward-driven loss that
    crosses 0). Only rises are flagged: a falling norm or loss is no spike. A
    non-finite norm is not a spike (the non-finite skip is
    :class:`~fastnorm.StepClipper`'s own); a non-finite loss is flagged.

    A step's gradient says nothing of the learning rate it is taken with, so a
    rate set 100x too high for one step (a schedule bug) would move the weights
    before any norm could show it. With ``lr_jump``, a step whose learning rate
    (any group's, host floats) is more than ``lr_jump`` times the largest of the
    last ``window`` steps let through (after ``warmup`` of them) is flagged as
    well: a host comparison of host numbers, no sync. A schedule that restarts
    (SGDR) jumps by design: give ``lr_jump=None``, or a larger factor.

    Call :meth:`decide` with the step's norm (and loss) before the step, and
    :meth:`commit` with whether the step was skipped after it; a
    :class:`~fastnorm.StepClipper` does both. A :meth:`decide` whose step was
    never committed is committed by the next :meth:`decide` with its own flag.

    Args:
        window (int): how many applied steps the statistics cover. Default: 128.
        threshold (float): the z-score above which a step is flagged, > 0. Default: 6.
        warmup (int): the applied steps needed before any flag, 2 <= warmup <= window. Default: 20.
        release_after (int): after this many consecutive flagged steps the run of
            skips ends: the statistics restart (a new warm-up), >= 1. Default: 50.
        lr_jump (float or None): the learning-rate rise in one step that flags it,
            > 1; None: the learning rate is not checked. Default: 10.

    Attributes:
        flagged (Tensor or None): float32 device scalar, 1 where the last
            :meth:`decide` flagged its step. None before the first.
        spikes (Tensor or None): int64 device scalar, the steps flagged so far.
        releases (Tensor or None): int64 device scalar, how many times a run of
            ``release_after`` flags restarted the statistics.

    Example::

        >>> guard = fastnorm.SpikeGuard()
        >>> clipper = fastnorm.StepClipper(optimizer, max_norm=1.0, skip_spikes=guard)
        >>> norm = clipper.arm(loss=loss)   # decides on the device
        >>> optimizer.step()                  # skipped when the norm or loss spiked
    """

    def __init__(
        self,
        window: int = 128,
        threshold: float = 6.0,
        warmup: int = 20,
        release_after: int = 50,
        lr_jump: float | None = 10.0,
    ) -> None:
        self.window = checks.positive_int(window, "window", "SpikeGuard")
        if self.window < 2:
            raise ValueError(f"SpikeGuard: window must be >= 2, got {window}")
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
            raise TypeError(f"SpikeGuard: threshold must be a number, got {type(threshold).__name__}")
        if not (math.isfinite(threshold) and threshold > 0):
            raise ValueError(f"SpikeGuard: threshold must be finite and > 0, got {threshold}")
        self.threshold = float(threshold)
        self.warmup = checks.positive_int(warmup, "warmup", "SpikeGuard")
        if not 2 <= self.warmup <= self.window:
            raise ValueError(f"SpikeGuard: warmup must be between 2 and window ({self.window}), got {warmup}")
        self.release_after = checks.positive_int(release_after, "release_after", "SpikeGuard")
        if lr_jump is not None:
            if isinstance(lr_jump, bool) or not isinstance(lr_jump, (int, float)):
                raise TypeError(f"SpikeGuard: lr_jump must be a number or None, got {type(lr_jump).__name__}")
            if not (math.isfinite(lr_jump) and lr_jump > 1):
                raise ValueError(f"SpikeGuard: lr_jump must be finite and > 1 (or None), got {lr_jump}")
            lr_jump = float(lr_jump)
        self.lr_jump = lr_jump
        # The learning rates of the last `window` steps the lr rule let through, per group (host floats).
        self._lrs: list[deque[float]] | None = None
        self._lr_run = 0  # consecutive steps the lr rule flagged
        self.flagged: Tensor | None = None
        self.spikes: Tensor | None = None
        self.releases: Tensor | None = None
        self._state: dict[str, Tensor] | None = None
        self._pending: tuple[Tensor, Tensor | None, Tensor] | None = None  # (v, loss, flag) of decide()

    def __repr__(self) -> str:
        return (
            f"SpikeGuard(window={self.window}, threshold={self.threshold}, warmup={self.warmup}, "
            f"release_after={self.release_after}, lr_jump={self.lr_jump})"
        )

    # ------------------------------------------------------------------

    def _allocate(self, device: torch.device) -> dict[str, Tensor]:
        def zeros(*shape: int, dtype: torch.dtype = torch.float64) -> Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        state = {
            "norms": zeros(self.window),
            "losses": zeros(self.window),
            "has_loss": zeros(self.window, dtype=torch.bool),
            "count": zeros(dtype=torch.int64),  # applied steps in the window (at most window)
            "pos": zeros(dtype=torch.int64),  # where the next applied step goes
            "run": zeros(dtype=torch.int64),  # consecutive flagged steps
        }
        self.spikes = zeros(dtype=torch.int64)
        self.releases = zeros(dtype=torch.int64)
        self._slots = torch.arange(self.window, device=device)
        return state

    def reset(self) -> None:
        """Forgets the statistics and the counters (e.g. after loading a checkpoint of another run)."""
        self._state = None
        self._pending = None
        self.flagged = self.spikes = self.releases = None
        self._lrs, self._lr_run = None, 0

    def _lr_jumped(self, lrs: Sequence[float | None]) -> bool:
        """Whether a group's learning rate is more than ``lr_jump`` times its largest of the last
        ``window`` steps let through (after ``warmup`` of them); a host rule on host floats."""
        if self._lrs is None or len(self._lrs) != len(lrs):
            self._lrs = [deque(maxlen=self.window) for _ in lrs]  # new groups: a new history
        jumped = False
        for history, lr in zip(self._lrs, lrs):
            if lr is None or not math.isfinite(lr):
                continue
            if len(history) >= self.warmup and lr > self.lr_jump * max(history) > 0:
                jumped = True
        self._lr_run = self._lr_run + 1 if jumped else 0
        if self._lr_run >= self.release_after:
            self._lrs, self._lr_run = None, 0  # a lasting change: the new level is the run's now
        elif not jumped:
            for history, lr in zip(self._lrs, lrs):
                if lr is not None and math.isfinite(lr):
                    history.append(lr)
        return jumped

    @staticmethod
    def _band(values: Tensor, valid: Tensor, n: Tensor) -> tuple[Tensor, Tensor]:
        """The mean and (population) standard deviation of ``values`` where ``valid``, over ``n`` of them."""
        weights = valid.to(values.dtype)
        count = n.clamp_min(1).to(values.dtype)
        mean = (values * weights).sum() / count
        var = ((values - mean).square() * weights).sum() / count
        return mean, var.sqrt()

    def decide(
        self, norm: Tensor, loss: Tensor | None = None, lrs: Sequence[float | None] | None = None
    ) -> Tensor:
        """Flags this step if its norm (or loss) spikes; nothing read on the host.

        Args:
            norm (Tensor): the step's total gradient norm (one value, on its device).
            loss (Tensor, optional): the step's loss (one value, same device);
                detached, not differentiated.
            lrs (sequence of float, optional): the learning rate this step will be taken
                with, per parameter group (host floats; None for a group whose rate is a
                Tensor: not checked). A :class:`~fastnorm.StepClipper` passes its
                optimizers' at :meth:`~fastnorm.StepClipper.arm`.

        Returns:
            Tensor: a float32 device scalar, 1 where the step should be skipped, else 0.
        """
        if not isinstance(norm, Tensor) or norm.numel() != 1:
            raise TypeError(
                "SpikeGuard.decide: norm must be a one-value Tensor, got "
                + (f"shape {tuple(norm.shape)}" if isinstance(norm, Tensor) else type(norm).__name__)
            )
        if loss is not None:
            if not isinstance(loss, Tensor) or loss.numel() != 1:
                raise TypeError(
                    "SpikeGuard.decide: loss must be a one-value Tensor (the step's loss), got "
                    + (f"shape {tuple(loss.shape)}" if isinstance(loss, Tensor) else type(loss).__name__)
                )
            if loss.device != norm.device:
                raise ValueError(f"SpikeGuard.decide: loss is on {loss.device}, the norm on {norm.device}")
        if self._pending is not None:
            self.commit(self._pending[2])
        if self._state is None:
            self._state = self._allocate(norm.device)
        s = self._state
        with torch.no_grad():
            v = norm.detach().reshape(()).to(torch.float64).clamp_min(_TINY).log()
            valid = self._slots < s["count"]
            warm = s["count"] >= self.warmup
            mean, std = self._band(s["norms"], valid, s["count"])
            spike = warm & torch.isfinite(v) & ((v - mean) / std.clamp_min(_MIN_LOG_STD) > self.threshold)
            lv = None
            if loss is not None:
                lv = loss.detach().reshape(()).to(torch.float64)
                with_loss = valid & s["has_loss"]
                n_loss = with_loss.sum()
                lmean, lstd = self._band(s["losses"], with_loss, n_loss)
                floor = (lmean.abs() * _MIN_LOSS_REL_STD).clamp_min(1e-12)
                z = (lv - lmean) / lstd.clamp_min(floor)
                # A loss positive here and all through the window is judged by its log: its spikes are
                # ratios, and a loss near 0 (a classifier that fits) has a heavy upper tail.
                positive = (lv > 0) & ((s["losses"] > 0) | ~with_loss).all()
                logs = s["losses"].clamp_min(_TINY).log()
                log_mean, log_std = self._band(logs, with_loss, n_loss)
                log_z = (lv.clamp_min(_TINY).log() - log_mean) / log_std.clamp_min(_MIN_LOSS_REL_STD)
                z = torch.where(positive, log_z, z)
                loss_spike = (n_loss >= self.warmup) & (z > self.threshold)
                spike = spike | loss_spike | ~torch.isfinite(lv)
            if lrs is not None and self.lr_jump is not None and self._lr_jumped(lrs):
                spike = spike | True
            flag = spike.to(torch.float32)
        self.flagged = flag
        self._pending = (v, lv, flag)
        return flag

    def commit(self, skipped: Tensor | None) -> None:
        """Records the step of the last :meth:`decide`: into the statistics where it was applied.

        Args:
            skipped (Tensor, optional): nonzero where the step was skipped, for any
                reason (e.g. :attr:`StepClipper.skipped <fastnorm.StepClipper>`);
                None: skipped where the guard flagged it.
        """
        if self._pending is None or self._state is None:
            return
        v, lv, flag = self._pending
        self._pending = None
        s = self._state
        with torch.no_grad():
            if skipped is None:
                skipped = flag
            applied = (skipped.detach().reshape(()) == 0) & torch.isfinite(v)
            if lv is not None:
                applied = applied & torch.isfinite(lv)
            spiked = flag.reshape(()) != 0
            pos = s["pos"].reshape(1)
            keep = applied.reshape(1)
            s["norms"].index_copy_(0, pos, torch.where(keep, v.reshape(1), s["norms"].index_select(0, pos)))
            if lv is not None:
                s["losses"].index_copy_(
                    0, pos, torch.where(keep, lv.reshape(1), s["losses"].index_select(0, pos))
                )
            has = torch.full((1,), lv is not None, dtype=torch.bool, device=v.device)
            s["has_loss"].index_copy_(0, pos, torch.where(keep, has, s["has_loss"].index_select(0, pos)))
            step = applied.to(torch.int64)
            s["pos"].copy_((s["pos"] + step) % self.window)
            s["count"].copy_((s["count"] + step).clamp_max(self.window))
            run = torch.where(spiked, s["run"] + 1, torch.zeros_like(s["run"]))
            release = run >= self.release_after
            s["count"].copy_(torch.where(release, torch.zeros_like(s["count"]), s["count"]))
            s["pos"].copy_(torch.where(release, torch.zeros_like(s["pos"]), s["pos"]))  # entries from slot 0
            s["run"].copy_(torch.where(release, torch.zeros_like(run), run))
            self.spikes.add_(spiked.to(torch.int64))
            self.releases.add_(release.to(torch.int64))
