"""From what the user passes to the tensors the backends read: validation and rules.

Rules: a parameter (an ``nn.Parameter`` or any tensor that requires grad)
stands for its ``.grad``; any other tensor is a gradient itself. Sparse
gradients contribute their (merged) values, complex ones their real view
(p=2 only), DTensors their local shard. The same memory given twice counts
once. Every check runs before any gradient is touched or any collective is
issued, so a bad argument leaves nothing half-done and no rank waiting.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Union

import torch
from torch import Tensor
from torch.nn import Parameter

from fastnorm import distributed
from fastnorm.distributed import LOCAL, Domain

TensorOrTensors = Union[Tensor, Iterable[Tensor]]

_SUPPORTED = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_SPARSE_COMPRESSED = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


def norm_type(value: float | str, fn: str) -> float:
    try:
        p = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{fn}: norm_type must be a positive number or 'inf', got {value!r}") from None
    if math.isnan(p) or p <= 0:
        raise ValueError(f"{fn}: norm_type must be > 0 (or inf), got {value!r}")
    return p


def max_norm(value: float, fn: str) -> float:
    try:
        bound = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{fn}: max_norm must be a number, got {value!r}") from None
    if math.isnan(bound) or bound < 0:
        raise ValueError(
            f"{fn}: max_norm must be >= 0, got {value!r} (a negative or NaN max_norm "
            "would flip or poison every gradient)"
        )
    return bound


def items_of(tensors: TensorOrTensors, fn: str) -> list[Any]:
    if isinstance(tensors, Tensor):
        return [tensors]
    try:
        return list(tensors)
    except TypeError:
        raise TypeError(
            f"{fn}: expected a Tensor or an iterable of Tensors, got {type(tensors).__name__}"
        ) from None


def contributes_grad(item: Tensor) -> bool:
    """A parameter (or any tensor that requires grad) stands for its ``.grad``."""
    return isinstance(item, Parameter) or item.requires_grad


def is_dense(t: Tensor) -> bool:
    """True when ``t`` covers exactly ``numel`` consecutive elements from data_ptr,
    in any order (contiguous, channels_last, any permutation): read as flat."""
    if t.is_contiguous():
        return True
    expected = 1
    for stride, size in sorted((s, n) for s, n in zip(t.stride(), t.shape) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


@dataclass
class Gradients:
    """What the items stand for, split the way the backends need it."""

    per_item: list[Tensor | None] = field(default_factory=list)  # each item's gradient
    slots: list[int | None] = field(default_factory=list)  # each item's index in `norm`
    item_domains: list[int] = field(default_factory=list)  # each item's index in `domains`
    norm: list[Tensor] = field(default_factory=list)  # local tensors to reduce
    scale: list[Tensor] = field(default_factory=list)  # local tensors to scale (differ for sparse)
    dense: list[bool] = field(default_factory=list)  # whether norm[i] and scale[i] read as flat
    domain_of: list[int] = field(default_factory=list)  # each norm tensor's index in `domains`
    domains: list[Domain] = field(default_factory=list)  # in order of first appearance
    scale_differs: bool = False  # uncoalesced sparse: scale the raw values, reduce merged ones
    result_dtype: torch.dtype = torch.float32
    first_device: torch.device | None = None
    cacheable: bool = True


def gradient_of(item: Any, position: int, fn: str) -> Tensor | None:
    """The gradient an item stands for (None when it has none), type-checked."""
    if not isinstance(item, Tensor):
        raise TypeError(f"{fn}: item {position} is a {type(item).__name__}, not a Tensor")
    if contributes_grad(item):
        grad = item.grad
        what = f"the .grad of item {position}"
    else:
        grad = item
        what = f"item {position}"
    if grad is not None and grad.dtype not in _SUPPORTED and not grad.is_complex():
        raise TypeError(
            f"{fn}: {what} has dtype {grad.dtype}; gradients must be float16, bfloat16, "
            "float32 or float64 (or complex, for norm_type=2)"
        )
    return grad


def collect(items: list[Any], p: float, fn: str, group: Any = None) -> Gradients:
    """Validates ``items`` and sorts their gradients out (see the module docstring)."""
    out = Gradients()
    seen: dict[tuple[Any, ...], int] = {}
    domain_index: dict[tuple[Any, ...], int] = {}
    # DeviceMesh's own accessors are slow (its .mesh is rebuilt on every
    # access): one domain per (mesh, placements) per call.
    mesh_domains: dict[tuple[int, Any], Domain] = {}
    plain = LOCAL if group is None else distributed.group_domain(group)

    def dtensor_domain(t: Any, position: int) -> Domain:
        key = (id(t.device_mesh), t.placements)
        if key not in mesh_domains:
            mesh_domains[key] = distributed.dtensor_domain(t, position, fn)
        return mesh_domains[key]

    def domain_id(domain: Domain) -> int:
        if domain.key not in domain_index:
            domain_index[domain.key] = len(out.domains)
            out.domains.append(domain)
        return domain_index[domain.key]

    def add(norm_t: Tensor, scale_t: Tensor, domain: int, key: Any = None) -> int | None:
        """Registers a tensor once; the same memory (or the same sparse tensor,
        ``key``) given again maps to the first one: counted once, scaled once."""
        if norm_t.numel() == 0:
            return None
        dense = is_dense(norm_t) and is_dense(scale_t)
        if key is None:
            key = (norm_t.device, norm_t.data_ptr(), norm_t.dtype, norm_t.numel())
            if not dense:  # a view with gaps: the same view, not just the same start
                key += (tuple(norm_t.shape), norm_t.stride())
        if key in seen:
            return seen[key]
        seen[key] = len(out.norm)
        if not dense:
            out.cacheable = False
        out.norm.append(norm_t)
        out.scale.append(scale_t)
        out.dense.append(dense)
        out.domain_of.append(domain)
        return len(out.norm) - 1

    for position, item in enumerate(items):
        grad = gradient_of(item, position, fn)
        out.per_item.append(grad)
        # The domain comes from the item, gradient or not, so that every rank
        # joins the same collectives even where a gradient is missing.
        source = grad if grad is not None else item
        if distributed.is_dtensor(source):
            domain = domain_id(dtensor_domain(source, position))
        else:
            domain = domain_id(plain)
        out.item_domains.append(domain)
        slot = None
        if grad is not None:
            if distributed.is_dtensor(grad):
                grad = distributed.local_tensor(grad)
            if out.first_device is None:
                out.first_device = grad.device
            if grad.dtype in (torch.float64, torch.complex128):
                out.result_dtype = torch.float64
            if grad.is_complex():
                if p != 2.0:
                    raise TypeError(
                        f"{fn}: item {position} is complex ({grad.dtype}); complex gradients are "
                        f"supported for norm_type=2 only, got {p}"
                    )
                grad = torch.view_as_real(grad)
                out.cacheable = False
            if grad.layout == torch.sparse_coo:
                # Duplicate indices add up: the norm needs them merged; scaling does not.
                merged = grad if grad.is_coalesced() else grad.coalesce()
                out.scale_differs |= merged is not grad
                slot = add(merged._values(), grad._values(), domain, key=("sparse", id(grad)))
                out.cacheable = False
            elif grad.layout in _SPARSE_COMPRESSED:
                slot = add(grad.values(), grad.values(), domain)
                out.cacheable = False
            elif grad.layout != torch.strided:
                raise TypeError(f"{fn}: item {position} has unsupported layout {grad.layout}")
            else:
                slot = add(grad, grad, domain)
        out.slots.append(slot)
    if group is not None and plain.key not in domain_index:
        domain_id(plain)  # group= always joins its collective, even with no tensor here
    return out
