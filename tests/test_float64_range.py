"""float64 L2 norms whose squares fit float64 one by one but overflow when added."""

from __future__ import annotations

import math

import pytest
import torch

import fastnorm
from reference import norm, rel_err


def _cases() -> dict[str, list[torch.Tensor]]:
    f64 = torch.float64
    return {
        # Two tensors, each norm^2 about 1.44e308: only their sum leaves float64.
        "two tensors": [torch.full((1,), 1.2e154, dtype=f64), torch.full((1,), -1.2e154, dtype=f64)],
        # One tensor of many chunks and tasks, each sum of squares below the
        # largest double, the total above it.
        "one tensor": [torch.full((3000,), 5e152, dtype=f64).mul_(torch.rand(3000, dtype=f64) + 0.5)],
        # A dense tensor (fused) beside a strided one (the torch backend): the
        # front merges two groups whose partials fit alone.
        "two groups": [
            torch.full((1,), 1.2e154, dtype=f64),
            torch.full((2, 2), 9e153, dtype=f64)[:, 0],
        ],
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_sum_that_overflows_only_when_added_is_finite(backend, case, monkeypatch):
    tensors = _cases()[case]
    if case == "two groups" and backend != "torch":  # two backends share the call: auto's cpp and torch
        if backend == "triton":
            pytest.skip("on CPU tensors only auto mixes backends (cpp and torch): the cpp case")
        monkeypatch.setenv("FASTNORM_BACKEND", "auto")
    expected = norm(tensors, 2.0)
    got = fastnorm.total_norm(tensors)
    assert got.dtype == torch.float64
    assert rel_err(got.item(), expected) < 1e-12, (got.item(), expected)
    total, per_item = fastnorm.tensor_norms(tensors)
    assert rel_err(total.item(), expected) < 1e-12
    for t, value in zip(tensors, per_item.tolist()):
        assert rel_err(value, norm([t], 2.0)) < 1e-12


def test_clip_uses_the_finite_norm(backend):
    tensors = _cases()["two tensors"]
    grads = [t.clone() for t in tensors]
    params = [torch.nn.Parameter(torch.zeros_like(t)) for t in tensors]
    for p, g in zip(params, grads):
        p.grad = g
    norm_before = fastnorm.clip_(params, 1.0)
    assert math.isfinite(norm_before.item())
    assert fastnorm.total_norm(params).item() == pytest.approx(1.0, rel=1e-6)


def test_an_inf_element_stays_inf(backend):
    tensors = _cases()["two tensors"] + [torch.tensor([math.inf], dtype=torch.float64)]
    assert fastnorm.total_norm(tensors).item() == math.inf
    tensors[-1] = torch.tensor([math.nan], dtype=torch.float64)
    assert math.isnan(fastnorm.total_norm(tensors).item())
