"""torchtitan's clip utility trains with fastnorm.patch() as with torch (see stack_harness).

torchtitan's trainer calls ``torchtitan.distributed.utils.clip_grad_norm_``,
which takes ``torch.nn.utils.get_total_norm`` of the gradients, reduces it over
the pipeline stages itself (in place on the returned norm) and clips with
``torch.nn.utils.clip_grads_with_norm_``; with expert parallelism it does so
for the expert and the dense gradients, two device meshes, apart.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchtitan")
from torchtitan.distributed import utils as dist_utils  # noqa: E402
from torchtitan.models.llama3 import Transformer, TransformerModelArgs  # noqa: E402

from stack_harness import Run, assert_runs_agree, one_rank, params_of, run_three  # noqa: E402

pytestmark = pytest.mark.slow  # importing torchtitan takes seconds

STEPS = 10


def llama() -> torch.nn.Module:
    args = TransformerModelArgs(dim=64, n_layers=2, n_heads=4, vocab_size=128, multiple_of=16, max_seq_len=32)
    torch.manual_seed(0)
    model = Transformer(args)
    with torch.no_grad():
        model.init_weights()
    return model


def test_torchtitan_llama_clips_with_fastnorm(one_thread):
    def train(run, spy, monitor):
        model = llama()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        g = torch.Generator().manual_seed(1)
        losses = []
        for _ in range(STEPS):
            tokens = torch.randint(0, 128, (4, 17), generator=g)
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            loss.backward()
            dist_utils.clip_grad_norm_(model.parameters(), max_norm=1.0, foreach=True)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return Run(losses, params_of(model), spy)

    runs = run_three(train)
    assert_runs_agree(runs)
    ours = runs["fastnorm"]
    assert ours.spy.count("get_total_norm") == ours.spy.count("clip_grads_with_norm_") == STEPS
    assert ours.monitor.values() == [c.value for c in ours.spy.calls if c.name == "clip_grads_with_norm_"]


def test_torchtitan_expert_and_pipeline_meshes_clip_with_fastnorm(one_thread):
    """ep_enabled: expert and dense gradients on their own meshes, a norm each, combined; pp_mesh:
    the total reduced over the stages in place (one process, gloo)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    def train(run, spy, monitor):
        mesh = init_device_mesh("cpu", (1, 1, 1), mesh_dim_names=("pp", "ep", "dp"))
        torch.manual_seed(0)
        experts = torch.nn.Parameter(distribute_tensor(torch.randn(4, 8, 8) * 0.3, mesh["ep"], [Shard(0)]))
        dense = torch.nn.Parameter(distribute_tensor(torch.randn(8, 8) * 0.3, mesh["dp"], [Replicate()]))
        optimizer = torch.optim.SGD([experts, dense], lr=0.1)
        g = torch.Generator().manual_seed(2)
        losses = []
        for _ in range(STEPS):
            x = torch.randn(16, 8, generator=g)
            h = torch.tanh(x @ dense.full_tensor())
            loss = torch.einsum("bi,eij->bej", h, experts.full_tensor()).square().mean()
            loss.backward()
            dist_utils.clip_grad_norm_([experts, dense], 0.5, ep_enabled=True, pp_mesh=mesh["pp"])
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        params = {"experts": experts.detach().full_tensor(), "dense": dense.detach().full_tensor()}
        return Run(losses, params, spy)

    with one_rank():
        runs = run_three(train)
    assert_runs_agree(runs)
    ours = runs["fastnorm"]
    assert ours.spy.count("get_total_norm") == ours.spy.count("clip_grads_with_norm_") == 2 * STEPS
    assert len(ours.monitor.norms) == STEPS  # one total per step, though two groups are clipped with it
