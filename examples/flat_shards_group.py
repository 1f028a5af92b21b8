"""Clip gradients that are disjoint flat shards of one model (ZeRO / FSDP1 style).

    torchrun --standalone --nproc-per-node 2 examples/flat_shards_group.py
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

norm = fastnorm.clip_([shard], max_norm=1.0, group=dist.group.WORLD)  # the norm of `full`
expected = torch.linalg.vector_norm(full)
if rank == 0:
    print(f"global grad_norm={norm.item():.4f} (unsharded: {expected.item():.4f})")

dist.destroy_process_group()
