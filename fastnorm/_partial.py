"""Arithmetic on partials, shared by the front and the torch backend.

A partial is a tensor ``[m, s]`` (see ``fastnorm.backends.Backend.reduce``):
L2/L1 keep ``s = sum |x|^p``, LINF keeps ``m = max |x|``, LP keeps the norm^p
as ``m^p * s``, which never overflows. All ops are torch ops on the device:
nothing here reads a value on the host.
"""

from __future__ import annotations

import torch

from fastnorm.backends import Mode


def combine(partials: list[torch.Tensor], mode: Mode, p: float) -> torch.Tensor:
    """One partial for the union of the tensors behind ``partials`` (same device)."""
    if len(partials) == 1:
        return partials[0]
    stacked = torch.stack(partials)
    m, s = stacked[:, 0], stacked[:, 1]
    if mode in (Mode.L2, Mode.L1):
        return torch.stack([m.new_zeros(()), s.sum()])
    top = m.amax()  # propagates NaN
    if mode == Mode.LINF:
        return torch.stack([top, s.new_zeros(())])
    return torch.stack([top, rescaled(m, s, top, p).sum()])


def rescaled(m: torch.Tensor, s: torch.Tensor, top: torch.Tensor, p: float) -> torch.Tensor:
    """``s_i * (m_i / top)^p``: scaled sums moved to the scale ``top``, exact
    where ``m_i == top`` (so inf and 0 merge)."""
    ratio = torch.where(m == top, torch.ones_like(m), m / top)
    return s * ratio.pow(p)


def root(partial: torch.Tensor, mode: Mode, p: float, dtype: torch.dtype) -> torch.Tensor:
    """The norm a partial ``[m, s]`` stands for, as a tensor of ``dtype``.

    Also takes a stack of partials (shape ``(n, 2)``) and returns ``n`` norms.
    """
    m, s = partial[..., 0], partial[..., 1]
    if mode == Mode.L2:
        value = s.sqrt()
    elif mode == Mode.L1:
        value = s
    elif mode == Mode.LINF:
        value = m
    else:
        value = torch.where(m == 0, torch.zeros_like(m), m * s.pow(1.0 / p))
    return value.to(dtype, copy=True)  # a tensor of its own, never a view into the partial
