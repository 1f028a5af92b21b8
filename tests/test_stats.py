"""Per-tensor statistics (fastnorm.stats, fastnorm.tensor_stats) against a float64 reference.

The reference counts with NumPy on float64 copies and takes the thresholds
from the documented definitions (``finfo(limit).tiny``, ``finfo(limit).max /
16``), sharing no code with any backend. The data is fresh random values with
NaN, inf, zeros, subnormals and values on both sides of the overflow margin
injected at random places, tails included.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastnorm
from fastnorm.stats import COLUMNS, reduce_stats
from helpers import use_backend

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def reference(tensors: list[torch.Tensor], limits: list[torch.dtype | None]) -> np.ndarray:
    rows = []
    for t, limit in zip(tensors, limits):
        info = torch.finfo(limit or t.dtype)
        x = t.detach().to(torch.float64).reshape(-1).numpy()
        a = np.abs(x)
        finite = np.isfinite(x)
        with np.errstate(over="ignore", invalid="ignore"):
            sum_sq = float(np.sum(x * x)) if x.size else 0.0
        rows.append(
            [
                sum_sq,
                float(a[finite].max()) if finite.any() else 0.0,
                float((~finite).sum()),
                float((x == 0).sum()),
                float(((a < info.tiny) & (a != 0)).sum()),
                float(((a > info.max / 16) & finite).sum()),
            ]
        )
    return np.array(rows, dtype=np.float64).reshape(len(tensors), len(COLUMNS))


def injected(n: int, dtype: torch.dtype, gen: torch.Generator, limit: torch.dtype | None = None) -> torch.Tensor:
    """``n`` random values of ``dtype`` with every special kind injected (near the
    end too, so that loop tails see them), on the scale of the limit dtype."""
    info = torch.finfo(limit or dtype)
    x = torch.randn(n, generator=gen, dtype=torch.float64)
    margin = info.max / 16
    specials = [
        float("nan"),
        float("inf"),
        -float("inf"),
        0.0,
        -0.0,
        info.tiny / 4,
        -info.tiny / 2,
        info.tiny,
        margin * 1.25,
        -margin * 1.5,
        margin * 0.75,
    ]
    if n:
        count = max(1, n // 17)
        where = torch.randint(0, n, (count,), generator=gen)
        picks = torch.randint(0, len(specials), (count,), generator=gen)
        x[where] = torch.tensor(specials, dtype=torch.float64)[picks]
        x[-1] = specials[int(torch.randint(0, len(specials), (1,), generator=gen))]
    return x.to(dtype)


def check(got: torch.Tensor, want: np.ndarray, dtype: torch.dtype, backend: str = "cpp") -> None:
    assert got.dtype == torch.float64 and tuple(got.shape) == want.shape
    got_np = got.numpy()
    np.testing.assert_array_equal(got_np[:, 1:], want[:, 1:])  # exact: maxima and counts
    # Sums: float64 accumulation of exact squares; a float64 tensor's squares round. Triton's
    # norm sums at most 32 squares in float32 before float64 (fastnorm._stats).
    rtol = sum_rtol(dtype, backend)
    np.testing.assert_allclose(got_np[:, 0], want[:, 0], rtol=rtol, atol=0, equal_nan=True)


def large(backend: str, n: int) -> int:
    """A large tensor's size: a tenth under Triton's interpreter, still many chunks of 512 there
    (INTERPRETER_CONFIG), each with its tail; the interpreter runs each chunk's loop in NumPy."""
    return n // 10 if backend == "triton" else n


def sum_rtol(dtype: torch.dtype, backend: str) -> float:
    """The sum of squares is a float64 sum on the C++ and torch backends; Triton
    sums at most 32 squares per lane in float32 (fastnorm._stats documents it)."""
    return 1e-6 if backend == "triton" else 1e-10 if dtype == torch.float64 else 1e-12


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_column_matches_the_reference(backend, dtype):
    gen = torch.Generator().manual_seed(hash((str(dtype), backend)) % 2**31)
    sizes = [123, 4097, 1, 0, 32, 31, large(backend, 200_000)]
    tensors = [injected(n, dtype, gen) for n in sizes]
    limits = [None] * len(tensors)
    check(reduce_stats(tensors), reference(tensors, limits), dtype, backend)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tensors_with_gaps_are_read_by_torch_ops_beside_dense_ones(mixing, dtype):
    gen = torch.Generator().manual_seed(5)
    tensors = [
        injected(4097 * 3, dtype, gen).reshape(3, 4097)[:, ::3],  # gaps: torch's ops
        injected(123, dtype, gen),
        injected(64 * 5, dtype, gen).reshape(64, 5).t(),  # a transpose: dense, any order
    ]
    check(reduce_stats(tensors), reference(tensors, [None] * 3), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("limit", (torch.float16, torch.bfloat16, torch.float32))
def test_a_limit_dtype_judges_by_its_range(backend, dtype, limit):
    if limit == dtype:
        pytest.skip("the tensor's own dtype")
    gen = torch.Generator().manual_seed(7)
    tensors = [injected(n, dtype, gen, limit) for n in (123, 4097)]
    limits = [limit, None]
    want = reference(tensors, limits)
    check(reduce_stats(tensors, limits), want, dtype)
    if torch.finfo(dtype).max >= torch.finfo(limit).max:  # the data reaches the limit's ends
        assert want[0, COLUMNS.index("overflow")] > 0 and want[0, COLUMNS.index("subnormal")] > 0


def test_many_small_tensors_and_one_large(backend):
    gen = torch.Generator().manual_seed(3)
    tensors = [injected(int(n), torch.float32, gen) for n in torch.randint(1, 70, (300,), generator=gen)]
    # more than one task of the C++ split
    tensors.append(injected(large(backend, 300_000), torch.bfloat16, gen))
    tensors += [injected(5, torch.float16, gen), injected(33, torch.float64, gen)]
    got = reduce_stats(tensors)
    want = reference(tensors, [None] * len(tensors))
    np.testing.assert_array_equal(got.numpy()[:, 1:], want[:, 1:])
    rtol = sum_rtol(torch.float64, backend)
    np.testing.assert_allclose(got.numpy()[:, 0], want[:, 0], rtol=rtol, equal_nan=True)


def test_tensor_stats_gives_the_total_norm_of_the_same_call(backend):
    gen = torch.Generator().manual_seed(11)
    model = torch.nn.Sequential(torch.nn.Linear(7, 33), torch.nn.ReLU(), torch.nn.Linear(33, 5))
    model(torch.randn(9, 7, generator=gen)).square().sum().backward()
    params = list(model.parameters())
    extra = torch.nn.Parameter(torch.zeros(3))  # no gradient: a row of zeros
    for p in (2.0, 1.0, float("inf"), 3.0):
        total, stats = fastnorm.tensor_stats([*params, extra], p)
        assert torch.equal(total, fastnorm.total_norm(params, p))
        grads = [q.grad for q in params]
        want = np.vstack([reference(grads, [None] * len(grads)), np.zeros((1, len(COLUMNS)))])
        np.testing.assert_array_equal(stats.numpy()[:, 1:], want[:, 1:])
        np.testing.assert_allclose(stats.numpy()[:, 0], want[:, 0], rtol=sum_rtol(torch.float32, backend))


def test_gradients_true_reads_parameters_as_given():
    w = torch.nn.Parameter(torch.tensor([0.0, float("inf"), 2.0]))
    w.grad = torch.ones(3)
    _, as_param = fastnorm.tensor_stats([w])
    _, as_given = fastnorm.tensor_stats([w], gradients=True)
    assert as_param[0, COLUMNS.index("nonfinite")] == 0
    assert as_given[0, COLUMNS.index("nonfinite")] == 1 and as_given[0, COLUMNS.index("zeros")] == 1
    assert torch.equal(reduce_stats([w]), as_given)


def test_refusals_name_the_bad_argument():
    x = torch.ones(3)
    with pytest.raises(ValueError, match="limit_dtypes has 1 entries for 2 tensors"):
        reduce_stats([x, x], [None])
    with pytest.raises(TypeError, match=r"limit_dtypes\[1\] is torch.int32"):
        reduce_stats([x, x], [None, torch.int32])
    with pytest.raises(TypeError, match="one Tensor"):
        reduce_stats(x)
    with pytest.raises(TypeError, match=r"tensors\[1\] is a float"):
        reduce_stats([x, 1.0])
    with pytest.raises(ValueError, match="2 devices"):
        reduce_stats([x, torch.ones(2, device="meta")])
    with pytest.raises(ValueError, match="same tensor with different limit dtypes"):
        reduce_stats([x, x], [None, torch.float16])
    assert reduce_stats([]).shape == (0, len(COLUMNS))


def test_no_host_sync(backend):
    from torch.overrides import TorchFunctionMode

    class CountSyncs(TorchFunctionMode):
        syncs = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") in ("item", "__bool__", "tolist", "__float__", "__int__"):
                CountSyncs.syncs += 1
            return func(*args, **(kwargs or {}))

    tensors = [torch.randn(100), torch.randn(4097, dtype=torch.float16)]
    reduce_stats(tensors)  # builds and caches the plan
    with CountSyncs():
        reduce_stats(tensors, [torch.bfloat16, None])
        fastnorm.tensor_stats(tensors, gradients=True)
    assert CountSyncs.syncs == 0


def test_opcheck_and_compile():
    grads = [torch.randn(5), torch.randn(3, 4, dtype=torch.float64), torch.empty(0)]
    torch.library.opcheck(torch.ops.fastnorm.tensor_stats, (grads, 2.0, [-1, 0, -1]))

    def step(ts):
        return fastnorm.tensor_stats(ts, gradients=True, limit_dtypes=[torch.float16, None, None])

    eager = step(grads)
    compiled = torch.compile(step, backend="eager", fullgraph=True)(grads)
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])


# ---------------------------------------------------------------------------
# The C++ kernel: the norm's own bits, every instruction set, any thread count

def _cpp():
    from fastnorm.backends import cpp

    if cpp._C is None:
        pytest.skip("the C++ kernels are not built")
    return cpp


@pytest.fixture
def isas():
    cpp = _cpp()
    default = cpp._C.isa()
    yield cpp._C.supported_isas()
    cpp._C.use_isa(default)


def _mixed(gen: torch.Generator) -> list[torch.Tensor]:
    tensors = [injected(n, dt, gen) for n in (1, 31, 33, 4097, 70001) for dt in DTYPES]
    tensors.append(injected(300_000, torch.bfloat16, gen))  # over one task of 256 KiB, into the threads
    return tensors


def test_cpp_statistics_keep_the_norms_bits_in_every_mode(isas):
    """The partial and root of every mode, and the L2 sums, bit for bit those of
    the norm's own loop (``_C.reduce``), in every instruction set."""
    from fastnorm._partial import Mode

    cpp = _cpp()
    gen = torch.Generator().manual_seed(13)
    tensors = [t.nan_to_num(0.0, 0.0, 0.0) for t in _mixed(gen)]  # finite: NaN's bits differ by path
    tensors.append(torch.tensor([1e300, -3e300], dtype=torch.float64))  # a scaled float64 partial
    want = reference(tensors, [None] * len(tensors))
    for isa in isas:
        cpp._C.use_isa(isa)
        prepared = cpp.BACKEND.prepare(tensors)
        for p in (2.0, 1.0, float("inf"), 3.0):
            partial, root, rows = cpp.BACKEND.reduce(prepared, Mode.of(p), p, torch.float64, True)
            s_partial, s_root, stats = cpp.BACKEND.reduce_stats(
                prepared, Mode.of(p), p, torch.float64, [None] * len(tensors)
            )
            assert torch.equal(partial, s_partial) and torch.equal(root, s_root), (isa, p)
            if p == 2.0:
                plain = rows[:, 0] == 0
                assert torch.equal(stats[plain, 0], rows[plain, 1]), isa
            np.testing.assert_array_equal(stats.numpy()[:, 1:], want[:, 1:])
        assert stats[-1, 0] == float("inf")  # 1e600 overflows the unscaled sum; the norm does not


def test_cpp_statistics_do_not_depend_on_the_thread_count_or_the_isa(isas, monkeypatch):
    monkeypatch.setenv("FASTNORM_BACKEND", "cpp")
    cpp = _cpp()
    gen = torch.Generator().manual_seed(17)
    tensors = _mixed(gen)
    limits = [torch.float16 if i % 3 == 0 else None for i in range(len(tensors))]
    threads = torch.get_num_threads()
    results = []
    try:
        for isa in isas:
            cpp._C.use_isa(isa)
            for n in (1, 2):
                torch.set_num_threads(n)
                results.append(reduce_stats(tensors, limits))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        assert torch.equal(other.nan_to_num(7.0), results[0].nan_to_num(7.0))
    check(results[0], reference(tensors, limits), torch.float64)


def test_cpp_refuses_an_unknown_limit_code():
    cpp = _cpp()
    x = torch.ones(3)
    prepared = cpp.BACKEND.prepare([x])
    out = torch.empty(2, dtype=torch.float64)
    root = torch.empty((), dtype=torch.float64)
    stats = torch.empty((1, 6), dtype=torch.float64)
    codes = torch.tensor([9], dtype=torch.int32)
    with pytest.raises(ValueError, match="unknown limit dtype code 9"):
        cpp._C.reduce_stats(
            prepared, 0, 2.0, out.data_ptr(), root.data_ptr(), True, cpp._THRESHOLDS.data_ptr(),
            codes.data_ptr(), stats.data_ptr(), 1,
        )


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_cpp_counts_of_a_16_bit_piece_over_65535_values_are_exact(isas, dtype):
    """One 256 KiB task of 131072 16-bit values, most of them zeros or subnormal:
    a count kept in 16-bit lanes over the whole piece would wrap."""
    cpp = _cpp()
    gen = torch.Generator().manual_seed(19)
    tiny = torch.finfo(dtype).tiny
    x = torch.zeros(131072, dtype=torch.float64)
    x[torch.randint(0, 131072, (40000,), generator=gen)] = tiny / 4  # subnormal in both dtypes
    x[-5:] = 1.5
    tensors = [x.to(dtype), torch.full((70000,), tiny / 2, dtype=torch.float64).to(dtype)]
    want = reference(tensors, [None, None])
    assert want[0, COLUMNS.index("zeros")] > 65536 and want[1, COLUMNS.index("subnormal")] > 65536
    count_stats, _, task, table = cpp.count_stats_args(1)
    for isa in isas:
        cpp._C.use_isa(isa)
        _, _, stats = cpp.BACKEND.reduce_stats(
            cpp.BACKEND.prepare(tensors), 0, 2.0, torch.float64, [None, None]
        )
        np.testing.assert_array_equal(stats.numpy()[:, 1:], want[:, 1:])
        for t, row in zip(tensors, want):  # the counts alone (a pass's activations), a piece at a time
            counts = torch.empty(len(COLUMNS), dtype=torch.float64)
            code = cpp.DTYPE_CODES[dtype]
            count_stats(t.data_ptr(), t.numel(), code, -1, task, table, counts.data_ptr(), 1)
            np.testing.assert_array_equal(counts.numpy()[1:], row[1:], err_msg=isa)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpp_counts_alone_find_the_largest_magnitude_in_every_lane(isas, dtype):
    """The counts alone (a pass's activations) keep the largest magnitude of the
    vector loops' lanes: placed at each element of two 64-byte registers, with
    a zero and a subnormal beside it, it is the one reported."""
    cpp = _cpp()
    gen = torch.Generator().manual_seed(29)
    tiny = torch.finfo(dtype).tiny
    count_stats, _, task, table = cpp.count_stats_args(1)
    code = cpp.DTYPE_CODES[dtype]
    lanes = 128 // (torch.finfo(dtype).bits // 8)
    tensors = []
    for k in range(lanes):
        x = torch.rand(4 * lanes + 3, generator=gen, dtype=torch.float64) + 0.5
        x[k] = -7.0 - k / 8  # exact in every dtype
        x[(k + 1) % lanes], x[(k + 2) % lanes] = 0.0, tiny / 4
        tensors.append(x.to(dtype))
    want = reference(tensors, [None] * len(tensors))
    for isa in isas:
        cpp._C.use_isa(isa)
        for k, (t, row) in enumerate(zip(tensors, want)):
            counts = torch.empty(len(COLUMNS), dtype=torch.float64)
            count_stats(t.data_ptr(), t.numel(), code, -1, task, table, counts.data_ptr(), 1)
            np.testing.assert_array_equal(counts.numpy()[1:], row[1:], err_msg=f"{isa}, lane {k}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpp_counts_see_every_stretch_of_the_fused_pass_once(isas, dtype):
    """The counts run inside the sum's loop, a stretch at a time (16 KiB, the
    bfloat16 loop's first block apart): values on both sides of every stretch's
    and piece's edges, in tensors whose chunks the bfloat16 word loop reads in
    each of its ways (no zero or subnormal; then both), are each counted once."""
    cpp = _cpp()
    gen = torch.Generator().manual_seed(23)
    info = torch.finfo(dtype)
    n = 3 * 65536 + 77  # over three 256 KiB pieces of float32
    stretch = 16384 * 8 // info.bits
    tensors = []
    for specials in (
        [info.max / 8, float("inf"), float("nan"), info.tiny, -info.max / 12],
        [0.0, info.tiny / 4, info.max / 8, float("nan"), -0.0],
    ):
        x = torch.randn(n, generator=gen, dtype=torch.float64) + 3.0  # no zero, nothing near one
        edges = [e + d for e in range(0, n, stretch) for d in (-1, 0, 1)]
        edges += [e + d for e in range(32, n, stretch) for d in (-1, 0, 1)]  # the bfloat16 loop's edges
        edges = sorted({e for e in edges if 0 <= e < n} | {n - 1})
        for k, e in enumerate(edges):
            x[e] = specials[k % len(specials)]
        tensors.append(x.to(dtype))
    want = reference(tensors, [None, None])
    for isa in isas:
        cpp._C.use_isa(isa)
        prepared = cpp.BACKEND.prepare(tensors)
        _, _, stats = cpp.BACKEND.reduce_stats(prepared, 0, 2.0, torch.float64, [None, None])
        np.testing.assert_array_equal(stats.numpy()[:, 1:], want[:, 1:], err_msg=isa)


def test_the_total_is_total_norms_bits_with_or_without_the_backends_statistics(fused):
    """Where the backend has no statistics of its own for the call (Triton for
    p != 2), the rows come from torch's ops but the total is still the norm's
    own pass; where it has, its counting pass gives the same partials: either
    way bit for bit ``total_norm`` of the same tensors, in every mode."""
    gen = torch.Generator().manual_seed(29)
    for trial in range(24):  # the float32 results of two summation orders differ in some of them (p=1)
        tensors = [torch.randn(n, generator=gen) for n in (231, 4097, 33, 1, 165)]
        # every mode once: the interpreter is slow
        for p in (1.0,) if trial else (2.0, 1.0, float("inf"), 3.0):
            total, _ = fastnorm.tensor_stats(tensors, p, gradients=True)
            assert torch.equal(total, fastnorm.total_norm(tensors, p, gradients=True)), (trial, p)


# ---------------------------------------------------------------------------
# The Triton kernel: the counts from the norm's own loads


def _triton_spy(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    from fastnorm.backends import triton_backend

    calls = []
    real = triton_backend.TritonBackend.reduce_stats

    def spy(self, *args, **kwargs):
        calls.append(True)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(triton_backend.TritonBackend, "reduce_stats", spy)
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_counts_every_value_once_across_chunk_and_run_edges(monkeypatch, dtype):
    """p=2 with each tensor's own range: norm_stats_kernel counts the rows (the
    spy sees it), with specials on both sides of every chunk's and run's edge,
    in a chunk's masked tail (whose padding is not a zero) and in chunks read
    twice (a value above the margin) or once; float64 tensors whose squares
    leave the range take the scaled path."""
    use_backend("triton", monkeypatch)
    calls = _triton_spy(monkeypatch)
    from fastnorm.backends.triton_backend import INTERPRETER_CONFIG

    gen = torch.Generator().manual_seed(31)
    info = torch.finfo(dtype)
    chunk = INTERPRETER_CONFIG.max_chunk
    run = 2 * INTERPRETER_CONFIG.run_elements  # a step of the interpreter's main loop, or less
    n = 5 * chunk + 77
    tensors = []
    for specials in ([0.0, info.tiny / 4, -0.0, info.tiny], [info.max / 8, float("nan"), 0.0, -float("inf")]):
        x = torch.randn(n, generator=gen, dtype=torch.float64) + 3.0
        edges = sorted({e + d for e in range(0, n, run) for d in (-1, 0) if 0 <= e + d < n} | {n - 1})
        for k, e in enumerate(edges[::3]):
            x[e] = specials[k % len(specials)]
        tensors.append(x.to(dtype))
    tensors.append(torch.randn(chunk - 3, generator=gen, dtype=torch.float64).to(dtype))  # one masked tail
    if dtype == torch.float64:
        tensors.append(torch.full((chunk + 5,), 1e200, dtype=dtype))  # squares overflow float64
        tensors.append(torch.full((33,), 1e-200, dtype=dtype))  # squares underflow it
    got = reduce_stats(tensors)
    assert calls, "the rows did not come from the Triton kernel"
    want = reference(tensors, [None] * len(tensors))
    np.testing.assert_array_equal(got.numpy()[:, 1:], want[:, 1:])
    finite = np.isfinite(want[:, 0])
    np.testing.assert_allclose(got.numpy()[finite, 0], want[finite, 0], rtol=sum_rtol(dtype, "triton"))
    assert np.array_equal(np.isnan(got.numpy()[:, 0]), np.isnan(want[:, 0]))


@pytest.mark.slow
def test_triton_hands_other_calls_to_torchs_rows(monkeypatch):
    """p != 2 or a limit dtype: the thresholds are constants of the kernel, so
    torch's ops give the rows; they are still right."""
    use_backend("triton", monkeypatch)
    calls = _triton_spy(monkeypatch)
    gen = torch.Generator().manual_seed(37)
    tensors = [injected(n, torch.float32, gen, torch.float16) for n in (700, 33)]
    limits = [torch.float16, None]
    check(reduce_stats(tensors, limits), reference(tensors, limits), torch.float32)
    _, rows = fastnorm.tensor_stats(tensors, 1.0, gradients=True)
    check(rows, reference(tensors, [None, None]), torch.float32)
    assert not calls
