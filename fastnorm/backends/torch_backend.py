"""The torch backend: correct everywhere, built from torch's own ops.

Serves devices with no fused backend (MPS, XPU, ...) and any device whose
fused backend is missing. Per-tensor norms are accumulated in float64 where the
device has it (float32 otherwise), so 16-bit gradients never give a 16-bit
norm. Unlike the fused backends, ``scale_`` always rewrites the gradients (by
exactly 1.0 when nothing needs clipping), as torch does.
"""

from __future__ import annotations

import torch

from fastnorm import _partial
from fastnorm.backends import Mode


def accumulate_dtype(device: torch.device) -> torch.dtype:
    """float64 where the device supports it."""
    return torch.float32 if device.type == "mps" else torch.float64


def _per_tensor_norms(tensors: list[torch.Tensor], p: float, dtype: torch.dtype) -> torch.Tensor:
    try:
        norms = torch._foreach_norm(tensors, p, dtype=dtype)
    except (RuntimeError, NotImplementedError):  # devices without foreach kernels
        norms = [torch.linalg.vector_norm(t, p, dtype=dtype) for t in tensors]
    return torch.stack(list(norms))


class TorchBackend:
    name = "torch"

    def not_supported_reasons(self, device: torch.device) -> list[str]:
        return []

    def prepare(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return tensors

    def reduce(
        self, tensors: list[torch.Tensor], mode: Mode, p: float, result_dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = accumulate_dtype(tensors[0].device)
        if mode == Mode.LP:
            # Per-tensor norms, then the same (max, scaled sum) form as the kernels.
            norms = _per_tensor_norms(tensors, p, dtype)
            top = norms.amax()
            partial = torch.stack([top, _partial.rescaled_sum(norms, torch.ones_like(norms), top, p)])
        else:
            ord_ = float("inf") if mode == Mode.LINF else p
            norms = _per_tensor_norms(tensors, ord_, dtype)
            if mode == Mode.LINF:
                partial = torch.stack([norms.amax(), norms.new_zeros(())])
            else:
                total = norms.square().sum() if mode == Mode.L2 else norms.sum()
                partial = torch.stack([norms.new_zeros(()), total])
        return partial, _partial.root(partial, mode, p, result_dtype)

    def scale_(self, tensors: list[torch.Tensor], norm: torch.Tensor, max_norm: float) -> None:
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        try:
            torch._foreach_mul_(tensors, coef)
        except (RuntimeError, NotImplementedError):
            for t in tensors:
                t.mul_(coef)


BACKEND = TorchBackend()
