"""A stand-in for the per-tensor statistics of ``fastnorm.stats`` until that module lands.

Same contract: ``reduce_stats(tensors, limit_dtypes=None)`` returns a float64
tensor of shape ``(n, 6)`` on the tensors' device, columns as ``COLUMNS``,
without reading anything on the host. Computed with plain torch ops, one
tensor at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

COLUMNS = ("sum_sq", "max_abs", "nonfinite", "zeros", "subnormal", "overflow")
OVERFLOW_HEADROOM = 2.0**4


def _one(t: Tensor, limit: torch.dtype) -> Tensor:
    info = torch.finfo(limit)
    a = t.detach().reshape(-1).abs()
    finite = torch.isfinite(a)
    nonzero = a != 0
    return torch.stack(
        [
            a.double().square().sum(),
            torch.where(finite, a, 0).amax().double() if a.numel() else a.new_zeros((), dtype=torch.float64),
            (~finite).sum().double(),
            (~nonzero).sum().double(),
            (nonzero & (a.double() < info.tiny)).sum().double(),
            (finite & (a.double() > info.max / OVERFLOW_HEADROOM)).sum().double(),
        ]
    )


def reduce_stats(
    tensors: Sequence[Tensor], limit_dtypes: Sequence[torch.dtype | None] | None = None
) -> Tensor:
    """Each tensor's row of statistics (see ``COLUMNS``), stacked: float64 ``(n, 6)``."""
    limits = list(limit_dtypes) if limit_dtypes is not None else [None] * len(tensors)
    return torch.stack([_one(t, limit or t.dtype) for t, limit in zip(tensors, limits)])
