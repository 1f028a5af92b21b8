"""The torch backend: correct everywhere, built from torch's own ops.

Serves devices with no fused backend (MPS, XPU, ...), tensors the fused
backends cannot read as flat (views with gaps, expanded tensors), any device
whose fused backend is missing, and the norm types only torch's ops compute
(0, negative p, -inf). Per-tensor values are accumulated in float64 where the
device has it (float32 otherwise), so 16-bit gradients never give a 16-bit
norm, and it emits the same partials as the fused backends: p-norms other than
1, 2 and inf are scaled by each tensor's largest |x| (smallest, for p < 0), and
float64 sums of squares by a power of two near it, so the norm is finite
wherever the true norm is. Unlike the fused backends, ``scale_`` always
rewrites the gradients (by exactly 1.0 when nothing needs clipping), as torch
does.
``reduce_stats`` adds each tensor's statistics (``fastnorm._stats``), a few
reductions per tensor beside the norm's own rows.
"""

from __future__ import annotations

import torch

from fastnorm import _partial, _stats
from fastnorm._partial import Mode, accumulate_dtype

# Moving a scaled sum back by a power of two is exact while the result is a
# normal float64: such rows are stored unscaled (m = 0), as a plain sum.
_SMALLEST_NORMAL = torch.finfo(torch.float64).tiny


def _norms(tensors: list[torch.Tensor], p: float, dtype: torch.dtype) -> torch.Tensor:
    """Each tensor's p-"norm" as torch computes it, in ``dtype``, stacked."""
    try:
        norms = torch._foreach_norm(tensors, p, dtype=dtype)
    except (RuntimeError, NotImplementedError):  # devices without foreach kernels
        norms = [torch.linalg.vector_norm(t, p, dtype=dtype) for t in tensors]
    return torch.stack(list(norms))


def _scaled_sums(tensors: list[torch.Tensor], scales: torch.Tensor, p: float) -> torch.Tensor:
    """``sum |x / scale|^p`` of each tensor, in the scales' dtype."""
    scaled = [t.to(scales.dtype) / k for t, k in zip(tensors, scales)]
    return _norms(scaled, p, scales.dtype).pow(p)


def _l2_rows(tensors: list[torch.Tensor], acc: torch.dtype) -> torch.Tensor:
    """L2 rows. Squares of 16- and 32-bit values neither overflow nor underflow
    in float64: a plain sum. float64 tensors are summed scaled by a power of two
    near their largest |x| (exact, so the common range keeps its bits), and the
    row is unscaled again wherever that is exact."""
    wide = [i for i, t in enumerate(tensors) if t.dtype == torch.float64]
    narrow = [i for i, t in enumerate(tensors) if t.dtype != torch.float64]
    parts = []
    if narrow:
        sums = _norms([tensors[i] for i in narrow], 2.0, acc).square()
        parts.append((narrow, torch.stack([torch.zeros_like(sums), sums], 1)))
    if wide:
        group = [tensors[i] for i in wide]
        top = _norms(group, float("inf"), acc)
        # max / scale in [1, 2); 0, inf and NaN keep the scale 1 (and their sums).
        _, exponent = torch.frexp(top)
        scale = torch.where(top > 0, torch.ldexp(torch.ones_like(top), exponent - 1), torch.ones_like(top))
        sums = _scaled_sums(group, scale, 2.0)
        plain = sums * scale.square()
        exact = (torch.isfinite(plain) & (plain >= _SMALLEST_NORMAL)) | (sums == 0) | ~torch.isfinite(sums)
        rows = torch.stack(
            [torch.where(exact, torch.zeros_like(scale), scale), torch.where(exact, plain, sums)], 1
        )
        parts.append((wide, rows))
    if len(parts) == 1:
        return parts[0][1]
    ordered: list[torch.Tensor] = [torch.empty(0)] * len(tensors)
    for positions, rows in parts:  # no index tensor: it would be copied to the device
        for i, row in zip(positions, rows):
            ordered[i] = row
    return torch.stack(ordered)


def _rows(tensors: list[torch.Tensor], mode: Mode, p: float, acc: torch.dtype) -> torch.Tensor:
    """Each tensor's own partial (see ``fastnorm._partial``), shape ``(n, 2)``."""
    if mode == Mode.L2:
        return _l2_rows(tensors, acc)
    if mode in (Mode.L1, Mode.ZERO):
        values = _norms(tensors, p, acc)  # sum |x|; the number of non-zeros
        return torch.stack([torch.zeros_like(values), values], 1)
    if mode == Mode.LINF:
        top = _norms(tensors, p, acc)
        return torch.stack([top, torch.zeros_like(top)], 1)
    if mode == Mode.NINF:
        bottom = _norms(tensors, p, acc)  # the front never passes an empty tensor
        return torch.stack([bottom, torch.ones_like(bottom)], 1)
    # LP: scaled by the largest |x|, NEG by the smallest, so that |x / m|^p <= 1.
    m = _norms(tensors, float("inf") if mode == Mode.LP else float("-inf"), acc)
    sums = _scaled_sums(tensors, m, p)
    # All zeros (LP): the root is 0. A 0 (NEG): the root is 0. inf: the root is inf.
    # NaN: the sums are NaN already.
    if mode == Mode.LP:
        sums = torch.where(m == 0, torch.zeros_like(sums), sums)
    else:
        sums = torch.where(m == 0, torch.ones_like(sums), sums)
    sums = torch.where(torch.isinf(m), torch.ones_like(sums), sums)
    return torch.stack([m, sums], 1)


def _counts(t: torch.Tensor, limit: torch.dtype | None, acc: torch.dtype) -> torch.Tensor:
    """``[max_abs, nonfinite, zeros, subnormal, overflow]`` of one tensor (``fastnorm._stats``),
    judged by ``limit`` (None: its own dtype)."""
    limit = limit or t.dtype
    tiny, margin = _stats.thresholds(limit)
    # The thresholds are exact in the tensor's own dtype; another limit's may not be.
    a = t.abs() if limit == t.dtype else t.to(torch.float64).abs()
    finite = torch.isfinite(a)
    nonzero = a != 0
    values = [
        torch.where(finite, a, torch.zeros_like(a)).amax() if a.numel() else a.new_zeros(()),
        (~finite).sum(),
        (~nonzero).sum(),
        ((a < tiny) & nonzero).sum(),
        ((a > margin) & finite).sum(),
    ]
    return torch.stack([v.to(acc) for v in values])


def stats_rows(
    tensors: list[torch.Tensor], l2: torch.Tensor, limits: list[torch.dtype | None]
) -> torch.Tensor:
    """Each tensor's statistics row (``fastnorm._stats.COLUMNS``) from its L2 row ``[m, s]``."""
    sum_sq = l2[:, 1] * _partial.l2_scale(l2[:, 0]).square()
    if not tensors:
        return l2.new_zeros((0, len(_stats.COLUMNS)))
    counts = torch.stack([_counts(t, limit, l2.dtype) for t, limit in zip(tensors, limits)])
    return torch.cat([sum_sq[:, None], counts], 1)


class TorchBackend:
    name = "torch"
    cacheable = False  # its prepared state is the tensors themselves

    def not_supported_reasons(
        self, device: torch.device, mode: Mode | None = None, dense: bool = True
    ) -> list[str]:
        return []

    def prepare(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return tensors

    def reduce(
        self,
        prepared: list[torch.Tensor],
        mode: Mode,
        p: float,
        result_dtype: torch.dtype,
        per_tensor: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        rows = _rows(prepared, mode, p, accumulate_dtype(prepared[0].device))
        partial = _partial.of_tensors(rows, mode, p)
        return partial, _partial.root(partial, mode, p, result_dtype), rows if per_tensor else None

    def reduce_stats(
        self,
        prepared: list[torch.Tensor],
        mode: Mode,
        p: float,
        result_dtype: torch.dtype,
        limits: list[torch.dtype | None],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        partial, root, rows = self.reduce(prepared, mode, p, result_dtype, per_tensor=True)
        assert rows is not None
        l2 = rows if mode == Mode.L2 else _l2_rows(prepared, accumulate_dtype(prepared[0].device))
        return partial, root, stats_rows(prepared, l2, limits)

    def scale_(self, prepared: list[torch.Tensor], norm: torch.Tensor, max_norm: float) -> None:
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        try:
            torch._foreach_mul_(prepared, coef)
        except (RuntimeError, NotImplementedError):
            for t in prepared:
                t.mul_(coef)


BACKEND = TorchBackend()
