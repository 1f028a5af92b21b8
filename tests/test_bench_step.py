"""The training-step benchmark helper: it runs, checks the fold clipped, and refuses bad setups."""

from __future__ import annotations

import pytest
import torch

from fastnorm.bench import step


def test_measure_workload_quick():
    result = step.measure_workload("gpt2-small", quick=True, rounds=2, warmup=1)
    assert set(result.medians) == set(step.CONTENDERS) == set(result.ratios)
    assert all(len(s) == 2 and min(s) > 0 for s in result.samples.values())
    assert result.ratios["step"] == 1.0
    assert result.tensors == len(step.WORKLOADS["gpt2-small"].shapes(quick=True))
    row = result.row()
    assert row["workload"] == "gpt2-small (quick)" and row["folded / step"] == result.ratios["folded"]
    lines = step.table([result]).splitlines()
    assert len(lines) == 2 and "folded / step" in lines[0]


def test_measure_leaves_the_gradients_as_given():
    params = step.workload_params("llama-300m", quick=True, seed=3)
    grads = [p.grad.clone() for p in params]
    step.measure(params, rounds=1, warmup=0)
    assert all(torch.equal(p.grad, g) for p, g in zip(params, grads))


def test_measure_refuses_what_would_not_measure_the_fold():
    params = step.workload_params("gpt2-small", quick=True)
    with pytest.raises(ValueError, match="would not clip"):
        step.measure(params, max_norm=1e9, rounds=1)
    with pytest.raises(ValueError, match="not fused"):
        step.measure(params, rounds=1, optimizer=lambda ps: torch.optim.AdamW(ps))


def test_the_check_catches_a_step_that_did_not_clip():
    params = step.workload_params("gpt2-small", quick=True)
    originals = [p.grad.clone() for p in params]
    with pytest.raises(RuntimeError, match="did not clip gradient 0"):
        step._check_folded_clips(params, originals, 0.5)
    for p in params:
        p.grad.mul_(0.5)
    step._check_folded_clips(params, originals, 0.5)


def test_main_prints_a_table(capsys):
    assert step.main(["--workloads", "gpt2-small", "--quick", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "gpt2-small (quick)" in out and "threads" in out
