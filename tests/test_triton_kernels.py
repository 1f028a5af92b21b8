"""The Triton kernels in Triton's interpreter: every alignment and tail, the float32 runs, the L2 contract.

Each test compares with the float64 oracle (reference.py) on fresh random data.
Most run the kernels with a small launch geometry (``small``): the same code
with fewer rows, so that every tail length of a step costs little.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import fastnorm
import reference
from fastnorm._partial import Mode
from helpers import INTERPRETED

pytestmark = pytest.mark.skipif(not INTERPRETED, reason="runs the kernels in Triton's interpreter")

if INTERPRETED:
    from fastnorm.backends import triton_backend
    from fastnorm.backends.triton_backend import BACKEND, Config

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
NORM_TYPES = [2.0, 1.0, float("inf"), 3.0]
# A float32 result is within half an ulp of the float64 partial; 16-bit inputs are exact in float32.
TOLERANCE = {torch.float32: 2e-7, torch.bfloat16: 2e-7, torch.float16: 2e-7, torch.float64: 1e-13}


@pytest.fixture(autouse=True)
def triton_on_cpu(monkeypatch):
    monkeypatch.setenv("FASTNORM_BACKEND", "triton")
    fastnorm.clear_cache()
    yield
    fastnorm.clear_cache()


@pytest.fixture
def small(monkeypatch):
    """Four rows of threads, two 16-byte vectors or eight elements per step, 64-element chunks."""
    config = Config(1, 4, 2, 8, 4, 64, chunks_per_program=1, programs_per_sm=1, register_budget=False)
    monkeypatch.setattr(triton_backend, "INTERPRETER_CONFIG", config)
    return config


def step(config, dtype, aligned):
    run, rows, vec = config.geometry(dtype, aligned)
    return run * rows * vec


def random(n, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g, dtype=torch.float64) * scale).to(dtype)


def unaligned_views(sizes, dtype, offset, seed):
    """Views of one buffer, each ``offset`` elements past a multiple of 16 elements, with gaps."""
    starts, at = [], 0
    for n in sizes:
        starts.append(at + offset)
        at = -(-(at + offset + n + 1) // 16) * 16
    buffer = random(at, dtype, seed)
    return buffer, [buffer[s : s + n] for s, n in zip(starts, sizes)]


def chosen_alignment(tensors):
    return {t.dtype: t.aligned for t in BACKEND.prepare(tensors).tables}


def check_norms(tensors, p, tol):
    total, per_tensor = fastnorm.tensor_norms(tensors, p)
    assert reference.rel_err(total.item(), reference.norm(tensors, p)) <= tol
    assert torch.equal(total, fastnorm.total_norm(tensors, p))
    for t, got in zip(tensors, per_tensor):
        assert reference.rel_err(got.item(), reference.norm([t], p)) <= tol, (t.numel(), got.item())


def check_clip_like_torch(tensors, max_norm=0.5):
    """clip_ scales exactly as torch.nn.utils.clip_grads_with_norm_ given the same norm."""
    expected = [t.clone() for t in tensors]
    params = []
    for e in expected:
        q = torch.nn.Parameter(torch.zeros_like(e))
        q.grad = e
        params.append(q)
    dtype = torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32
    norm = torch.nn.utils.get_total_norm(expected).to(dtype)
    fastnorm.clip_(tensors, max_norm, total_norm=norm, gradients=True)
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    assert norm.item() > max_norm  # a real clip: the coefficient is below 1
    for got, want in zip(tensors, expected):
        assert torch.equal(got, want)


# ----------------------------------------------------------------------------
# Alignment: the host's choice, and every storage offset
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_aligned_kernels_only_when_every_address_is_16_byte_aligned(dtype):
    fresh = [random(n, dtype, 0) for n in (100, 7, 3000)]
    assert all(t.data_ptr() % 16 == 0 for t in fresh)  # torch's CPU allocator aligns to 64 bytes
    assert chosen_alignment(fresh) == {dtype: True}
    _, views = unaligned_views([50], dtype, 1, 1)
    assert chosen_alignment(fresh + views) == {dtype: False}
    # 16 bytes past an aligned address is still aligned
    base = random(1000, dtype, 2)
    assert chosen_alignment([base[16 // dtype.itemsize :]]) == {dtype: True}
    # other dtypes keep their own choice
    other = torch.float32 if dtype != torch.float32 else torch.float64
    assert chosen_alignment(views + [random(10, other, 3)]) == {dtype: False, other: True}


def test_chunks_are_whole_steps_and_many_per_program():
    config = triton_backend.GPU_CONFIG
    programs = 132 * config.programs_per_sm  # an H200
    for dtype in DTYPES:
        for aligned in (True, False):
            run, rows, vec = config.geometry(dtype, aligned)
            step = run * rows * vec
            for total in (1, 10**5, 25_557_032, 124_439_808, 6_738_415_616):
                chunk = triton_backend.chunk_size(config, dtype, aligned, total, programs)
                assert chunk % step == 0 and step <= chunk <= config.max_chunk
                assert chunk * dtype.itemsize % 16 == 0
                if step < chunk < config.max_chunk:  # sized for the programs, not clamped
                    assert -(-total // chunk) >= programs * config.chunks_per_program * 0.5
    # a ResNet-50's 25.6M float32 values: 3100 chunks of 8192, not 390 of 65536 on 528 programs
    assert triton_backend.chunk_size(config, torch.float32, True, 25_557_032, programs) == 8192


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [0, 1, 3, 7])
def test_every_storage_offset(small, dtype, offset):
    sizes = [1, 5, 31, 64, 65, 200]
    buffer, views = unaligned_views(sizes, dtype, offset, seed=offset)
    assert chosen_alignment(views) == {dtype: offset * dtype.itemsize % 16 == 0}
    for p in (2.0, float("inf")):
        check_norms(views, p, TOLERANCE[dtype])
    outside = buffer.clone()
    check_clip_like_torch(views)
    # nothing outside the views was read into the result or written
    inside = torch.zeros(buffer.numel(), dtype=torch.bool)
    for v in views:
        start = v.storage_offset()
        inside[start : start + v.numel()] = True
    assert torch.equal(buffer[~inside], outside[~inside])


# ----------------------------------------------------------------------------
# Tails: every length from one element to one step and one element, both kernels
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("aligned", [True, False])
def test_every_tail_length(small, dtype, aligned):
    lengths = list(range(1, step(small, dtype, aligned) + 2))
    if aligned:
        tensors = [random(n, dtype, n) for n in lengths]
    else:
        _, tensors = unaligned_views(lengths, dtype, 1, 4)
    assert chosen_alignment(tensors) == {dtype: aligned}
    for p in (2.0, 1.0, float("inf")):
        check_norms(tensors, p, TOLERANCE[dtype])
    check_clip_like_torch(tensors)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("aligned", [True, False])
def test_tensors_of_exactly_one_chunk_and_around(small, dtype, aligned):
    chunk = small.max_chunk
    sizes = [chunk - 1, chunk, chunk + 1, 2 * chunk, 3 * chunk + 5]
    if aligned:
        tensors = [random(n, dtype, n) for n in sizes]
    else:
        _, tensors = unaligned_views(sizes, dtype, 3, 5)
    assert chosen_alignment(tensors) == {dtype: aligned}
    assert [t.chunk for t in BACKEND.prepare(tensors).tables] == [chunk]
    for p in NORM_TYPES:
        check_norms(tensors, p, 5e-7 if p == 3.0 else TOLERANCE[dtype])
    check_clip_like_torch(tensors)


# ----------------------------------------------------------------------------
# float32 runs: accuracy, and the values whose squares leave float32's range
# ----------------------------------------------------------------------------


def l2_partial(tensors, per_tensor=False):
    """The backend's float64 L2 partial (and per-tensor partials) of the tensors."""
    partial, root, rows = BACKEND.reduce(BACKEND.prepare(tensors), Mode.L2, 2.0, torch.float64, per_tensor)
    return partial, root, rows


def sum_of_squares(tensors):
    x = reference.as_float64(tensors)
    return float(np.sum(x * x))


def emulate_l2(tensors, config, max_programs, chain=False):
    """The float32 L2 norm kernel's sum of squares, in NumPy, in the kernel's own order.

    Chunks (sized as the backend sizes them) go to the programs in turn; a chunk
    is read in steps of shape (R, ROWS, VEC), the last one masked; each of the ROWS threads sums its
    R * VEC squares in float32 (over VEC, then over R, as the interpreter's
    tl.sum does; or, with ``chain``, in one running float32 sum, the order with
    the largest rounding error bound) and adds the result to its float64 total;
    a chunk's total is the sum of its threads'; the programs add their chunks
    in order, and the finalize kernel adds the programs' partials in lanes of
    256. Only ordinary values: no chunk here needs its second, float64 read.
    """
    run, rows, vec = config.geometry(torch.float32, True)
    step = run * rows * vec
    chunk = triton_backend.chunk_size(config, torch.float32, True, sum(t.size for t in tensors), max_programs)
    programs = min(max_programs, sum(-(-t.size // chunk) for t in tensors))
    per_program = np.zeros(programs)
    chunk_index = 0

    def thread_sums(x):
        squares = (x * x).reshape(-1, rows, vec)
        if chain:
            total = np.zeros(rows, np.float32)
            for r in range(squares.shape[0]):
                for v in range(vec):
                    total += squares[r, :, v]
            return total
        return np.sum(np.sum(squares, 2), 0)

    for t in tensors:
        for start in range(0, t.size, chunk):
            x = t[start : start + chunk]
            acc = np.zeros(rows)
            whole = x.size // step * step
            for off in range(0, whole, step):
                acc += thread_sums(x[off : off + step]).astype(np.float64)
            if whole < x.size:  # the tail: one masked step
                tail = np.zeros(step, np.float32)
                tail[: x.size - whole] = x[whole:]
                acc += thread_sums(tail).astype(np.float64)
            total = np.sum(acc)
            assert 2.0**-100 <= total < np.inf
            per_program[chunk_index % programs] += total
            chunk_index += 1
    lanes = np.zeros(triton_backend.REDUCE_BLOCK)
    for off in range(0, programs, lanes.size):
        block = per_program[off : off + lanes.size]
        lanes[: block.size] += block
    return float(np.sum(lanes))


def test_emulation_reproduces_the_interpreted_kernel_bit_for_bit(monkeypatch):
    # The GPU's launch geometry (32 float32 squares per thread per step) in the interpreter.
    config = triton_backend.GPU_CONFIG
    monkeypatch.setattr(triton_backend, "INTERPRETER_CONFIG", config)
    g = torch.Generator().manual_seed(20)
    tensors = [torch.randn(2**20 - 777, generator=g), torch.randn(70_001, generator=g) * 3]
    partial, _, _ = l2_partial(tensors)
    assert partial[0].item() == 0.0
    emulated = emulate_l2([t.numpy() for t in tensors], config, triton_backend.INTERPRETER_PROGRAMS)
    assert partial[1].item() == emulated
    exact = sum_of_squares(tensors)
    ours = reference.rel_err(partial[1].item(), exact)
    theirs = reference.rel_err(torch.nn.utils.get_total_norm(tensors).double().item() ** 2, exact)
    assert ours <= 1e-6 and ours <= theirs + 1e-9


@pytest.mark.slow
def test_float32_runs_stay_within_1e_6_on_1e8_values():
    # 10^8 values of N(0, 1) in the kernel's order on an H200 (132 SMs, 4
    # programs each), emulated: the interpreter would take hours.
    rng = np.random.default_rng(21)
    tensors = [rng.standard_normal(n, dtype=np.float32) for n in (60_000_000, 25_000_007, 15_000_000 - 7)]
    assert sum(t.size for t in tensors) == 10**8
    exact = math.fsum(float(np.dot(t.astype(np.float64), t.astype(np.float64))) for t in tensors)
    for chain in (False, True):
        got = emulate_l2(tensors, triton_backend.GPU_CONFIG, 132 * 4, chain)
        assert abs(got - exact) / exact <= 1e-6


# The first, float32 pass squares 3e38 to inf (and NumPy, running the
# interpreter, says so): that is how the kernel finds the chunk to sum again.
@pytest.mark.filterwarnings("ignore:overflow encountered in multiply:RuntimeWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("where", ["main", "tail"])
def test_squares_past_float32_range_are_summed_in_float64(small, dtype, where):
    n = 5 * small.max_chunk + 9  # the last chunk has a tail
    x = random(n, dtype, 6)
    at = 2 * small.max_chunk + 3 if where == "main" else n - 2
    x[at] = 3e38 if dtype == torch.float32 else 1e38
    x[at - 1] = -1e20
    partial, root, _ = l2_partial([x])
    assert partial[0].item() == 0.0 and math.isfinite(partial[1].item())
    assert reference.rel_err(partial[1].item(), sum_of_squares([x])) <= 1e-12
    assert reference.rel_err(root.item(), reference.norm([x], 2.0)) <= 1e-12
    x[at] = torch.finfo(dtype).max
    twice = [x, x.clone()]  # the table holds addresses: the tensors must outlive the call
    l1, _, _ = BACKEND.reduce(BACKEND.prepare(twice), Mode.L1, 1.0, torch.float64)
    assert reference.rel_err(l1[1].item(), reference.norm(twice, 1.0)) <= 1e-12  # 2 * max: past float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", [1e-30, 1e-38, 1e-20])
def test_squares_below_float32_range_are_summed_in_float64(small, dtype, scale):
    # 1e-30 squared is 1e-60: zero in float32. Whole chunks of such values, and
    # chunks where they sit next to ordinary ones.
    tiny = random(3 * small.max_chunk + 11, dtype, 7, scale)
    mixed = random(2 * small.max_chunk, dtype, 8, scale)
    mixed[5] = 1.0
    for tensors in ([tiny], [mixed], [tiny, mixed]):
        partial, root, rows = l2_partial(tensors, per_tensor=True)
        assert partial[1].item() > 0
        assert reference.rel_err(partial[1].item(), sum_of_squares(tensors)) <= 1e-12
        assert reference.rel_err(root.item(), reference.norm(tensors, 2.0)) <= 1e-12
        for t, row in zip(tensors, rows):
            assert reference.rel_err(row[1].item(), sum_of_squares([t])) <= 1e-12


@pytest.mark.parametrize("dtype", DTYPES)
def test_zeros_give_an_exact_zero(small, dtype):
    tensors = [torch.zeros(n, dtype=dtype) for n in (1, small.max_chunk, 3 * small.max_chunk + 7)]
    for p in NORM_TYPES:
        assert fastnorm.total_norm(tensors, p).item() == 0.0


# Triton's interpreter runs the kernels on NumPy, which warns on inf - inf in
# lanes that tl.where then discards; the GPU does not.
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", NORM_TYPES)
def test_nan_and_inf_are_exact_in_main_loop_and_tail(small, dtype, p):
    n = 2 * small.max_chunk + 13
    for at in (small.max_chunk + 1, n - 1):
        for bad, values in (
            ([float("inf")], float("inf")),
            ([-float("inf")], float("inf")),
            ([float("nan")], float("nan")),
            ([float("inf"), float("nan")], float("nan")),
        ):
            x = random(n, dtype, 9)
            for k, v in enumerate(bad):
                x[at - 2 * k] = v
            got = fastnorm.total_norm([x], p).item()
            assert (math.isnan(got) and math.isnan(values)) or got == values, (at, bad, got)


# ----------------------------------------------------------------------------
# The L2 partial contract for float64: plain sums in the common range, scaled beyond
# ----------------------------------------------------------------------------


def contract_norm(partial):
    m, s = partial[..., 0], partial[..., 1]
    return s.sqrt() * torch.where(m > 0, m, torch.ones_like(m))


def is_power_of_two(v):
    mantissa, _ = math.frexp(v)
    return mantissa == 0.5


def test_float64_common_range_is_a_plain_sum(small):
    tensors = [random(n, torch.float64, n, scale) for n, scale in ((500, 1e-100), (77, 1.0), (300, 1e100))]
    partial, root, rows = l2_partial(tensors, per_tensor=True)
    assert partial[0].item() == 0.0 and torch.all(rows[:, 0] == 0)
    assert reference.rel_err(partial[1].item(), sum_of_squares(tensors)) <= 1e-14
    assert reference.rel_err(root.item(), reference.norm(tensors, 2.0)) <= 1e-14


# Plain float64 squares of 1e300 overflow first (NumPy says so), then the chunk is summed scaled.
@pytest.mark.filterwarnings("ignore:overflow encountered in multiply:RuntimeWarning")
@pytest.mark.parametrize("scale", [1e-310, 1e-300, 1e-160, 1e160, 1e300, 1e307])
def test_float64_extremes_are_scaled_and_accurate(small, scale):
    big = random(3 * small.max_chunk + 5, torch.float64, 10, scale)
    ordinary = random(small.max_chunk + 3, torch.float64, 11)
    for tensors in ([big], [big, ordinary], [ordinary, big]):
        partial, root, rows = l2_partial(tensors, per_tensor=True)
        ref = reference.norm(tensors, 2.0)
        assert math.isfinite(root.item()) and root.item() > 0
        assert reference.rel_err(root.item(), ref) <= 1e-12
        assert reference.rel_err(contract_norm(partial).item(), ref) <= 1e-12
        m = partial[0].item()
        assert m == 0.0 or is_power_of_two(m)
        for t, row in zip(tensors, rows):
            assert reference.rel_err(contract_norm(row).item(), reference.norm([t], 2.0)) <= 1e-12
        assert reference.rel_err(fastnorm.total_norm(tensors).item(), ref) <= 1e-12


@pytest.mark.filterwarnings("ignore:overflow encountered in multiply:RuntimeWarning")
def test_float64_scaled_partials_keep_inf_and_nan(small):
    big = random(2 * small.max_chunk, torch.float64, 12, 1e300)
    tiny = random(small.max_chunk, torch.float64, 13, 1e-310)
    for bad, check in ((float("inf"), math.isinf), (float("nan"), math.isnan)):
        spoiled = random(small.max_chunk + 9, torch.float64, 14)
        spoiled[small.max_chunk + 4] = bad
        for tensors in ([big, spoiled], [tiny, spoiled], [spoiled, tiny, big]):
            _, root, _ = l2_partial(tensors)
            assert check(root.item()), (bad, root.item())


# ----------------------------------------------------------------------------
# The interpreter as the tests run it (helpers.patch_triton_language_once_per_launch)
# ----------------------------------------------------------------------------


def test_the_language_is_patched_within_a_launch_only():
    # conftest makes device calls skip patching triton.language again inside a launch; a launch still
    # patches it and puts it back, so that a kernel sees NumPy builtins and nothing outside one does.
    import triton.language as tl
    from triton.runtime import interpreter

    from helpers import patch_triton_language_once_per_launch

    assert getattr(interpreter._patch_lang, "once_per_launch", False)
    assert patch_triton_language_once_per_launch() is False  # once only
    assert tl.core.is_builtin(tl.load)
    x = random(1000, torch.float32, 15)
    got = fastnorm.total_norm([x]).item()
    assert reference.rel_err(got, reference.norm([x], 2.0)) <= TOLERANCE[torch.float32]
    assert tl.core.is_builtin(tl.load)


def test_the_overflow_checks_the_interpreter_would_drop_are_not_computed(monkeypatch):
    # conftest turns sanitize_overflow off while debug is off: device_assert drops the checks then.
    import dataclasses

    from triton.runtime import interpreter

    from helpers import skip_discarded_overflow_checks

    builder = interpreter.interpreter_builder
    assert (builder.options.debug, builder.options.sanitize_overflow) == (False, False)
    assert skip_discarded_overflow_checks() is False  # nothing left to turn off
    # with debug on, the checks would run: they are left as they are
    debugging = dataclasses.replace(builder.options, debug=True, sanitize_overflow=True)
    monkeypatch.setattr(builder, "options", debugging)
    assert skip_discarded_overflow_checks() is False
    assert builder.options.sanitize_overflow
