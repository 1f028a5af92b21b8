"""Scenarios run on every rank of a gloo process group by test_distributed.py.

Every rank builds the same full tensors from a shared seed, takes its shard,
calls fastnorm, and records what it got next to the float64 oracle of the full
tensors (or torch's result on the unsharded model). The test reads the records.
"""

from __future__ import annotations

import datetime
import json
import os
import traceback

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor, init_device_mesh
from torch.distributed.tensor.placement_types import Partial

import fastnorm
import reference

NORM_TYPES = [2.0, float("inf"), 1.0, 3.0]


def full_tensors(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(37, 11), (3, 5), (1000,), (8, 8, 3), (2,)]
    return [torch.randn(s, generator=g) * 3 for s in shapes]


def _bounds(n: int, world: int) -> list[int]:
    # Uneven on purpose, and with world > 2 the last rank holds nothing.
    cuts = [0] + [int(n * 0.6 * (r + 1) / (world - 1)) for r in range(world - 1)] + [n]
    return [min(c, n) for c in cuts]


def plain_shards_with_group(rank: int, world: int) -> dict:
    full = torch.cat([t.reshape(-1) for t in full_tensors(1)])
    lo, hi = _bounds(full.numel(), world)[rank : rank + 2]
    mine = full[lo:hi].clone()
    out = {}
    for p in NORM_TYPES:
        out[str(p)] = (
            fastnorm.total_norm([mine], p, group=dist.group.WORLD).item(),
            reference.norm([full], p),
        )
    return out


def cached_plans_with_and_without_group(rank: int, world: int) -> dict:
    """The same parameters, their norm taken locally and with group=, in turn:
    the plan cached for one must never serve the other."""
    full = full_tensors(11)
    params = [torch.nn.Parameter(torch.zeros_like(t)) for t in full]
    for p, t in zip(params, full):
        p.grad = t * (rank + 1)  # each rank's own gradients
    everyone = [t * (r + 1) for r in range(world) for t in full]
    out = {}
    for i, group in enumerate([None, dist.group.WORLD, None, dist.group.WORLD]):
        for repeat in range(2):  # the second from the cached plan
            want = reference.norm(everyone if group else [p.grad for p in params], 2.0)
            out[f"total_norm {i} {repeat}"] = (fastnorm.total_norm(params, group=group).item(), want)
            out[f"tensor_norms {i} {repeat}"] = (fastnorm.tensor_norms(params, group=group)[0].item(), want)
    return out


def dtensor_placements(rank: int, world: int) -> dict:
    mesh = init_device_mesh("cpu", (world,))
    full = full_tensors(2)
    placements = [Shard(0), Shard(1), Replicate(), Shard(0), Shard(0)]  # (3, 5) over 4 ranks: one empty
    sharded = [distribute_tensor(t, mesh, [pl]) for t, pl in zip(full, placements)]
    out = {}
    for p in NORM_TYPES:
        out[str(p)] = (fastnorm.total_norm(sharded, p).item(), reference.norm(full, p))
    total, per_item = fastnorm.tensor_norms(sharded)
    out["tensor_norms"] = (per_item.tolist(), [reference.norm([t], 2.0) for t in full])
    out["tensor_norms_total"] = (total.item(), reference.norm(full, 2.0))
    return out


def two_d_mesh(rank: int, world: int) -> dict:
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    full = full_tensors(3)
    layouts = [
        [Replicate(), Shard(0)],
        [Shard(0), Shard(1)],
        [Replicate(), Replicate()],
        [Shard(1), Replicate()],
        [Shard(0), Replicate()],
    ]
    sharded = [distribute_tensor(t, mesh, pl) for t, pl in zip(full, layouts)]
    return {str(p): (fastnorm.total_norm(sharded, p).item(), reference.norm(full, p)) for p in NORM_TYPES}


def mixed_meshes(rank: int, world: int) -> dict:
    # Expert and non-expert parameters on different meshes, plus replicated
    # plain tensors that every rank holds (counted once), in one call.
    world_mesh = init_device_mesh("cpu", (world,))
    grid = init_device_mesh("cpu", (2, world // 2)) if world % 2 == 0 else world_mesh
    full = full_tensors(4)
    items = [
        distribute_tensor(full[0], world_mesh, [Shard(0)]),
        distribute_tensor(full[1], grid, [Shard(0), Replicate()][: grid.ndim]),
        full[2],
        distribute_tensor(full[3], world_mesh, [Replicate()]),
        distribute_tensor(full[4], grid, [Replicate(), Shard(0)][: grid.ndim]),
    ]
    return {str(p): (fastnorm.total_norm(items, p).item(), reference.norm(full, p)) for p in NORM_TYPES}


def nan_on_one_rank(rank: int, world: int) -> dict:
    mesh = init_device_mesh("cpu", (world,))
    full = full_tensors(5)
    full[2][7] = float("nan")  # lands on rank 0's shard only
    sharded = [distribute_tensor(t, mesh, [Shard(0)]) for t in full]
    return {str(p): fastnorm.total_norm(sharded, p).item() for p in NORM_TYPES}


def partial_is_rejected(rank: int, world: int) -> dict:
    mesh = init_device_mesh("cpu", (world,))
    pending = DTensor.from_local(torch.randn(4), mesh, [Partial()])
    try:
        fastnorm.total_norm([pending])
    except ValueError as exc:
        return {"error": str(exc)}
    return {"error": None}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(13, 32), torch.nn.ReLU(), torch.nn.Linear(32, 7))


def fsdp2_clip(rank: int, world: int) -> dict:
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    reference_model, sharded_model = _model(), _model()
    fully_shard(sharded_model[0], mesh=mesh)
    fully_shard(sharded_model, mesh=mesh)
    x = torch.randn(16, 13, generator=torch.Generator().manual_seed(1)) * 5
    reference_model(x).square().sum().backward()
    sharded_model(x).square().sum().backward()
    out = {}
    expected = torch.nn.utils.clip_grad_norm_(reference_model.parameters(), 0.5)
    got = fastnorm.clip_(sharded_model.parameters(), 0.5)
    out["norm"] = (got.item(), expected.item(), type(got).__name__)
    gathered = [p.grad.full_tensor() for p in sharded_model.parameters()]
    out["max_grad_diff"] = max(
        (a - b.grad).abs().max().item() for a, b in zip(gathered, reference_model.parameters())
    )
    out["clipped_norm"] = reference.norm(gathered, 2.0)
    return out


def dtensor_clip_matches_torch(rank: int, world: int) -> dict:
    mesh = init_device_mesh("cpu", (world,))
    full = full_tensors(6)
    params = []
    for t, pl in zip(full, [Shard(0), Shard(1), Replicate(), Shard(0), Shard(0)]):
        param = torch.nn.Parameter(distribute_tensor(torch.zeros_like(t), mesh, [pl]))
        param.grad = distribute_tensor(t, mesh, [pl])
        params.append(param)
    plain = []
    for t in full:
        q = torch.nn.Parameter(torch.zeros_like(t))
        q.grad = t.clone()
        plain.append(q)
    got = fastnorm.clip_(params, 1.0, float("inf"))
    expected = torch.nn.utils.clip_grad_norm_(plain, 1.0, float("inf"))
    diff = max((p.grad.full_tensor() - q.grad).abs().max().item() for p, q in zip(params, plain))
    return {"norm": (got.item(), expected.item()), "max_grad_diff": diff}


def dtensor_norm_given_to_clip(rank: int, world: int) -> dict:
    """torch's own two-step clip on DTensors (what accelerate and torchtitan call):
    get_total_norm returns a DTensor, which clip_ takes as total_norm=."""
    mesh = init_device_mesh("cpu", (world,))
    full = full_tensors(8)
    params = []
    for t, pl in zip(full, [Shard(0), Shard(1), Replicate(), Shard(0), Shard(0)]):
        param = torch.nn.Parameter(distribute_tensor(torch.zeros_like(t), mesh, [pl]))
        param.grad = distribute_tensor(t.clone(), mesh, [pl])  # Replicate() would share t's memory
        params.append(param)
    grads = [q.grad for q in params]
    norm = torch.nn.utils.get_total_norm(grads)
    out = {"kind": type(norm).__name__}
    ours = fastnorm.total_norm(grads, gradients=True)
    out["total_norm"] = (ours.item(), norm.full_tensor().item())
    expected = [t * min(1.0, 1.0 / (norm.full_tensor().item() + 1e-6)) for t in full]
    fastnorm.clip_(params, 1.0, total_norm=norm)
    out["max_grad_diff"] = max(
        (q.grad.full_tensor() - e).abs().max().item() for q, e in zip(params, expected)
    )
    # A norm still in partial sums (each rank holds a share): its full value is the sum.
    share = torch.tensor(norm.full_tensor().item() / world)
    partial = DTensor.from_local(share, mesh, [Partial()])
    for q, t in zip(params, full):
        q.grad = distribute_tensor(t.clone(), mesh, q.grad.placements)
    fastnorm.clip_(params, 1.0, total_norm=partial)
    out["partial_max_grad_diff"] = max(
        (q.grad.full_tensor() - e).abs().max().item() for q, e in zip(params, expected)
    )
    return out


def _sharded_params(full: list[torch.Tensor], mesh: object) -> list[torch.nn.Parameter]:
    """DTensor parameters sharded on dim 0, each with its ``full`` tensor as gradient."""
    params = []
    for t in full:
        param = torch.nn.Parameter(distribute_tensor(torch.zeros_like(t), mesh, [Shard(0)]))
        param.grad = distribute_tensor(t, mesh, [Shard(0)])
        params.append(param)
    return params


def cached_plan_follows_dtensor_gradients(rank: int, world: int) -> dict:
    # The second and third calls reuse the cached plan of the same DTensor
    # parameters; new values, then new gradient DTensors, must be seen.
    mesh = init_device_mesh("cpu", (world,))
    full = full_tensors(7)
    params = _sharded_params(full, mesh)
    out = {"first": (fastnorm.total_norm(params).item(), reference.norm(full, 2.0))}
    params[0].grad._local_tensor.mul_(3)
    full[0] = full[0] * 3
    out["values"] = (fastnorm.total_norm(params).item(), reference.norm(full, 2.0))
    full[2] = torch.randn(full[2].shape, generator=torch.Generator().manual_seed(8))
    params[2].grad = distribute_tensor(full[2], mesh, [Shard(0)])
    out["new gradient"] = (fastnorm.total_norm(params).item(), reference.norm(full, 2.0))
    # clip_ from the cached plan bumps the version of each gradient and of its local shard.
    fastnorm.clip_(params, 1e9)
    before = [(p.grad._version, p.grad._local_tensor._version) for p in params]
    fastnorm.clip_(params, 1e9)
    after = [(p.grad._version, p.grad._local_tensor._version) for p in params]
    out["versions bumped"] = (float(all(a > b for pair in zip(after, before) for a, b in zip(*pair))), 1.0)
    return out


def cached_plan_follows_dtensor_layouts(rank: int, world: int) -> dict:
    # A cached plan serves a DTensor gradient with a new spec of the same
    # layout; the same local shard with other placements is looked at afresh.
    from torch.distributed.tensor import DTensor

    from fastnorm import _plan

    mesh = init_device_mesh("cpu", (world,))
    full = full_tensors(9)
    params = _sharded_params(full, mesh)
    fastnorm.total_norm(params)
    builds = [0]
    build = _plan.build

    def counting(*args, **kwargs):
        builds[0] += 1
        return build(*args, **kwargs)

    def regrad(placement: object) -> None:
        grad = params[1].grad
        shape, stride = grad.shape, grad.stride()
        params[1].grad = DTensor.from_local(grad._local_tensor, mesh, [placement], shape=shape, stride=stride)

    _plan.build = counting
    try:
        regrad(Shard(0))  # a new DTensorSpec, equal to the old one
        out = {"same layout": (fastnorm.total_norm(params).item(), reference.norm(full, 2.0))}
        out["same layout, no rebuild"] = (float(builds[0]), 0.0)
        # Unreduced partial sums in the same local shard: refused, as on a first call.
        regrad(Partial())
        try:
            fastnorm.total_norm(params)
            out["partial refused"] = (0.0, 1.0)
        except ValueError as exc:
            out["partial refused"] = (float("Partial" in str(exc)), 1.0)
    finally:
        _plan.build = build
    return out


def module_to_after_a_cached_clip(rank: int, world: int) -> dict:
    # nn.Module.to swaps DTensor parameters in place (torch.utils.swap_tensors),
    # which refuses a tensor that anything holds a weak reference to.
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    model = _model()
    fully_shard(model, mesh=mesh)
    model(torch.randn(16, 13, generator=torch.Generator().manual_seed(2))).square().sum().backward()
    fastnorm.clip_(model.parameters(), 1e9)
    fastnorm.clip_(model.parameters(), 1e9)
    model.to(torch.float64)
    gathered = [p.grad.full_tensor() for p in model.parameters()]
    out = {"dtype": (float(gathered[0].dtype == torch.float64), 1.0)}
    out["norm"] = (fastnorm.total_norm(model.parameters()).item(), reference.norm(gathered, 2.0))
    return out


def group_tensor_norms_with_uneven_items(rank: int, world: int) -> dict:
    # Each rank holds a different number of gapped views (served by the torch
    # backend): the total is global, each item's norm its own.
    def shards_of(r: int) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(10 + r)
        return [torch.randn(6, 4, generator=g)[:, :2] * 3 for _ in range(r + 1)]

    mine = shards_of(rank)
    everything = [t for r in range(world) for t in shards_of(r)]
    total, per_item = fastnorm.tensor_norms(mine, group=dist.group.WORLD)
    return {
        "total": (total.item(), reference.norm(everything, 2.0)),
        "per_item": (per_item.tolist(), [reference.norm([t], 2.0) for t in mine]),
    }


def _extreme_shards(rank: int, world: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """This rank's float64 shards and the full tensors: 1e200 on rank 0, subnormals
    on rank 1, ordinary values elsewhere, and an empty shard on the last rank."""
    g = torch.Generator().manual_seed(30)
    scales = [1e200, 1e-310] + [1.0] * (world - 2)
    full = [(torch.rand(40, generator=g, dtype=torch.float64) + 0.5) * scale for scale in scales]
    mine = [full[rank]] if rank < world - 1 or world == 2 else [full[rank][:0]]
    return mine, full[: world - 1] if world > 2 else full


def _norms_of_extremes(rank: int, world: int) -> dict:
    mine, full = _extreme_shards(rank, world)
    out = {}
    for p in (2.0, 3.0, 1.0, float("inf"), -2.0, float("-inf")):
        got = fastnorm.total_norm(mine, p, group=dist.group.WORLD).item()
        out[str(p)] = (got, reference.total_norm(full, p))
    mesh = init_device_mesh("cpu", (world,))
    whole = torch.cat(full + [torch.zeros(0, dtype=torch.float64)] * (world - len(full)))
    sharded = distribute_tensor(whole, mesh, [Shard(0)])  # uneven: rank 1's shard mixes scales
    out["dtensor"] = (fastnorm.total_norm([sharded]).item(), reference.norm([whole], 2.0))
    return out


def l2_extremes_across_ranks_on_the_torch_backend(rank: int, world: int) -> dict:
    # The front's merge rule and the collective, on partials the torch backend scales.
    os.environ["FASTNORM_BACKEND"] = "torch"
    try:
        return _norms_of_extremes(rank, world)
    finally:
        del os.environ["FASTNORM_BACKEND"]


def l2_extremes_across_ranks(rank: int, world: int) -> dict:
    return _norms_of_extremes(rank, world)  # the default backend: the C++ kernels


def l2_sum_overflows_only_across_ranks(rank: int, world: int) -> dict:
    # Each rank's norm^2 is about 1.44e308, a finite double; only the SUM across
    # ranks leaves float64's range.
    mine = [torch.full((1,), 1.2e154 * (1 + rank / 8), dtype=torch.float64)]
    full = [torch.full((1,), 1.2e154 * (1 + r / 8), dtype=torch.float64) for r in range(world)]
    mesh = init_device_mesh("cpu", (world,))
    sharded = distribute_tensor(torch.cat(full), mesh, [Shard(0)])
    return {
        "group=": (fastnorm.total_norm(mine, group=dist.group.WORLD).item(), reference.norm(full, 2.0)),
        "dtensor": (fastnorm.total_norm([sharded]).item(), reference.norm(full, 2.0)),
    }


def unscaled_partials_keep_their_bits(rank: int, world: int) -> dict:
    # Ordinary values: the global norm is the square root of one SUM of the local
    # plain sums of squares, as before partials could be scaled.
    from fastnorm._partial import Mode
    from fastnorm._plan import build

    g = torch.Generator().manual_seed(31 + rank)
    mine = [torch.randn(1000 + 17 * rank, generator=g, dtype=torch.float64) * 3]
    got = fastnorm.total_norm(mine, group=dist.group.WORLD)
    group = build(mine, 2.0, "test").norm_groups[0]
    partial, _, _ = group.backend.reduce(group.prepared, Mode.L2, 2.0, torch.float64)
    assert partial[0].item() == 0.0  # unscaled
    plain = partial[1].clone()
    dist.all_reduce(plain, op=dist.ReduceOp.SUM)
    return {"same bits": torch.equal(got, plain.sqrt())}


def same_collectives_whatever_the_values(rank: int, world: int) -> dict:
    # Rank 0 scaled, rank 1 NaN, others empty: every rank issues the same collectives.
    import torch.distributed as d

    issued = []
    original = d.all_reduce

    def recording(tensor, op=d.ReduceOp.SUM, group=None, async_op=False):
        issued.append((str(op), tensor.numel(), str(tensor.dtype)))
        return original(tensor, op=op, group=group, async_op=async_op)

    values = {0: [torch.full((5,), 1e200, dtype=torch.float64)], 1: [torch.tensor([float("nan"), 1.0])]}
    mine = values.get(rank, [])
    d.all_reduce = recording
    try:
        for p in (2.0, 1.0, float("inf"), 3.0, 0.0, -2.0, float("-inf")):
            fastnorm.total_norm(mine, p, group=dist.group.WORLD)
    finally:
        d.all_reduce = original
    return {"issued": issued}


def norm_types_only_torch_computes_across_ranks(rank: int, world: int) -> dict:
    g = torch.Generator().manual_seed(32)
    everything = [torch.randn(n, generator=g) * 3 for n in (30, 20, 10, 25, 15)]
    everything[3].zero_()  # no non-zero: not counted by p=0, makes p<0 zero
    mine = everything[rank::world]
    out = {}
    for p in (0.0, -0.5, -2.0, float("-inf")):
        out[str(p)] = (
            fastnorm.total_norm(mine, p, group=dist.group.WORLD).item(),
            reference.total_norm(everything, p),
        )
    without_zeros = [t for t in everything if t.count_nonzero()]
    mesh = init_device_mesh("cpu", (world,))
    sharded = [distribute_tensor(t, mesh, [Shard(0)]) for t in without_zeros]
    for p in (-0.5, -2.0, float("-inf")):
        out[f"dtensor {p}"] = (fastnorm.total_norm(sharded, p).item(), reference.total_norm(without_zeros, p))
    try:
        fastnorm.total_norm(sharded, 0)
    except NotImplementedError as exc:
        out["p=0 on DTensors"] = str(exc)
    return out


def group_and_dtensors_where_a_rank_holds_no_plain_gradient(rank: int, world: int) -> dict:
    # group= brings its own communicator (as pipeline or expert groups do), the
    # DTensors their mesh's. Rank 0 lists a plain gradient first; the other ranks
    # hold DTensor shards only. Only an order every rank agrees on, not each
    # rank's order of first appearance, issues the two domains' collectives
    # alike everywhere; and every rank must join group='s collective, also one
    # without a plain gradient.
    group = dist.new_group(list(range(world)))
    mesh = init_device_mesh("cpu", (world,))
    # float64, and one tensor whose shards are larger than one C++ task (256 KiB).
    full = [t.double() for t in full_tensors(11)]
    large = torch.randn(70_001 * world, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
    full.insert(1, large)
    shared, plain = full[:4], full[4:]

    def mine() -> list[torch.Tensor]:
        sharded = [distribute_tensor(t.clone(), mesh, [Shard(0)]) for t in shared]
        return ([t.clone() for t in plain] if rank == 0 else []) + sharded

    out = {}
    for p in NORM_TYPES:
        out[str(p)] = (fastnorm.total_norm(mine(), p, group=group).item(), reference.norm(full, p))
    total, per_item = fastnorm.tensor_norms(mine(), group=group)
    out["tensor_norms total"] = (total.item(), reference.norm(full, 2.0))
    own = plain if rank == 0 else []
    out["per item"] = (per_item.tolist(), [reference.norm([t], 2.0) for t in own + shared])
    grads, before = mine(), reference.norm(full, 2.0)
    norm = fastnorm.clip_(grads, 1.0, group=group, gradients=True)
    out["clip"] = (norm.item(), before)
    out["after clip"] = (fastnorm.total_norm(grads, group=group).item(), before / (before + 1e-6))
    return out


SCENARIOS = [
    l2_extremes_across_ranks_on_the_torch_backend,
    l2_extremes_across_ranks,
    l2_sum_overflows_only_across_ranks,
    unscaled_partials_keep_their_bits,
    same_collectives_whatever_the_values,
    norm_types_only_torch_computes_across_ranks,
    group_tensor_norms_with_uneven_items,
    cached_plan_follows_dtensor_gradients,
    cached_plan_follows_dtensor_layouts,
    module_to_after_a_cached_clip,
    plain_shards_with_group,
    cached_plans_with_and_without_group,
    dtensor_placements,
    two_d_mesh,
    mixed_meshes,
    nan_on_one_rank,
    partial_is_rejected,
    fsdp2_clip,
    dtensor_clip_matches_torch,
    dtensor_norm_given_to_clip,
]


def worker(
    rank: int, world: int, port: int, out_dir: str, names: list[str] | None = None, timeout_s: float = 300
) -> None:
    """Runs the scenarios (``names``, default all) on this rank and writes their records.

    A collective that never finds its partner on the other ranks (ranks issuing
    different collectives) raises after ``timeout_s`` instead of hanging.
    """
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    scenarios = SCENARIOS if names is None else [globals()[name] for name in names]
    results = {}
    for i, scenario in enumerate(scenarios):
        if scenario is two_d_mesh and world % 2:
            continue
        try:
            results[scenario.__name__] = scenario(rank, world)
        except Exception:
            results[scenario.__name__] = {"exception": traceback.format_exc()}
        if i + 1 < len(scenarios):
            dist.barrier()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()
    # torch's gloo threads can abort the interpreter's finalization ("terminate
    # called without an active exception", pytorch/pytorch#190489; seen here
    # with a bare dist.all_reduce): the records are written, skip it.
    os._exit(0)
