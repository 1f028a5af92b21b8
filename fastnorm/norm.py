"""``total_norm``, ``clip_`` and ``tensor_norms``: the stages around the kernels.

A call is three stages (see ARCHITECTURE.md): each device's backend computes a
local partial in one fused pass; partials that belong to a distributed domain
are all-reduced across ranks; the root is taken on the first gradient's
device. Clipping then hands the norm to the backends' conditional scale,
after every check that can fail and after bumping the version counter of
every gradient it may write, so that autograd sees the write. Nothing here
reads a device value on the host, so no call synchronizes (except with
``error_if_nonfinite=True``).
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Callable, Hashable
from operator import attrgetter
from typing import Any

import torch
from torch import Tensor
from torch.nn import Parameter

from fastnorm import _partial, checks, distributed, ops
from fastnorm._collect import (
    Items,
    TensorOrTensors,
    check_tensor,
    collect,
    is_parameter,
    items_of,
    refuse_parameter,
)
from fastnorm._plan import Plan, Reduced, cached_for_writing, cached_norm, clear_cache, plan_for
from fastnorm._plan import build as build_plan
from fastnorm.backends import Mode
from fastnorm.backends.torch_backend import accumulate_dtype

__all__ = ["total_norm", "clip_", "tensor_norms", "clear_cache"]

_get_grad = attrgetter("grad")
_is_inference = Tensor.is_inference
_PARAMETERS_ONLY = {Parameter}

# torch's own messages, which code written for torch matches on.
NONFINITE = (
    "The total norm of order {p} for gradients from `parameters` is non-finite, so it cannot be "
    "clipped. To disable this error and scale the gradients by the non-finite norm anyway, set "
    "`error_if_nonfinite=False`"
)
EMPTY_GENERATOR = "`parameters` is an empty generator, no gradient clipping will occur."
INFERENCE = (
    "Inplace update to inference tensor outside InferenceMode is not allowed.You can make a clone "
    "to get a normal tensor before doing inplace update.See https://github.com/pytorch/rfcs/pull/17 "
    "for more details."
)
OVERLAP = (
    "unsupported operation: more than one element of the written-to tensor refers to a single "
    "memory location. Please clone() the tensor before performing the operation."
)


def _to_device(t: Tensor, device: torch.device) -> Tensor:
    if t.device == device:
        return t
    if t.device.type == "cpu" and device.type != "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)  # to the CPU: the value must be ready, which waits for it


def _index(plan: Plan, name: Hashable, device: torch.device, build: Callable[[], list[int]]) -> Tensor:
    """An int64 index tensor of the plan on ``device``, built once."""
    key = (name, str(device))
    if key not in plan.indices:
        plan.indices[key] = _to_device(torch.tensor(build(), dtype=torch.int64), device)
    return plan.indices[key]


def _item_gather(plan: Plan) -> list[int]:
    """Each item's row in the per-tensor partials of all groups, stacked, plus one zero row."""
    offsets, total = [], 0
    for g in plan.norm_groups:
        offsets.append(total)
        total += g.size
    return [total if r is None else offsets[r[0]] + r[1] for r in plan.item_rows]


def _plan_for(
    items: list[Any],
    p: float,
    fn: str,
    group: Any,
    grads: list[Any] | None = None,
    looked_up: bool = False,
    held: list[Tensor] | None = None,
) -> Plan:
    """The plan for ``items``: cached, fused where it can be, for the norm types
    the fused backends compute; on the torch backend everywhere for the others.
    ``grads``: the parameters' ``.grad``, already read by the caller;
    ``looked_up`` and ``held`` (the tensors to keep until the plan is reduced):
    see ``_plan.plan_for``."""
    if Mode.of(p).fused:
        return plan_for(items, p, fn, group, grads, looked_up, held)
    return build_plan(collect(items, p, fn, group), "torch")


def _reduce(
    plan: Plan,
    p: float,
    fn: str,
    per_item: bool = False,
    reduced: Reduced | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor | None]:
    """The total norm and, with ``per_item``, each item's norm (from the same pass).
    ``reduced``: the plan's one group, reduced already (``_plan.cached_norm``);
    ``dtype``: the results', instead of the plan's result dtype."""
    mode = Mode.of(p)
    first, dtype = plan.result_device, dtype or plan.result_dtype
    if mode == Mode.ZERO and any(d.key[0] == "mesh" for d in plan.domains):
        raise NotImplementedError(
            f"{fn}: norm_type=0 counts the tensors that hold a non-zero, which DTensor shards "
            "cannot tell on their own; use it on plain (full) tensors"
        )
    if reduced is not None:
        results = [reduced]
    else:
        results = [g.backend.reduce(g.state, mode, p, dtype, per_item) for g in plan.norm_groups]

    if len(results) == 1 and not plan.distributed:
        total = _to_device(results[0][1], first)  # the backend's own root: no extra launch
    elif not results and not plan.distributed:
        total = torch.zeros((), dtype=dtype, device=first)
    else:
        per_domain: list[list[Tensor]] = [[] for _ in plan.domains]
        for g, (partial, _, _) in zip(plan.norm_groups, results):
            per_domain[g.domain].append(partial)
        partials = []
        for d in plan.collective_order:
            domain = plan.domains[d]
            device = distributed.collective_device(domain, first)
            local = [_to_device(q, device) for q in per_domain[d]]
            partials.append(_to_device(distributed.global_partial(local, mode, p, domain, device), first))
        total = _partial.root(_partial.combine(partials, mode, p), mode, p, dtype)
    if not per_item:
        return total, None

    acc = accumulate_dtype(first)
    rows = [_to_device(t, first).to(acc) for _, _, t in results]
    rows.append(torch.zeros((1, 2), dtype=acc, device=first))  # items without a gradient
    items = torch.cat(rows)[_index(plan, "gather", first, lambda: _item_gather(plan))]
    for d in plan.collective_order:
        domain = plan.domains[d]
        # Each rank holds a shard of every DTensor item: their rows are reduced.
        # Plain tensors given with group= are different tensors on each rank
        # (stages, experts, flat shards): their norms stay local.
        if domain.groups and domain.key[0] == "mesh":
            members = [i for i, item_domain in enumerate(plan.item_domains) if item_domain == d]
            index = _index(plan, ("domain", d), first, lambda m=members: m)
            device = distributed.collective_device(domain, first)
            reduced = distributed.all_reduce(_to_device(items[index], device), mode, p, domain)
            items = items.index_copy(0, index, _to_device(reduced, first))
    return total, _partial.root(items, mode, p, dtype)


def wide_total_norm(
    items: list[Any], p: float, group: Any, dtype: torch.dtype | None = torch.float64
) -> tuple[Tensor, torch.dtype]:
    """The stages of :func:`total_norm` for checked arguments, run eagerly: the
    norm as ``dtype`` (None: the dtype ``total_norm`` gives), and that dtype.

    For ``StepClipper``: the float32 norm of gradients a ``GradScaler`` has
    multiplied may overflow where the gradients do not; in float64 it cannot.
    """
    fused = Mode.of(p).fused
    held: list[Tensor] = []  # what the plan reads, alive until it is reduced
    hit = cached_norm(items, p, group, held=held, dtype=dtype) if fused else None
    if hit is None:  # no valid cached plan: build one (not looked up again)
        hit = _plan_for(items, p, "total_norm", group, looked_up=fused, held=held), None
    plan, reduced = hit
    norm, _ = _reduce(plan, p, "total_norm", reduced=reduced, dtype=dtype)
    return norm, plan.result_dtype


def _check_finite(norm: Tensor, p: float) -> None:
    if not bool(torch.isfinite(norm)):
        raise RuntimeError(NONFINITE.format(p=p) + f" (the norm is {norm.item()})")


def _check_total_norm(norm: Any) -> None:
    if norm is None:
        return
    if not isinstance(norm, Tensor):
        raise TypeError(f"clip_: total_norm must be a Tensor, got {type(norm).__name__}")
    if not norm.is_floating_point():
        raise TypeError(f"clip_: total_norm must be a floating-point tensor, got dtype {norm.dtype}")
    if norm.numel() != 1:
        raise ValueError(f"clip_: total_norm must hold one value, got shape {tuple(norm.shape)}")


def _clip_targets(items: list[Any], gradients: bool) -> list[Any]:
    """The items whose gradients ``clip_`` writes (the item rule, see ``fastnorm._collect``).

    Without ``gradients``, the parameters only: every other tensor is skipped,
    as torch skips it. With it, every item, each checked not to be a parameter.
    """
    if isinstance(items, Items) and items.gradients:  # fastnorm's own ops
        return items
    if gradients:
        for position, item in enumerate(items):
            refuse_parameter(check_tensor(item, position, "clip_"), position, "clip_")
        return Items(items, gradients=True)
    if set(map(type, items)) <= _PARAMETERS_ONLY:
        return items
    kept, positions = [], []
    for position, item in enumerate(items):
        if is_parameter(check_tensor(item, position, "clip_")):
            kept.append(item)
            positions.append(position)
    return items if len(kept) == len(items) else Items(kept, positions)


def _gradients(targets: list[Any]) -> list[Any]:
    """Each target's gradient (None where it has none), as ``clip_`` writes them."""
    return targets if isinstance(targets, Items) and targets.gradients else list(map(_get_grad, targets))


def _written(targets: list[Any], grads: list[Any], plan: Plan) -> list[Tensor]:
    """The tensors ``clip_`` may write, after checking that torch would write them.

    Refuses, before anything is written, what torch's in-place ops refuse: an
    inference tensor outside inference mode, and a tensor whose elements share
    memory (an expanded one), which only the torch backend's tensors can be.
    """
    present = [g for g in grads if g is not None]

    def position_of(tensor: Tensor) -> int:
        i = next(i for i, g in enumerate(grads) if g is tensor)
        positions = getattr(targets, "positions", None)
        return positions[i] if positions else i

    if not torch.is_inference_mode_enabled() and any(map(_is_inference, present)):
        bad = next(g for g in present if g.is_inference())
        raise RuntimeError(f"{INFERENCE} (clip_: the gradient of item {position_of(bad)})")
    if not plan.cacheable:
        for grad in present:
            local = distributed.local_tensor(grad) if distributed.is_dtensor(grad) else grad
            if local.layout == torch.strided and torch._debug_has_internal_overlap(local) == 1:
                raise RuntimeError(
                    f"{OVERLAP} (clip_: the gradient of item {position_of(grad)}, for example an "
                    "expanded tensor, has elements that share memory)"
                )
    if any(d.key[0] == "mesh" for d in plan.domains):
        present += [distributed.local_tensor(g) for g in present if distributed.is_dtensor(g)]
    return present


def _scale(plan: Plan, norm: Tensor, max_norm: float) -> None:
    for g in plan.scale_groups:
        n = _to_device(norm, g.device)
        if n.dtype not in (torch.float32, torch.float64):
            n = n.float()
        g.backend.scale_(g.state, n.reshape(()), max_norm)


# ----------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------


def total_norm(
    tensors: TensorOrTensors,
    norm_type: float | str = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
    *,
    group: Any = None,
) -> Tensor:
    r"""The p-norm of all gradients together, as if concatenated into one vector.

    Replaces :func:`torch.nn.utils.get_total_norm` (same signature and
    positional order, plus the keyword ``group``). All gradients are read in
    one fused multi-tensor pass per device: on CUDA one Triton launch per dtype
    present plus one finalize launch, whatever the number of tensors; on CPU one
    call into the threaded C++ kernel; elsewhere torch's own ops.

    Args:
        tensors (Tensor or iterable of Tensors): gradients, or parameters. A
            parameter (an ``nn.Parameter``, a leaf tensor that requires grad, or
            any tensor whose ``.grad`` is set) contributes its ``.grad``
            (skipped when None); any other tensor (a non-leaf tensor, or a plain
            tensor with neither ``.grad`` nor ``requires_grad``) is a gradient
            itself. Generators are consumed once. The same tensor given twice
            counts once. DTensors (FSDP2, tensor parallel) contribute their local
            shard: ``Shard`` placements are summed across the mesh, ``Replicate``
            ones counted once.
        norm_type (float or str): the p of the p-norm: any number, ``'inf'`` or
            ``'-inf'``, with torch's meaning (0: the number of tensors that hold
            a non-zero; -inf: the smallest |x|). 2, 1, inf and any other p > 0
            are fused; 0, negative p and -inf are computed with torch's ops.
            Default: 2.0.
        error_if_nonfinite (bool): raise a RuntimeError (torch's message) when
            the norm is NaN or inf. Reading the value synchronizes with the
            device: this is the only case in which ``total_norm`` does.
            Default: False.
        foreach (bool, optional): accepted for compatibility with torch and
            ignored: every path is fused already. Default: None.
        group (ProcessGroup, optional): for plain tensors that are disjoint
            shards of the model on each rank (ZeRO/FSDP1 flat shards, pipeline
            stages, expert-parallel ranks): their local partial is all-reduced
            over ``group`` (``dist.group.WORLD`` for all ranks). Every rank of
            the group must call. Default: None (plain tensors are local).

    Returns:
        Tensor: a 0-dim tensor on the device of the first gradient, float32
        (float64 when any gradient is float64), never a 16-bit dtype: 16-bit
        gradients are accumulated in float64, so a norm past 65504 is finite.
        ``tensor(0.)`` when there is no gradient. With DTensors or ``group``, the
        global norm, the same on every rank, as a plain tensor.

    Example::

        >>> import torch, fastnorm
        >>> model = torch.nn.Linear(4, 2)
        >>> model(torch.randn(3, 4)).sum().backward()
        >>> norm = fastnorm.total_norm(model.parameters())  # a device scalar, no sync
    """
    del foreach  # every path is fused already
    p = checks.norm_type(norm_type, "total_norm")
    items = items_of(tensors, "total_norm")
    if torch.compiler.is_compiling():
        ops.check_compilable("total_norm", group, error_if_nonfinite)
        return torch.ops.fastnorm.total_norm(ops.traced_gradients(items, "total_norm"), p)
    norm, _ = wide_total_norm(items, p, group, None)
    if error_if_nonfinite:
        _check_finite(norm, p)
    return norm


def clip_(
    parameters: TensorOrTensors,
    max_norm: float,
    norm_type: float | str = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
    *,
    total_norm: Tensor | None = None,
    group: Any = None,
    gradients: bool = False,
) -> Tensor:
    r"""Clips the gradients' total norm in place; returns the norm before clipping.

    Drop-in for :func:`torch.nn.utils.clip_grad_norm_` (same positional order
    and keywords, so ``torch.nn.utils.clip_grad_norm_ = fastnorm.clip_`` works).
    Every gradient is scaled by ``min(1, max_norm / (total_norm + 1e-6))``,
    computed exactly as torch does. The coefficient is computed on the device
    and, on the fused backends, when it is 1 no gradient is read or written.
    With DTensors or ``group``, the global norm is used, so every rank scales
    its shards by the same coefficient. Every check that can fail runs before
    the first write, and the version counter of every gradient that may be
    written is bumped, so autograd sees the write as it sees torch's.

    Args:
        parameters (Tensor or iterable of Tensors): parameters (an
            ``nn.Parameter``, a leaf tensor that requires grad, or any tensor
            whose ``.grad`` is set) whose ``.grad`` to clip; a parameter without
            ``.grad`` is skipped, and so is every other tensor, as torch skips
            it: ``clip_`` never writes a tensor torch would not.
        max_norm (float): the largest norm allowed, >= 0. NaN or a negative
            value raises a ValueError (torch would flip or poison the gradients).
        norm_type (float or str): the p of the p-norm (see :func:`total_norm`).
        error_if_nonfinite (bool): raise a RuntimeError (torch's message),
            before touching any gradient, when the norm is NaN or inf (this reads
            the value: a sync). Otherwise a NaN norm scales every gradient by
            NaN, as torch does.
        foreach (bool, optional): accepted for compatibility, ignored.
        total_norm (Tensor, optional): a norm already computed, e.g. by
            :func:`total_norm` for logging: a floating-point tensor of one
            element, used as is (no second reduction).
        group (ProcessGroup, optional): see :func:`total_norm`.
        gradients (bool): the tensors given are the gradients themselves (flat
            shards given with ``group``, gradients returned by
            ``torch.autograd.grad``): clip them in place. Any parameter among
            them raises a TypeError before anything is touched. Default: False.

    Returns:
        Tensor: the total norm before clipping (see :func:`total_norm`).

    Example::

        >>> loss.backward()
        >>> norm = fastnorm.clip_(model.parameters(), max_norm=1.0)
        >>> optimizer.step()
    """
    del foreach  # every path is fused already
    bound = checks.max_norm(max_norm, "clip_")
    p = checks.norm_type(norm_type, "clip_")
    _check_total_norm(total_norm)
    items = items_of(parameters, "clip_")
    if not items and isinstance(parameters, types.GeneratorType):
        warnings.warn(EMPTY_GENERATOR, stacklevel=2)
    targets = _clip_targets(items, gradients)
    if torch.compiler.is_compiling():
        ops.check_compilable("clip_", group, error_if_nonfinite)
        grads = ops.traced_gradients(targets, "clip_")
        if total_norm is None:
            return torch.ops.fastnorm.clip_(grads, bound, p)
        torch.ops.fastnorm.scale_(grads, total_norm, bound)
        return total_norm
    # A cached plan's check also gives what to write, checked (see _plan.cached_for_writing).
    hit = cached_for_writing(targets, group, p if total_norm is None else None) if Mode.of(p).fused else None
    reduced = None
    if hit is not None:
        plan, written, reduced = hit
    else:
        grads = _gradients(targets)  # read once: the plan's check and the writes share them
        held: list[Tensor] = []  # what the plan reads, alive until it is reduced and scaled
        plan = _plan_for(targets, p, "clip_", group, None if grads is targets else grads, held=held)
        written = _written(targets, grads, plan)
    norm = _reduce(plan, p, "clip_", reduced=reduced)[0] if total_norm is None else total_norm
    if error_if_nonfinite:
        _check_finite(norm, p)
    torch._C._increment_version(written)
    with torch.no_grad():
        _scale(plan, norm, bound)
    return norm


def tensor_norms(
    tensors: TensorOrTensors,
    norm_type: float | str = 2.0,
    *,
    foreach: bool | None = None,
    group: Any = None,
) -> tuple[Tensor, Tensor]:
    r"""The total norm and each item's own norm, from the same fused pass.

    What a monitor needs to tell which layer exploded: the per-item norms come
    out of the pass that computes the total (on CUDA one extra small launch per
    dtype; no second read of the gradients).

    Args:
        tensors (Tensor or iterable of Tensors): as for :func:`total_norm`.
        norm_type (float or str): as for :func:`total_norm`.
        foreach (bool, optional): accepted for symmetry with
            :func:`total_norm`, ignored.
        group (ProcessGroup, optional): see :func:`total_norm`; the total is
            global, each plain item's norm is its own (local) tensor's. DTensor
            items' norms are global (one more all-reduce, of one row per item).

    Returns:
        tuple[Tensor, Tensor]: ``(total, per_item)``. ``total`` equals
        ``total_norm(tensors, norm_type)``; ``per_item`` is a 1-D tensor with one
        norm per item given, in order (0 for an item without a gradient), on the
        same device and of the same dtype as ``total``.

    Example::

        >>> total, per_param = fastnorm.tensor_norms(model.parameters())
        >>> names = [name for name, _ in model.named_parameters()]
    """
    del foreach  # every path is fused already
    p = checks.norm_type(norm_type, "tensor_norms")
    items = items_of(tensors, "tensor_norms")
    if torch.compiler.is_compiling():
        ops.check_compilable("tensor_norms", group)
        grads = ops.traced_gradients(items, "tensor_norms", keep_missing=True)
        return torch.ops.fastnorm.tensor_norms(grads, p)
    held: list[Tensor] = []  # what the plan reads, alive until it is reduced
    plan = _plan_for(items, p, "tensor_norms", group, held=held)
    total, per_item = _reduce(plan, p, "tensor_norms", per_item=True)
    assert per_item is not None
    return total, per_item
