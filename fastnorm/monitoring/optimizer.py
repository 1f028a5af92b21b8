"""What the monitor reads of an optimizer: its settings and the precision its parameters show.

Read on the host from ``param_groups``, never a device value (no sync): a
setting held in an accelerator's tensor is left out. Imports nothing of the
monitoring package.
"""

from __future__ import annotations

import numbers
from typing import Any

import torch
from torch import Tensor


def _host_number(value: Any) -> float | None:
    """A setting as a float, read without a sync: a CPU tensor is read, an accelerator's is not."""
    if isinstance(value, Tensor):
        return float(value) if value.device.type == "cpu" and value.numel() == 1 else None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(value)


def optimizer_lr(optimizer: Any) -> float | None:
    """The largest learning rate over the parameter groups, read on the host (None when none is)."""
    values = [v for g in optimizer.param_groups if (v := _host_number(g.get("lr"))) is not None]
    return max(values) if values else None


def optimizer_settings(optimizer: Any) -> dict[str, float]:
    """The optimizer's settings, as the monitor logs them (see ``fastnorm.monitoring.series``).

    The largest learning rate and weight decay over the parameter groups (a group without decay
    beside one with it is common), the smallest ``eps``, the first group's betas or momentum.
    Read on the host from ``param_groups``: a setting held in an accelerator's tensor is left out.
    """
    groups = optimizer.param_groups
    found: dict[str, float] = {}
    for name, pick in (("lr", max), ("weight_decay", max), ("eps", min)):
        values = [v for g in groups if (v := _host_number(g.get(name))) is not None]
        if values:
            found[name] = pick(values)
    first = groups[0] if groups else {}
    betas = first.get("betas")
    if isinstance(betas, (tuple, list)) and len(betas) == 2:
        for name, value in zip(("beta1", "beta2"), betas):
            if (v := _host_number(value)) is not None:
                found[name] = v
    if (v := _host_number(first.get("momentum"))) is not None:
        found["momentum"] = v
    return found


def precision_of(optimizer: Any) -> str | None:
    """The precision the parameters' dtype shows: pure bf16 or fp16; None for fp32 (autocast or not)."""
    dtypes = {p.dtype for g in optimizer.param_groups for p in g.get("params", ()) if isinstance(p, Tensor)}
    if dtypes == {torch.bfloat16}:
        return "bf16"
    if dtypes == {torch.float16}:
        return "fp16"
    if dtypes == {torch.float64}:
        return "fp64"
    return None
