"""From what the user passes to the tensors the backends read: the item rule and validation.

The item rule, in one place (docs/rules.md, "Rules", says the same):

* an ``nn.Parameter``, a leaf tensor that requires grad, and any tensor whose
  ``.grad`` is set are *parameters*: each stands for its ``.grad`` (None:
  skipped) and is itself never read as a gradient and never written;
* any other tensor (a non-leaf tensor, such as ``torch.autograd.grad(...,
  create_graph=True)`` returns, or a plain tensor with neither ``.grad`` nor
  ``requires_grad``) is a *gradient* itself for ``total_norm`` and
  ``tensor_norms``;
* ``clip_`` writes only gradients of parameters, and skips every other item
  exactly as torch's ``clip_grad_norm_`` does (norm and scale), unless it is
  told with ``gradients=True`` that every item is a gradient; it then refuses
  any parameter.

Sparse gradients contribute their (merged) values, complex ones their real
view (p=2 only; conjugated views are read through their memory, which has the
same magnitudes and scales alike), DTensors their local shard. The same memory
given twice counts once. Every check runs before any gradient is touched or
any collective is issued, so a bad argument leaves nothing half-done and no
rank waiting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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


def items_of(tensors: TensorOrTensors, fn: str) -> list[Any]:
    """The items of a call, as a list; what is not a Tensor or an iterable of them
    raises a TypeError that says what to pass instead."""
    if isinstance(tensors, Tensor):
        return [tensors]
    if isinstance(tensors, Items):
        return tensors
    hint = _what_to_pass(tensors)
    if hint:
        raise TypeError(f"{fn}: got {hint}")
    try:
        return list(tensors)
    except TypeError:
        raise TypeError(
            f"{fn}: expected a Tensor or an iterable of Tensors, got {type(tensors).__name__}"
        ) from None


def _what_to_pass(value: Any) -> str | None:
    """For the containers users pass by mistake: what they are, and what to pass."""
    name = type(value).__name__
    if isinstance(value, torch.nn.Module):
        return f"a module ({name}); pass its parameters: model.parameters()"
    if isinstance(value, torch.optim.Optimizer):
        return (
            f"an optimizer ({name}); pass the parameters it steps: "
            "[p for group in optimizer.param_groups for p in group['params']]"
        )
    if isinstance(value, Mapping):
        return (
            f"a mapping ({name}), which iterates over its keys; a state_dict() holds the weights, not "
            "their gradients: pass model.parameters()"
        )
    return None


def _item_hint(item: Any) -> str:
    """What an item that is not a Tensor most likely is, and what to pass instead."""
    named = isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
    if named and isinstance(item[1], Tensor):
        return " (a (name, parameter) pair, as named_parameters() gives: pass model.parameters())"
    if isinstance(item, torch.nn.Module):
        return " (a module: pass model.parameters())"
    if isinstance(item, dict) and "params" in item:
        return " (a param group: pass [p for group in groups for p in group['params']])"
    return ""


class Items(list):
    """Items with what the item rule alone does not say.

    ``positions``: each item's position in the caller's list (``clip_`` passes
    on its parameters only), so that messages name the caller's positions.
    ``gradients``: every item is read as a gradient itself, never as a
    parameter (``gradients=True`` and the compiled ops, whose items are
    gradients already). The plan cache keys on this reading too, and caches
    such lists only where it agrees with the rule's (no item requires grad or
    has a ``.grad``).
    """

    def __init__(self, items: Iterable[Any], positions: list[int] | None = None, gradients: bool = False):
        super().__init__(items)
        self.positions = positions
        self.gradients = gradients


def is_parameter(item: Tensor) -> bool:
    """Whether an item stands for its ``.grad`` (the item rule, see the module docstring)."""
    if type(item) is Parameter:
        return True
    if item.is_leaf:  # Parameter's own isinstance check is slow: after requires_grad
        return item.requires_grad or isinstance(item, Parameter) or item.grad is not None
    # A non-leaf tensor has a .grad only when it retains it (reading it otherwise warns).
    return item.retains_grad and item.grad is not None


def check_tensor(item: Any, position: int, fn: str) -> Tensor:
    if not isinstance(item, Tensor):
        raise TypeError(f"{fn}: item {position} is a {type(item).__name__}, not a Tensor{_item_hint(item)}")
    return item


def refuse_parameter(item: Tensor, position: int, fn: str) -> None:
    """For items that must be gradients: a parameter here is a mistake that would scale weights."""
    if is_parameter(item):
        raise TypeError(
            f"{fn}: item {position} is a parameter (an nn.Parameter, a leaf tensor that requires "
            "grad, or a tensor with a .grad), but gradients=True takes gradients only: pass the "
            "parameters without gradients=True to clip their .grad, or pass their .grad"
        )


def gradient_of(item: Any, position: int, fn: str, gradients: bool = False) -> Tensor | None:
    """The gradient an item stands for (None when it has none), type-checked.

    With ``gradients``, the item is the gradient: read as given, a parameter's
    own values included (torch's ``get_total_norm`` reads the tensors it is given).
    """
    item = check_tensor(item, position, fn)
    if gradients:
        grad, what = item, f"item {position}"
    elif is_parameter(item):
        grad, what = item.grad, f"the .grad of item {position}"
    else:
        grad, what = item, f"item {position}"
    if grad is not None and grad.dtype not in _SUPPORTED and not grad.is_complex():
        raise TypeError(
            f"{fn}: {what} has dtype {grad.dtype}; gradients must be float16, bfloat16, "
            "float32 or float64 (or complex, for norm_type=2)"
        )
    return grad


def resolved(grad: Tensor) -> Tensor:
    """``grad`` with its lazy conjugate or negative bit undone: a view of the same
    memory, whose magnitudes are the gradient's and which scales alike."""
    if grad.is_conj():
        grad = grad.conj()
    if grad.is_neg():
        grad = torch._neg_view(grad)
    return grad


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

    positions = getattr(items, "positions", None) or range(len(items))
    as_gradients = getattr(items, "gradients", False)
    on_meta: list[int] = []
    for position, item in zip(positions, items):
        grad = gradient_of(item, position, fn, as_gradients)
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
            if grad.device.type == "meta":
                on_meta.append(position)
                out.slots.append(None)
                continue
            if out.first_device is None:
                out.first_device = grad.device
            if grad.dtype in (torch.float64, torch.complex128):
                out.result_dtype = torch.float64
            if grad.is_conj() or grad.is_neg():
                grad = resolved(grad)
                out.cacheable = False
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
    if on_meta:
        devices = sorted({str(g.device) for g in out.per_item if g is not None})
        raise ValueError(
            f"{fn}: the gradients of items {on_meta} are on the meta device, which holds no values "
            f"to reduce (the gradients are on {', '.join(devices)}); materialize them first "
            "(e.g. module.to_empty(device=...))"
        )
    if group is not None and plain.key not in domain_index:
        domain_id(plain)  # group= always joins its collective, even with no tensor here
    return out
