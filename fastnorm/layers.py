"""Per-layer gradient norms and the total norm, from one fused pass (:class:`LayerGradNorms`).

With :meth:`LayerGradNorms.with_stats` the same pass also gives each layer's
gradient statistics (``fastnorm.stats.COLUMNS``), which the monitor keeps over
every step of its window (``GradNormMonitor.update(total, layer_stats=...)``).

Part of the compute side, beside :func:`fastnorm.tensor_norms`, which it calls:
the monitoring subpackage only receives what it computes (``GradNormMonitor.update(total,
layers=per_layer)``) and never imports it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from fastnorm import _stats, checks
from fastnorm.norm import tensor_norms, tensor_stats

__all__ = ["LayerGradNorms", "combine"]


class LayerGradNorms:
    r"""Per-layer gradient norms and the total norm, from one fused pass.

    Groups the parameters of a module by the module that owns them (or by the
    first ``depth`` parts of their names), computes every parameter's norm and
    the total with :func:`fastnorm.tensor_norms`, and combines each group's
    norms on the device (p=2: root of the sum of squares; inf: max; p:
    ``(sum n^p)^(1/p)``), so nothing is read on the host.

    Args:
        named_parameters (nn.Module or iterable of (str, Tensor)): the
            parameters, e.g. ``model`` or ``model.named_parameters()``.
        depth (int, optional): group by the first ``depth`` dot-separated parts
            of each name (``depth=1``: ``encoder``, ``decoder``). Default: by
            owning module (the name without its last part).
        norm_type (float or str): the p of the p-norm. Default: 2.0.

    Example::

        >>> layers = fastnorm.LayerGradNorms(model)
        >>> monitor = fastnorm.GradNormMonitor(50, loggers, layer_names=layers.names)
        >>> total, per_layer = layers()  # after backward
        >>> fastnorm.clip_(layers.parameters, 1.0, total_norm=total)
        >>> monitor.update(total, layers=per_layer)

    Every step, with each layer's statistics too (the same single pass)::

        >>> total, per_layer, stats = layers.with_stats()
        >>> monitor.update(total, layers=per_layer, layer_stats=stats)
    """

    def __init__(self, named_parameters: Any, depth: int | None = None, norm_type: float | str = 2.0) -> None:
        if isinstance(named_parameters, torch.nn.Module):
            named_parameters = named_parameters.named_parameters()
        if depth is not None:
            depth = checks.positive_int(depth, "depth", "LayerGradNorms")
        self.norm_type = float(norm_type)
        self.parameters: list[Tensor] = []
        self.names: list[str] = []
        group_of: dict[str, int] = {}
        index: list[int] = []
        for name, param in named_parameters:
            parts = name.split(".")
            group = ".".join(parts[:depth] if depth is not None else parts[:-1]) or name
            index.append(group_of.setdefault(group, len(group_of)))
            self.parameters.append(param)
        self.names = list(group_of)
        if not self.parameters:
            raise ValueError("LayerGradNorms: no parameters given")
        self._index = torch.tensor(index)

    def __call__(self) -> tuple[Tensor, Tensor]:
        """The total norm and the per-layer norms, both on the device, without a sync.

        Returns:
            (Tensor, Tensor): the total norm (as :func:`fastnorm.total_norm`)
            and a 1-D tensor with one norm per name in :attr:`names`.
        """
        total, per_item = tensor_norms(self.parameters, self.norm_type)
        if self._index.device != per_item.device:
            self._index = self._index.to(per_item.device)  # once: it stays there
        return total, combine(per_item, self._index, len(self.names), self.norm_type)

    def with_stats(self) -> tuple[Tensor, Tensor, Tensor]:
        """The total norm, the per-layer norms and each layer's gradient statistics, from one fused pass.

        The pass that computes the total (:func:`fastnorm.tensor_stats`) also
        gives every parameter's statistics; they are combined per layer on the
        device: ``sum_sq`` and the counts add up, ``max_abs`` is the largest.
        The per-layer norms come from the same rows (p=2: the root of the
        layer's ``sum_sq``; inf: its largest |g|, NaN or inf where a value is),
        equal to those of ``self()`` up to rounding (but inf for a float64
        gradient whose squares overflow float64). Nothing is read on the host.

        Returns:
            (Tensor, Tensor, Tensor): the total norm (as :func:`fastnorm.total_norm`),
            a 1-D tensor with one norm per name in :attr:`names`, and a float64
            ``(len(names), 6)`` tensor of the columns ``fastnorm.stats.COLUMNS``.

        Raises:
            ValueError: where ``norm_type`` is neither 2 nor inf (-inf included: the statistics hold
                no other p-norm of each layer).
        """
        p = self.norm_type
        if p not in (2.0, math.inf):
            raise ValueError(
                f"LayerGradNorms.with_stats: norm_type is {p:g}; the statistics give the per-layer "
                "norms for 2 and inf only (call the LayerGradNorms itself for another p)"
            )
        total, rows = tensor_stats(self.parameters, p)
        if self._index.device != rows.device:
            self._index = self._index.to(rows.device)
        index, groups = self._index, len(self.names)
        stats = torch.zeros((groups, rows.shape[1]), dtype=rows.dtype, device=rows.device)
        stats.index_add_(0, index, rows)
        stats[:, _stats.MAX_ABS] = 0.0  # the largest of the finite maxima (all >= 0), not their sum
        stats[:, _stats.MAX_ABS].scatter_reduce_(0, index, rows[:, _stats.MAX_ABS], "amax")
        if p == math.inf:
            # sum_sq is NaN where a value is NaN and inf where one is inf: what the inf-norm is there.
            bad = stats[:, _stats.NONFINITE] > 0
            per_layer = torch.where(bad, stats[:, _stats.SUM_SQ], stats[:, _stats.MAX_ABS])
        else:
            per_layer = stats[:, _stats.SUM_SQ].sqrt()
        return total, per_layer.to(total.dtype), stats


def combine(norms: Tensor, index: Tensor, groups: int, norm_type: float) -> Tensor:
    """Combines p-norms of parts into the p-norm of each group of parts, on the device.

    Args:
        norms (Tensor): 1-D, the norm of each part.
        index (Tensor): 1-D, the group of each part, on the device of ``norms``.
        groups (int): the number of groups.
        norm_type (float): the p of the norms.

    Returns:
        Tensor: 1-D, one norm per group, in the dtype of ``norms``.
    """
    # float64, so that squares (or p-th powers) of large norms do not overflow.
    n = norms.to(torch.float64)
    out = torch.zeros(groups, dtype=torch.float64, device=norms.device)
    if math.isinf(norm_type):
        out.scatter_reduce_(0, index, n, "amax")
    elif norm_type == 1.0:
        out.index_add_(0, index, n)
    else:
        out = out.index_add_(0, index, n.pow(norm_type)).pow(1.0 / norm_type)
    return out.to(norms.dtype)
