"""clip_: parity with torch.nn.utils.clip_grad_norm_, the conditional scale, reuse, errors."""

from __future__ import annotations

import math
import textwrap
import warnings

import pytest
import torch

import fastnorm
import reference
from helpers import NoMemoryWrapper, refused, run_python, serves, use_backend


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


# Odd sizes, 0 and 1 elements, more than one chunk of Triton's interpreter
# (512 elements), and for the C++ kernels more than one task (256 KiB).
SHAPES = [(123,), (4097,), (7, 9), (1,), (0,), (1500,)]
LARGE = {"cpp": [(70001,)], "torch": [(70001,)], "triton": []}


def shapes(backend, empty=True):
    """SHAPES with a tensor larger than the backend's unit of work; without the
    empty one (torch's foreach p=inf norm raises on it; fastnorm does not)."""
    return [s for s in SHAPES + LARGE[backend] if empty or s != (0,)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", [2.0, 1.0, float("inf"), 3.0])
@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_parity_with_torch(backend, dtype, p, max_norm):
    ours = make_params(shapes(backend, empty=False), dtype, seed=1, scale=2.0)
    theirs = clone_params(ours)
    norm = fastnorm.clip_(ours, max_norm, p)
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm, p)
    assert norm.dtype == expected.dtype
    assert norm.item() == pytest.approx(expected.item(), rel=1e-5)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale, max_norm", [(3.0, 0.7), (1e-3, 0.02)], ids=["norm-1e2", "norm-1e-1"])
def test_bitwise_equal_to_torch_given_the_same_norm(backend, dtype, scale, max_norm):
    # Same norm in, same coefficient (reciprocal of norm + 1e-6, then times
    # max_norm, in the norm's dtype), same rounding of the products: every bit
    # equal. Below a norm of about 1 the + 1e-6 shows in a float32 coefficient.
    ours = make_params(shapes(backend), dtype, seed=2, scale=scale)
    theirs = clone_params(ours)
    norm = torch.nn.utils.get_total_norm([p.grad for p in theirs if p.grad.numel()]).float()
    if dtype == torch.float64:
        norm = norm.double()
    assert max_norm < norm.item()  # it clips
    fastnorm.clip_(ours, max_norm, total_norm=norm)
    torch.nn.utils.clip_grads_with_norm_(theirs, max_norm, norm)
    for a, b in zip(ours, theirs):
        assert torch.equal(a.grad, b.grad)


def test_returns_pre_clip_norm_and_clips_to_max(backend):
    params = make_params([(1000,), (3000,), *shapes(backend)], seed=3, scale=5.0)
    before = reference.norm([p.grad for p in params], 2.0)
    norm = fastnorm.clip_(params, 1.0)
    assert norm.item() == pytest.approx(before, rel=1e-6)
    assert reference.norm([p.grad for p in params], 2.0) == pytest.approx(1.0, rel=1e-5)


def test_no_clip_leaves_gradients_bitwise_unchanged(backend):
    params = make_params(shapes(backend), seed=4)
    before = [p.grad.clone() for p in params]
    fastnorm.clip_(params, 1e9)
    assert all(torch.equal(p.grad, b) for p, b in zip(params, before))


@pytest.mark.parametrize("name", ["cpp", "triton"])
@pytest.mark.slow
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
    params = make_params([(100,), (200,), *shapes(backend)], seed=5, scale=4.0)
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
    (p,) = make_params([max(shapes(backend), key=math.prod)], seed=6, scale=3.0)
    (q,) = clone_params([p])
    fastnorm.clip_([p, p, p], 1.0)
    fastnorm.clip_([q], 1.0)
    assert torch.equal(p.grad, q.grad)


def test_nan_norm_scales_by_nan_like_torch(backend):
    ours = make_params([(10,), (20,), *shapes(backend)], seed=7)
    ours[0].grad[3] = float("nan")
    theirs = clone_params(ours)
    norm = fastnorm.clip_(ours, 1.0)
    torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert math.isnan(norm.item())
    for a, b in zip(ours, theirs):
        assert torch.equal(a.grad.isnan(), b.grad.isnan())


def test_zero_max_norm_zeroes_gradients(backend):
    params = make_params([(64,), *shapes(backend)], seed=8)
    fastnorm.clip_(params, 0.0)
    assert all(torch.count_nonzero(p.grad) == 0 for p in params)


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
    params = make_params([(10,), (20,), *shapes(backend)], seed=13, scale=3.0)
    params[1].grad[4] = bad
    before = [p.grad.clone() for p in params]
    with pytest.raises(RuntimeError, match="non-finite"):
        fastnorm.clip_(params, 1.0, error_if_nonfinite=True)
    for p, b in zip(params, before):
        torch.testing.assert_close(p.grad, b, rtol=0, atol=0, equal_nan=True)
    with pytest.raises(RuntimeError, match="non-finite"):
        fastnorm.total_norm(params, error_if_nonfinite=True)


# ----------------------------------------------------------------------------
# The item rule: clip_ never writes a tensor torch would not
# ----------------------------------------------------------------------------


def _both(items_for, *args, **kwargs):
    """Runs fastnorm's and torch's clip on two identical sets of items."""
    ours, theirs = items_for(), items_for()
    got = fastnorm.clip_(ours, *args, **kwargs)
    expected = torch.nn.utils.clip_grad_norm_(theirs, *args, **kwargs)
    return ours, theirs, got, expected


def test_a_tensor_with_a_grad_has_its_grad_clipped_not_itself(backend):
    def items():
        t = torch.full((4,), 3.0)
        t.grad = torch.full((4,), 10.0)
        return t

    ours, theirs, got, expected = _both(items, 1.0)
    assert got.item() == expected.item() == 20.0
    assert torch.equal(ours, torch.full((4,), 3.0))  # the tensor itself: never written
    assert torch.equal(ours.grad, theirs.grad)


def test_a_state_dict_is_left_alone(backend):
    def items():
        torch.manual_seed(0)
        return list(torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.BatchNorm1d(4)).state_dict().values())

    with pytest.warns(fastnorm.NoGradientWarning, match="state_dict"):  # torch says nothing
        ours, theirs, got, expected = _both(items, 1e-3)
    assert got.item() == expected.item() == 0.0
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))  # no weight scaled


def test_plain_and_non_leaf_tensors_are_skipped_among_parameters(backend):
    def items():
        g = torch.Generator().manual_seed(17)
        p = torch.nn.Parameter(torch.zeros(30))
        p.grad = torch.randn(30, generator=g) * 5
        plain = torch.randn(20, generator=g) * 5
        non_leaf = torch.randn(10, generator=g, requires_grad=True) * 5
        return [plain, p, non_leaf]

    ours = items()
    before = [ours[0].clone(), ours[2].detach().clone()]
    got = fastnorm.clip_(ours, 1.0)
    theirs = items()
    with pytest.warns(UserWarning, match="not a leaf"):  # torch reads the non-leaf's .grad
        expected = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert got.item() == pytest.approx(expected.item(), rel=1e-6)
    assert torch.equal(ours[0], before[0]) and torch.equal(ours[2].detach(), before[1])
    torch.testing.assert_close(ours[1].grad, theirs[1].grad)


def test_gradients_true_clips_the_tensors_given(backend):
    w = torch.nn.Parameter(torch.randn(40, generator=torch.Generator().manual_seed(18)))
    (grad,) = torch.autograd.grad((w**3).sum(), [w], create_graph=True)
    shards = [torch.randn(100) * 3, grad]
    before = reference.norm(shards, 2.0)
    norm = fastnorm.clip_(shards, 1.0, gradients=True)
    assert norm.item() == pytest.approx(before, rel=1e-6)
    assert reference.norm(shards, 2.0) == pytest.approx(1.0, rel=1e-5)
    with pytest.warns(fastnorm.NoGradientWarning, match="gradients=True"):
        assert (
            fastnorm.clip_(shards[:1], 1.0).item() == 0.0
        )  # without gradients=True: a plain tensor is skipped


@pytest.mark.parametrize(
    "parameter",
    [
        lambda: torch.nn.Parameter(torch.ones(5)),
        lambda: torch.ones(5, requires_grad=True),
        lambda: torch.ones(5).requires_grad_().detach().requires_grad_(),
    ],
    ids=["Parameter", "leaf-requires-grad", "detached-leaf"],
)
def test_gradients_true_refuses_parameters_before_anything_is_written(backend, parameter):
    shard = torch.full((10,), 5.0)
    weight = parameter()
    weight.grad = torch.full((5,), 5.0)
    with pytest.raises(TypeError, match="item 1 is a parameter"):
        fastnorm.clip_([shard, weight], 1.0, gradients=True)
    assert torch.equal(shard, torch.full((10,), 5.0))
    assert torch.equal(weight.detach(), torch.ones(5)) and torch.equal(weight.grad, torch.full((5,), 5.0))


# ----------------------------------------------------------------------------
# Autograd sees every write
# ----------------------------------------------------------------------------


def _penalty_after(clip):
    """A gradient penalty that saved w.grad, then a clip of w: its backward must see the write."""
    torch.manual_seed(19)
    w = torch.nn.Parameter(torch.randn(64) * 3)
    x = torch.randn(64)
    (w * x).sin().sum().backward(create_graph=True)
    penalty = w.grad.square().sum()  # saves w.grad
    clip([w], 1e-3)
    penalty.backward()


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
@pytest.mark.parametrize("clip", [torch.nn.utils.clip_grad_norm_, fastnorm.clip_], ids=["torch", "fastnorm"])
def test_double_backward_sees_the_inplace_scale(backend, clip):
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _penalty_after(clip)


def test_every_gradient_that_may_be_written_has_its_version_bumped(backend):
    params = make_params([(100,), (3, 4)], seed=20)
    versions = [p.grad._version for p in params]
    fastnorm.clip_(params, 1e9)  # nothing to clip: the fused backends do not even read them
    assert all(p.grad._version > v for p, v in zip(params, versions))
    versions = [p.grad._version for p in params]
    fastnorm.total_norm(params)  # reading writes nothing
    assert [p.grad._version for p in params] == versions


def test_inference_tensors_are_refused_as_torch_refuses_them(backend):
    params = make_params([(30,), (20,)], seed=21, scale=4.0)
    with torch.inference_mode():
        frozen = torch.randn(25) * 4
        copy = frozen.clone()  # torch's foreach clip writes it, then raises
    holder = torch.nn.Parameter(torch.zeros(25))
    holder.grad = frozen
    before = [p.grad.clone() for p in params] + [frozen.clone()]
    twin = torch.nn.Parameter(torch.zeros(25))
    twin.grad = copy
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor") as theirs:
        torch.nn.utils.clip_grad_norm_([twin], 1.0)
    with pytest.raises(RuntimeError, match="item 2") as ours:
        fastnorm.clip_([*params, holder], 1.0)
    assert str(ours.value).startswith(str(theirs.value))
    assert all(torch.equal(a, b) for a, b in zip([p.grad for p in params] + [frozen], before))
    with torch.inference_mode():  # where torch allows it, so does fastnorm
        norm = fastnorm.clip_([*params, holder], 1.0)
    assert norm.item() == pytest.approx(reference.norm(before, 2.0), rel=1e-6)
    assert reference.norm([p.grad for p in params] + [frozen], 2.0) == pytest.approx(1.0, rel=1e-5)


def test_an_inference_tensor_at_a_cached_gradients_address_is_refused(backend):
    # The same memory, the same size, dtype and layout: only the tensor's kind
    # tells the cached plan's facts apart, and clip_ must still refuse it.
    import numpy as np

    memory = np.random.default_rng(5).standard_normal(4000).astype(np.float32) * 4
    param = torch.nn.Parameter(torch.zeros(4000))
    param.grad = torch.from_numpy(memory)
    fastnorm.clip_([param], 1e9)  # cached (no clipping)
    with torch.inference_mode():
        frozen = torch.from_numpy(memory)
    assert frozen.is_inference() and frozen.data_ptr() == param.grad.data_ptr()
    param.grad = frozen
    before = memory.copy()
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor.*item 0"):
        fastnorm.clip_([param], 1.0)
    assert np.array_equal(memory, before)


# ----------------------------------------------------------------------------
# Nothing written on any error
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["auto", "torch", "cpp", "triton"])
def test_expanded_gradient_is_refused_before_anything_is_written(backend, monkeypatch):
    use_backend(backend, monkeypatch)
    dense = torch.nn.Parameter(torch.zeros(3))
    dense.grad = torch.full((3,), 5.0)
    expanded = torch.nn.Parameter(torch.zeros(10))
    expanded.grad = torch.ones(1).expand(10)
    if not serves(backend, dense=False):  # a forced fused backend refuses it, before writing too
        with refused(backend):
            fastnorm.clip_([dense, expanded], 1.0)
        assert torch.equal(dense.grad, torch.full((3,), 5.0))
        return
    with pytest.raises(RuntimeError, match="single memory location") as theirs:
        torch.nn.utils.clip_grad_norm_([expanded], 1.0)
    with pytest.raises(RuntimeError, match="item 1") as ours:
        fastnorm.clip_([dense, expanded], 1.0)
    assert str(ours.value).startswith(str(theirs.value))
    assert torch.equal(dense.grad, torch.full((3,), 5.0))  # torch would have scaled it already
    # Reading it is fine: torch's value.
    expected = torch.nn.utils.get_total_norm([dense.grad, expanded.grad])
    assert fastnorm.total_norm([dense, expanded]).item() == pytest.approx(expected.item(), rel=1e-6)


def test_conjugated_gradient_is_clipped(backend):
    z = torch.randn(50, dtype=torch.complex64, generator=torch.Generator().manual_seed(22)) * 3
    p = torch.nn.Parameter(torch.zeros(50, dtype=torch.complex64))
    p.grad = z.clone().conj()  # torch's own foreach clip refuses it
    norm = fastnorm.clip_([p], 1.0)
    assert norm.item() == pytest.approx(torch.linalg.vector_norm(z).item(), rel=1e-6)
    torch.testing.assert_close(p.grad.resolve_conj(), z.conj() * (1.0 / (norm + 1e-6)))
    neg = z.clone().conj().imag  # a real view with the negative bit
    q = torch.nn.Parameter(torch.zeros(50))
    q.grad = neg
    if not serves(backend, dense=False):  # every other element of the complex memory
        with refused(backend):
            fastnorm.clip_([q], 1.0)
        return
    expected = z.conj().imag * (1.0 / (torch.linalg.vector_norm(z.imag) + 1e-6))
    fastnorm.clip_([q], 1.0)
    torch.testing.assert_close(q.grad.resolve_neg(), expected)


def test_meta_gradient_is_refused_with_the_devices_named(backend):
    params = make_params([(10,)], seed=23, scale=3.0)
    ghost = torch.nn.Parameter(torch.zeros(4, device="meta"))
    ghost.grad = torch.ones(4, device="meta")
    before = params[0].grad.clone()
    with pytest.raises(ValueError, match=r"items \[0\] are on the meta device.*cpu, meta"):
        fastnorm.clip_([ghost, *params], 1.0)
    assert torch.equal(params[0].grad, before)


# ----------------------------------------------------------------------------
# torch's messages
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("p", [2.0, 1, float("inf"), "inf", 3.5, -2.0, 0.5])
def test_nonfinite_message_is_torchs(backend, p):
    def items():
        params = make_params([(10,), (20,)], seed=24)
        params[1].grad[5] = float("nan")
        return params

    with pytest.raises(RuntimeError) as theirs:
        torch.nn.utils.clip_grad_norm_(items(), 1.0, p, error_if_nonfinite=True)
    if not serves(backend, float(p)):
        with refused(backend):
            fastnorm.clip_(items(), 1.0, p, error_if_nonfinite=True)
        return
    with pytest.raises(RuntimeError) as ours:
        fastnorm.clip_(items(), 1.0, p, error_if_nonfinite=True)
    assert str(ours.value).startswith(str(theirs.value))
    with pytest.raises(RuntimeError) as ours:
        fastnorm.total_norm([q.grad for q in items()], p, error_if_nonfinite=True)
    assert str(ours.value).startswith(str(theirs.value))


def test_empty_generator_warns_with_torchs_text(backend):
    with pytest.warns(UserWarning) as theirs:
        torch.nn.utils.clip_grad_norm_((p for p in []), 1.0)
    with pytest.warns(UserWarning) as ours:
        norm = fastnorm.clip_((p for p in []), 1.0)
    assert [str(w.message) for w in ours] == [str(w.message) for w in theirs]
    assert ours[0].filename == __file__  # points at the caller, as torch's does
    assert norm.item() == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fastnorm.clip_([], 1.0)  # an empty list is no mistake: torch does not warn either
        fastnorm.total_norm(p for p in [])


def test_compiled_clip_follows_the_item_rule():
    def step(items, shards):
        return fastnorm.clip_(items, 1.0), fastnorm.clip_(shards, 1.0, gradients=True)

    g = torch.Generator().manual_seed(25)
    p = torch.nn.Parameter(torch.zeros(30))
    p.grad = torch.randn(30, generator=g) * 5
    plain, shard = torch.randn(20, generator=g) * 5, torch.randn(40, generator=g) * 5
    before = plain.clone()
    norm, shard_norm = torch.compile(step, fullgraph=True)([plain, p], [shard])
    assert torch.equal(plain, before)  # skipped, as in eager calls
    assert reference.norm([p.grad], 2.0) == pytest.approx(1.0, rel=1e-5)
    assert reference.norm([shard], 2.0) == pytest.approx(1.0, rel=1e-5)
    assert norm.item() > 1.0 and shard_norm.item() > 1.0


@pytest.mark.parametrize(
    "norm, error, match",
    [
        (torch.tensor(2), TypeError, "floating-point"),
        (torch.tensor([1.0, 2.0]), ValueError, "one value"),
        (torch.tensor([[1.0]]).to_sparse(), TypeError, "dense"),
        (torch.empty((), device="meta"), ValueError, "meta"),
        (torch.tensor(1.0 + 1j), TypeError, "floating-point"),
        (1.0, TypeError, "must be a Tensor"),
        ("wrapper", TypeError, "torch.Tensor or a DTensor"),
    ],
    ids=["int", "two-values", "sparse", "meta", "complex", "float", "wrapper-subclass"],
)
def test_a_total_norm_that_cannot_be_a_norm_raises_before_anything_is_written(backend, norm, error, match):
    params = make_params(SHAPES, seed=3)
    before = [q.grad.clone() for q in params]
    if isinstance(norm, str):
        norm = NoMemoryWrapper(torch.tensor(1.0))
    with pytest.raises(error, match=match):
        fastnorm.clip_(params, 0.1, total_norm=norm)
    assert all(torch.equal(q.grad, b) for q, b in zip(params, before))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_any_floating_norm_of_one_value_clips_as_torch_does(backend, dtype):
    params = make_params(shapes(backend), seed=4, scale=10.0)
    plain = clone_params(params)
    norm = torch.nn.utils.get_total_norm([q.grad for q in params]).to(dtype)
    view = torch.stack([norm, norm])[1:]  # one value, not at the start of its storage
    fastnorm.clip_(params, 1.0, total_norm=view.requires_grad_(dtype != torch.float16))
    # A 16-bit norm is widened to float32 first: torch would compute the coefficient in 16 bits.
    torch.nn.utils.clip_grads_with_norm_(plain, 1.0, norm if norm.dtype.itemsize >= 4 else norm.float())
    for q, r in zip(params, plain):
        torch.testing.assert_close(q.grad, r.grad, rtol=0, atol=0)


# ----------------------------------------------------------------------------
# Traps: what torch takes silently, or refuses without saying what to pass
# ----------------------------------------------------------------------------


def _model():
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))


@pytest.mark.parametrize(
    "given, hint",
    [
        (lambda m: m, r"a module \(Sequential\); pass its parameters: model.parameters\(\)"),
        (lambda m: m.named_parameters(), r"\(name, parameter\) pair, as named_parameters\(\) gives"),
        (lambda m: torch.optim.SGD(m.parameters(), lr=0.1), r"an optimizer \(SGD\).*param_groups"),
        (lambda m: m.state_dict(), r"a mapping \(OrderedDict\), which iterates over its keys"),
        (lambda m: torch.optim.SGD(m.parameters(), lr=0.1).param_groups, r"a param group"),
        (lambda m: list(m.children()), r"item 0 is a Linear, not a Tensor \(a module"),
    ],
    ids=["module", "named_parameters", "optimizer", "state_dict", "param_groups", "modules"],
)
def test_containers_passed_by_mistake_say_what_to_pass(given, hint):
    model = _model()
    model(torch.randn(5, 4)).sum().backward()
    before = [q.grad.clone() for q in model.parameters()]
    for call in (lambda x: fastnorm.clip_(x, 0.01), fastnorm.total_norm, fastnorm.tensor_norms):
        with pytest.raises(TypeError, match=hint):
            call(given(model))
    assert all(torch.equal(q.grad, b) for q, b in zip(model.parameters(), before))


@pytest.mark.parametrize(
    "call, items, says",
    [
        (lambda x: fastnorm.clip_(x, 1.0), lambda m: m.parameters(), "none of the 4 parameters has a .grad"),
        (fastnorm.total_norm, lambda m: list(m.parameters()), "none of the 4 parameters has a .grad"),
        (fastnorm.tensor_norms, lambda m: list(m.parameters()), "none of the 4 parameters has a .grad"),
        (
            lambda x: fastnorm.clip_(x, 1.0),
            lambda m: m.state_dict().values(),
            "none of the 4 items is a parameter",
        ),
    ],
    ids=[
        "clip_-before-backward",
        "total_norm-before-backward",
        "tensor_norms-before-backward",
        "clip_-state_dict",
    ],
)
def test_items_without_any_gradient_warn_once_per_call_site(backend, call, items, says):
    model = _model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # Python's own rule: once per call site
        for _ in range(3):
            call(items(model))
    [warning] = [w for w in caught if issubclass(w.category, fastnorm.NoGradientWarning)]
    assert says in str(warning.message) and warning.filename == __file__


def test_a_list_of_gradients_given_without_gradients_true_warns_with_the_fix(backend):
    model = _model()
    model(torch.randn(5, 4)).sum().backward()
    with pytest.warns(fastnorm.NoGradientWarning, match=r"\[p.grad for p in ...\]\? .* gradients=True"):
        norm = fastnorm.clip_([q.grad for q in model.parameters()], 1.0)
    assert norm.item() == 0.0  # torch's answer too: plain tensors are skipped


def test_no_warning_where_some_item_has_a_gradient(backend):
    model = _model()
    model(torch.randn(5, 4)).sum().backward()
    model[0].weight.grad = None
    with warnings.catch_warnings():
        warnings.simplefilter("error", fastnorm.NoGradientWarning)
        fastnorm.clip_(model.parameters(), 1.0)
        fastnorm.clip_([], 1.0)  # nothing given: nothing to warn about
        fastnorm.total_norm(model.parameters())
