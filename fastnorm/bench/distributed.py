"""Distributed workloads: DTensor gradients sharded over the ranks of a gloo group.

``fsdp2-gpt2``: GPT-2 small's gradients as FSDP2 lays them out, each tensor a
DTensor sharded on dim 0 over 2 CPU processes (gloo), each with one thread.
fastnorm's calls reduce the local shards in one pass and all-reduce one scalar;
torch's ``get_total_norm`` / ``clip_grad_norm_`` run their DTensor paths. Every
rank runs the same contenders in the same rounds (lockstep: their calls hold
collectives); rank 0's timings are reported. Bytes are one rank's shards, so
GB/s and the roofline (a read of a flat buffer of those bytes) are per rank.
"""

from __future__ import annotations

import json
import math
import os
import socket
import tempfile
from typing import Any

import torch
from torch.nn import Parameter

from fastnorm.bench.workloads import GROUPED_CONTENDERS, Prepared, Workload, gpt2_shapes, register_workload

RANKS = 2
CONTENDERS = GROUPED_CONTENDERS  # fastnorm's and torch's calls, and the roofline of the same bytes


def build_sharded(
    shapes: list[tuple[int, ...]], name: str, *, dtype: torch.dtype, device: torch.device, seed: int
) -> Prepared:
    """Seeded gradients of total norm ~1, sharded Shard(0) over the initialized group."""
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    numel = sum(math.prod(s) for s in shapes)
    generator = torch.Generator().manual_seed(seed)  # the same full tensors on every rank
    params, locals_, total = [], [], 0.0
    with torch.no_grad():
        for shape in shapes:
            full = (torch.randn(shape, generator=generator) / math.sqrt(numel)).to(dtype)
            total += float(full.to(torch.float64).square().sum())
            grad = distribute_tensor(full.to(device), mesh, [Shard(0)])
            param = Parameter(
                distribute_tensor(torch.empty(shape, dtype=dtype, device=device), mesh, [Shard(0)])
            )
            param.grad = grad
            params.append(param)
            locals_.append(grad._local_tensor)
    flat = torch.cat([t.reshape(-1) for t in locals_])
    prepared = Prepared(name, dtype, device, params, flat)
    prepared.ref_norm = math.sqrt(total)  # the whole model's, not this rank's
    prepared.ref_norms = [prepared.ref_norm]
    return prepared


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(
    rank: int, port: int, out: str, name: str, contenders: list[str], kwargs: dict[str, Any]
) -> None:
    from fastnorm.bench.contenders import CONTENDERS
    from fastnorm.bench.harness import run_workload
    from fastnorm.bench.workloads import WORKLOADS

    workload = WORKLOADS[name]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=workload.ranks)
    try:
        chosen = [CONTENDERS[c] for c in contenders]
        kwargs.update(min_time_s=0.0, lockstep=True)  # the same rounds on every rank
        record = run_workload(workload, contenders=chosen, **kwargs)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(record, f)
    finally:
        torch.distributed.destroy_process_group()
    # torch's gloo threads can abort the interpreter's finalization
    # (pytorch/pytorch#190489): the record is written, skip it.
    os._exit(0)


def run(workload: Workload, contenders: list[Any], **kwargs: Any) -> dict[str, Any]:
    """Runs ``harness.run_workload`` on ``workload.ranks`` processes; rank 0's record.

    The children get names, not objects: workloads and contenders hold lambdas,
    which do not pickle; importing fastnorm.bench registers them again there.
    """
    names = [c.name for c in contenders]
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "rank0.json")
        args = (_free_port(), out, workload.name, names, kwargs)
        torch.multiprocessing.spawn(_rank_main, args=args, nprocs=workload.ranks, join=True)
        with open(out) as f:
            record = json.load(f)
    record["ranks"] = workload.ranks
    return record


def _gpt2(**kwargs: Any) -> Prepared:
    return build_sharded(gpt2_shapes(**_GPT2_SIZE[kwargs.pop("quick")]), "fsdp2-gpt2", **kwargs)


_GPT2_SIZE = {False: {}, True: {"n_layer": 2, "d": 64, "vocab": 1000, "ctx": 128}}

register_workload(
    Workload(
        "fsdp2-gpt2",
        f"GPT-2 small's gradients as FSDP2 shards them (DTensor, Shard(0)) over {RANKS} gloo ranks",
        gpt2_shapes,
        lambda: gpt2_shapes(**_GPT2_SIZE[True]),
        devices=("cpu",),
        default_on=(),
        build=_gpt2,
        ranks=RANKS,
        contenders=CONTENDERS,
    )
)
