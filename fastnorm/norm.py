"""``total_norm``, ``clip_``, ``tensor_norms`` and ``tensor_stats``: the public functions.

Each checks its arguments (``fastnorm.checks``, the item rule of
``fastnorm._collect``), then runs the eager stages (``fastnorm._eager``) or,
under ``torch.compile``, calls the custom op that inductor sees
(``fastnorm.custom_ops``). How a call is computed is docs/design.md.
"""

from __future__ import annotations

import sys
import types
import warnings
from typing import Any

import torch
from torch import Tensor
from torch.nn import Parameter

from fastnorm import _eager, _stats, checks, custom_ops, distributed
from fastnorm._collect import (
    Items,
    TensorOrTensors,
    check_tensor,
    is_parameter,
    items_of,
    refuse_parameter,
)
from fastnorm._plan import Plan, clear_cache

__all__ = ["total_norm", "clip_", "tensor_norms", "tensor_stats", "clear_cache", "NoGradientWarning"]

_PARAMETERS_ONLY = {Parameter}

# torch's own message, which code written for torch matches on.
EMPTY_GENERATOR = "`parameters` is an empty generator, no gradient clipping will occur."


class NoGradientWarning(UserWarning):
    """A call was given items, and not one of them has a gradient: its norm is 0 and
    nothing is clipped (torch says nothing). Shown once per call site."""


def _warn_no_gradient(fn: str, what: str) -> None:
    """Warns at the first caller outside fastnorm (the user's line, or the framework's
    through ``fastnorm.patch()``): Python's filter then shows it once there."""
    frame, level = sys._getframe(1), 2
    while frame is not None and _inside(frame.f_globals.get("__name__", "")):
        frame, level = frame.f_back, level + 1
    warnings.warn(f"{fn}: {what}; the norm is 0 and nothing is clipped", NoGradientWarning, stacklevel=level)


def _inside(module: str) -> bool:
    """fastnorm's own frames, and torch's no_grad wrapper around a patched function."""
    return module.partition(".")[0] == "fastnorm" or module == "torch.utils._contextlib"


def warn_if_no_gradient(fn: str, count: int, plan: Plan | None) -> None:
    """The traps that return 0 silently in torch: parameters before ``backward()``,
    or tensors that ``clip_`` skips (a ``state_dict()``'s values, a list of ``.grad``)."""
    if count == 0:
        return
    if plan is None:
        _warn_no_gradient(
            fn,
            f"none of the {count} items is a parameter, so none is clipped: a state_dict()'s values "
            "or [p.grad for p in ...]? Pass model.parameters(), or the gradients with gradients=True",
        )
    elif plan.no_gradient:
        _warn_no_gradient(
            fn,
            f"none of the {count} parameters has a .grad: called before loss.backward(), or after "
            "optimizer.zero_grad()? Call it between backward() and step()",
        )


def _as_given(items: list[Any], gradients: bool) -> list[Any]:
    """``items``, each read as itself with ``gradients`` (see ``fastnorm._collect.Items``)."""
    if not gradients or (isinstance(items, Items) and items.gradients):
        return items
    return Items(items, gradients=True)


def _checked_total_norm(norm: Any) -> Tensor | None:
    """A norm given to ``clip_``, as a plain dense tensor of one float32/float64 value.

    A DTensor (accelerate and torchtitan pass one) stands for its full value,
    as torch's ``clip_grads_with_norm_`` uses it; its address never reaches a
    kernel. What cannot be a norm raises before anything is written.
    """
    if norm is None:
        return None
    if not isinstance(norm, Tensor):
        raise TypeError(f"clip_: total_norm must be a Tensor, got {type(norm).__name__}")
    if distributed.is_dtensor(norm):
        norm = norm.full_tensor()
    elif type(norm) not in (Tensor, Parameter):  # a wrapper subclass may hold no memory of its own
        raise TypeError(f"clip_: total_norm must be a torch.Tensor or a DTensor, got {type(norm).__name__}")
    if norm.layout != torch.strided:
        raise TypeError(f"clip_: total_norm must be a dense tensor, got layout {norm.layout}")
    if not norm.is_floating_point():
        raise TypeError(f"clip_: total_norm must be a floating-point tensor, got dtype {norm.dtype}")
    if norm.numel() != 1:
        raise ValueError(f"clip_: total_norm must hold one value, got shape {tuple(norm.shape)}")
    if norm.device.type == "meta":
        raise ValueError("clip_: total_norm is on the meta device, which holds no value to clip by")
    return norm.detach()


def _clip_targets(items: list[Any], gradients: bool) -> list[Any]:
    """The items whose gradients ``clip_`` writes (the item rule, see ``fastnorm._collect``).

    Without ``gradients``, the parameters only: every other tensor is skipped,
    as torch skips it. With it, every item, each checked not to be a parameter.
    """
    if isinstance(items, Items) and items.gradients:
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
    gradients: bool = False,
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
        gradients (bool): read every tensor as given, parameters included
            (their values, not their ``.grad``): the meaning of
            ``torch.nn.utils.get_total_norm(tensors)``, which is given the
            gradients themselves. Default: False.

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
    items = _as_given(items_of(tensors, "total_norm"), checks.boolean(gradients, "gradients", "total_norm"))
    if torch.compiler.is_compiling():
        custom_ops.check_compilable("total_norm", group, error_if_nonfinite)
        return torch.ops.fastnorm.total_norm(custom_ops.traced_gradients(items, "total_norm"), p)
    norm, plan = _eager.total_norm(items, p, group, error_if_nonfinite)
    warn_if_no_gradient("total_norm", len(items), plan)
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
    given = _checked_total_norm(total_norm)  # what the kernels read; the caller's tensor is returned
    items = items_of(parameters, "clip_")
    if not items and isinstance(parameters, types.GeneratorType) and total_norm is None:
        # clip_grad_norm_'s warning; clip_grads_with_norm_ (a norm given) has none
        warnings.warn(EMPTY_GENERATOR, stacklevel=2)
    targets = _clip_targets(items, checks.boolean(gradients, "gradients", "clip_"))
    if torch.compiler.is_compiling():
        custom_ops.check_compilable("clip_", group, error_if_nonfinite)
        grads = custom_ops.traced_gradients(targets, "clip_")
        if total_norm is None:
            return torch.ops.fastnorm.clip_(grads, bound, p)
        torch.ops.fastnorm.scale_(grads, total_norm, bound)
        return total_norm
    norm, plan = _eager.clip(targets, bound, p, group, error_if_nonfinite, given)
    warn_if_no_gradient("clip_", len(items), plan if targets else None)
    return norm if total_norm is None else total_norm


def tensor_norms(
    tensors: TensorOrTensors,
    norm_type: float | str = 2.0,
    *,
    foreach: bool | None = None,
    group: Any = None,
    gradients: bool = False,
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
        gradients (bool): read every tensor as given (see :func:`total_norm`).

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
    items = _as_given(
        items_of(tensors, "tensor_norms"), checks.boolean(gradients, "gradients", "tensor_norms")
    )
    if torch.compiler.is_compiling():
        custom_ops.check_compilable("tensor_norms", group)
        grads = custom_ops.traced_gradients(items, "tensor_norms", keep_missing=True)
        return torch.ops.fastnorm.tensor_norms(grads, p)
    total, per_item, plan = _eager.tensor_norms(items, p, group)
    warn_if_no_gradient("tensor_norms", len(items), plan)
    return total, per_item


def tensor_stats(
    tensors: TensorOrTensors,
    norm_type: float | str = 2.0,
    *,
    gradients: bool = False,
    limit_dtypes: list[torch.dtype | None] | None = None,
    group: Any = None,
) -> tuple[Tensor, Tensor]:
    r"""The total norm and each item's statistics, from the same fused pass.

    Where :func:`tensor_norms` tells which tensor is large, these tell which
    went non-finite, how many of its values did, and how close the others came
    to the ends of their dtype's range, for the price of the bytes the norm
    reads anyway (the C++ and Triton kernels compute them in the norm's own
    loop). Nothing is read on the host.

    Args:
        tensors (Tensor or iterable of Tensors): as for :func:`total_norm`
            (parameters contribute their ``.grad``).
        norm_type (float or str): as for :func:`total_norm`.
        gradients (bool): read every tensor as given (see :func:`total_norm`).
        limit_dtypes (list of dtypes or None, optional): one per item, the
            dtype whose smallest normal and overflow margin the item's
            gradient is judged by (None: its own dtype). Default: None.
        group (ProcessGroup, optional): see :func:`total_norm`: the total is
            global; the statistics are always those of each rank's own
            (local) tensors, DTensors' local shards included.

    Returns:
        tuple[Tensor, Tensor]: ``(total, stats)``. ``total`` equals
        ``total_norm(tensors, norm_type)``; ``stats`` is a float64 tensor of
        shape ``(len(items), 6)`` on ``total``'s device, one row per item given
        (zeros for an item without a gradient) in the columns
        ``fastnorm.stats.COLUMNS``: ``sum_sq`` (as the norm accumulates it),
        ``max_abs`` (of the finite values), and the exact counts
        ``nonfinite``, ``zeros``, ``subnormal`` (nonzero, below the limit
        dtype's smallest normal) and ``overflow`` (finite, above
        ``finfo(limit).max / 16``). Sparse gradients count their stored values.

    Example::

        >>> total, stats = fastnorm.tensor_stats(model.parameters())
        >>> names = [name for name, _ in model.named_parameters()]
        >>> bad = stats[:, fastnorm.stats.NONFINITE] > 0  # a device mask, no sync
    """
    p = checks.norm_type(norm_type, "tensor_stats")
    items = _as_given(
        items_of(tensors, "tensor_stats"), checks.boolean(gradients, "gradients", "tensor_stats")
    )
    limits = _stats.check_limits(limit_dtypes, len(items), "tensor_stats")
    if torch.compiler.is_compiling():
        custom_ops.check_compilable("tensor_stats", group)
        grads = custom_ops.traced_gradients(items, "tensor_stats", keep_missing=True)
        return torch.ops.fastnorm.tensor_stats(grads, p, custom_ops.limit_codes(limits))
    total, stats, plan = _eager.tensor_stats(items, p, group, limits)
    warn_if_no_gradient("tensor_stats", len(items), plan)
    return total, stats
