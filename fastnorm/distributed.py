"""The collective stage: local partials summed (p-norms) or maxed (inf) across ranks.

A *domain* is a set of gradients that share one reduction across ranks:

* DTensor gradients on one mesh with the same sharded mesh dimensions: each
  rank holds a shard of every tensor along the ``Shard`` dimensions, so the
  local partials are reduced over those dimensions' process groups, and not
  over ``Replicate`` dimensions (a replicated tensor counts once, not once per
  rank);
* plain tensors given with ``group=``: disjoint shards of the model (ZeRO/FSDP1
  flat shards, pipeline stages, expert-parallel ranks), reduced over ``group``;
* plain tensors without ``group=``: local, no collective.

Each domain costs one or two all-reduces of a few float64 values (see
``all_reduce``), issued on the current stream: no host sync. Every rank issues
the same collectives in the same order, whatever the values, also a rank whose
shards are all empty, so uneven sharding cannot hang.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from fastnorm import _partial
from fastnorm._partial import Mode, to_device


def dtensor_type() -> type | None:
    """``DTensor``, if its module is loaded; None otherwise. A DTensor exists only
    once ``torch.distributed.tensor`` is imported, so fastnorm never imports it
    (it costs about a second) and asks only where it is loaded already."""
    module = sys.modules.get("torch.distributed.tensor")
    return None if module is None else module.DTensor


@dataclass(frozen=True)
class Domain:
    """Gradients reduced together across ranks (see the module docstring)."""

    key: tuple[Any, ...]  # the same on every rank: collectives are issued in key order
    groups: tuple[Any, ...]  # process groups to all-reduce over, in order; empty: local
    device_type: str  # where the collective runs ("cpu" for gloo, "cuda" for nccl)


LOCAL = Domain(("local",), (), "")


def is_dtensor(t: Any) -> bool:
    cls = dtensor_type()
    return cls is not None and isinstance(t, cls)


def dtensor_domain(t: Any, position: int, fn: str) -> Domain:
    """The domain of a DTensor (a gradient, or a parameter standing for its gradient)."""
    from torch.distributed.tensor.placement_types import Partial  # loaded with any DTensor

    mesh = t.device_mesh
    for placement in t.placements:
        if isinstance(placement, Partial):
            raise ValueError(
                f"{fn}: item {position} is a DTensor with a Partial placement ({t.placements}): it holds "
                "unreduced partial sums, whose norm is not the norm of the gradient; reduce it first "
                "(e.g. .redistribute(placements=[Shard(0)]) or [Replicate()])"
            )
    shard_dims = tuple(d for d, placement in enumerate(t.placements) if placement.is_shard())
    groups = tuple(_mesh_group(mesh, d) for d in shard_dims)
    return Domain(("mesh", _mesh_key(mesh), shard_dims), groups, mesh.device_type)


def group_domain(group: Any) -> Domain:
    """The domain of plain tensors given with ``group=``."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("group= needs an initialized torch.distributed process group")
    # "gloo", "nccl", or per device ("cpu:gloo,cuda:nccl", the default when
    # init_process_group names no backend).
    # Every rank must pick the same device (the backend follows it), also a
    # rank without gradients: CUDA wherever the group can reduce there.
    config = str(dist.get_backend_config(group)).lower()
    cuda = torch.cuda.is_available() and ("nccl" in config or "cuda:" in config)
    device_type = "cuda" if cuda else "cpu"
    return Domain(("group", tuple(dist.get_process_group_ranks(group))), (group,), device_type)


def _mesh_key(mesh: Any) -> tuple[Any, ...]:
    return (mesh.device_type, tuple(mesh.mesh.flatten().tolist()), tuple(mesh.mesh.shape))


def _mesh_group(mesh: Any, dim: int) -> Any:
    return mesh.get_group(dim) if mesh.ndim > 1 else mesh.get_group()


def local_tensor(t: Any) -> torch.Tensor:
    """The shard of a DTensor that lives on this rank (shares its memory)."""
    return t._local_tensor


def collective_device(domain: Domain, gradients: torch.device) -> torch.device:
    """Where a domain's partial is reduced: the gradients' device for a local
    domain, else the domain's device type (the gradients' CUDA device if on CUDA)."""
    if not domain.groups:
        return gradients
    if domain.device_type == "cuda":
        return gradients if gradients.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
    return torch.device(domain.device_type)


def _extreme(m: torch.Tensor, domain: Domain, largest: bool) -> torch.Tensor:
    """The global max (or min) of ``m`` over the domain's groups, NaN included.

    Maxima do not always propagate NaN (NCCL and gloo compare), so NaN travels
    as a flag in the same all-reduce.
    """
    signed = m if largest else -m
    nan = m.isnan()
    flagged = torch.cat([torch.where(nan, torch.full_like(m, float("-inf")), signed), nan.to(m.dtype)])
    for group in domain.groups:
        dist.all_reduce(flagged, op=dist.ReduceOp.MAX, group=group)
    k = m.numel()
    top = flagged[:k] if largest else -flagged[:k]
    return torch.where(flagged[k:] > 0, torch.full_like(m, float("nan")), top)


def _max(values: torch.Tensor, domain: Domain) -> torch.Tensor:
    """The global max of values that are never NaN (L2 scales)."""
    top = values.clone()
    for group in domain.groups:
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
    return top


def _sum(values: torch.Tensor, domain: Domain) -> torch.Tensor:
    total = values.clone()  # reduced in place: never into the caller's partials
    for group in domain.groups:
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    return total


def all_reduce(partials: torch.Tensor, mode: Mode, p: float, domain: Domain) -> torch.Tensor:
    """Reduces partials (shape ``(k, 2)``, on the collective's device) across ranks.

    Returns the global partials, the same on every rank. The collectives depend
    on the norm type only, never on the values, so every rank issues the same:

    * L1 and 0: one SUM;
    * L2: one MAX of each partial's scale (see ``fastnorm._partial``), then one
      SUM of the sums moved to that scale by powers of two (and, in the same
      SUM, to a scale 2^32 above it, taken where the first overflows). Where
      no partial is scaled (every value in float64's plain range) the scale is
      1, nothing moves, and the SUM is the plain sum of squares, bit for bit;
    * inf: one MAX; -inf: one MIN and one SUM (of the element counts);
    * other p: one MAX (MIN for p < 0) of the scale, then one SUM.
    """
    if not domain.groups:
        return partials
    m, s = partials[:, 0], partials[:, 1]
    if mode in (Mode.L1, Mode.ZERO):
        return torch.stack([torch.zeros_like(s), _sum(s, domain)], 1)
    if mode == Mode.L2:
        top = _max(_partial.l2_active_scale(m, s), domain)
        # The overflow-proof sums (see _partial.l2_settled) travel in the same SUM.
        moved = [_partial.l2_rescaled(m, s, top), _partial.l2_rescaled(m, s, _partial.l2_wide_top(top))]
        sums = _sum(torch.cat(moved), domain)
        k = m.numel()
        return _partial.l2_settled(top, sums[:k], sums[k:])
    top = _extreme(m, domain, largest=mode in (Mode.LINF, Mode.LP))
    if mode == Mode.LINF:
        return torch.stack([top, torch.zeros_like(top)], 1)
    if mode == Mode.NINF:
        return torch.stack([top, _sum(s, domain)], 1)
    return torch.stack([top, _sum(_partial.rescaled(m, s, top, p), domain)], 1)


def global_partial(
    partials: list[torch.Tensor], mode: Mode, p: float, domain: Domain, device: torch.device
) -> torch.Tensor:
    """The global partial of a domain from this rank's partials (on ``device``; maybe none)."""
    if partials:
        local = _partial.combine([q.to(torch.float64) for q in partials], mode, p)
    else:
        local = _partial.empty(mode, device)
    return all_reduce(local.reshape(1, 2), mode, p, domain)[0]


def order(domains: list[Domain]) -> list[int]:
    """The domains' indices in an order every rank agrees on (their keys')."""
    return sorted(range(len(domains)), key=lambda i: repr(domains[i].key))


def total_partial(
    local: list[tuple[int, torch.Tensor]], domains: list[Domain], mode: Mode, p: float, device: torch.device
) -> torch.Tensor:
    """The partial of every gradient of a call, on ``device``: the local partials
    (``(domain index, partial)`` pairs) combined per domain, each domain's
    reduced across its ranks in ``order`` (every rank issues the same
    collectives, also with no partial of its own), then combined."""
    per_domain: list[list[torch.Tensor]] = [[] for _ in domains]
    for d, partial in local:
        per_domain[d].append(partial)
    partials = []
    for d in order(domains):
        where = collective_device(domains[d], device)
        mine = [to_device(q, where) for q in per_domain[d]]
        partials.append(to_device(global_partial(mine, mode, p, domains[d], where), device))
    return _partial.combine(partials, mode, p) if partials else _partial.empty(mode, device)


def reduce_item_rows(
    rows: torch.Tensor,
    item_domains: list[int],
    domains: list[Domain],
    mode: Mode,
    p: float,
    index: Any,
) -> torch.Tensor:
    """Each item's partial (``rows``, one per item) made global where the item is a
    DTensor: every rank holds a shard of it, so its rows are all-reduced over the
    mesh. Plain tensors given with ``group=`` are different tensors on each rank
    (stages, experts, flat shards): their rows stay local. ``index(d, members)``
    gives the items of domain ``d`` as an index tensor on the rows' device."""
    for d in order(domains):
        domain = domains[d]
        if domain.groups and domain.key[0] == "mesh":
            members = [i for i, item_domain in enumerate(item_domains) if item_domain == d]
            where = index(d, members)
            device = collective_device(domain, rows.device)
            reduced = all_reduce(to_device(rows[where], device), mode, p, domain)
            rows = rows.index_copy(0, where, to_device(reduced, rows.device))
    return rows
