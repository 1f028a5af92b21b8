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
        self,
        tensors: list[torch.Tensor],
        mode: Mode,
        p: float,
        result_dtype: torch.dtype,
        per_tensor: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        norms = _per_tensor_norms(tensors, p, accumulate_dtype(tensors[0].device))
        # Each tensor's partial, in the same [m, s] form as the kernels'.
        zeros, ones = torch.zeros_like(norms), torch.ones_like(norms)
        if mode == Mode.L2:
            rows = torch.stack([zeros, norms.square()], 1)
        elif mode == Mode.L1:
            rows = torch.stack([zeros, norms], 1)
        elif mode == Mode.LINF:
            rows = torch.stack([norms, zeros], 1)
        else:
            rows = torch.stack([norms, ones], 1)
        partial = _partial.combine(list(rows), mode, p)
        return partial, _partial.root(partial, mode, p, result_dtype), rows if per_tensor else None

    def scale_(self, tensors: list[torch.Tensor], norm: torch.Tensor, max_norm: float) -> None:
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        try:
            torch._foreach_mul_(tensors, coef)
        except (RuntimeError, NotImplementedError):
            for t in tensors:
                t.mul_(coef)


BACKEND = TorchBackend()
