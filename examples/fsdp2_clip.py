"""Clip FSDP2-sharded gradients with fastnorm.

    torchrun --standalone --nproc-per-node 2 examples/fsdp2_clip.py

Runs on CPU (gloo) or, where every rank has a GPU, on CUDA (nccl).
"""

import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import fastnorm

device = "cuda" if torch.cuda.is_available() else "cpu"
dist.init_process_group("nccl" if device == "cuda" else "gloo")
if device == "cuda":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh(device, (dist.get_world_size(),))

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(device)
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer, mesh=mesh)
model = fully_shard(model, mesh=mesh)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

for step in range(3):
    x = torch.randn(16, 32, device=device)
    loss = model(x).square().mean()
    loss.backward()
    # Each rank holds a shard of every gradient (DTensor, Shard(0)): fastnorm
    # reduces its shards in one fused pass and all-reduces one scalar.
    norm = fastnorm.clip_(model.parameters(), max_norm=1.0)
    optimizer.step()
    optimizer.zero_grad()
    if dist.get_rank() == 0:
        print(f"step {step}: grad_norm={norm.item():.4f}")  # the global norm, the same on every rank

dist.destroy_process_group()
