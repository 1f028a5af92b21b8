"""The distributed examples the README points to run under torchrun (gloo, 2 ranks)."""

from __future__ import annotations

import re
from pathlib import Path

from harness import run_python

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


def test_fsdp2_example():
    stdout = torchrun("fsdp2_clip.py")
    steps = re.findall(r"step (\d): grad_norm=([0-9.]+)", stdout)
    assert [s for s, _ in steps] == ["0", "1", "2"]
    assert all(float(v) > 0 for _, v in steps)


def test_flat_shards_example():
    stdout = torchrun("flat_shards_group.py")
    got, expected = re.search(r"global grad_norm=([0-9.]+) \(unsharded: ([0-9.]+)\)", stdout).groups()
    assert got == expected and float(got) > 1.0
    # gradients=True: every rank's shard was clipped, so the global norm is max_norm now.
    assert re.search(r"after clipping: ([0-9.]+)", stdout).group(1) == "1.0000"
