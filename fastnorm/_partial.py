"""Arithmetic on partials, shared by the front, the torch backend and the collective stage.

A partial is a float64 tensor ``[m, s]`` that stands for the norm of a set of
tensors (see ``fastnorm.backends.Backend.reduce``), in a form that merges
without overflow:

* L2: the norm^2 is ``scale^2 * s``, ``scale = m`` when ``m > 0``, else 1. A
  plain sum of squares has ``m = 0``; where float64 squares would overflow or
  underflow, ``m`` is a power of two near the largest |x| and
  ``s = sum (x / m)^2``. Merging moves every ``s`` to the largest scale by
  exact powers of two, so partials with ``m = 0`` merge into the plain sum,
  bit for bit;
* L1: ``[0, sum |x|]``; LINF: ``[max |x|, 0]``;
* LP (p > 0): the norm^p is ``m^p * s``, ``m = max |x|`` (``s <= count``);
* NEG (p < 0): the norm^p is ``m^p * s``, ``m = min |x|`` (``s >= 1``); an
  empty partial is ``[inf, 0]``;
* NINF: ``[min |x|, number of elements]``; an empty partial is ``[inf, 0]``;
* ZERO: ``[0, number of tensors with a non-zero]`` (torch's ``get_total_norm``
  takes the 0-"norm" of the per-tensor counts). One tensor's own row is
  ``[0, count of non-zeros]``: ``of_tensors`` turns rows into a partial.

All ops are torch ops on the partials' device: nothing here reads a value on
the host, and NaN anywhere makes the result NaN.
"""

from __future__ import annotations

import enum

import torch


class Mode(enum.IntEnum):
    """Which reduction a norm type needs (the partials above differ by mode).

    L2, L1, LINF and LP (any other p > 0) are the fused reductions: their
    values are shared with csrc/fastnorm.h and the Triton kernels. ZERO
    (p = 0), NEG (p < 0) and NINF (p = -inf) are computed by torch's ops; each
    backend says which modes it serves (``Backend.not_supported_reasons``).
    """

    L2 = 0
    L1 = 1
    LINF = 2
    LP = 3
    ZERO = 4
    NEG = 5
    NINF = 6

    @staticmethod
    def of(p: float) -> Mode:
        if p == 2.0:
            return Mode.L2
        if p == 1.0:
            return Mode.L1
        if p == float("inf"):
            return Mode.LINF
        if p == 0.0:
            return Mode.ZERO
        if p == float("-inf"):
            return Mode.NINF
        if p < 0.0:
            return Mode.NEG
        return Mode.LP

    @property
    def fused(self) -> bool:
        """Whether this is one of the reductions the fused kernels compute."""
        return self <= Mode.LP


_MIN_MODES = (Mode.NEG, Mode.NINF)


def accumulate_dtype(device: torch.device) -> torch.dtype:
    """What partials are accumulated in on ``device``: float64 where it has it."""
    return torch.float32 if device.type == "mps" else torch.float64


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``, without a host sync towards an accelerator (pinned,
    ``non_blocking``); towards the CPU the value must be ready, which waits for it."""
    if t.device == device:
        return t
    if t.device.type == "cpu" and device.type != "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def empty(mode: Mode, device: torch.device) -> torch.Tensor:
    """The partial of no tensor at all (the identity of ``combine``)."""
    top = float("inf") if mode in _MIN_MODES else 0.0
    return torch.tensor([top, 0.0], dtype=torch.float64, device=device)


def combine(partials: list[torch.Tensor], mode: Mode, p: float) -> torch.Tensor:
    """One partial for the union of the tensors behind ``partials`` (same device)."""
    if len(partials) == 1:
        return partials[0]
    return merge(torch.stack(partials), mode, p)


def merge(stacked: torch.Tensor, mode: Mode, p: float) -> torch.Tensor:
    """``combine`` of the rows of a ``(n, 2)`` tensor of partials."""
    m, s = stacked[:, 0], stacked[:, 1]
    if mode == Mode.L2:
        top = l2_top(m, s)
        return l2_settled(top, l2_rescaled(m, s, top).sum(), l2_rescaled(m, s, l2_wide_top(top)).sum())
    if mode in (Mode.L1, Mode.ZERO):
        return torch.stack([m.new_zeros(()), s.sum()])
    if mode == Mode.LINF:
        return torch.stack([m.amax(), s.new_zeros(())])  # amax propagates NaN
    if mode == Mode.NINF:
        return torch.stack([m.amin(), s.sum()])
    top = m.amax() if mode == Mode.LP else m.amin()
    return torch.stack([top, rescaled(m, s, top, p).sum()])


def of_tensors(rows: torch.Tensor, mode: Mode, p: float) -> torch.Tensor:
    """The partial of distinct tensors from their own rows (shape ``(n, 2)``)."""
    if mode == Mode.ZERO:
        counts = rows[:, 1]
        return torch.stack([counts.new_zeros(()), (counts != 0).sum().to(counts.dtype)])
    return merge(rows, mode, p)


def rescaled(m: torch.Tensor, s: torch.Tensor, top: torch.Tensor, p: float) -> torch.Tensor:
    """``s_i * (m_i / top)^p`` (LP and NEG): scaled sums moved to the scale ``top``,
    exact where ``m_i == top`` (so inf and 0 merge)."""
    ratio = torch.where(m == top, torch.ones_like(m), m / top)
    return s * ratio.pow(p)


def l2_scale(m: torch.Tensor) -> torch.Tensor:
    """The scale an L2 partial's ``m`` stands for: ``m`` when ``m > 0``, else 1."""
    return torch.where(m > 0, m, torch.ones_like(m))


def l2_active_scale(m: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Each L2 partial's scale, 0 for an empty one (``s == 0``): never NaN, at
    least 1 for an unscaled partial, so that a MAX over partials (or ranks) is
    the scale to merge them at."""
    return torch.where(s != 0, l2_scale(m), torch.zeros_like(m))


def l2_top(m: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """The largest scale among the non-empty L2 partials (0 when all are empty)."""
    return l2_active_scale(m, s).amax()


def l2_merged_scale(top: torch.Tensor) -> torch.Tensor:
    """The ``m`` of a merged L2 partial: 0 (unscaled) when ``top`` is 0 or 1."""
    return torch.where((top == 0) | (top == 1), torch.zeros_like(top), top)


def l2_rescaled(m: torch.Tensor, s: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """Each L2 partial's ``s`` moved to the scale ``top`` (from ``l2_top``).

    The ratios are powers of two (or exactly 1), so unscaled partials keep their
    bits. inf and NaN stay inf and NaN (never ``inf * 0``); an empty partial
    stays 0 whatever its scale.
    """
    target = l2_scale(top)
    scale = l2_scale(m)
    ratio = torch.where(scale == target, torch.ones_like(scale), scale / target)
    moved = torch.where(torch.isfinite(s), s * ratio.square(), s)
    return torch.where(s == 0, torch.zeros_like(s), moved)


# Finite L2 partials whose sum overflows only when they are added are summed
# again at a scale this much larger: their sums move down by 2^-64, which fits
# any number of partials below 2^63.
L2_HEADROOM = 2.0**32


def l2_wide_top(top: torch.Tensor) -> torch.Tensor:
    """The scale of the second, overflow-proof sum beside the one at ``top``."""
    return l2_scale(top) * L2_HEADROOM


def l2_settled(top: torch.Tensor, plain: torch.Tensor, wide: torch.Tensor) -> torch.Tensor:
    """The merged L2 partial(s) ``[m, s]`` from sums of the same partials moved
    to ``top`` (``plain``) and to ``l2_wide_top(top)`` (``wide``): the plain sum,
    unless it overflowed in the addition alone (an inf element makes both inf)."""
    overflow = torch.isinf(plain) & torch.isfinite(wide)
    m = torch.where(overflow, l2_wide_top(top), l2_merged_scale(top))
    return torch.stack([m, torch.where(overflow, wide, plain)], -1)


def root(partial: torch.Tensor, mode: Mode, p: float, dtype: torch.dtype) -> torch.Tensor:
    """The norm a partial ``[m, s]`` stands for, as a tensor of ``dtype``.

    Also takes a stack of partials (shape ``(n, 2)``) and returns ``n`` norms.
    Nothing to reduce (an empty partial) gives 0 for every norm type.
    """
    m, s = partial[..., 0], partial[..., 1]
    zero = torch.zeros_like(m)
    if mode == Mode.L2:
        value = s.sqrt() * l2_scale(m)
    elif mode in (Mode.L1, Mode.ZERO):
        value = s
    elif mode == Mode.LINF:
        value = m
    elif mode == Mode.NINF:
        value = torch.where(s == 0, zero, m)
    elif mode == Mode.LP:
        value = torch.where(m == 0, zero, m * s.pow(1.0 / p))
    else:
        value = torch.where(s == 0, zero, m * s.pow(1.0 / p))
    return value.to(dtype, copy=True)  # a tensor of its own, never a view into the partial
