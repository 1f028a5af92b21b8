"""float64 L2 norms whose squares fit float64 one by one but overflow when added."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import fastnorm
from fastnorm.backends import cpp
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


MAGNITUDES = (1e-310, 1e-200, 1e-30, 1.0, 1e30, 1e154, 1e300)


def _split(order: str, first: float, then: float) -> list[torch.Tensor]:
    """float64 gradients split between the fused backend (dense tensors, "d") and
    the torch backend (views with gaps, "g"), which the front then combines: the
    first at magnitude ``first``, the others at ``then`` (so that with three, one
    group merges two magnitudes itself)."""
    g = torch.Generator().manual_seed(len(order))
    tensors = []
    for i, kind in enumerate(order):
        magnitude = then if i else first
        full = (torch.rand(2, 300, generator=g, dtype=torch.float64) + 0.5) * magnitude
        tensors.append(full[0] if kind == "d" else full[:, ::3])
    return tensors


@pytest.mark.skipif(cpp._C is None, reason="the C++ kernels are not built")
@pytest.mark.parametrize("order", ["dg", "gd", "dgd", "gdg"])
def test_groups_of_any_magnitudes_combine_to_the_norm(monkeypatch, order):
    """The front merges the two groups' L2 partials, each plain or scaled by a
    power of two, at every pair of magnitudes and whichever group comes first
    (auto's C++ kernels and torch ops: the Triton backend's partials obey the same contract)."""
    monkeypatch.setenv("FASTNORM_BACKEND", "auto")
    for first, then in itertools.product(MAGNITUDES, MAGNITUDES):
        tensors = _split(order, first, then)
        expected = norm(tensors, 2.0)
        got = fastnorm.total_norm(tensors)
        assert rel_err(got.item(), expected) < 1e-13, (first, then, got.item(), expected)
        total, per_item = fastnorm.tensor_norms(tensors)
        assert total.item() == got.item()
        for t, value in zip(tensors, per_item.tolist()):
            assert rel_err(value, norm([t], 2.0)) < 1e-13, (first, then)
