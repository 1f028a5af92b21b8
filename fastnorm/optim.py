"""Clipping folded into torch's fused optimizer step: no extra pass, no sync.

torch's fused ``Adam``, ``AdamW``, ``SGD`` and ``Adagrad`` (``fused=True``)
read two optional device scalars from the optimizer, ``grad_scale`` and
``found_inf``: the hook :class:`torch.amp.GradScaler` uses. The step divides
every gradient by ``grad_scale`` in the pass that already reads it, and
returns at once, leaving parameters and state as they were, when
``found_inf == 1``. :class:`StepClipper` hands them the clip coefficient
(``grad_scale = 1 / min(1, max_norm / (norm + 1e-6))``) and the non-finite
flag, so clipping costs no pass of its own and a step with a NaN or inf norm
is skipped on the device.

The attributes exist only inside ``step()``: a step pre-hook sets them,
composed with what a ``GradScaler`` set, and a post-hook puts back what was
there before, so ``GradScaler.step`` still finds and deletes its own.
"""

from __future__ import annotations

import inspect
import warnings
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Union

import torch
from torch import Tensor
from torch.optim import Optimizer

from fastnorm import _eager, checks
from fastnorm import norm as _norm
from fastnorm.guard import SpikeGuard

__all__ = ["StepClipper", "not_supported_reasons"]

Optimizers = Union[Optimizer, Iterable[Optimizer]]

_ATTRS = ("grad_scale", "found_inf")
_ABSENT = object()
_FLOAT32_MAX = torch.finfo(torch.float32).max

# The torch steps that pass the optimizer's grad_scale and found_inf to their
# fused kernels (AdamW inherits Adam's step). A subclass that overrides step()
# may ignore them: it is not on this list, so it falls back.
_FOLDING_STEPS = frozenset(
    inspect.unwrap(cls.step) for cls in (torch.optim.Adam, torch.optim.SGD, torch.optim.Adagrad)
)

# Every clipper's optimizers: one optimizer has at most one clipper. The clipper
# is held weakly too: it holds its optimizers, so a strong value would keep every
# key (the optimizer, its parameters and state) alive for the process's life.
_CLIPPER_OF: weakref.WeakKeyDictionary[Optimizer, weakref.ref[StepClipper]] = weakref.WeakKeyDictionary()


def not_supported_reasons(optimizer: Optimizer) -> list[str]:
    """Why ``optimizer.step()`` cannot apply the clip itself (empty when it can).

    Args:
        optimizer (Optimizer): the optimizer to check.

    Returns:
        list[str]: one line per reason; empty for torch's ``Adam``, ``AdamW``,
        ``SGD`` and ``Adagrad`` whose every parameter group is ``fused=True``.
    """
    name = type(optimizer).__name__
    step = inspect.unwrap(type(optimizer).step)
    if step not in _FOLDING_STEPS:
        return [
            f"{name}.step() does not take torch's grad_scale/found_inf (only torch's own Adam, "
            "AdamW, SGD and Adagrad do, built with fused=True)"
        ]
    unfused = [i for i, g in enumerate(optimizer.param_groups) if not g.get("fused")]
    if unfused:
        return [f"{name}: param groups {unfused} are not fused (build the optimizer with fused=True)"]
    return []


@dataclass
class _Installed:
    """What the pre-hook set on one optimizer, and what it replaced."""

    previous: tuple[Any, Any]
    mine: tuple[Tensor, Tensor | None]  # the grad_scale and found_inf it set
    # Fused SGD with momentum at its first step: the parameters whose momentum
    # buffers torch creates uninitialized, and the groups' dampening.
    first_sgd: list[tuple[list[Tensor], float]]


class StepClipper:
    r"""Clips the gradients inside the optimizer's own step; skips non-finite steps on the device.

    Replaces ``fastnorm.clip_(params, max_norm)`` (or
    :func:`torch.nn.utils.clip_grad_norm_`) followed by ``optimizer.step()``.
    :meth:`arm` computes the total norm of the optimizers' gradients in one
    fused pass, as :func:`fastnorm.total_norm` does, and writes nothing; the
    next ``optimizer.step()`` divides each gradient by
    ``1 / min(1, max_norm / (norm + 1e-6))`` while it reads it, and when the
    norm is NaN or inf it leaves the parameters and the optimizer state as they
    were. No value is read on the host.

    Folding needs torch's ``Adam``, ``AdamW``, ``SGD`` or ``Adagrad`` with
    ``fused=True`` (see :func:`not_supported_reasons`). Any other optimizer
    is clipped by :func:`fastnorm.clip_` with the same norm, after a one-time
    warning: torch's behaviour, a non-finite step is not skipped. With
    ``strict=True`` such an optimizer raises instead.

    With :class:`torch.amp.GradScaler`, follow torch's recipe: ``scaler.unscale_(optimizer)``
    before :meth:`arm`, then ``scaler.step(optimizer)``. The step then skips
    when either the scaler or the norm says so. Without ``unscale_`` the
    clip is still right (the coefficient is computed, in float64, from the norm
    divided by the scale the step unscales by), but :meth:`arm` returns the
    norm of the scaled gradients, which may be inf in float32 while they are
    finite; the step skips only when they are not. Where the scale times the
    coefficient passes float32's range (scales near 2^127), the step's
    ``grad_scale`` cannot hold it: the gradients are then unscaled in place
    first, as ``unscale_`` does, and the step divides by the coefficient alone.

    Args:
        optimizers (Optimizer or iterable of Optimizers): the optimizers whose
            steps apply the clip; the norm is taken over all their gradients
            together (each parameter once), as one ``clip_`` over all of them.
        max_norm (float): the largest norm allowed, >= 0.
        norm_type (float or str): the p of the p-norm (see :func:`fastnorm.total_norm`).
            Default: 2.0.
        skip_nonfinite (bool): skip the step when the norm is NaN or inf
            (default). False keeps torch's behaviour: every gradient is scaled
            by the non-finite coefficient (0 for an inf norm, NaN for a NaN
            one) and the step is applied.
        skip_spikes (bool or SpikeGuard): also skip the step whose norm (or
            loss, given to :meth:`arm`) spikes above its recent band, decided on
            the device by a :class:`~fastnorm.SpikeGuard` (True: one with the
            defaults, z > 6 over the last 128 applied steps after 20). The flag
            reaches the fused step through ``found_inf``, as the non-finite one
            does. An optimizer that cannot fold applies its step: its gradients
            are multiplied by 0 at a spike, which freezes plain SGD but not an
            optimizer with momentum or weight decay (Adam's moments decay and its
            update goes on); ``strict=True`` refuses such an optimizer. Default: False.
        strict (bool): raise a ValueError for an optimizer that cannot fold
            the clip, instead of clipping it with a separate pass. Default: False.
        group (ProcessGroup, optional): see :func:`fastnorm.total_norm`.

    Attributes:
        skipped (Tensor or None): a float32 device scalar, 1 when the steps
            armed by the last :meth:`arm` skipped (non-finite norm, or a
            ``GradScaler`` that found an inf), else 0; read it after the steps
            (a ``GradScaler``'s flag joins it in ``step()``), e.g. for
            ``GradNormMonitor.update(norm, skipped=clipper.skip_reason)``. An
            optimizer that cannot fold applies its step: once its ``step()``
            has run, ``skipped`` is 0. None before the first :meth:`arm`.
        skip_reason (Tensor or None): a float32 device scalar: 0 where the
            steps were applied, 1 where they were skipped for a non-finite norm
            (or a ``GradScaler``'s inf), 2 where they were skipped for a spike
            alone; what :meth:`GradNormMonitor.update <fastnorm.GradNormMonitor.update>`
            logs as ``gradient_norm_skipped``. None before the first :meth:`arm`.
        guard (SpikeGuard or None): the spike rule (``skip_spikes``); may be
            replaced or set to None between steps.

    Example::

        >>> optimizer = torch.optim.AdamW(model.parameters(), fused=True)
        >>> clipper = fastnorm.StepClipper(optimizer, max_norm=1.0)
        >>> for batch in loader:
        ...     model(batch).mean().backward()
        ...     norm = clipper.arm()     # the norm before clipping; nothing written
        ...     optimizer.step()           # clips and steps in one pass
        ...     optimizer.zero_grad(set_to_none=True)
    """

    def __init__(
        self,
        optimizers: Optimizers,
        max_norm: float,
        norm_type: float | str = 2.0,
        *,
        skip_nonfinite: bool = True,
        skip_spikes: bool | SpikeGuard = False,
        strict: bool = False,
        group: Any = None,
    ) -> None:
        self.max_norm = checks.max_norm(max_norm, "StepClipper")
        self.norm_type = checks.norm_type(norm_type, "StepClipper")
        opts = [optimizers] if isinstance(optimizers, Optimizer) else list(optimizers)
        for opt in opts:
            if not isinstance(opt, Optimizer):
                raise TypeError(f"StepClipper: optimizers must be torch Optimizers, got {type(opt).__name__}")
        if not opts:
            raise ValueError("StepClipper: optimizers is empty")
        if len({id(o) for o in opts}) != len(opts):
            raise ValueError("StepClipper: the same optimizer is given twice")
        for opt in opts:
            if opt in _CLIPPER_OF and _CLIPPER_OF[opt]() is not None:
                raise ValueError(
                    f"StepClipper: this {type(opt).__name__} already has a StepClipper "
                    "(call its remove() first)"
                )
        reasons = {id(o): not_supported_reasons(o) for o in opts}
        if strict and any(reasons.values()):
            raise ValueError(
                "StepClipper(strict=True): these optimizers cannot apply the clip in their step:\n  "
                + "\n  ".join(r for o in opts for r in reasons[id(o)])
            )
        if isinstance(skip_spikes, SpikeGuard):
            guard: SpikeGuard | None = skip_spikes
        elif isinstance(skip_spikes, bool):
            guard = SpikeGuard() if skip_spikes else None
        else:
            raise TypeError(
                f"StepClipper: skip_spikes must be a bool or a fastnorm.SpikeGuard, got {type(skip_spikes).__name__}"
            )
        self.optimizers = opts
        self.guard = guard
        self.skip_nonfinite = bool(skip_nonfinite)
        self.strict = bool(strict)
        self.group = group
        self.skipped: Tensor | None = None
        # The last arm()'s own skip flags: its norm's, and the float64 norm's (for
        # gradients a GradScaler multiplied, whose float32 norm may overflow).
        self._nonfinite: Tensor | None = None
        self._wide_nonfinite: Tensor | None = None
        self._spike: Tensor | None = None  # the guard's flag of the last arm()
        self._spike_guard: SpikeGuard | None = None  # the guard that set it, to commit the step to
        self._skip_counted = False  # a step armed by the last arm() set `skipped` already
        self._folding = [o for o in opts if not reasons[id(o)]]
        self._separate = [o for o in opts if reasons[id(o)]]
        # id(optimizer) -> the norm its next step clips by, as returned and in float64
        self._pending: dict[int, tuple[Tensor, Tensor]] = {}
        self._armed_separate: set[int] = set()  # the optimizers that cannot fold, armed by arm()
        self._separate_applied = False  # one of them stepped since arm(): not every step was skipped
        self._installed: dict[int, _Installed] = {}
        self._handles: list[Any] = []
        self._removed = False
        for opt in self._folding:
            self._handles.append(opt.register_step_pre_hook(self._pre_step))
            self._handles.append(opt.register_step_post_hook(self._post_step))
        for opt in self._separate:
            self._handles.append(opt.register_step_pre_hook(self._separate_step))
        for opt in opts:
            _CLIPPER_OF[opt] = weakref.ref(self)
        for opt in self._separate:
            spikes = (
                " A spike zeroes its gradients, but the step is applied (momentum and weight decay move on)."
                if guard is not None
                else ""
            )
            warnings.warn(
                f"StepClipper: {'; '.join(reasons[id(opt)])}. Its gradients are clipped by "
                "fastnorm.clip_ in a separate pass, and a step with a non-finite norm is "
                f"applied, as torch does.{spikes} (strict=True makes this an error.)",
                stacklevel=2,
            )

    # ------------------------------------------------------------------
    # The loop's side
    # ------------------------------------------------------------------

    def parameters(self) -> list[Tensor]:
        """Every parameter of the optimizers, each once, in order."""
        seen: set[int] = set()
        params = []
        for opt in self.optimizers:
            for g in opt.param_groups:
                for p in g["params"]:
                    if id(p) not in seen:
                        seen.add(id(p))
                        params.append(p)
        return params

    @property
    def skip_reason(self) -> Tensor | None:
        """Why the last armed steps were skipped: 0 applied, 1 non-finite (or the scaler's inf), 2 a spike."""
        if self.skipped is None:
            return None
        if self._spike is None:
            return self.skipped.to(torch.float32)
        # Skipped without the guard's flag: the scaler's inf; with it: a spike, unless the norm was non-finite.
        hard = self._spike == 0
        if self._nonfinite is not None:
            hard = hard | (self._nonfinite > 0)
        return torch.where(self.skipped == 0, 0.0, torch.where(hard, 1.0, 2.0)).to(torch.float32)

    def _lrs(self) -> list[float | None]:
        """Each group's learning rate, as set for the coming step (None where it is a Tensor: not read)."""
        return [
            None if isinstance(g.get("lr"), Tensor) or not isinstance(g.get("lr"), (int, float)) else float(g["lr"])
            for opt in self.optimizers
            for g in opt.param_groups
        ]

    def _commit_guard(self) -> None:
        """Tells the guard whether the last armed steps were skipped (the weights untouched)."""
        guard, self._spike_guard = self._spike_guard, None
        if guard is None or self.skipped is None or self._spike is None:
            return
        guard.commit(torch.maximum(self.skipped, self._spike))

    def arm(self, *, total_norm: Tensor | None = None, loss: Tensor | None = None) -> Tensor:
        r"""Computes the norm and arms each optimizer's next ``step()`` to clip by it.

        Writes no gradient of a folding optimizer and reads nothing on the
        host. The next ``step()`` of each optimizer applies the clip (and the
        skip); an ``arm()`` not followed by a step is replaced by the next one.

        Args:
            total_norm (Tensor, optional): a norm already computed over the
                same gradients (e.g. by :func:`fastnorm.tensor_norms` for a
                monitor). It is used as is: no second reduction.
            loss (Tensor, optional): the step's loss, for the spike rule
                (``skip_spikes``); ignored without a guard. The guard also reads
                the learning rates the optimizers hold now (set them before, as a
                scheduler stepped after the last ``step()`` does).

        Returns:
            Tensor: the total norm before clipping (see :func:`fastnorm.total_norm`).
        """
        if self._removed:
            raise RuntimeError("StepClipper.arm: this clipper was removed")
        for opt in self._folding:
            reasons = not_supported_reasons(opt)
            if reasons:
                raise RuntimeError(f"StepClipper.arm: {'; '.join(reasons)} (changed since construction)")
        if total_norm is not None and not isinstance(total_norm, Tensor):
            raise TypeError(f"StepClipper.arm: total_norm must be a Tensor, got {type(total_norm).__name__}")
        if total_norm is not None and total_norm.numel() != 1:
            raise ValueError(
                f"StepClipper.arm: total_norm must hold one value, got shape {tuple(total_norm.shape)}"
            )
        if loss is not None and not isinstance(loss, Tensor):
            raise TypeError(f"StepClipper.arm: loss must be a Tensor, got {type(loss).__name__}")
        for opt in self._folding:
            self._uninstall(opt)  # left by a step that raised
        self._commit_guard()
        params = self.parameters()
        if total_norm is not None:
            norm = wide = total_norm.reshape(())
        elif torch.compiler.is_compiling():  # the op gives the norm in its own dtype only
            norm = wide = _norm.total_norm(params, self.norm_type, group=self.group)
        else:
            wide, plan = _eager.total_norm(params, self.norm_type, self.group, False, torch.float64)
            _norm.warn_if_no_gradient("StepClipper.arm", len(params), plan)
            norm = wide.to(plan.result_dtype)
        if self.skip_nonfinite:
            self._nonfinite = torch.isfinite(norm).logical_not_().to(torch.float32)
            self._wide_nonfinite = torch.isfinite(wide).logical_not_().to(torch.float32)
        else:
            self._nonfinite = self._wide_nonfinite = None
        self._spike = self._spike_guard = None
        if self.guard is not None:
            if loss is not None and loss.device != norm.device:
                loss = loss.detach().to(norm.device, non_blocking=True)
            self._spike = self.guard.decide(norm, loss, self._lrs() if self.guard.lr_jump is not None else None)
            self._spike_guard = self.guard
        skip = _either(self._nonfinite, self._spike)
        self.skipped = skip if skip is not None else torch.zeros((), dtype=torch.float32, device=norm.device)
        self._skip_counted = False
        for opt in self._folding:
            self._pending[id(opt)] = (norm, wide)
        self._armed_separate = {id(opt) for opt in self._separate}
        self._separate_applied = False
        if self._separate:
            separate = [p for opt in self._separate for g in opt.param_groups for p in g["params"]]
            by = norm if self._spike is None else torch.where(self._spike > 0, torch.inf, norm)
            _norm.clip_(separate, self.max_norm, self.norm_type, total_norm=by, group=self.group)
        return norm

    def remove(self) -> None:
        """Detaches the clipper from its optimizers (their steps no longer clip)."""
        self._removed = True
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for opt in self._folding:
            self._uninstall(opt)
        self._pending.clear()
        self._armed_separate.clear()
        for opt in self.optimizers:
            ref = _CLIPPER_OF.get(opt)
            if ref is not None and ref() is self:
                del _CLIPPER_OF[opt]

    def __enter__(self) -> StepClipper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        names = ", ".join(type(o).__name__ for o in self.optimizers)
        return (
            f"StepClipper([{names}], max_norm={self.max_norm}, norm_type={self.norm_type}, "
            f"skip_nonfinite={self.skip_nonfinite}, folding={len(self._folding)}/{len(self.optimizers)})"
        )

    # ------------------------------------------------------------------
    # The step's side
    # ------------------------------------------------------------------

    # Traced by dynamo, the attributes set here are deferred side effects that
    # the fused step (which torch never traces) does not see: run these eagerly.
    @torch.compiler.disable
    def _pre_step(self, opt: Optimizer, args: Any, kwargs: Any) -> None:
        self._uninstall(opt)
        pending = self._pending.pop(id(opt), None)
        if pending is None:
            return  # a step without arm(): nothing to fold
        norm, wide = pending
        previous = (vars(opt).get("grad_scale", _ABSENT), vars(opt).get("found_inf", _ABSENT))
        outer_scale, outer_inf = (None if v is _ABSENT else v for v in previous)
        with torch.no_grad():
            if outer_scale is None:
                # 1 / min(1, max_norm / (norm + 1e-6)) in one division; NaN stays NaN.
                grad_scale = torch.clamp_min((norm + 1e-6) / self.max_norm, 1.0)
                found_inf = _either(self._nonfinite, self._spike)
            else:
                grad_scale = self._unscaling_grad_scale(opt, wide, outer_scale)
                found_inf = _either(self._wide_nonfinite, self._spike)
            grad_scale = grad_scale.to(torch.float32)  # what the fused kernels read
            if outer_inf is not None:
                outer = torch.as_tensor(outer_inf, device=norm.device).to(torch.float32)
                # The kernels skip only when found_inf == 1 exactly: a sum could make 2.
                found_inf = outer if found_inf is None else torch.maximum(found_inf, outer)
            if found_inf is not None and not self._separate_applied:
                # Each armed step's flag, not arm()'s first guess, which may be
                # the float32 norm's where this step reads the float64 one.
                if self._skip_counted:
                    self.skipped = torch.maximum(self.skipped, found_inf)
                else:
                    self.skipped = found_inf
                self._skip_counted = True
        opt.grad_scale = grad_scale
        if found_inf is None:
            vars(opt).pop("found_inf", None)
        else:
            opt.found_inf = found_inf
        first_sgd = _sgd_first_step(opt) if found_inf is not None and isinstance(opt, torch.optim.SGD) else []
        self._installed[id(opt)] = _Installed(previous, (grad_scale, found_inf), first_sgd)

    def _unscaling_grad_scale(self, opt: Optimizer, wide: Tensor, outer_scale: Any) -> Tensor:
        """The ``grad_scale`` that unscales and clips ``opt``'s gradients, which a
        ``GradScaler`` multiplied by ``outer_scale`` (no ``unscale_``) and whose
        norm is ``wide`` (float64): ``outer_scale`` over the clip coefficient.

        Computed in float64. Where that passes float32's range (scales near
        2^127), the gradients are unscaled in place first, as ``unscale_`` does
        (by the float32 ``1 / scale``), and the step divides by the coefficient
        alone. That write is decided on the device: ``clip_`` by a norm of
        ``scale`` scales by exactly ``1 / scale``, and by a norm of 0 writes
        nothing (on the fused backends).
        """
        scale = torch.as_tensor(outer_scale, device=wide.device).to(torch.float64)
        coefficient = torch.clamp_min((wide / scale + 1e-6) / self.max_norm, 1.0)
        divisor = coefficient * scale
        unscale = (divisor > _FLOAT32_MAX) & torch.isfinite(divisor)
        params = [p for g in opt.param_groups for p in g["params"]]
        _norm.clip_(params, 1.0, total_norm=torch.where(unscale, scale, torch.zeros_like(scale)))
        return torch.where(unscale, coefficient, divisor)

    @torch.compiler.disable
    def _separate_step(self, opt: Optimizer, args: Any, kwargs: Any) -> None:
        """An optimizer that cannot fold applies its step, whatever the norm: not every step skipped."""
        if id(opt) not in self._armed_separate:
            return
        self._armed_separate.discard(id(opt))
        if not self._separate_applied:
            self._separate_applied = True
            self.skipped = torch.zeros_like(self.skipped)

    @torch.compiler.disable
    def _post_step(self, opt: Optimizer, args: Any, kwargs: Any) -> None:
        installed = self._installed.get(id(opt))
        if installed is None:
            return
        found_inf = vars(opt).get("found_inf")
        self._uninstall(opt)
        for params, dampening in installed.first_sgd:
            _forget_skipped_first_step(opt, params, dampening, found_inf)

    def _uninstall(self, opt: Optimizer) -> None:
        """Puts back what the pre-hook replaced, where it is still there.

        After ``step()``, and also after a step that raised (then from the next
        ``arm()`` or step pre-hook). An attribute someone replaced since (a
        ``GradScaler`` stepping after a step that raised) is theirs: kept.
        """
        installed = self._installed.pop(id(opt), None)
        if installed is None:
            return
        current = tuple(vars(opt).get(a, _ABSENT) for a in _ATTRS)
        scaler_now = current[1] is not installed.mine[1] and current[1] is not _ABSENT
        for attr, now, mine, before in zip(_ATTRS, current, installed.mine, installed.previous):
            if now is not mine:
                continue
            if before is not _ABSENT:
                setattr(opt, attr, before)
            elif scaler_now:
                # GradScaler (after unscale_) copied our stale grad_scale and will
                # delete the attribute after the step: leave what it meant, None.
                setattr(opt, attr, None)
            else:
                vars(opt).pop(attr, None)


def _either(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    """The larger of two optional 0/1 flags (the fused kernels skip only at exactly 1)."""
    if a is None or b is None:
        return a if b is None else b
    return torch.maximum(a, b)


def _sgd_first_step(opt: Optimizer) -> list[tuple[list[Tensor], float]]:
    """The fused SGD groups with momentum about to take their first step."""
    first = []
    for g in opt.param_groups:
        if g["momentum"] == 0:
            continue
        # torch's own test (every buffer missing), cut short at the first
        # parameter with a gradient: a buffer there means a later step.
        lead = next((p for p in g["params"] if p.grad is not None), None)
        if lead is None or "momentum_buffer" in opt.state.get(lead, {}):
            continue
        params = [p for p in g["params"] if p.grad is not None]
        if all("momentum_buffer" not in opt.state.get(p, {}) for p in params):
            first.append((params, float(g["dampening"])))
    return first


def _forget_skipped_first_step(
    opt: Optimizer, params: list[Tensor], dampening: float, found_inf: Tensor
) -> None:
    """Undoes what a skipped first step of fused SGD leaves behind.

    torch creates the momentum buffers with ``empty_like`` before the kernel,
    which then skips, so they hold garbage that the next step would take as
    momentum. With ``dampening == 0`` a zero buffer is exactly a first step
    (``0 * momentum + grad``), so they are zeroed on the device; otherwise the
    buffers must go, which needs the flag on the host (once, at the first step).
    """
    buffers = [opt.state[p]["momentum_buffer"] for p in params]
    if dampening == 0:
        mask = found_inf.to(torch.bool)
        with torch.no_grad():
            for b in buffers:
                b.masked_fill_(mask.to(b.device), 0)
    elif bool(found_inf):
        for p in params:
            del opt.state[p]["momentum_buffer"]
