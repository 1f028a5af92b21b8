"""The float64 oracle: NumPy on the concatenated values, sharing no code with any backend."""

from __future__ import annotations

import numpy as np
import torch


def as_float64(tensors: list[torch.Tensor]) -> np.ndarray:
    parts = [t.detach().to("cpu", torch.float64).reshape(-1).numpy() for t in tensors]
    return np.concatenate(parts) if parts else np.zeros(0)


def norm(tensors: list[torch.Tensor], p: float) -> float:
    """The p-norm of all values together, in float64 (scaled so |x|^p cannot overflow)."""
    x = np.abs(as_float64(tensors))
    if x.size == 0:
        return 0.0
    if np.isnan(x).any():
        return float("nan")
    top = float(x.max())
    if p == float("inf") or top == 0.0 or np.isinf(top):
        return top
    return top * float(np.sum((x / top) ** p)) ** (1.0 / p)


def rel_err(value: float, ref: float) -> float:
    return abs(value - ref) / abs(ref) if ref != 0 else abs(value)
