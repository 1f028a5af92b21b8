"""Clip gradients that are disjoint flat shards of one model (ZeRO / FSDP1 style).

    torchrun --standalone --nproc-per-node 2 examples/flat_shards_group.py

The shards are plain tensors, the gradients themselves: ``clip_`` writes them
only when told so with ``gradients=True`` (a plain tensor in a list of
parameters is skipped, as torch skips it, so that a wrong list can never
scale weights).
"""

import torch
import torch.distributed as dist

import fastnorm

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()

# Every rank owns one contiguous slice of the model's flattened gradient.
torch.manual_seed(0)
full = torch.randn(10_000)
shard = full.tensor_split(world)[rank].clone()

norm = fastnorm.clip_([shard], max_norm=1.0, group=dist.group.WORLD, gradients=True)  # the norm of `full`
expected = torch.linalg.vector_norm(full)
clipped = fastnorm.total_norm([shard], group=dist.group.WORLD)  # the global norm after clipping
if rank == 0:
    print(f"global grad_norm={norm.item():.4f} (unsharded: {expected.item():.4f})")
    print(f"after clipping: {clipped.item():.4f}")

dist.destroy_process_group()
