"""Plans: the gradients grouped per (domain, device, backend) with the backends'
prepared states, and the cache that reuses a plan while nothing it depends on
has changed.

A plan is cached per list of items (by identity) and norm type, and reused
while every gradient keeps its address, size, dtype and layout (see _Cache).
Values are never cached: they are read afresh by every call. Plans that hold
tensors made for the call (merged sparse values, complex views) or served by
a backend whose prepared state holds the tensors (``Backend.cacheable``) are
not cached, so the cache never keeps a gradient alive.

Two entry points: ``lookup`` (the cached plan, checked, and where a backend
can read while the cache checks, its norm) and ``build`` (a new plan, cached
where it can be). Which backend serves which tensors is the backends' own
answer (``fastnorm.backends.choose``); nothing here names one.
"""

from __future__ import annotations

import operator
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import attrgetter
from typing import Any

import torch
from torch import Tensor
from torch.nn import Parameter

from fastnorm import _extension
from fastnorm._collect import Gradients, collect
from fastnorm._partial import Mode
from fastnorm.backends import Backend, CheckedReduce, choose, requested, warn_if_slow
from fastnorm.distributed import Domain, collective_device, dtensor_type

_get_grad = attrgetter("grad")
_get_requires_grad = attrgetter("requires_grad")
_get_local = attrgetter("_local_tensor")
_get_dtype = attrgetter("dtype")
_data_ptr = Tensor.data_ptr


@dataclass
class Group:
    """Local tensors of one domain and device, served by one backend."""

    domain: int
    device: torch.device
    backend: Backend
    prepared: Any  # what backend.prepare returned
    size: int  # number of tensors


@dataclass
class Plan:
    norm_groups: list[Group]
    scale_groups: list[Group]
    domains: list[Domain]
    result_dtype: torch.dtype
    result_device: torch.device
    cacheable: bool
    # For tensor_norms: each item's (group, row) in norm_groups, None without a
    # gradient, and each item's domain.
    item_rows: list[tuple[int, int] | None]
    item_domains: list[int]
    no_gradient: bool  # items were given, and not one of them has a gradient
    indices: dict[Any, Tensor] = field(default_factory=dict)  # device index tensors, built on first use
    in_order: bool | None = None  # item i is row i of the one norm group (see _eager.tensor_stats)
    # Backends' states hold addresses only: tensors made for this plan live as
    # long as it does (such plans are never cached).
    keepalive: list[Tensor] = field(default_factory=list, repr=False)
    # The facts of the tensors read (see _signature), as the backends' states hold them: see same_facts.
    facts: tuple[list[Any], ...] = ()

    @property
    def distributed(self) -> bool:
        return any(d.groups for d in self.domains)


def _groups(
    tensors: list[Tensor], dense: list[bool], domain_of: list[int], request: str, mode: Mode
) -> tuple[list[Group], list[tuple[int, int]]]:
    """One group per (domain, device, backend), in order of first appearance, and
    each tensor's (group, row): per (domain, device), the dense tensors and then
    the others, each served by the backend that ``choose`` picks for them."""
    buckets: dict[tuple[int, torch.device], tuple[list[int], list[int]]] = {}
    for i, (t, flat) in enumerate(zip(tensors, dense)):
        buckets.setdefault((domain_of[i], t.device), ([], []))[0 if flat else 1].append(i)
    groups: list[Group] = []
    rows: list[tuple[int, int]] = [(0, 0)] * len(tensors)
    for (domain, device), (flat, rest) in buckets.items():
        served: list[tuple[Backend, list[int]]] = []
        for members, is_dense in ((flat, True), (rest, False)):
            if not members:
                continue
            choice = choose(device, request, mode, is_dense)
            warn_if_slow(device, choice)
            if served and served[-1][0] is choice.backend:
                served[-1][1].extend(members)
            else:
                served.append((choice.backend, list(members)))
        for backend, members in served:
            for row, i in enumerate(members):
                rows[i] = (len(groups), row)
            prepared = backend.prepare([tensors[i] for i in members])
            groups.append(Group(domain, device, backend, prepared, len(members)))
    return groups, rows


def _plan(grads: Gradients, request: str, mode: Mode) -> Plan:
    norm_groups, rows = _groups(grads.norm, grads.dense, grads.domain_of, request, mode)
    if grads.scale_differs:
        scale_groups, _ = _groups(grads.scale, grads.dense, grads.domain_of, request, mode)
    else:
        scale_groups = norm_groups
    # A tensor subclass's __torch_function__ runs Python code on each fact the check reads, which may
    # move a gradient checked already (see fastnorm._eager): its plans are built afresh each call.
    subclassed = any(type(t) is not Tensor for t in grads.norm)
    cacheable = grads.cacheable and not subclassed and all(g.backend.cacheable for g in norm_groups)
    device = grads.first_device
    if device is None:  # no gradient on this rank: the result lives where the collective runs
        device = torch.device("cpu")
        for domain in grads.domains:
            if domain.groups:
                device = collective_device(domain, device)
                break
    return Plan(
        norm_groups,
        scale_groups,
        grads.domains,
        grads.result_dtype,
        device,
        cacheable,
        [None if slot is None else rows[slot] for slot in grads.slots],
        grads.item_domains,
        bool(grads.per_item) and all(g is None for g in grads.per_item),
        keepalive=[] if cacheable else grads.norm + grads.scale,
    )


_KINDS = {"tensors": 0, "params": 1, "dtensor_params": 2}  # Snapshot.Kind in csrc/snapshot.h


def _signature(tensors: list[Tensor]) -> tuple[list[Any], ...]:
    """What a plan depends on, per tensor: address, size, dtype and layout."""
    return (
        list(map(_data_ptr, tensors)),
        list(map(Tensor.numel, tensors)),
        list(map(_get_dtype, tensors)),
        list(map(Tensor.is_contiguous, tensors)),
    )


class _PySnapshot:
    """The facts of ``csrc/snapshot.h``, read from Python: for builds without
    ``fastnorm._C`` (a CUDA machine without a compiler, say)."""

    __slots__ = ("kind", "ids", "item_type", "present", "signature", "layouts", "specs")

    def __init__(self, kind: str, items: list[Any], grads: list[Tensor | None]) -> None:
        self.kind = kind
        # No reference to an item, as in the extension: ids, and their one type.
        self.ids = list(map(id, items))
        types = set(map(type, items))
        if len(types) > 1:
            raise ValueError("_PySnapshot: the items are not all of one type")
        self.item_type = types.pop() if types else None
        self.present = [g is not None for g in grads]
        # DTensor parameters: the spec each item's domain came from.
        self.specs = (
            [(g if g is not None else t)._spec for t, g in zip(items, grads)]
            if kind == "dtensor_params"
            else []
        )
        tensors = self._tensors(grads)
        self.signature = _signature(tensors)
        # Tensors read as flat without being contiguous (channels_last, permuted):
        # their strides must stay the same too.
        self.layouts = {i: (t.shape, t.stride()) for i, t in enumerate(tensors) if not t.is_contiguous()}

    def _tensors(self, grads: list[Any]) -> list[Tensor]:
        """The present gradients as the plan reads them (a DTensor's local shard)."""
        present = compress(grads, self.present)
        return list(map(_get_local, present) if self.kind == "dtensor_params" else present)

    def matches(
        self,
        items: list[Any],
        grads: list[Any] | None = None,
        written: list | None = None,
        held: list | None = None,
    ) -> bool:
        if written is not None:
            return False  # clip_'s checks run in Python (norm._written) without the extension
        if list(map(id, items)) != self.ids or any(type(t) is not self.item_type for t in items):
            return False
        if self.kind == "tensors":
            # An item that starts requiring grad, or gets a .grad, is a parameter now.
            if any(map(_get_requires_grad, items)) or any(
                map(operator.is_not, map(_get_grad, items), repeat(None))
            ):
                return False
            grads = items
        else:
            grads = list(map(_get_grad, items)) if grads is None else grads
            if [g is not None for g in grads] != self.present:
                return False
        try:
            if self.specs and not all(map(_same_spec, items, grads, self.specs)):
                return False
            tensors = self._tensors(grads)
            if _signature(tensors) != self.signature:
                return False
        except (TypeError, RuntimeError, AttributeError):  # a gradient now sparse, or not sharded
            return False
        if not all((tensors[i].shape, tensors[i].stride()) == layout for i, layout in self.layouts.items()):
            return False
        if held is not None:
            held.extend(tensors)
        return True


def _same_spec(item: Any, grad: Any, spec: Any) -> bool:
    """Whether a DTensor parameter's domain is still the one of ``spec``."""
    now = (grad if grad is not None else item)._spec
    return now is spec or (now.mesh is spec.mesh and now.placements == spec.placements)


def _descriptor(owner: type, name: str) -> Any:
    """What ``getattr(obj, name)`` finds on the class of an ``owner`` instance."""
    for klass in owner.__mro__:
        if name in vars(klass):
            return vars(klass)[name]
    raise AttributeError(f"{owner.__name__} has no attribute {name!r}")


# The order of TensorAccess in csrc/snapshot.h: (owner, name, descriptor, is_method).
_ACCESS = tuple(
    (owner, name, _descriptor(owner, name), method)
    for owner, name, method in (
        (Parameter, "grad", False),
        (Tensor, "grad", False),
        (Tensor, "requires_grad", False),
        (Tensor, "data_ptr", True),
        (Tensor, "nbytes", False),
        (Tensor, "dtype", False),
        (Tensor, "is_contiguous", True),
        (Tensor, "shape", False),
        (Tensor, "stride", True),
        (Tensor, "_version", False),
    )
)


def _snapshot(kind: str, items: list[Any], grads: list[Tensor | None]) -> Any:
    """The facts a plan depends on, read in the extension where it is built."""
    if _extension.C is None:
        return _PySnapshot(kind, items, grads)
    return _extension.C.Snapshot(_KINDS[kind], items, grads, _ACCESS)


class _Entry:
    __slots__ = ("snapshot", "plan", "checked")

    def __init__(
        self, kind: str, items: list[Any], grads: list[Tensor | None], plan: Plan, slots: list[int | None]
    ) -> None:
        # "params": every item is a Parameter; "dtensor_params": every item is a
        # DTensor parameter; "tensors": no item requires grad or has a .grad.
        self.snapshot = _snapshot(kind, items, grads)
        self.plan = plan
        # The one group whose backend reads while the snapshot checks (lookup),
        # where one backend call computes the plan and nothing is reduced across ranks.
        self.checked: Group | None = None
        if len(plan.norm_groups) == 1 and not plan.distributed and not isinstance(self.snapshot, _PySnapshot):
            group = plan.norm_groups[0]
            if isinstance(group.backend, CheckedReduce):
                first_item = [-1] * group.size
                for i, slot in reversed(list(enumerate(slots))):
                    if slot is not None:
                        first_item[slot] = i
                if -1 not in first_item and group.backend.gate(group.prepared, first_item):
                    self.checked = group


class _Cache:
    """Plans keyed by (backend request, group, number of items, first and last
    item's id); a hit also checks that every item is the same object, of the
    same type.

    A plan stays valid while every gradient has the same address, size, dtype
    and layout, also as a new tensor (``zero_grad(set_to_none=True)`` makes new
    ones, often at the old addresses). Anything else (a resize, a new dtype at
    the same address, a sparse or missing gradient, a DTensor gradient on
    another mesh or with other placements) rebuilds it. Those facts are read
    on every call, in the extension (``csrc/snapshot.h``).

    It holds no reference to an item or a gradient, not even a weak one:
    ``torch.utils.swap_tensors``, which ``nn.Module.to`` uses on DTensor
    parameters (and on every parameter under
    ``torch.__future__.set_swap_module_params_on_conversion(True)``), refuses
    a tensor that has weak references. An item that dies may leave its id to a
    new object; the entry then serves that object only if it has the same type
    and its gradient every fact above, which is all the plan depends on.

    It holds the ``size`` lists used last, so that clipping many lists per step
    (per parameter group, per expert) keeps hitting: an entry costs a few bytes
    per tensor and holds no tensor.
    """

    def __init__(self, size: int = 128) -> None:
        self._entries: OrderedDict[tuple[Any, ...], _Entry] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def match(
        self,
        key: tuple[Any, ...],
        items: list[Any],
        written: list[Tensor] | None = None,
        held: list[Tensor] | None = None,
    ) -> _Entry | None:
        """The entry of ``key`` if it still describes ``items``. ``written`` (for
        ``clip_``, with the extension's snapshot only): on a match, filled with the
        tensors it writes, none of them an inference tensor (see ``csrc/snapshot.h``).
        ``held``: receives every tensor the plan reads, as it is checked (see
        ``lookup``). An exception other than what a changed gradient raises
        propagates (see ``csrc/snapshot.h``)."""
        entry = self._entries.get(key)
        if entry is None or not entry.snapshot.matches(items, None, written, held):
            return None
        self.touch(key)
        return entry

    def entry(self, key: tuple[Any, ...]) -> _Entry | None:
        return self._entries.get(key)

    def touch(self, key: tuple[Any, ...]) -> None:
        """Marks ``key`` as used last."""
        try:
            self._entries.move_to_end(key)  # atomic under the GIL, as are the dict's reads
        except KeyError:  # evicted or cleared by another thread meanwhile: the plan stays valid
            pass

    def store(
        self,
        key: tuple[Any, ...],
        kind: str,
        items: list[Any],
        grads: list[Tensor | None],
        plan: Plan,
        slots: list[int | None],
    ) -> None:
        entry = _Entry(kind, items, grads, plan, slots)
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
    """How the items may be cached: all parameters, all DTensor parameters (FSDP2),
    all plain gradients, or not at all (parameters read as gradients themselves,
    ``gradients=True``: the snapshot would check their ``.grad``)."""
    if all(type(item) is Tensor and not item.requires_grad and item.grad is None for item in items):
        return "tensors"
    if getattr(items, "gradients", False):
        return None
    if all(type(item) is Parameter for item in items):
        return "params"
    dtensor = dtensor_type()
    if dtensor is not None and all(type(item) is dtensor and isinstance(item, Parameter) for item in items):
        return "dtensor_params"
    return None


def _key(items: list[Any], group: Any, request: str, mode: Mode) -> tuple[Any, ...]:
    """The cache key: the backend request, the group, the reduction (backends serve
    some modes only), how the items are read (``Items.gradients``) and the list's
    length, first and last item."""
    first, last = (id(items[0]), id(items[-1])) if items else (0, 0)
    return (request, id(group), mode, getattr(items, "gradients", False), len(items), first, last)


Reduced = tuple[Tensor, Tensor, None]  # what Backend.reduce returns, without per-tensor norms


@dataclass
class Hit:
    """A cached plan that still describes the items of a call."""

    plan: Plan
    # The norm's reduction, read while the plan was checked (lookup's ``reduce``).
    reduced: Reduced | None
    # Whether the check filled lookup's ``written`` (else the caller checks what it writes).
    wrote: bool


def lookup(
    items: list[Any],
    group: Any,
    p: float,
    reduce: bool = False,
    written: list[Tensor] | None = None,
    held: list[Tensor] | None = None,
    dtype: torch.dtype | None = None,
) -> Hit | None:
    """The cached plan of ``items`` for the norm type ``p``, if it still describes
    them; None when there is no valid plan.

    With ``reduce``, and where one backend call serves the plan, the norm is
    computed while the plan is checked: the backend reads each tensor as soon as
    the items up to the one that gives it are confirmed, so the check, item
    after item on this thread, and the read of the memory overlap; a tensor
    that fails the check is never read, and every one that passed it stays
    referenced until it is read. ``written`` (for ``clip_``): a list the
    check fills with the tensors to write, each checked writable, where the
    snapshot can (see ``Hit.wrote``). ``held``: a list that receives every
    tensor the plan reads, which the caller keeps until the plan is reduced, so
    that Python code the check runs (a ``TorchFunctionMode``) cannot free one
    meanwhile. ``dtype``: the reduced norm's, instead of the plan's result dtype.
    """
    mode = Mode.of(p)
    key = _key(items, group, requested(), mode)
    entry = _CACHE.entry(key)
    if entry is None:
        return None
    fills = written if not isinstance(entry.snapshot, _PySnapshot) else None
    if reduce and entry.checked is not None:
        checked = entry.checked
        reduced = checked.backend.reduce_checked(
            checked.prepared, entry.snapshot, items, fills, mode, p, dtype or entry.plan.result_dtype
        )
        if reduced is None:
            return None
        _CACHE.touch(key)
        return Hit(entry.plan, reduced, fills is not None)
    if _CACHE.match(key, items, fills, held) is None:
        return None
    return Hit(entry.plan, None, fills is not None)


def build(items: list[Any], p: float, fn: str, group: Any = None, held: list[Tensor] | None = None) -> Plan:
    """A new plan for ``items`` (validated and sorted out by ``_collect.collect``),
    cached where it can be. ``held``: receives the tensors the plan reads (see ``lookup``)."""
    request, mode = requested(), Mode.of(p)
    grads = collect(items, p, fn, group)
    if held is not None:
        held.extend(grads.norm)
    with torch._C.DisableTorchFunction():  # the addresses the kernel reads, read with no Python code between
        plan = _plan(grads, request, mode)
        plan.facts = _signature(grads.norm) if plan.cacheable else ()
    kind = _kind(items)
    if plan.cacheable and kind is not None:
        _CACHE.store(_key(items, group, request, mode), kind, items, grads.per_item, plan, grads.slots)
    return plan


def same_facts(plan: Plan, held: list[Tensor]) -> bool:
    """Whether the tensors a cached plan's check held (in item order) are still the ones its backends'
    states describe: each at the address, of the size, dtype and layout read when it was built. Called
    where no Python code can run until the kernel has read them (see ``fastnorm._eager``)."""
    return _signature(held) == plan.facts


def uncached(items: list[Any], p: float, fn: str, group: Any, request: str) -> Plan:
    """A new plan for ``items`` with the backend ``request`` forced, never cached."""
    return _plan(collect(items, p, fn, group), request, Mode.of(p))


def clear_cache() -> None:
    """Forgets every cached plan (they are rebuilt on the next call)."""
    _CACHE.clear()
