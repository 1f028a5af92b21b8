"""The distributed examples docs/distributed.md points to run under torchrun (gloo, 2 ranks)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

import reference
from helpers import run_python

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# torch's gloo threads sometimes abort the interpreter's finalization after a
# script has finished (pytorch/pytorch#190489, reproduced here with a bare
# dist.all_reduce): tolerated only when that is the sole failure, after all the
# expected output.
TEARDOWN_ABORT = "terminate called without an active exception"


def torchrun(script: str) -> str:
    """Runs an example on 2 ranks (torchrun) and returns what it printed."""
    result = run_python(
        ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(EXAMPLES / script)],
        OMP_NUM_THREADS="1",
    )
    if result.returncode != 0:
        assert TEARDOWN_ABORT in result.stderr, result.stderr
        assert f'File "{EXAMPLES}' not in result.stderr, result.stderr  # the example itself raised nothing
    return result.stdout


def printed_close(printed: str, oracle: float) -> bool:
    """A value printed with 4 decimals, from float32 arithmetic, against the float64 oracle."""
    return abs(float(printed) - oracle) <= 5e-5 + 1e-5 * abs(oracle)


def fsdp2_oracle() -> list[float]:
    """The example's three steps in one process, unsharded and in float64, clipped by
    torch: the same draws from the same seed (FSDP2 averages the ranks' gradients of
    the same batch, which is this batch's gradient)."""
    return reference.torch_clip_loop((32, 64, 4), batch=16)


def test_fsdp2_example():
    stdout = torchrun("fsdp2_clip.py")
    steps = re.findall(r"step (\d): grad_norm=([0-9.]+)", stdout)
    assert [s for s, _ in steps] == ["0", "1", "2"]
    oracle = fsdp2_oracle()
    assert all(printed_close(v, ref) for (_, v), ref in zip(steps, oracle)), (steps, oracle)


def test_flat_shards_example():
    stdout = torchrun("flat_shards_group.py")
    got, shown = re.search(r"global grad_norm=([0-9.]+) \(unsharded: ([0-9.]+)\)", stdout).groups()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        full = torch.randn(10_000).double()  # the example's model gradient, in float64
    oracle = torch.linalg.vector_norm(full).item()
    assert printed_close(got, oracle) and printed_close(shown, oracle) and oracle > 1.0
    # gradients=True: every rank's shard was clipped by max_norm / (norm + 1e-6).
    after = re.search(r"after clipping: ([0-9.]+)", stdout).group(1)
    assert printed_close(after, oracle / (oracle + 1e-6))
    assert after == f"{oracle / (oracle + 1e-6):.4f}"
