"""clip_: parity with torch.nn.utils.clip_grad_norm_, the conditional scale, reuse, errors."""

from __future__ import annotations

import math
import textwrap

import pytest
import torch

import fastnorm
import reference
from harness import run_python


def make_params(shapes, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    params = []
    for s in shapes:
        p = torch.nn.Parameter(torch.zeros(s, dtype=dtype))
        p.grad = (torch.randn(s, generator=g, dtype=torch.float64) * scale).to(dtype)
        params.append(p)
    return params


def clone_params(params):
    out = []
    for p in params:
        q = torch.nn.Parameter(p.detach().clone())
        q.grad = None if p.grad is None else p.grad.clone()
        out.append(q)
    return out


SHAPES = [(123,), (4097,), (7, 9), (1,), (0,), (1500,)]
# torch's foreach p=inf norm raises on an empty tensor; fastnorm does not.
PARITY_SHAPES = [s for s in SHAPES if s != (0,)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", [2.0, 1.0, float("inf"), 3.0])
@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_parity_with_torch(backend, dtype, p, max_norm):
    ours = make_params(PARITY_SHAPES, dtype, seed=1, scale=2.0)
    theirs = clone_params(ours)
    norm = fastnorm.clip_(ours, max_norm, p)
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm, p)
    assert norm.dtype == expected.dtype
    assert norm.item() == pytest.approx(expected.item(), rel=1e-5)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_bitwise_equal_to_torch_given_the_same_norm(backend, dtype):
    # Same norm in, same coefficient (reciprocal then times max_norm, in the
    # norm's dtype), same rounding of the products: every bit equal.
    ours = make_params(SHAPES, dtype, seed=2, scale=3.0)
    theirs = clone_params(ours)
    norm = torch.nn.utils.get_total_norm([p.grad for p in theirs if p.grad.numel()]).float()
    if dtype == torch.float64:
        norm = norm.double()
    fastnorm.clip_(ours, 0.7, total_norm=norm)
    torch.nn.utils.clip_grads_with_norm_(theirs, 0.7, norm)
    for a, b in zip(ours, theirs):
        assert torch.equal(a.grad, b.grad)


def test_returns_pre_clip_norm_and_clips_to_max(backend):
    params = make_params([(1000,), (3000,)], seed=3, scale=5.0)
    before = reference.norm([p.grad for p in params], 2.0)
    norm = fastnorm.clip_(params, 1.0)
    assert norm.item() == pytest.approx(before, rel=1e-6)
    assert reference.norm([p.grad for p in params], 2.0) == pytest.approx(1.0, rel=1e-5)


def test_no_clip_leaves_gradients_bitwise_unchanged(backend):
    params = make_params(SHAPES, seed=4)
    before = [p.grad.clone() for p in params]
    fastnorm.clip_(params, 1e9)
    assert all(torch.equal(p.grad, b) for p, b in zip(params, before))


@pytest.mark.parametrize("name", ["cpp", "triton"])
def test_no_clip_touches_no_memory(name, tmp_path):
    # The gradients live in read-only memory: any write would crash the process,
    # so the check runs in a child process.
    script = textwrap.dedent(
        f"""
        import ctypes, mmap, os
        import numpy as np, torch
        os.environ["FASTNORM_BACKEND"] = "{name}"
        os.environ["TRITON_INTERPRET"] = "1"
        import fastnorm
        n = 5000
        region = mmap.mmap(-1, n * 4)
        values = np.frombuffer(region, dtype=np.float32)
        values[:] = np.random.default_rng(0).standard_normal(n)
        address = ctypes.addressof(ctypes.c_char.from_buffer(region))
        PROT_READ = 1
        assert ctypes.CDLL(None).mprotect(ctypes.c_void_p(address), ctypes.c_size_t(n * 4), PROT_READ) == 0
        grad = torch.from_numpy(values)
        norm = fastnorm.clip_([grad], max_norm=1e9, gradients=True)
        print("untouched", float(norm), flush=True)
        fastnorm.clip_([grad], max_norm=1.0, gradients=True)
        print("unreachable", flush=True)
        """
    )
    result = run_python(["-c", script])
    assert "untouched" in result.stdout, result.stderr
    # Clipping for real does write, and the read-only page stops it: proof the
    # first call did not write.
    assert "unreachable" not in result.stdout
    assert result.returncode != 0


def test_total_norm_is_reused_without_a_second_reduction(backend, monkeypatch):
    params = make_params([(100,), (200,)], seed=5, scale=4.0)
    given = fastnorm.total_norm(params)
    calls = []
    from fastnorm.backends import backends

    for b in backends().values():
        original = b.reduce
        monkeypatch.setattr(b, "reduce", lambda *a, _o=original, **k: calls.append(1) or _o(*a, **k))
    expected = [p.grad * (1.0 / (given + 1e-6) * 2.0) for p in params]
    returned = fastnorm.clip_(params, 2.0, total_norm=given)
    assert calls == []
    assert returned is given
    for p, e in zip(params, expected):
        torch.testing.assert_close(p.grad, e)


def test_same_tensor_twice_is_scaled_once(backend):
    (p,) = make_params([(500,)], seed=6, scale=3.0)
    (q,) = clone_params([p])
    fastnorm.clip_([p, p, p], 1.0)
    fastnorm.clip_([q], 1.0)
    assert torch.equal(p.grad, q.grad)


def test_nan_norm_scales_by_nan_like_torch(backend):
    ours = make_params([(10,), (20,)], seed=7)
    ours[0].grad[3] = float("nan")
    theirs = clone_params(ours)
    norm = fastnorm.clip_(ours, 1.0)
    torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert math.isnan(norm.item())
    for a, b in zip(ours, theirs):
        assert torch.equal(a.grad.isnan(), b.grad.isnan())


def test_zero_max_norm_zeroes_gradients(backend):
    params = make_params([(64,)], seed=8)
    fastnorm.clip_(params, 0.0)
    assert torch.count_nonzero(params[0].grad) == 0


def test_sparse_gradients_are_clipped(backend):
    indices = torch.tensor([[0, 2, 2, 5]])
    values = torch.tensor([3.0, -2.0, 4.0, 1.0])
    p = torch.nn.Parameter(torch.zeros(6))
    p.grad = torch.sparse_coo_tensor(indices, values, (6,))  # index 2 twice
    dense = p.grad.to_dense()
    norm = fastnorm.clip_([p], 1.0)
    assert norm.item() == pytest.approx(dense.norm().item(), rel=1e-6)
    torch.testing.assert_close(p.grad.to_dense(), dense * (1.0 / (norm + 1e-6)))


def test_drop_in_replacement_signature(backend):
    params = make_params([(30,)], seed=9, scale=5.0)
    theirs = clone_params(params)
    fastnorm.clip_(params, 1.0, 2.0, False, True)  # positional, foreach accepted
    torch.nn.utils.clip_grad_norm_(theirs, 1.0, 2.0, False, True)
    torch.testing.assert_close(params[0].grad, theirs[0].grad)


# ----------------------------------------------------------------------------
# Bad input: a clear error and nothing half-done
# ----------------------------------------------------------------------------


def _assert_untouched(params, before):
    assert all(torch.equal(p.grad, b) for p, b in zip(params, before))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"max_norm": float("nan")}, ValueError, "max_norm"),
        ({"max_norm": -1.0}, ValueError, "max_norm"),
        ({"max_norm": "big"}, TypeError, "max_norm"),
        ({"max_norm": 1.0, "norm_type": float("nan")}, ValueError, "norm_type"),
        ({"max_norm": 1.0, "norm_type": "big"}, TypeError, "norm_type"),
        ({"max_norm": 1.0, "total_norm": 3.0}, TypeError, "total_norm"),
        ({"max_norm": 1.0, "total_norm": torch.ones(2)}, ValueError, "total_norm"),
        ({"max_norm": 1.0, "total_norm": torch.tensor(3)}, TypeError, "floating-point"),
        ({"max_norm": 1.0, "total_norm": torch.tensor(True)}, TypeError, "floating-point"),
        ({"max_norm": 1.0, "total_norm": torch.tensor(3 + 0j)}, TypeError, "floating-point"),
        ({"max_norm": 1.0, "total_norm": torch.ones(1, 1)}, None, None),
    ],
)
def test_bad_arguments(backend, kwargs, error, match):
    params = make_params([(10,), (20,)], seed=10, scale=3.0)
    before = [p.grad.clone() for p in params]
    if error is None:  # accepted: a floating tensor of one element, whatever its shape
        fastnorm.clip_(params, **kwargs)
        assert not torch.equal(params[0].grad, before[0])
        return
    with pytest.raises(error, match=match):
        fastnorm.clip_(params, **kwargs)
    _assert_untouched(params, before)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_integer_gradient_is_a_type_error_naming_position_and_dtype(backend, dtype):
    params = make_params([(10,), (20,)], seed=11, scale=3.0)
    before = [p.grad.clone() for p in params]
    bad = torch.ones(5, dtype=dtype)
    holder = torch.ones(5, dtype=dtype)
    holder.grad = bad  # a tensor with a .grad is a parameter, whatever its dtype
    with pytest.raises(TypeError, match=rf"item 2 .*{dtype}"):
        fastnorm.clip_([*params, holder], 1.0)
    with pytest.raises(TypeError, match=rf"item 3 .*{dtype}"):
        fastnorm.clip_([*params, torch.ones(3), holder], 1.0)  # the caller's position, not the kept one
    with pytest.raises(TypeError, match=rf"item 1 .*{dtype}"):
        fastnorm.total_norm([params[0].grad, bad])
    with pytest.raises(TypeError, match=rf"item 1 .*{dtype}"):
        fastnorm.clip_([params[0].grad, bad], 1.0, gradients=True)
    _assert_untouched(params, before)


def test_non_tensor_item_is_a_type_error(backend):
    params = make_params([(10,)], seed=12, scale=3.0)
    before = [p.grad.clone() for p in params]
    with pytest.raises(TypeError, match="item 1 is a float"):
        fastnorm.clip_([params[0], 1.5], 1.0)
    with pytest.raises(TypeError, match="iterable"):
        fastnorm.total_norm(3.0)
    _assert_untouched(params, before)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_error_if_nonfinite_raises_before_scaling(backend, bad):
    params = make_params([(10,), (20,)], seed=13, scale=3.0)
    params[1].grad[4] = bad
    before = [p.grad.clone() for p in params]
    with pytest.raises(RuntimeError, match="non-finite"):
        fastnorm.clip_(params, 1.0, error_if_nonfinite=True)
    for p, b in zip(params, before):
        torch.testing.assert_close(p.grad, b, rtol=0, atol=0, equal_nan=True)
    with pytest.raises(RuntimeError, match="non-finite"):
        fastnorm.total_norm(params, error_if_nonfinite=True)
