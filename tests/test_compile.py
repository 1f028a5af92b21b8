"""fastnorm under torch.compile: custom ops that pass opcheck, a fullgraph training step."""

from __future__ import annotations

import pytest
import torch

import fastnorm
from fastnorm import custom_ops as ops


def _grads(seed=0, dtypes=(torch.float32, torch.bfloat16, torch.float64)):
    g = torch.Generator().manual_seed(seed)
    sizes = [123, 4097, 7, 1]
    return [(torch.randn(n, generator=g) * 3).to(dtypes[i % len(dtypes)]) for i, n in enumerate(sizes)]


@pytest.mark.parametrize(
    "op, args",
    [
        (ops.total_norm_op, lambda: (_grads(), 2.0)),
        (ops.total_norm_op, lambda: (_grads(1, (torch.float32,)), float("inf"))),
        (ops.clip_op, lambda: (_grads(2), 0.5, 2.0)),
        (ops.scale_op, lambda: (_grads(3), torch.tensor(40.0), 1.0)),
        (ops.tensor_norms_op, lambda: (_grads(4), 1.0)),
    ],
)
def test_opcheck(op, args):
    result = torch.library.opcheck(op, args())
    assert all(status == "SUCCESS" for status in result.values()), result


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))


def _sgd_step(model, clip, max_norm=0.5, lr=0.1):
    params = list(model.parameters())
    norm = clip(params, max_norm)
    with torch.no_grad():
        torch._foreach_add_(params, [p.grad for p in params], alpha=-lr)
    return norm


def test_fullgraph_training_step_matches_eager():
    eager, compiled = _model(), _model()
    step = torch.compile(_sgd_step, fullgraph=True)
    g = torch.Generator().manual_seed(1)
    for i in range(4):
        x = torch.randn(16, 12, generator=g) * (1 + 10 * (i % 2))  # alternately clipped and not
        for model in (eager, compiled):
            model.zero_grad(set_to_none=True)
            model(x).square().sum().backward()
        expected = _sgd_step(eager, torch.nn.utils.clip_grad_norm_)
        got = step(compiled, fastnorm.clip_)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=0)
        for a, b in zip(compiled.parameters(), eager.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_compiled_norms_match_eager():
    model = _model()
    model(torch.randn(5, 12)).sum().backward()
    model[2].bias.grad = None  # missing: per-item norm 0, skipped by the total
    params = list(model.parameters())

    def norms(ps):
        total = fastnorm.total_norm(ps, 3.0)
        both = fastnorm.tensor_norms(ps)
        reused = fastnorm.clip_(ps, 1e9, total_norm=both[0])
        return total, both, reused

    compiled = torch.compile(norms, fullgraph=True)(params)
    eager = norms(params)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    assert compiled[1][1].shape == (len(params),) and compiled[1][1][-1] == 0


def test_unsupported_arguments_say_so_under_compile():
    params = list(_model().parameters())
    for p in params:
        p.grad = torch.randn_like(p)

    def with_check(ps):
        return fastnorm.clip_(ps, 1.0, error_if_nonfinite=True)

    with pytest.raises(Exception, match="not supported under torch.compile"):
        torch.compile(with_check, fullgraph=True)(params)
