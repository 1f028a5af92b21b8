"""``total_norm`` and ``clip_``: everything around the kernels, once for all backends.

The front turns the user's parameters into a list of gradients (validated,
deduplicated), groups them by device, lets each device's backend compute a
partial, combines the partials on the first device and takes the root. Clipping
hands the norm to the backends' conditional scale. Nothing here reads a device
value on the host, so neither function synchronizes (except with
``error_if_nonfinite=True``).
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter
from typing import Any, Union

import torch
from torch import Tensor
from torch.nn import Parameter

from fastnorm import _partial
from fastnorm.backends import Backend, Mode, choose, requested, warn_if_slow

TensorOrTensors = Union[Tensor, Iterable[Tensor]]

_SUPPORTED = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_SPARSE_COMPRESSED = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)

_get_grad = attrgetter("grad")
_get_requires_grad = attrgetter("requires_grad")
_data_ptr = Tensor.data_ptr


# ----------------------------------------------------------------------------
# Arguments
# ----------------------------------------------------------------------------


def _norm_type(norm_type: float | str, fn: str) -> float:
    try:
        p = float(norm_type)
    except (TypeError, ValueError):
        raise TypeError(f"{fn}: norm_type must be a positive number or 'inf', got {norm_type!r}") from None
    if math.isnan(p) or p <= 0:
        raise ValueError(f"{fn}: norm_type must be > 0 (or inf), got {norm_type!r}")
    return p


def _max_norm(max_norm: float, fn: str) -> float:
    try:
        value = float(max_norm)
    except (TypeError, ValueError):
        raise TypeError(f"{fn}: max_norm must be a number, got {max_norm!r}") from None
    if math.isnan(value) or value < 0:
        raise ValueError(
            f"{fn}: max_norm must be >= 0, got {max_norm!r} (a negative or NaN max_norm "
            "would flip or poison every gradient)"
        )
    return value


def _items(tensors: TensorOrTensors, fn: str) -> list[Any]:
    if isinstance(tensors, Tensor):
        return [tensors]
    try:
        return list(tensors)
    except TypeError:
        raise TypeError(
            f"{fn}: expected a Tensor or an iterable of Tensors, got {type(tensors).__name__}"
        ) from None


def _contributes_grad(item: Tensor) -> bool:
    """A parameter (or any tensor that requires grad) stands for its ``.grad``."""
    return isinstance(item, Parameter) or item.requires_grad


# ----------------------------------------------------------------------------
# Gradients -> per-device groups
# ----------------------------------------------------------------------------


def _is_dense(t: Tensor) -> bool:
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
class _Group:
    """Gradients of one device served by one backend."""

    device: torch.device
    backend: Backend
    state: Any  # what backend.prepare returned
    size: int  # number of tensors


@dataclass
class _Prepared:
    norm_groups: list[_Group]
    scale_groups: list[_Group]
    result_dtype: torch.dtype
    result_device: torch.device
    cacheable: bool
    # For tensor_norms: each item's (group, row) in norm_groups, None without a gradient.
    item_rows: list[tuple[int, int] | None]
    gather: dict[str, Tensor] = field(default_factory=dict)  # per-item index, built on first use
    # Backends' states hold addresses only. Tensors made here (merged sparse
    # values, complex views) live as long as this plan, which is then never
    # cached; the user's own gradients are kept alive by the caller.
    keepalive: list[Tensor] = field(default_factory=list, repr=False)


@dataclass
class _Gradients:
    """What the items stand for, split the way the backends need it."""

    per_item: list[Tensor | None] = field(default_factory=list)  # each item's gradient
    slots: list[int | None] = field(default_factory=list)  # each item's index in `norm`
    norm: list[Tensor] = field(default_factory=list)  # tensors to reduce
    scale: list[Tensor] = field(default_factory=list)  # tensors to scale (differs for sparse)
    dense: list[bool] = field(default_factory=list)  # whether norm[i] and scale[i] read as flat
    scale_differs: bool = False  # uncoalesced sparse: scale the raw values, reduce merged ones
    result_dtype: torch.dtype = torch.float32
    first_device: torch.device | None = None
    cacheable: bool = True


def _gradient_of(item: Any, position: int, fn: str) -> Tensor | None:
    if not isinstance(item, Tensor):
        raise TypeError(f"{fn}: item {position} is a {type(item).__name__}, not a Tensor")
    if _contributes_grad(item):
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


def _collect(items: list[Any], p: float, fn: str) -> _Gradients:
    out = _Gradients()
    seen: dict[tuple[Any, ...], int] = {}

    def add(norm_t: Tensor, scale_t: Tensor) -> int | None:
        if norm_t.numel() == 0:
            return None
        dense = _is_dense(norm_t) and _is_dense(scale_t)
        if dense:
            key = (norm_t.device, norm_t.data_ptr(), norm_t.numel(), norm_t.dtype)
            if key in seen:  # the same memory twice counts once and is scaled once
                return seen[key]
            seen[key] = len(out.norm)
        else:
            out.cacheable = False
        out.norm.append(norm_t)
        out.scale.append(scale_t)
        out.dense.append(dense)
        return len(out.norm) - 1

    for position, item in enumerate(items):
        grad = _gradient_of(item, position, fn)
        out.per_item.append(grad)
        slot = None
        if grad is not None:
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
                slot = add(merged._values(), grad._values())
                out.cacheable = False
            elif grad.layout in _SPARSE_COMPRESSED:
                slot = add(grad.values(), grad.values())
                out.cacheable = False
            elif grad.layout != torch.strided:
                raise TypeError(f"{fn}: item {position} has unsupported layout {grad.layout}")
            else:
                slot = add(grad, grad)
        out.slots.append(slot)
    return out


def _groups(
    tensors: list[Tensor], dense: list[bool], request: str
) -> tuple[list[_Group], list[tuple[int, int]]]:
    """One group per (device, backend), in order of first appearance, and each
    tensor's (group, row). Tensors that are not dense go to the torch backend."""
    by_device: dict[torch.device, tuple[list[int], list[int]]] = {}
    for i, (t, flat) in enumerate(zip(tensors, dense)):
        by_device.setdefault(t.device, ([], []))[0 if flat else 1].append(i)
    groups: list[_Group] = []
    rows: list[tuple[int, int]] = [(0, 0)] * len(tensors)
    torch_backend = choose(torch.device("cpu"), "torch").backend
    for device, (fused, rest) in by_device.items():
        choice = choose(device, request)
        warn_if_slow(device, choice)
        if choice.backend.name == "torch":
            fused, rest = [], fused + rest
        for backend, members in ((choice.backend, fused), (torch_backend, rest)):
            if members:
                for row, i in enumerate(members):
                    rows[i] = (len(groups), row)
                state = backend.prepare([tensors[i] for i in members])
                groups.append(_Group(device, backend, state, len(members)))
    return groups, rows


def _prepare(grads: _Gradients, request: str) -> _Prepared:
    norm_groups, rows = _groups(grads.norm, grads.dense, request)
    if grads.scale_differs:
        scale_groups, _ = _groups(grads.scale, grads.dense, request)
    else:
        scale_groups = norm_groups
    # The torch backend's state holds the tensors themselves: caching it would
    # keep old gradients alive.
    cacheable = grads.cacheable and all(g.backend.name != "torch" for g in norm_groups)
    return _Prepared(
        norm_groups,
        scale_groups,
        grads.result_dtype,
        grads.first_device if grads.first_device is not None else torch.device("cpu"),
        cacheable,
        [None if slot is None else rows[slot] for slot in grads.slots],
        keepalive=[] if cacheable else grads.norm + grads.scale,
    )


# ----------------------------------------------------------------------------
# The cache: per list of items, the prepared groups, reused while every item is
# alive and every gradient keeps its identity and address.
# ----------------------------------------------------------------------------


class _Entry:
    __slots__ = ("kind", "grad_ids", "ptrs", "dense_mask", "prepared", "alive", "refs", "__weakref__")

    def __init__(self, kind: str, grads: list[Tensor | None], prepared: _Prepared) -> None:
        self.kind = kind  # "params": every item is a Parameter; "tensors": none requires grad
        self.grad_ids = list(map(id, grads))
        self.dense_mask = [g is not None for g in grads]
        self.ptrs = list(map(_data_ptr, compress(grads, self.dense_mask)))
        self.prepared = prepared
        self.alive = True
        self.refs: list[weakref.ref] = []


class _Cache:
    """A few entries keyed by (backend request, ids of the items)."""

    def __init__(self, size: int = 8) -> None:
        self._entries: OrderedDict[tuple[Any, ...], _Entry] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def lookup(self, key: tuple[Any, ...], items: list[Any]) -> _Prepared | None:
        entry = self._entries.get(key)
        if entry is None or not entry.alive:
            return None
        if entry.kind == "params":
            grads = list(map(_get_grad, items))
            if list(map(id, grads)) != entry.grad_ids:
                return None
        else:
            if any(map(_get_requires_grad, items)):
                return None
            grads = items
        if list(map(_data_ptr, compress(grads, entry.dense_mask))) != entry.ptrs:
            return None
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
        return entry.prepared

    def store(
        self,
        key: tuple[Any, ...],
        kind: str,
        items: list[Any],
        grads: list[Tensor | None],
        prepared: _Prepared,
    ) -> None:
        entry = _Entry(kind, grads, prepared)
        entry_ref = weakref.ref(entry)

        def expire(_: object) -> None:
            e = entry_ref()
            if e is not None:
                e.alive = False

        watched = items if kind == "tensors" else items + [g for g in grads if g is not None]
        entry.refs = [weakref.ref(t, expire) for t in watched]
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


_CACHE = _Cache()


def _kind(items: list[Any]) -> str | None:
    """How the items may be cached: all parameters, all plain gradients, or not at all."""
    if all(type(item) is Parameter for item in items):
        return "params"
    if all(type(item) is Tensor and not item.requires_grad for item in items):
        return "tensors"
    return None


def _prepared_for(items: list[Any], p: float, fn: str) -> _Prepared:
    """The prepared groups for ``items``, from the cache when still valid."""
    request = requested()
    key = (request, tuple(map(id, items)))
    prepared = _CACHE.lookup(key, items)
    if prepared is not None:
        return prepared
    grads = _collect(items, p, fn)
    prepared = _prepare(grads, request)
    kind = _kind(items)
    if prepared.cacheable and kind is not None:
        _CACHE.store(key, kind, items, grads.per_item, prepared)
    return prepared


def clear_cache() -> None:
    """Forgets every cached plan (they are rebuilt on the next call)."""
    _CACHE.clear()


# ----------------------------------------------------------------------------
# Stages
# ----------------------------------------------------------------------------


def _reduce(prepared: _Prepared, p: float, per_item: bool = False) -> tuple[Tensor, Tensor | None]:
    """The total norm and, with ``per_item``, each item's norm (same pass)."""
    groups = prepared.norm_groups
    first, dtype = prepared.result_device, prepared.result_dtype
    mode = Mode.of(p)
    results = [g.backend.reduce(g.state, mode, p, dtype, per_item) for g in groups]
    if not results:
        total = torch.zeros((), dtype=torch.float32, device=first)
    elif len(results) == 1:
        total = results[0][1]
    else:
        partials = [_to_device(partial, first) for partial, _, _ in results]
        acc = torch.float64 if all(q.dtype == torch.float64 for q in partials) else torch.float32
        combined = _partial.combine([q.to(acc) for q in partials], mode, p)
        total = _partial.root(combined, mode, p, dtype)
    if not per_item:
        return total, None
    rows = [_partial.root(_to_device(t, first), mode, p, dtype) for _, _, t in results]
    rows.append(torch.zeros(1, dtype=dtype, device=first))  # the row of items without a gradient
    return total, torch.cat(rows)[_gather_index(prepared, first)]


def _gather_index(prepared: _Prepared, device: torch.device) -> Tensor:
    """For each item, its row in the concatenated per-tensor norms (cached per plan)."""
    index = prepared.gather.get(str(device))
    if index is None:
        sizes = [g.size for g in prepared.norm_groups]
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        zero_row = sum(sizes)
        host = torch.tensor(
            [zero_row if r is None else offsets[r[0]] + r[1] for r in prepared.item_rows],
            dtype=torch.int64,
        )
        index = _to_device(host, device)
        prepared.gather[str(device)] = index
    return index


def _to_device(t: Tensor, device: torch.device) -> Tensor:
    if t.device == device:
        return t
    if t.device.type == "cpu" and device.type != "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)  # to the CPU: the value must be ready, which waits for it


def _check_finite(norm: Tensor, p: float) -> None:
    if not bool(torch.isfinite(norm)):
        raise RuntimeError(
            f"The total norm of order {p} of the gradients is non-finite ({norm.item()}), so it "
            "cannot be clipped. To disable this error and scale the gradients by the non-finite "
            "norm anyway, set error_if_nonfinite=False"
        )


def _scale(prepared: _Prepared, norm: Tensor, max_norm: float) -> None:
    for g in prepared.scale_groups:
        n = norm
        if n.device != g.device:
            n = _to_device(n, g.device)
        if n.dtype not in (torch.float32, torch.float64):
            n = n.float()
        g.backend.scale_(g.state, n.reshape(()), max_norm)


# ----------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------


def total_norm(
    tensors: TensorOrTensors,
    norm_type: float | str = 2.0,
    *,
    error_if_nonfinite: bool = False,
) -> Tensor:
    r"""The p-norm of all gradients together, as if concatenated into one vector.

    Replaces :func:`torch.nn.utils.get_total_norm`. All gradients are read in
    one fused multi-tensor pass per device: on CUDA one Triton launch per dtype
    present plus one finalize launch, whatever the number of tensors; on CPU one
    call into the threaded C++ kernel; elsewhere torch's own ops.

    Args:
        tensors (Tensor or iterable of Tensors): gradients, or parameters. A
            parameter (an ``nn.Parameter`` or any tensor that requires grad)
            contributes its ``.grad`` (skipped when None); any other tensor is
            taken as a gradient itself. Generators are consumed once. The same
            tensor given twice counts once.
        norm_type (float or str): the p of the p-norm, any p > 0 or ``'inf'``.
            Default: 2.0.
        error_if_nonfinite (bool): raise a RuntimeError when the norm is NaN or
            inf. Reading the value synchronizes with the device: this is the
            only case in which ``total_norm`` does. Default: False.

    Returns:
        Tensor: a 0-dim tensor on the device of the first gradient, float32
        (float64 when any gradient is float64), never a 16-bit dtype: 16-bit
        gradients are accumulated in float64, so a norm past 65504 is finite.
        ``tensor(0.)`` when there is no gradient.

    Example::

        >>> import torch, fastnorm
        >>> model = torch.nn.Linear(4, 2)
        >>> model(torch.randn(3, 4)).sum().backward()
        >>> norm = fastnorm.total_norm(model.parameters())  # a device scalar, no sync
    """
    p = _norm_type(norm_type, "total_norm")
    items = _items(tensors, "total_norm")
    prepared = _prepared_for(items, p, "total_norm")
    norm, _ = _reduce(prepared, p)
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
) -> Tensor:
    r"""Clips the gradients' total norm in place; returns the norm before clipping.

    Drop-in for :func:`torch.nn.utils.clip_grad_norm_` (same positional order
    and keywords, so ``torch.nn.utils.clip_grad_norm_ = fastnorm.clip_`` works).
    Every gradient is scaled by ``min(1, max_norm / (total_norm + 1e-6))``,
    computed exactly as torch does. The coefficient is computed on the device
    and, on the fused backends, when it is 1 no gradient is read or written.

    Args:
        parameters (Tensor or iterable of Tensors): parameters whose ``.grad``
            to clip, or the gradients themselves (see :func:`total_norm`).
        max_norm (float): the largest norm allowed, >= 0. NaN or a negative
            value raises a ValueError (torch would flip or poison the gradients).
        norm_type (float or str): the p of the p-norm, any p > 0 or ``'inf'``.
        error_if_nonfinite (bool): raise a RuntimeError, before touching any
            gradient, when the norm is NaN or inf (this reads the value: a sync).
            Otherwise a NaN norm scales every gradient by NaN, as torch does.
        foreach (bool, optional): accepted for compatibility, ignored.
        total_norm (Tensor, optional): a norm already computed, e.g. by
            :func:`total_norm` for logging. It is used as is: no second reduction.

    Returns:
        Tensor: the total norm before clipping (see :func:`total_norm`).

    Example::

        >>> loss.backward()
        >>> norm = fastnorm.clip_(model.parameters(), max_norm=1.0)
        >>> optimizer.step()
    """
    del foreach  # every path is fused already
    bound = _max_norm(max_norm, "clip_")
    p = _norm_type(norm_type, "clip_")
    if total_norm is not None and not isinstance(total_norm, Tensor):
        raise TypeError(f"clip_: total_norm must be a Tensor, got {type(total_norm).__name__}")
    if total_norm is not None and total_norm.numel() != 1:
        raise ValueError(f"clip_: total_norm must hold one value, got shape {tuple(total_norm.shape)}")
    items = _items(parameters, "clip_")
    prepared = _prepared_for(items, p, "clip_")
    norm = _reduce(prepared, p)[0] if total_norm is None else total_norm
    if error_if_nonfinite:
        _check_finite(norm, p)
    with torch.no_grad():
        _scale(prepared, norm, bound)
    return norm


def tensor_norms(
    tensors: TensorOrTensors,
    norm_type: float | str = 2.0,
) -> tuple[Tensor, Tensor]:
    r"""The total norm and each item's own norm, from the same fused pass.

    What a monitor needs to tell which layer exploded: the per-item norms come
    out of the pass that computes the total (on CUDA one extra small launch per
    dtype; no second read of the gradients).

    Args:
        tensors (Tensor or iterable of Tensors): as for :func:`total_norm`.
        norm_type (float or str): the p of the p-norm, any p > 0 or ``'inf'``.

    Returns:
        tuple[Tensor, Tensor]: ``(total, per_item)``. ``total`` equals
        ``total_norm(tensors, norm_type)``; ``per_item`` is a 1-D tensor with one
        norm per item given, in order (0 for an item without a gradient), on the
        same device and of the same dtype as ``total``.

    Example::

        >>> total, per_param = fastnorm.tensor_norms(model.parameters())
        >>> names = [name for name, _ in model.named_parameters()]
    """
    p = _norm_type(norm_type, "tensor_norms")
    items = _items(tensors, "tensor_norms")
    prepared = _prepared_for(items, p, "tensor_norms")
    total, per_item = _reduce(prepared, p, per_item=True)
    assert per_item is not None
    return total, per_item
