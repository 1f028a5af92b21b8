"""total_norm and tensor_norms on every backend against the float64 oracle."""

from __future__ import annotations

import inspect
import math
import warnings

import pytest
import torch

import fastnorm
import reference
from helpers import refused, serves, use_backend

NORM_TYPES = [2.0, 1.0, float("inf"), 0.5, 3.0]
# Tolerances per input dtype, relative to the oracle: 16-bit inputs are exact
# in float32 and the sums run in float64, so only the final rounding remains.
TOLERANCE = {
    torch.float32: 5e-6,
    torch.float64: 1e-12,
    torch.float16: 5e-6,
    torch.bfloat16: 5e-6,
}


def grads(shapes, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(s, generator=g, dtype=torch.float64) * scale).to(dtype) for s in shapes]


# Odd sizes, 0 and 1 elements, and more than one chunk on every backend
# (triton's interpreter uses 512-element chunks; the C++ tasks hold 256 KiB).
SHAPES = [(0,), (1,), (123,), (4097,), (3, 5, 7)]
LARGE = {"cpp": [(70001,)], "torch": [(70001,)], "triton": [(1500,)]}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("p", NORM_TYPES)
def test_matches_oracle(backend, dtype, p):
    tensors = grads(SHAPES + LARGE[backend], dtype, seed=NORM_TYPES.index(p) * 10 + dtype.itemsize)
    got = fastnorm.total_norm(tensors, p)
    ref = reference.norm(tensors, p)
    tol = 5e-5 if p not in (1.0, 2.0, float("inf")) else TOLERANCE[dtype]
    assert reference.rel_err(got.item(), ref) <= tol
    assert got.dim() == 0
    assert got.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)


@pytest.mark.parametrize("p", [2.0, float("inf"), 1.0])
def test_mixed_dtypes_and_layouts(mixing, p):
    g = torch.Generator().manual_seed(7)
    tensors = [
        torch.randn(300, generator=g).to(torch.bfloat16),
        torch.randn(64, 33, generator=g).t(),  # transposed: dense, read as flat
        torch.randn(2, 3, 4, 5, generator=g).to(memory_format=torch.channels_last),
        torch.randn(40, 40, generator=g)[::2, 1::3],  # gaps: served by torch ops
        torch.randn(999, generator=g).to(torch.float16),
        torch.randn(1000, generator=g),
    ]
    got = fastnorm.total_norm(tensors, p)
    assert reference.rel_err(got.item(), reference.norm(tensors, p)) <= 5e-6
    assert got.dtype == torch.float32


def test_float64_anywhere_gives_float64(backend):
    tensors = grads([(10,), (20,)], torch.float32, 1) + grads([(5,)], torch.float64, 2)
    got = fastnorm.total_norm(tensors)
    assert got.dtype == torch.float64
    assert reference.rel_err(got.item(), reference.norm(tensors, 2.0)) <= 1e-7


def test_parameters_contribute_their_grad(backend):
    model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    model(torch.randn(4, 7)).square().sum().backward()
    model[2].bias.grad = None  # skipped
    got = fastnorm.total_norm(model.parameters())
    expected = [p.grad for p in model.parameters() if p.grad is not None]
    assert reference.rel_err(got.item(), reference.norm(expected, 2.0)) <= 5e-6


def test_frozen_parameter_without_grad_is_skipped(backend):
    layer = torch.nn.Linear(4, 4)
    layer.weight.requires_grad_(False)  # a Parameter stands for its .grad, even when frozen
    layer.bias.grad = torch.randn(4)
    assert fastnorm.total_norm(layer.parameters()).item() == pytest.approx(
        reference.norm([layer.bias.grad], 2.0), rel=1e-6
    )


def test_nothing_to_reduce_gives_zero(backend):
    for empty in ([], [torch.nn.Parameter(torch.randn(3))], iter(())):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fastnorm.NoGradientWarning)  # the parameter without a .grad
            got = fastnorm.total_norm(empty)
        assert got.item() == 0.0 and got.dtype == torch.float32 and got.dim() == 0
    assert fastnorm.total_norm([torch.zeros(0)]).item() == 0.0


def test_generator_is_consumed_once(backend):
    tensors = grads([(50,), (60,)], torch.float32, 3)
    got = fastnorm.total_norm(t for t in tensors)
    assert got.item() == pytest.approx(reference.norm(tensors, 2.0), rel=1e-6)


def test_single_tensor(backend):
    (t,) = grads([(33, 3)], torch.float32, 4)
    assert fastnorm.total_norm(t, 1).item() == pytest.approx(reference.norm([t], 1.0), rel=1e-6)


def test_same_tensor_twice_counts_once(backend):
    a, b = grads([(100,), (10,)], torch.float32, 5)
    once = fastnorm.total_norm([a, b])
    assert torch.equal(fastnorm.total_norm([a, b, a, a.view(10, 10)]), once)
    # A view of the first elements starts at the same address but is another tensor.
    head = a[:10]
    got = fastnorm.total_norm([a, head])
    assert reference.rel_err(got.item(), reference.norm([a, head], 2.0)) <= 5e-6


def test_the_same_strided_or_sparse_tensor_twice_counts_once(backend):
    gapped = torch.randn(8, 8)[:, :3]  # a view with gaps: read through torch ops
    indices = torch.tensor([[0, 0, 2]])
    sparse = torch.sparse_coo_tensor(indices, torch.tensor([2.0, 2.0, 1.0]), (3,))  # uncoalesced
    for t in (gapped, sparse):
        if t is gapped and not serves(backend, dense=False):
            with refused(backend):
                fastnorm.total_norm([t, t])
            continue
        assert torch.equal(fastnorm.total_norm([t, t]), fastnorm.total_norm([t]))
        once, twice = t.clone(), t
        fastnorm.clip_([once], 1.0, gradients=True)
        fastnorm.clip_([twice, twice], 1.0, gradients=True)
        torch.testing.assert_close(twice.to_dense(), once.to_dense())
        assert fastnorm.total_norm([once]).item() == pytest.approx(1.0, rel=1e-5)  # clipped, once


def test_empty_float64_gradients_give_a_float64_zero(backend):
    total, per_item = fastnorm.tensor_norms([torch.zeros(0, dtype=torch.float64), torch.zeros(0)])
    assert total.dtype == per_item.dtype == torch.float64 and total.item() == 0.0


def _poison_allocator() -> None:
    """Leaves NaN in freed memory of the sizes the backends allocate for partials,
    which the CPU allocator hands out again: a kernel that reads a row it did not
    write gets NaN, not a lucky zero."""
    for n in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
        for dtype in (torch.float64, torch.float32):
            torch.full((n,), float("nan"), dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bitwise_deterministic(backend, dtype):
    # What can differ between two calls on the same values: the thread count, the
    # memory holding the values (fresh copies, at the same 16-byte alignment), a
    # cached or a rebuilt plan, a per-tensor pass or none, and what the memory the
    # backend allocates held before. float64 gradients: their sums keep every
    # difference in the order of the additions that float32 would round away.
    tensors = grads([(4097,), *LARGE[backend], (5,), (300, 7)], dtype, 6, scale=3.0)
    ref = reference.norm(tensors, 2.0)
    threads = torch.get_num_threads()
    results = []
    try:
        # the interpreted Triton kernels run on one thread: only their host side sees the count
        for n in (1, 2) if backend == "triton" else (1, 2, 3):
            torch.set_num_threads(n)
            for given in (tensors, [t.clone() for t in tensors]):
                fastnorm.clear_cache()
                for _ in range(2):  # rebuilt, then cached
                    _poison_allocator()
                    results.append(fastnorm.total_norm(given))
                    _poison_allocator()
                    total, per_item = fastnorm.tensor_norms(given)
                    results += [total, per_item]
    finally:
        torch.set_num_threads(threads)
    totals, per_items = results[::3] + results[1::3], results[2::3]
    assert reference.rel_err(totals[0].item(), ref) <= TOLERANCE[dtype]
    assert all(torch.equal(t, totals[0]) for t in totals)
    assert all(torch.equal(t, per_items[0]) for t in per_items)
    for t, value in zip(tensors, per_items[0].tolist()):
        assert reference.rel_err(value, reference.norm([t], 2.0)) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpp_result_does_not_depend_on_thread_count(monkeypatch, dtype):
    # The split into tasks depends only on the sizes: any thread count adds the
    # same partials in the same order. float64 gradients and a float64 result
    # keep every bit of that order.
    monkeypatch.setenv("FASTNORM_BACKEND", "cpp")
    tensors = grads([(300_001,), (1_000_003,), (17,)], dtype, 8)
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            results.append([fastnorm.total_norm(tensors, p) for p in (2.0, 1.0, float("inf"), 3.0)])
            results[-1] += list(fastnorm.tensor_norms(tensors))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for r in results for a, b in zip(r, results[0]))
    assert reference.rel_err(results[0][0].item(), reference.norm(tensors, 2.0)) <= TOLERANCE[dtype]


# ----------------------------------------------------------------------------
# Numerics
# ----------------------------------------------------------------------------


def test_float16_norm_past_65504_is_finite(backend):
    got = fastnorm.total_norm([torch.full((10,), 60000.0, dtype=torch.float16)])
    assert got.item() == pytest.approx(189736.66, rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_huge_gradients_are_not_a_nan_collapse(backend, dtype):
    if backend == "torch" and dtype == torch.bfloat16:
        pytest.skip("the torch backend upcasts per tensor: covered by float32")
    got = fastnorm.total_norm([torch.full((10,), 1e20, dtype=dtype)])
    expected = math.sqrt(10) * torch.tensor(1e20, dtype=dtype).item()
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_tiny_gradients_do_not_vanish(backend):
    tensors = [torch.full((1000,), 1e-30)]
    assert fastnorm.total_norm(tensors).item() == pytest.approx(reference.norm(tensors, 2.0), rel=1e-6)


@pytest.mark.parametrize("p", [3.0, 0.5])
def test_p_norms_of_the_smallest_float64_values(fused, p):
    tensors = [torch.tensor([1e-310, 0.0, 3e-311], dtype=torch.float64)]
    assert reference.rel_err(fastnorm.total_norm(tensors, p).item(), reference.norm(tensors, p)) <= 1e-6


@pytest.mark.parametrize("p", [7.0, 12.5])
def test_large_p_with_huge_values_stays_finite(fused, p):
    # |x|^p of 1e30 overflows float64 for p > 10: the fused kernels scale by the max.
    tensors = [torch.full((100,), 1e30), torch.full((3,), 2e30), torch.full((5,), 1e-20)]
    got = fastnorm.total_norm(tensors, p)
    assert reference.rel_err(got.item(), reference.norm(tensors, p)) <= 5e-5


# Triton's interpreter runs the kernels on NumPy, which warns on inf - inf and
# inf / inf in lanes that tl.where then discards; the GPU does not.
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("p", NORM_TYPES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_and_inf_propagate(backend, p, bad):
    tensors = grads([(1000,), (77,)], torch.float32, 9)
    tensors[1][13] = bad
    got = fastnorm.total_norm(tensors, p).item()
    if math.isnan(bad):
        assert math.isnan(got)  # a max that drops NaN (fmax) would be a bug for p=inf
    else:
        assert got == float("inf")
    tensors[0][500] = float("nan")
    assert math.isnan(fastnorm.total_norm(tensors, p).item())


@pytest.mark.slow
def test_accuracy_at_scale_beats_naive_float32():
    # Positive values make a float32 running sum drift by percents at this size;
    # float64 accumulation must stay within 5e-6 of the oracle, and within
    # torch's own error (torch's float32 CPU norm is itself visibly off).
    g = torch.Generator().manual_seed(10)
    tensors = [torch.rand(10_000_000, generator=g) + 1.0 for _ in range(3)]
    for p in (2.0, 1.0, float("inf")):
        ref = reference.norm(tensors, p)
        ours = reference.rel_err(fastnorm.total_norm(tensors, p).item(), ref)
        theirs = reference.rel_err(torch.nn.utils.get_total_norm(tensors, p).item(), ref)
        assert ours <= 5e-6
        assert ours <= theirs + 2**-24


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("p", [2.0, 1.0, float("inf")])
def test_error_no_larger_than_torch(backend, dtype, p):
    tensors = grads([(5000,), (123,), (4097,)], dtype, seed=11, scale=3.0)
    ref = reference.norm(tensors, p)
    ours = reference.rel_err(fastnorm.total_norm(tensors, p).item(), ref)
    theirs = reference.rel_err(torch.nn.utils.get_total_norm(tensors, p).float().item(), ref)
    # Half an ulp of float32 is the floor of any float32 result.
    assert ours <= theirs + 2**-24


# ----------------------------------------------------------------------------
# Sparse and complex gradients
# ----------------------------------------------------------------------------


def test_sparse_gradients(backend):
    indices = torch.tensor([[0, 2, 2, 5], [1, 0, 0, 3]])  # (2, 0) twice: uncoalesced
    values = torch.tensor([1.5, -2.0, 4.0, 0.25])
    coo = torch.sparse_coo_tensor(indices, values, (6, 4))
    csr = torch.randn(5, 7).relu().to_sparse_csr()
    got = fastnorm.total_norm([coo, csr])
    assert got.item() == pytest.approx(reference.norm([coo.to_dense(), csr.to_dense()], 2.0), rel=1e-6)


def test_complex_gradients_for_p2(backend):
    z = torch.randn(50, dtype=torch.complex64)
    assert fastnorm.total_norm([z]).item() == pytest.approx(torch.linalg.vector_norm(z).item(), rel=1e-6)
    # complex128 holds float64 parts: a float64 norm, as for float64 gradients.
    w = torch.randn(70, dtype=torch.complex128, generator=torch.Generator().manual_seed(17))
    got = fastnorm.total_norm([z, w])
    assert got.dtype == torch.float64
    expected = reference.norm([torch.view_as_real(z), torch.view_as_real(w)], 2.0)
    assert reference.rel_err(got.item(), expected) <= 1e-7
    with pytest.raises(TypeError, match="complex"):
        fastnorm.total_norm([z], 1.0)


# ----------------------------------------------------------------------------
# tensor_norms
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("p", [2.0, 1.0, float("inf"), 3.0])
def test_tensor_norms(backend, p):
    # Tensors larger than one C++ task (256 KiB) and than one Triton chunk, in
    # four dtypes interleaved so that grouping them by dtype permutes them (not
    # an involution: putting them back needs the inverse permutation).
    model = torch.nn.Sequential(torch.nn.Linear(9, 8), torch.nn.Linear(8, 2))
    model(torch.randn(3, 9)).sum().backward()
    model[1].bias.grad = None
    large = LARGE[backend][0][0]
    extra = [
        grads([(1000,)], torch.bfloat16, 12)[0],
        grads([(large // 2,)], torch.float64, 13)[0],
        grads([(large,)], torch.float32, 14)[0],
        grads([(77,)], torch.float16, 15)[0],
    ]
    items = [*model.parameters(), *extra]
    total, per_item = fastnorm.tensor_norms(items, p)
    assert torch.equal(total, fastnorm.total_norm(items, p))
    assert total.dtype == torch.float64  # a float64 gradient among them
    present = [it.grad for it in items[:4] if it.grad is not None] + extra
    assert reference.rel_err(total.item(), reference.norm(present, p)) <= (5e-5 if p == 3.0 else 1e-6)
    expected = [reference.norm([it.grad], p) if it.grad is not None else 0.0 for it in items[:4]]
    expected += [reference.norm([t], p) for t in extra]
    assert per_item.shape == (len(items),) and per_item.dtype == total.dtype
    for got, ref in zip(per_item.tolist(), expected):
        assert got == pytest.approx(ref, rel=5e-5 if p == 3.0 else 1e-6)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("p", [3.0, 0.5])
def test_p_norm_of_partials_from_two_backends_with_zeros_and_inf(mixing, p):
    # A dense tensor and a view with gaps are read by two backends (the view by
    # torch's ops); the front merges their partials at the largest scale, where
    # equal scales of 0 or inf must merge without 0 / 0 or inf / inf.
    for first, second in ((0.0, 0.0), (math.inf, math.inf), (math.inf, 2.0), (0.0, 2.0)):
        tensors = [torch.full((1000,), first), torch.full((40, 40), second)[::2, 1::3]]
        got, ref = fastnorm.total_norm(tensors, p).item(), reference.norm(tensors, p)
        assert got == ref or reference.rel_err(got, ref) <= 5e-6, (first, second, got)


# ----------------------------------------------------------------------------
# The item rule, as total_norm and tensor_norms read it
# ----------------------------------------------------------------------------


def test_gradients_that_require_grad_are_read_as_gradients(backend):
    # torch.autograd.grad(create_graph=True) returns non-leaf tensors that require grad.
    w = torch.nn.Parameter(torch.randn(40, generator=torch.Generator().manual_seed(12)))
    (grad,) = torch.autograd.grad((w**3).sum(), [w], create_graph=True)
    assert grad.requires_grad and not grad.is_leaf
    got = fastnorm.total_norm([grad])
    assert got.item() == pytest.approx(reference.norm([grad], 2.0), rel=1e-6)
    assert got.item() == pytest.approx(torch.nn.utils.get_total_norm([grad]).item(), rel=1e-6)
    assert fastnorm.tensor_norms([grad])[1].item() == pytest.approx(got.item(), rel=1e-6)


def test_a_tensor_with_a_grad_stands_for_its_grad(backend):
    t = torch.full((4,), 3.0)
    t.grad = torch.full((4,), 10.0)
    assert fastnorm.total_norm(t).item() == pytest.approx(20.0)
    activation = torch.randn(6, requires_grad=True).mul(2)  # non-leaf
    activation.retain_grad()
    activation.sum().backward()
    assert fastnorm.total_norm([activation]).item() == pytest.approx(6**0.5)  # its .grad: ones


def test_a_leaf_that_requires_grad_stands_for_its_grad(backend):
    w = torch.randn(7, requires_grad=True)
    with pytest.warns(fastnorm.NoGradientWarning, match="none of the 1 parameters has a .grad"):
        assert fastnorm.total_norm([w]).item() == 0.0  # no .grad yet: skipped, never read itself
    w.grad = torch.full((7,), 2.0)
    assert fastnorm.total_norm([w]).item() == pytest.approx(2.0 * 7**0.5)


def test_cache_notices_a_plain_tensor_that_gets_a_grad(fused):
    a, b = torch.randn(50), torch.randn(60)
    fastnorm.total_norm([a, b])  # a cached plan that reads a and b themselves
    b.grad = torch.randn(60)  # b is a parameter now
    assert fastnorm.total_norm([a, b]).item() == pytest.approx(reference.norm([a, b.grad], 2.0), rel=1e-6)


# ----------------------------------------------------------------------------
# get_total_norm's signature and norm types
# ----------------------------------------------------------------------------


def test_signature_is_get_total_norms():
    ours = inspect.signature(fastnorm.total_norm).parameters
    theirs = inspect.signature(torch.nn.utils.get_total_norm).parameters
    assert list(ours)[: len(theirs)] == list(theirs)
    for name, parameter in theirs.items():
        assert ours[name].default == parameter.default, name
        assert ours[name].kind == parameter.kind, name
    assert ours["group"].kind == inspect.Parameter.KEYWORD_ONLY


def test_positional_error_if_nonfinite_and_foreach(backend):
    tensors = grads([(30,), (40,)], torch.float32, 13)
    tensors[1][3] = float("inf")
    for foreach in (None, False, True):
        with pytest.raises(RuntimeError, match="non-finite"):
            fastnorm.total_norm(tensors, 2.0, True, foreach)
        assert fastnorm.total_norm(tensors, 2.0, False, foreach).item() == float("inf")
    total, _ = fastnorm.tensor_norms(tensors, 1.0, foreach=True)
    assert total.item() == float("inf")


TORCH_ONLY_NORM_TYPES = [0.0, -0.5, -1.0, -2.0, -3.5, float("-inf"), "-inf", 0]


@pytest.mark.parametrize("p", TORCH_ONLY_NORM_TYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_norm_types_only_torch_computes_give_torchs_values(backend, p, dtype):
    g = torch.Generator().manual_seed(14)
    tensors = [(torch.randn(n, generator=g, dtype=torch.float64) * 3).to(dtype) for n in (50, 7, 300)]
    tensors.append(torch.zeros(9, dtype=dtype))  # no non-zero: not counted by p=0, makes p<0 zero
    tensors.append(torch.randn(4, 5, generator=g).to(dtype).t())  # transposed
    if not serves(backend, float(p)):
        for call in (fastnorm.total_norm, fastnorm.tensor_norms):
            with refused(backend):
                call(tensors, p)
        return
    for subset in (tensors[:3], tensors):
        got = fastnorm.total_norm(subset, p)
        ref = reference.total_norm(subset, float(p))
        assert got.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
        assert reference.rel_err(got.item(), ref) <= 1e-6
        theirs = torch.nn.utils.get_total_norm([t.double() for t in subset], p)
        assert reference.rel_err(got.item(), theirs.item()) <= 1e-6
        total, per_item = fastnorm.tensor_norms(subset, p)
        assert torch.equal(total, got)
        for t, value in zip(subset, per_item.tolist()):
            expected = torch.linalg.vector_norm(t.double(), float(p)).item()
            assert reference.rel_err(value, expected) <= 1e-6


def test_norm_type_zero_counts_tensors_not_elements(backend):
    # torch takes the 0-"norm" of the per-tensor counts: 2 tensors hold a non-zero.
    tensors = [torch.tensor([1.0, 2.0, 0.0]), torch.tensor([0.0, 5.0]), torch.zeros(3)]
    if not serves(backend, 0.0):
        with refused(backend):
            fastnorm.total_norm(tensors, 0)
        return
    assert fastnorm.total_norm(tensors, 0).item() == 2.0 == torch.nn.utils.get_total_norm(tensors, 0).item()
    assert fastnorm.tensor_norms(tensors, 0)[1].tolist() == [2.0, 1.0, 0.0]  # each tensor's own count


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("p", [0.0, -2.0, float("-inf")])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_norm_types_only_torch_computes_propagate_like_torch(backend, p, bad):
    tensors = grads([(100,), (7,)], torch.float64, 15)
    tensors[1][2] = bad
    if not serves(backend, p):
        with refused(backend):
            fastnorm.total_norm(tensors, p)
        return
    got = fastnorm.total_norm(tensors, p).item()
    theirs = torch.nn.utils.get_total_norm(tensors, p).item()
    assert got == theirs or (math.isnan(got) and math.isnan(theirs))


def test_tiny_and_huge_values_at_negative_p_stay_finite(backend):
    # |x|^-2 underflows to 0 for 2e200 (torch's norm becomes inf): scaled by the smallest |x| it does not.
    tensors = [torch.full((10,), 2e200, dtype=torch.float64), torch.full((3,), 1e-300, dtype=torch.float64)]
    for p in (-2.0, -0.5):
        if not serves(backend, p):
            with refused(backend):
                fastnorm.total_norm(tensors, p)
            continue
        got = fastnorm.total_norm(tensors[:1], p).item()
        assert reference.rel_err(got, reference.total_norm(tensors[:1], p)) <= 1e-12
        got = fastnorm.total_norm(tensors, p).item()
        assert reference.rel_err(got, reference.total_norm(tensors, p)) <= 1e-12


# ----------------------------------------------------------------------------
# Lazily-resolved and unusual tensors
# ----------------------------------------------------------------------------


def test_conjugated_and_negative_views_are_read_through_their_memory(backend):
    z = torch.randn(60, dtype=torch.complex64, generator=torch.Generator().manual_seed(16))
    conj = z.conj()
    assert conj.is_conj()
    expected = torch.linalg.vector_norm(z).item()
    assert fastnorm.total_norm([conj]).item() == pytest.approx(expected, rel=1e-6)
    neg = z.conj().imag  # a real view with the negative bit
    assert neg.is_neg()
    if not serves(backend, dense=False):  # every other element of the complex memory
        with refused(backend):
            fastnorm.total_norm([neg])
        return
    for p in (2.0, 1.0, float("inf"), 3.0):
        assert reference.rel_err(fastnorm.total_norm([neg], p).item(), reference.norm([neg], p)) <= 5e-6


def test_expanded_gradients_are_read_element_by_element(backend):
    expanded = torch.randn(1, 8).expand(5, 8)  # stride 0: 40 elements over 8 values
    for p in (2.0, 1.0, float("inf"), 3.0, 0.0, -1.0):
        if not serves(backend, p, dense=False):
            with refused(backend):
                fastnorm.total_norm([expanded], p)
            continue
        got = fastnorm.total_norm([expanded], p).item()
        assert reference.rel_err(got, torch.nn.utils.get_total_norm([expanded.double()], p).item()) <= 1e-6


def test_meta_gradients_get_a_message_naming_the_devices(backend):
    for tensors in (
        [torch.ones(3, device="meta"), torch.ones(3)],
        [torch.ones(3), torch.ones(3, device="meta")],
    ):
        with pytest.raises(ValueError, match=r"items \[\d\] are on the meta device.*cpu, meta"):
            fastnorm.total_norm(tensors)


# ----------------------------------------------------------------------------
# One answer per input: backend x layout x dtype x p x magnitude
# ----------------------------------------------------------------------------

LAYOUTS = ["contiguous", "strided", "channels_last", "expanded"]
MATRIX_NORM_TYPES = [2.0, 1.0, float("inf"), 3.0, 0.5, 100.0, 0.0, -2.0, float("-inf")]
MAGNITUDES = {  # the magnitudes each dtype can hold
    torch.float16: [1.0],
    torch.bfloat16: [1e-30, 1.0, 1e20],
    torch.float32: [1e-30, 1.0, 1e20],
    torch.float64: [1e-310, 1e-30, 1.0, 1e20, 1e200],
}
MATRIX = [(dtype, magnitude) for dtype, magnitudes in MAGNITUDES.items() for magnitude in magnitudes]


def laid_out(shape, layout, dtype, magnitude, g):
    """A tensor of ``shape`` in ``layout`` whose |x| lie in [magnitude / 2, 3 * magnitude / 2]."""

    def values(size):
        signs = torch.randint(0, 2, size, generator=g).double() * 2 - 1
        return ((torch.rand(size, generator=g, dtype=torch.float64) + 0.5) * signs * magnitude).to(dtype)

    n, c, h, w = shape
    if layout == "contiguous":
        return values(shape)
    if layout == "strided":
        return values((n, c, h, 2 * w))[..., ::2]
    if layout == "channels_last":
        return values(shape).to(memory_format=torch.channels_last)
    return values((n, 1, h, w)).expand(shape)


def matrix_tolerance(dtype, p):
    if dtype != torch.float64:
        return 5e-6  # a float32 result
    return 1e-12 if p in (2.0, 1.0, float("inf"), 0.0, float("-inf")) else 1e-9


DENSE_LAYOUTS = ("contiguous", "channels_last")
# Only the cases each backend serves (a forced backend refuses the others, see
# test_a_forced_backend_refuses_what_it_does_not_serve): every case on torch.
SERVED = [
    pytest.param(
        backend,
        layout,
        dtype,
        magnitude,
        p,
        id=f"{backend}-{layout}-{str(dtype).split('.')[1]}-{magnitude:g}-p{p}",
    )
    for backend in ("cpp", "triton", "torch")
    for layout in LAYOUTS
    for dtype, magnitude in MATRIX
    for p in MATRIX_NORM_TYPES
    if serves(backend, p, layout in DENSE_LAYOUTS)
]


@pytest.mark.parametrize("name, layout, dtype, magnitude, p", SERVED)
def test_one_answer_per_input(name, layout, dtype, magnitude, p, monkeypatch):
    backend = use_backend(name, monkeypatch)
    g = torch.Generator().manual_seed(hash((layout, str(dtype), magnitude, p)) % 2**31)
    shapes = [(2, 3, 4, 5), (3, 2, 2, 3)]
    if layout == "contiguous":  # and one larger than a C++ task (256 KiB) or a Triton chunk
        shapes.append((1, 1, 1, LARGE[backend][0][0]))
    tensors = [laid_out(shape, layout, dtype, magnitude, g) for shape in shapes]
    assert all(bool((t != 0).all()) and bool(t.isfinite().all()) for t in tensors)  # the dtype holds them
    total, per_item = fastnorm.tensor_norms(tensors, p)
    tolerance = matrix_tolerance(dtype, p)
    expected = reference.total_norm(tensors, p)
    assert math.isfinite(total.item()) and reference.rel_err(total.item(), expected) <= tolerance, (
        total.item(),
        expected,
    )
    for t, value in zip(tensors, per_item.tolist()):
        own = float(t.count_nonzero()) if p == 0 else reference.total_norm([t], p)  # one tensor's count
        assert reference.rel_err(value, own) <= tolerance
    assert torch.equal(fastnorm.total_norm(tensors, p), total)


def test_gradients_true_reads_every_tensor_as_given_as_torch_does(backend):
    g = torch.Generator().manual_seed(11)
    params = []
    for shape in [(123,), (4097,), (7, 9)]:
        q = torch.nn.Parameter(torch.randn(shape, generator=g, dtype=torch.float64).float())
        q.grad = torch.randn(shape, generator=g, dtype=torch.float64).float() * 5
        params.append(q)
    values = reference.norm([q.detach() for q in params], 2.0)
    grads = reference.norm([q.grad for q in params], 2.0)
    # Interleaved, twice, so that a plan cached for one reading cannot serve the other.
    for _ in range(2):
        assert fastnorm.total_norm(params).item() == pytest.approx(grads, rel=1e-6)
        assert fastnorm.total_norm(params, gradients=True).item() == pytest.approx(values, rel=1e-6)
        total, each = fastnorm.tensor_norms(params, gradients=True)
        assert total.item() == pytest.approx(values, rel=1e-6)
        assert each.tolist() == pytest.approx([reference.norm([q.detach()], 2.0) for q in params], rel=1e-6)
    expected = torch.nn.utils.get_total_norm(params)
    assert fastnorm.total_norm(params, gradients=True).item() == pytest.approx(expected.item(), rel=1e-6)
    with pytest.raises(TypeError, match="total_norm: gradients must be True or False"):
        fastnorm.total_norm(params, gradients="yes")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("p", MATRIX_NORM_TYPES, ids=lambda p: f"p{p}")
def test_a_forced_backend_refuses_what_it_does_not_serve(fused, layout, p):
    # Never handed to torch behind the user's back: FASTNORM_BACKEND=cpp runs cpp or raises.
    tensors = [laid_out((2, 3, 4, 5), layout, torch.float32, 1.0, torch.Generator().manual_seed(3))]
    if serves(fused, p, layout in DENSE_LAYOUTS):
        assert (
            reference.rel_err(fastnorm.total_norm(tensors, p).item(), reference.total_norm(tensors, p))
            <= 5e-6
        )
        return
    for call in (
        fastnorm.total_norm,
        fastnorm.tensor_norms,
        lambda t, p: fastnorm.clip_(t, 1.0, p, gradients=True),
    ):
        with refused(fused) as raised:
            call(tensors, p)
        why = str(raised.value)
        assert ("norm type" in why) == (not (p > 0 or p == float("inf")))
        assert ("consecutively in memory" in why) == (layout not in DENSE_LAYOUTS)
