"""The values given to ``GradNormMonitor.update``, checked before anything is recorded."""

from __future__ import annotations

import numbers
from typing import Any

import torch
from torch import Tensor


def dense(value: Tensor, name: str) -> None:
    """A tensor whose value can be copied into the buffer: not a meta tensor (no data), not sparse."""
    if value.is_meta or value.layout != torch.strided:
        kind = "meta" if value.is_meta else str(value.layout).replace("torch.", "")
        raise ValueError(f"GradNormMonitor.update: {name} must be a dense tensor with data, got a {kind} tensor")


def scalar(value: Any, name: str) -> Tensor | float:
    """A one-value real tensor or a real number, checked before anything is recorded."""
    if isinstance(value, Tensor):
        dense(value, name)
        if value.numel() != 1:
            raise ValueError(
                f"GradNormMonitor.update: {name} must hold one value, got shape {tuple(value.shape)}"
            )
        if value.dtype == torch.bool or value.is_complex():
            raise TypeError(f"GradNormMonitor.update: {name} must be real, got a {value.dtype} tensor")
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"GradNormMonitor.update: {name} must be a Tensor or a number, "
            f"got {value!r} ({type(value).__name__})"
        )
    return float(value)


def flag(value: Any) -> Tensor | float:
    """A skip flag: a one-value tensor (bool or real; nonzero: skipped, 2: for a spike) or a bool, 0, 1 or 2.

    numpy's scalars too. 2 is :attr:`StepClipper.skip_reason <fastnorm.StepClipper>`'s code of a step
    skipped for a spike alone.
    """
    if isinstance(value, Tensor):
        dense(value, "skipped")
        if value.numel() != 1:
            raise ValueError(
                f"GradNormMonitor.update: skipped must hold one value, got shape {tuple(value.shape)}"
            )
        if value.is_complex():
            raise TypeError(f"GradNormMonitor.update: skipped must be real, got a {value.dtype} tensor")
        return value
    if getattr(value, "shape", None) == () and callable(getattr(value, "item", None)):
        value = value.item()  # a numpy bool or number (np.True_, np.int64(1)), as the Python one
    if not isinstance(value, numbers.Real):
        raise TypeError(
            "GradNormMonitor.update: skipped must be a one-value Tensor (e.g. StepClipper.skipped) "
            f"or a bool, got {value!r} ({type(value).__name__})"
        )
    if value not in (0, 1, 2):
        raise ValueError(
            f"GradNormMonitor.update: skipped must be True/False, or 0, 1 or 2 (a spike), got {value!r}"
        )
    return float(value)
