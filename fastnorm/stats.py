"""Per-tensor statistics from the norm's own fused pass: what a watcher of many
tensors reads once per step to tell where values went non-finite or left the
range of their dtype.

``reduce_stats(tensors)`` reads each tensor as given (its values, never its
``.grad``) and returns one row per tensor of the columns ``COLUMNS``, which
``fastnorm._stats`` defines: the sum of squares as the norm accumulates it,
the largest finite |x|, and the exact counts of non-finite values, zeros,
nonzero values below the smallest normal of the limit dtype and finite values
above its overflow margin (``finfo(limit).max / OVERFLOW_HEADROOM``). The
tensors are read by the backend that reads them for the norm (the C++ kernel
on the CPU, Triton on CUDA, torch's ops elsewhere), one fused multi-tensor
pass per device and dtype, with no host sync. ``fastnorm.tensor_stats`` gives
the same rows together with the total norm, for parameters' gradients.

This module imports only the compute core, never the monitor.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from fastnorm import _eager
from fastnorm._collect import Items
from fastnorm._stats import (
    COLUMNS,
    MAX_ABS,
    NONFINITE,
    OVERFLOW,
    OVERFLOW_HEADROOM,
    SUBNORMAL,
    SUM_SQ,
    ZEROS,
    check_limits,
    thresholds,
)

__all__ = [
    "COLUMNS",
    "SUM_SQ",
    "MAX_ABS",
    "NONFINITE",
    "ZEROS",
    "SUBNORMAL",
    "OVERFLOW",
    "OVERFLOW_HEADROOM",
    "thresholds",
    "reduce_stats",
]


def reduce_stats(
    tensors: Sequence[Tensor], limit_dtypes: Sequence[torch.dtype | None] | None = None
) -> Tensor:
    """Each tensor's statistics, from one fused pass per dtype, without a host sync.

    Args:
        tensors (sequence of Tensors): float16, bfloat16, float32 or float64
            tensors, all on one device, each read as given (a parameter's
            values, not its ``.grad``); any shape or layout (tensors that are
            not dense are read by torch's ops).
        limit_dtypes (sequence of dtypes or None, optional): for each tensor,
            the dtype whose range it is judged by (its smallest normal and
            overflow margin), None for its own dtype: under float16 autocast, a
            float32 activation that the next op casts to float16 is judged by
            float16. Default: None (every tensor by its own dtype).

    Returns:
        Tensor: float64 ``(len(tensors), 6)`` on the tensors' device (CPU for
        no tensor), one row per tensor in the columns ``COLUMNS`` (see
        ``fastnorm._stats``): ``sum_sq``, ``max_abs`` (of the finite values),
        ``nonfinite``, ``zeros``, ``subnormal``, ``overflow``.
    """
    if isinstance(tensors, Tensor):
        raise TypeError("reduce_stats: tensors must be a sequence of Tensors, got one Tensor; wrap it in a list")
    tensors = list(tensors)
    limits = check_limits(limit_dtypes, len(tensors), "reduce_stats")
    devices = []
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"reduce_stats: tensors[{i}] is a {type(t).__name__}, not a Tensor")
        if t.device not in devices:
            devices.append(t.device)
    if len(devices) > 1:
        raise ValueError(
            f"reduce_stats: the tensors are on {len(devices)} devices ({', '.join(map(str, devices))}); "
            "give the tensors of one device per call"
        )
    if not tensors:
        return torch.zeros((0, len(COLUMNS)), dtype=torch.float64)
    with torch.no_grad():
        _, stats, _ = _eager.tensor_stats(Items(tensors, gradients=True), 2.0, None, limits)
    return stats
