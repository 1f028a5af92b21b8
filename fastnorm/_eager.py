"""The eager stages of ``total_norm``, ``clip_``, ``tensor_norms`` and ``tensor_stats``, on
checked arguments.

A call is three stages (see docs/design.md): each device's backend computes a
local partial in one fused pass (``fastnorm.backends``); partials that belong
to a distributed domain are all-reduced across ranks
(``fastnorm.distributed``); the root is taken on the first gradient's device
(``fastnorm._partial``). Clipping then hands the norm to the backends'
conditional scale, after every check that can fail and after bumping the
version counter of every gradient it may write, so that autograd sees the
write. Nothing here reads a device value on the host, so no call synchronizes
(except with ``error_if_nonfinite=True``).

The public functions (``fastnorm/norm.py``) check their arguments and call
these; so do the custom ops that ``torch.compile`` sees
(``fastnorm/custom_ops.py``), whose gradients are checked already.

The fused kernels read the gradients at the addresses a plan holds. Under a
torch function mode, Python code runs on every attribute read of a tensor, and
code that calls ``set_()`` or ``resize_()`` on a gradient read already frees
the memory at its old address, which holding the tensor does not prevent. So
under a mode the cached plan's check runs with the mode (its code may drop a
gradient, or raise), but not overlapped with the kernel's read; then, from
the last Python call to the kernel's end, torch functions are disabled
(``_no_user_code``), and the gradients the check held are read again there:
a plan whose gradients moved meanwhile is rebuilt.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable
from operator import attrgetter
from typing import Any

import torch
from torch import Tensor

from fastnorm import _partial, _plan, distributed
from fastnorm._collect import Items
from fastnorm._partial import Mode, accumulate_dtype, to_device
from fastnorm._plan import Plan, Reduced
from fastnorm._stats import COLUMNS

_get_grad = attrgetter("grad")
_is_inference = Tensor.is_inference
_mode_enabled = torch._C._is_torch_function_mode_enabled
_NOTHING = contextlib.nullcontext()


def _no_user_code(mode: bool) -> Any:
    """Torch functions disabled where a mode is on (``mode``): no Python code runs until the kernel's end."""
    return torch._C.DisableTorchFunction() if mode else _NOTHING


def _confirmed(hit: _plan.Hit | None, held: list[Tensor], mode: bool) -> _plan.Hit | None:
    """The cached plan, when the gradients its check held still have the facts it was built from (read
    with no Python code running, see the module's description); None to rebuild it."""
    if hit is None or not mode or _plan.same_facts(hit.plan, held):
        return hit
    held.clear()
    return None

# torch's own messages, which code written for torch matches on.
NONFINITE = (
    "The total norm of order {p} for gradients from `parameters` is non-finite, so it cannot be "
    "clipped. To disable this error and scale the gradients by the non-finite norm anyway, set "
    "`error_if_nonfinite=False`"
)
INFERENCE = (
    "Inplace update to inference tensor outside InferenceMode is not allowed.You can make a clone "
    "to get a normal tensor before doing inplace update.See https://github.com/pytorch/rfcs/pull/17 "
    "for more details."
)
OVERLAP = (
    "unsupported operation: more than one element of the written-to tensor refers to a single "
    "memory location. Please clone() the tensor before performing the operation."
)


def _index(plan: Plan, name: Hashable, device: torch.device, build: Callable[[], list[int]]) -> Tensor:
    """An int64 index tensor of the plan on ``device``, built once."""
    key = (name, str(device))
    if key not in plan.indices:
        plan.indices[key] = to_device(torch.tensor(build(), dtype=torch.int64), device)
    return plan.indices[key]


def _item_gather(plan: Plan) -> list[int]:
    """Each item's row in the per-tensor partials of all groups, stacked, plus one zero row."""
    offsets, total = [], 0
    for g in plan.norm_groups:
        offsets.append(total)
        total += g.size
    return [total if r is None else offsets[r[0]] + r[1] for r in plan.item_rows]


def _total(plan: Plan, results: list[tuple[Tensor, Tensor, Any]], mode: Mode, p: float, dtype: torch.dtype) -> Tensor:
    """The total norm from each group's ``(partial, root, _)``, on the plan's result device."""
    first = plan.result_device
    if len(results) == 1 and not plan.distributed:
        return to_device(results[0][1], first)  # the backend's own root: no extra launch
    if not results and not plan.distributed:
        return torch.zeros((), dtype=dtype, device=first)
    local = [(g.domain, partial) for g, (partial, _, _) in zip(plan.norm_groups, results)]
    return _partial.root(distributed.total_partial(local, plan.domains, mode, p, first), mode, p, dtype)


def _reduce(
    plan: Plan,
    p: float,
    fn: str,
    per_item: bool = False,
    reduced: Reduced | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor | None]:
    """The total norm and, with ``per_item``, each item's norm (from the same pass).
    ``reduced``: the plan's one group, reduced already (``_plan.lookup``);
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
        results = [g.backend.reduce(g.prepared, mode, p, dtype, per_item) for g in plan.norm_groups]

    total = _total(plan, results, mode, p, dtype)
    if not per_item:
        return total, None

    acc = accumulate_dtype(first)
    rows = [to_device(t, first).to(acc) for _, _, t in results]
    rows.append(torch.zeros((1, 2), dtype=acc, device=first))  # items without a gradient
    items = torch.cat(rows)[_index(plan, "gather", first, lambda: _item_gather(plan))]
    items = distributed.reduce_item_rows(
        items,
        plan.item_domains,
        plan.domains,
        mode,
        p,
        lambda d, members: _index(plan, ("domain", d), first, lambda: members),
    )
    return total, _partial.root(items, mode, p, dtype)


def check_finite(norm: Tensor, p: float) -> None:
    if not bool(torch.isfinite(norm)):
        raise RuntimeError(NONFINITE.format(p=p) + f" (the norm is {norm.item()})")


def gradients(targets: list[Any]) -> list[Any]:
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
        n = to_device(norm, g.device)
        if n.dtype not in (torch.float32, torch.float64):
            n = n.float()
        g.backend.scale_(g.prepared, n.reshape(()), max_norm)


def total_norm(
    items: list[Any], p: float, group: Any, error_if_nonfinite: bool, dtype: torch.dtype | None = None
) -> tuple[Tensor, Plan]:
    """The norm of ``items`` (see ``fastnorm.total_norm``), and the plan it used.

    ``dtype``: the norm's, instead of the one ``total_norm`` gives (the plan's
    ``result_dtype``). For ``StepClipper``: the float32 norm of gradients a
    ``GradScaler`` has multiplied may overflow where the gradients do not.
    """
    held: list[Tensor] = []  # what the plan reads, alive until it is reduced
    mode = _mode_enabled()
    hit = _plan.lookup(items, group, p, reduce=not mode, held=held, dtype=dtype)
    with _no_user_code(mode):
        hit = _confirmed(hit, held, mode)
        if hit is None:
            plan, reduced = _plan.build(items, p, "total_norm", group, held), None
        else:
            plan, reduced = hit.plan, hit.reduced
        norm, _ = _reduce(plan, p, "total_norm", reduced=reduced, dtype=dtype)
    if error_if_nonfinite:
        check_finite(norm, p)
    return norm, plan


def clip(
    targets: list[Any],
    max_norm: float,
    p: float,
    group: Any,
    error_if_nonfinite: bool,
    given: Tensor | None,
) -> tuple[Tensor, Plan]:
    """Clips the gradients of ``targets`` (see ``fastnorm.clip_``, ``_clip_targets``)
    by their norm, or by ``given``; returns the norm used and the plan."""
    written: list[Tensor] = []
    held: list[Tensor] = []  # what the plan reads, alive until it is reduced and scaled
    mode = _mode_enabled()
    # A cached plan's check also gives what to write, checked (see _plan.lookup).
    hit = _plan.lookup(targets, group, p, reduce=given is None and not mode, written=written, held=held)
    with _no_user_code(mode):
        hit = _confirmed(hit, held, mode)
        if hit is not None and hit.wrote:
            plan, reduced = hit.plan, hit.reduced
        else:
            grads = gradients(targets)  # read once: the plan's check and the writes share them
            plan = hit.plan if hit is not None else _plan.build(targets, p, "clip_", group, held)
            reduced = hit.reduced if hit is not None else None
            written = _written(targets, grads, plan)
        norm = _reduce(plan, p, "clip_", reduced=reduced)[0] if given is None else given
        if error_if_nonfinite:
            check_finite(norm, p)
        torch._C._increment_version(written)
        with torch.no_grad():
            _scale(plan, norm, max_norm)
    return norm, plan


def tensor_norms(items: list[Any], p: float, group: Any) -> tuple[Tensor, Tensor, Plan]:
    """The total and each item's norm (see ``fastnorm.tensor_norms``), and the plan."""
    held: list[Tensor] = []  # what the plan reads, alive until it is reduced
    mode = _mode_enabled()
    hit = _plan.lookup(items, group, p, held=held)
    with _no_user_code(mode):
        hit = _confirmed(hit, held, mode)
        plan = _plan.build(items, p, "tensor_norms", group, held) if hit is None else hit.plan
        total, per_item = _reduce(plan, p, "tensor_norms", per_item=True)
    assert per_item is not None
    return total, per_item, plan


def _group_limits(plan: Plan, limits: list[torch.dtype | None]) -> list[list[torch.dtype | None]]:
    """Each group's limit dtype per row, from each item's (None: the tensor's own)."""
    rows: list[list[torch.dtype | None]] = [[None] * g.size for g in plan.norm_groups]
    if limits.count(None) == len(limits):
        return rows  # no limit given (the usual call): nothing to place, no item to tell apart
    given: dict[tuple[int, int], int] = {}
    for item, (where, limit) in enumerate(zip(plan.item_rows, limits)):
        if where is None:
            continue
        if where in given and limits[given[where]] != limit:
            raise ValueError(
                f"tensor_stats: items {given[where]} and {item} are the same tensor with different "
                f"limit dtypes ({limits[given[where]]} and {limit})"
            )
        given[where] = item
        rows[where[0]][where[1]] = limit
    return rows


def _serves_stats(backend: Any, mode: Mode, limits: list[torch.dtype | None]) -> bool:
    """Whether ``backend`` counts the statistics in the norm's own pass for this call."""
    if not hasattr(backend, "reduce_stats"):
        return False
    serves = getattr(backend, "serves_stats", None)
    return serves is None or serves(mode, limits)


def tensor_stats(
    items: list[Any], p: float, group: Any, limits: list[torch.dtype | None]
) -> tuple[Tensor, Tensor, Plan]:
    """The total norm and each item's statistics (see ``fastnorm.tensor_stats``), and the plan.

    ``limits``: one limit dtype per item (``fastnorm._stats``), checked already.
    """
    held: list[Tensor] = []  # what the plan reads, alive until it is reduced
    hit = _plan.lookup(items, group, p, held=held)
    plan = _plan.build(items, p, "tensor_stats", group, held) if hit is None else hit.plan
    mode = Mode.of(p)
    norm_plan = plan
    if not all(_serves_stats(g.backend, mode, limits) for g in plan.norm_groups):
        # A backend without statistics for this call (Triton for p != 2 or a
        # limit dtype given): torch's ops read these tensors for the rows (not
        # cached); the total stays the norm's own pass, so it is total_norm's,
        # bit for bit.
        plan = _plan.uncached(items, p, "tensor_stats", group, "torch")
    if mode == Mode.ZERO and any(d.key[0] == "mesh" for d in plan.domains):
        raise NotImplementedError("tensor_stats: norm_type=0 is not supported on DTensor shards")
    dtype, first = plan.result_dtype, plan.result_device
    per_group = _group_limits(plan, limits)
    results = [
        g.backend.reduce_stats(g.prepared, mode, p, dtype, lim) for g, lim in zip(plan.norm_groups, per_group)
    ]
    if plan is norm_plan:
        total = _total(plan, results, mode, p, dtype)
    else:
        total = _reduce(norm_plan, p, "tensor_stats")[0]
    acc = accumulate_dtype(first)
    if _in_order(plan):  # the backend's rows are the items' already (a tensor of its own, made by this call)
        return total, to_device(results[0][2], first).to(acc), plan
    rows = [to_device(t, first).to(acc) for _, _, t in results]
    rows.append(torch.zeros((1, len(COLUMNS)), dtype=acc, device=first))  # items without a gradient
    return total, torch.cat(rows)[_index(plan, "gather", first, lambda: _item_gather(plan))], plan


def _in_order(plan: Plan) -> bool:
    """Whether item i is row i of the plan's one norm group, every item with a gradient (found once)."""
    if plan.in_order is None:
        groups = plan.norm_groups
        plan.in_order = (
            len(groups) == 1
            and groups[0].size == len(plan.item_rows)
            and all(r == (0, i) for i, r in enumerate(plan.item_rows))
        )
    return plan.in_order
