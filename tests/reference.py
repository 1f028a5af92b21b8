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


def total_norm(tensors: list[torch.Tensor], p: float) -> float:
    """What torch's get_total_norm means for every p, in float64, scaled so that
    no power overflows or underflows: the p-norm of the concatenated values for
    p > 0, the smallest |x| for -inf, the norm scaled by the smallest |x| for
    p < 0, and for p = 0 the number of tensors that hold a non-zero (torch takes
    the 0-"norm" of the per-tensor counts of non-zeros)."""
    if p > 0:
        return norm(tensors, p)
    if p == 0:
        return float(sum(bool(np.any(as_float64([t]) != 0)) for t in tensors if t.numel()))
    x = np.abs(as_float64(tensors))
    if x.size == 0:
        return 0.0
    if np.isnan(x).any():
        return float("nan")
    bottom = float(x.min())
    if p == float("-inf") or bottom == 0.0 or np.isinf(bottom):
        return bottom
    with np.errstate(over="ignore"):  # a ratio past float64's range: its power is 0, exactly
        return bottom * float(np.sum((x / bottom) ** p)) ** (1.0 / p)


def torch_clip_loop(layers: tuple[int, int, int], batch: int, steps: int = 3, seed: int = 0) -> list[float]:
    """The pre-clip norms of a short loop clipped by torch, in float64: a
    Linear-ReLU-Linear model of widths ``layers`` and SGD (lr 0.1), built and fed
    after ``torch.manual_seed(seed)``, as the README's and the examples' loops do,
    so from the same draws. The caller's random state is left as it was."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        d_in, hidden, d_out = layers
        model = torch.nn.Sequential(
            torch.nn.Linear(d_in, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, d_out)
        ).double()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        norms = []
        for _ in range(steps):
            loss = model(torch.randn(batch, d_in).double()).square().mean()
            loss.backward()
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0).item())
            optimizer.step()
            optimizer.zero_grad()
    return norms
