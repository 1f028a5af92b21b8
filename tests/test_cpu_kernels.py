"""The C++ kernels: every instruction set gives the same bits, in the documented
lane order, independent of the thread count; float64 L2 norms are finite and
accurate from subnormals to 1e300 (the scaled partial contract)."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch

import fastnorm
import reference
from fastnorm import _extension
from fastnorm._partial import Mode
from fastnorm.backends import cpp
from helpers import cpp_env, run_python

pytestmark = pytest.mark.skipif(cpp._C is None, reason="the C++ kernels are not built")
ISAS = cpp._C.supported_isas() if cpp._C is not None else []
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
NORM_TYPES = (2.0, 1.0, float("inf"), 3.0)
# Around the 32-element blocks, and one tensor spanning several 256 KiB tasks.
SIZES = (1, 3, 31, 32, 33, 100, 1000, 4099, 70001)


@pytest.fixture(autouse=True)
def restore_isa():
    if cpp._C is None:
        yield
        return
    default = cpp._C.isa()
    yield
    cpp._C.use_isa(default)


def _reduce(tensors: list[torch.Tensor], p: float, isa: str) -> torch.Tensor:
    """The partial, the root and each tensor's partial of one call, as float64 bits."""
    cpp._C.use_isa(isa)
    plan = cpp.BACKEND.prepare(tensors)
    partial, root, per = cpp.BACKEND.reduce(plan, Mode.of(p), p, torch.float64, True)
    values = torch.cat([partial, root.reshape(1), per.reshape(-1)])
    # NaN payloads may differ between instruction sets (the C++ standard leaves them open).
    return torch.where(values.isnan(), torch.tensor(float("nan"), dtype=torch.float64), values)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int64), b.view(torch.int64))


def _norm_of_row(m: float, s: float, p: float) -> float:
    """The norm a tensor's partial ``[m, s]`` stands for (the contract of fastnorm.backends)."""
    if p == 2.0:
        return math.sqrt(s) * (m if m > 0 else 1.0)
    if p == 1.0:
        return s
    if p == math.inf:
        return m
    return 0.0 if m == 0.0 else m * s ** (1.0 / p)


def _special(dtype: torch.dtype) -> list[torch.Tensor]:
    """Values that take other paths: zeros, subnormals, the largest finite ones, inf, NaN."""
    info = torch.finfo(dtype)
    tiny = torch.full((37,), info.smallest_normal / 8, dtype=dtype)  # subnormal
    big = torch.full((45,), info.max, dtype=dtype)
    out = [torch.zeros(50, dtype=dtype), tiny, big, torch.tensor([info.max, -info.max, 1.0], dtype=dtype)]
    for bad in (float("inf"), float("-inf"), float("nan")):
        x = torch.randn(70, dtype=torch.float64).to(dtype)
        x[33] = bad
        out.append(x)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_instruction_set_gives_the_same_bits(dtype):
    g = torch.Generator().manual_seed(0)
    tensors = [(torch.randn(n, generator=g, dtype=torch.float64) * 3).to(dtype) for n in SIZES]
    tensors.append((torch.randn(200_000, generator=g, dtype=torch.float64) * 1e-3).to(dtype))
    tensors += _special(dtype)
    if dtype in (torch.float16, torch.bfloat16):
        # Every 16-bit pattern, once at a block's start and once shifted into a tail.
        every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
        finite = every[every.isfinite()]
        tensors += [finite, finite[5:4106]]
    for p in NORM_TYPES:
        results = {isa: _reduce(tensors, p, isa) for isa in ISAS}
        for isa, got in results.items():
            assert _same_bits(got, results["generic"]), (isa, p)
        # Agreement alone would pass a bug every loop shares (and test nothing
        # where the CPU runs the portable loop only): each tensor's norm, and
        # the total, against the float64 oracle.
        got = results[ISAS[-1]]
        rows = got[3:].reshape(-1, 2).tolist()
        norms = [_norm_of_row(m, s, p) for m, s in rows] + [got[2].item()]
        want = [reference.norm([t], p) for t in tensors] + [reference.norm(tensors, p)]
        assert norms == pytest.approx(want, rel=1e-10, nan_ok=True), p


@pytest.fixture
def restore_prefetch():
    default = cpp._C.prefetch_bytes()
    yield
    cpp._C.set_prefetch_bytes(default)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_prefetch_distance_never_changes_the_bits(dtype, restore_prefetch):
    """Every distance (csrc/prefetch.h), whatever the instruction set, sums and
    clips to the bits of no prefetch, which match the float64 oracle: pieces
    shorter than the distance, pieces that end inside it, several tasks."""
    g = torch.Generator().manual_seed(3)
    sizes = (1, 33, 1000, 2047, 2048, 2049, 4096 + 31, 70001, 200_003)
    tensors = [(torch.randn(n, generator=g, dtype=torch.float64) * 2).to(dtype) for n in sizes]
    tensors[-2][123] = 0.0  # a zero among bfloat16 words: the careful ways
    tensors += _special(dtype)
    want = {p: [reference.norm([t], p) for t in tensors] for p in (2.0, 1.0)}
    base = {}
    for isa in ISAS:
        for ahead in (0, 64, 4096, 65536):
            cpp._C.set_prefetch_bytes(ahead)
            for p in (2.0, 1.0):
                got = _reduce(tensors, p, isa)
                rows = got[3:].reshape(-1, 2).tolist()
                assert [_norm_of_row(m, s, p) for m, s in rows] == pytest.approx(
                    want[p], rel=1e-10, nan_ok=True
                )
                assert _same_bits(got, base.setdefault(p, got)), (isa, ahead, p)
            clipped = [t.clone() for t in tensors[:-7]]  # finite ones: a coefficient below 1
            fastnorm.clip_(clipped, 1.0, gradients=True)
            flat = torch.cat([c.float().reshape(-1) for c in clipped])
            assert _same_bits(flat.double(), base.setdefault("clip", flat.double())), (isa, ahead)


def test_a_prefetch_distance_out_of_range_is_refused(restore_prefetch):
    for bad in (-64, 100, 1 << 17):
        with pytest.raises(ValueError, match="64-byte lines"):
            cpp._C.set_prefetch_bytes(bad)
    for bad in ("100", "-64", "+64", "1_024", " 64", "4k", "131072"):
        with mock.patch.dict(os.environ, {"FASTNORM_PREFETCH": bad}):
            assert "FASTNORM_PREFETCH" in (_extension._bad_prefetch() or ""), bad
    for good in ("0", "64", "4096", "65536"):
        with mock.patch.dict(os.environ, {"FASTNORM_PREFETCH": good}):
            assert _extension._bad_prefetch() is None


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_instruction_set_clips_to_the_same_bits(dtype):
    if dtype in (torch.float16, torch.bfloat16):
        every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
        values = [every, every[7:4110]]  # whole blocks, and a tail
    else:
        g = torch.Generator().manual_seed(1)
        values = [(torch.randn(n, generator=g, dtype=torch.float64) * 3).to(dtype) for n in SIZES]
    norm = torch.tensor(2.7182817, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    results = {}
    for isa in ISAS:
        cpp._C.use_isa(isa)
        clipped = [v.clone() for v in values]
        fastnorm.clip_(clipped, 1.0, total_norm=norm, gradients=True)
        # NaN payloads may differ (F16C keeps them, the portable path makes them canonical, as c10 does).
        results[isa] = [torch.where(c.isnan(), torch.full_like(c, float("nan")), c) for c in clipped]
    for isa, got in results.items():
        for a, b in zip(got, results["generic"]):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), isa


# Where element e of a block of 32 goes, by dtype (csrc/lanes.h).
LANE_OF = {
    torch.float32: list(range(32)),
    torch.float64: list(range(32)),
    torch.bfloat16: [8 * (e // 8) + 4 * (e % 2) + (e % 8) // 2 for e in range(32)],
    torch.float16: list(range(32)),
}


def _canonical_sum(x: np.ndarray, power: int, dtype: torch.dtype) -> float:
    """The sum of |x|^power in the documented order (csrc/lanes.h), written anew:
    32 lanes, element e of each block of 32 to lane LANE_OF[e], lanes in order,
    then the fixed fold."""
    lane_of = LANE_OF[dtype]
    n = len(x)
    padded = np.zeros((n + 31) // 32 * 32)
    padded[:n] = np.abs(x)
    lanes = np.zeros(32)
    for block in padded.reshape(-1, 32):
        lanes[lane_of] = lanes[lane_of] + (block * block if power == 2 else block)
    h = lanes[:16] + lanes[16:]
    i = h[:8] + h[8:]
    j = i[:4] + i[4:]
    return float((j[0] + j[2]) + (j[1] + j[3]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [2.0, 1.0])
def test_sums_follow_the_documented_lane_order(dtype, p):
    g = torch.Generator().manual_seed(1)
    # One tensor per call, within one task (256 KiB): one piece, one lane sum.
    # Several long ones, so that another order would round differently somewhere.
    # Values over many binades: sums of 16-bit squares that round.
    sizes = (5, 32, 1000) + (30001,) * 8
    wide = [
        torch.randn(n, generator=g, dtype=torch.float64) * torch.randn(n, generator=g).mul(4).exp()
        for n in sizes
    ]
    tensors = [x.clamp(-6e4, 6e4).to(dtype) for x in wide]  # finite in float16
    for isa in ISAS:
        for t in tensors:
            m, s = _reduce([t], p, isa)[:2].tolist()
            assert m == 0.0 and s == _canonical_sum(t.double().numpy(), int(p), dtype), (isa, t.numel())
    if dtype == torch.bfloat16 and p == 2.0:
        # The data tells the orders apart: the natural one gives other bits somewhere.
        natural = [_canonical_sum(t.double().numpy(), int(p), torch.float32) for t in tensors]
        assert natural != [_canonical_sum(t.double().numpy(), int(p), dtype) for t in tensors]


@pytest.mark.parametrize("isa", ISAS)
def test_result_does_not_depend_on_the_thread_count(isa):
    cpp._C.use_isa(isa)
    g = torch.Generator().manual_seed(2)
    # A float64 gradient makes the result float64, which keeps every bit of the
    # order in which the tasks' partials are added.
    dtypes = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
    tensors = [torch.randn(300_000, generator=g).to(dt) for dt in dtypes]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = [fastnorm.total_norm(tensors, p) for p in NORM_TYPES]
        torch.set_num_threads(2)
        two = [fastnorm.total_norm(tensors, p) for p in NORM_TYPES]
        torch.set_num_threads(3)
        three = [fastnorm.total_norm(tensors, p) for p in NORM_TYPES]
    finally:
        torch.set_num_threads(threads)
    assert one[0].dtype == torch.float64
    assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(one, two, three))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("norm, max_norm", [(2.7182817, 1.0), (4 - 1e-6, 3.0)], ids=["coef-.37", "coef-.75"])
def test_every_instruction_set_scales_every_16bit_value_like_torch(dtype, norm, max_norm):
    """Every 16-bit pattern, in whole vector blocks and in a loop's tail, scaled
    and rounded as torch rounds it. With the coefficient 3/4 (4 - 1e-6 + 1e-6 is
    4 in float32) a quarter of the products are exact ties, which round to even."""
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    values = torch.cat([bits.view(dtype), bits[:4103].view(dtype)])
    total = torch.tensor(norm, dtype=torch.float32)
    param = torch.nn.Parameter(torch.zeros_like(values))
    param.grad = values.clone()
    torch.nn.utils.clip_grads_with_norm_([param], max_norm, total)
    theirs = param.grad
    for isa in ISAS:
        cpp._C.use_isa(isa)
        ours = values.clone()
        cpp.BACKEND.scale_(cpp.BACKEND.prepare([ours]), total, max_norm)
        same = (ours.view(torch.int16) == theirs.view(torch.int16)) | (ours.isnan() & theirs.isnan())
        assert bool(same.all()), (isa, values[~same][:5])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("p", [2.0, 1.0])
def test_16bit_infinity_and_nan_survive_the_widening(dtype, p):
    """16-bit values are widened with integer shifts, which turn inf and NaN into
    large finite values: a sum that large is checked against max |x|."""
    big = torch.full((1000,), torch.finfo(dtype).max, dtype=dtype)
    for isa in ISAS:
        # Finite, and past the check's threshold: exact (the float64 root; a
        # float32 one would overflow for bfloat16).
        root = _reduce([big], p, isa)[2].item()
        assert root == pytest.approx(reference.norm([big], p), rel=1e-15)
        for bad, want in ((float("inf"), math.inf), (float("nan"), math.nan)):
            x = big.clone()
            x[123] = bad
            got = _reduce([x], p, isa)[2].item()
            assert got == want or (math.isnan(want) and math.isnan(got)), (isa, bad)


# ----------------------------------------------------------------------------
# bfloat16 read as float32 words (csrc/isa_avx2.h): the zeros, subnormals, inf
# and NaN that the word loop cannot read, in chunks of 8192 elements
# ----------------------------------------------------------------------------

BF16_CHUNK = 256 * 32


def _tiny_bf16(n: int, seed: int) -> torch.Tensor:
    """Normal bfloat16 values near 2^-120, so small that the 2^-266 a neighbour's
    bits would add to a zero's square shows in the sum's last bits."""
    g = torch.Generator().manual_seed(seed)
    sign = torch.randint(0, 2, (n,), generator=g) * 2 - 1
    return (sign * (1 + torch.rand(n, generator=g)) * 2.0**-120).to(torch.bfloat16)


def _bf16_word_cases() -> dict[str, torch.Tensor]:
    n = 3 * BF16_CHUNK + 77
    base = _tiny_bf16(n, 11)
    g = torch.Generator().manual_seed(12)
    cases = {"dense": base}
    cases["scattered zeros"] = base.masked_fill(torch.rand(n, generator=g) < 0.02, 0)
    rows = base[: 32 * 768].clone()
    rows.view(32, 768)[::3] = 0  # zero rows, as an embedding's unused ones
    cases["zero rows"] = rows
    late = base.clone()
    late[-200] = 0  # only the last chunk has one
    cases["one zero in the last chunk"] = late
    sub = cases["scattered zeros"].clone()
    sub[BF16_CHUNK + 999] = torch.finfo(torch.bfloat16).smallest_normal / 4
    cases["a subnormal among zeros"] = sub
    lone = base.clone()
    lone[2 * BF16_CHUNK + 5] = torch.finfo(torch.bfloat16).smallest_normal / 8
    cases["a lone subnormal"] = lone
    return cases


@pytest.mark.parametrize("p", [2.0, 1.0])
@pytest.mark.parametrize("case", list(_bf16_word_cases()))
def test_bf16_words_give_the_exact_lane_sums(case, p):
    x = _bf16_word_cases()[case]
    want = _canonical_sum(x.double().numpy(), int(p), torch.bfloat16)
    # The data tells a neighbour's bits apart: adding 2^-266 for every zero changes the sum.
    if "zero" in case and p == 2.0:
        wrong = x.double().numpy().copy()
        wrong[wrong == 0] = 2.0**-133
        assert _canonical_sum(wrong, 2, torch.bfloat16) != want
    for isa in ISAS:
        m, s = _reduce([x], p, isa)[:2].tolist()
        assert m == 0.0 and s == want, (isa, case)


@pytest.mark.parametrize("p", [2.0, 1.0])
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_bf16_words_keep_inf_and_nan(bad, p):
    """The float32 word of an inf and a non-zero neighbour is a NaN."""
    x = _tiny_bf16(2 * BF16_CHUNK, 13)
    x[BF16_CHUNK + 3] = bad  # an even element: its word holds x[BF16_CHUNK + 2] below it
    for isa in ISAS:
        got = _reduce([x], p, isa)[2].item()
        assert math.isnan(got) if math.isnan(bad) else got == math.inf, isa


_GUARDED = """
import ctypes, json, mmap, sys
import torch
from fastnorm._partial import Mode
from fastnorm.backends import cpp

page, pages = mmap.PAGESIZE, 6
region = mmap.mmap(-1, page * (pages + 2))
base = ctypes.addressof(ctypes.c_char.from_buffer(region))
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
x = torch.frombuffer(region, dtype=torch.bfloat16, offset=page, count=pages * page // 2)
x.copy_(torch.load(sys.argv[1]))
for guard in (base, base + (pages + 1) * page):
    assert libc.mprotect(guard, page, 0) == 0, ctypes.get_errno()  # PROT_NONE
sums = {}
for isa in cpp._C.supported_isas():
    cpp._C.use_isa(isa)
    partial = cpp.BACKEND.reduce(cpp.BACKEND.prepare([x]), Mode.of(2.0), 2.0, torch.float64)[0]
    sums[isa] = partial[1].item()
print(json.dumps(sums))
"""


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="mprotect through libc: Linux")
@pytest.mark.slow
def test_bf16_words_read_nothing_outside_the_tensor(tmp_path):
    """A tensor that starts and ends next to a page that cannot be read: the word
    loop reads one element before each block but the piece's first. Run in a
    child process, which a stray read would kill."""
    import mmap

    x = _tiny_bf16(6 * mmap.PAGESIZE // 2, 14)
    x[100::97] = 0
    want = _canonical_sum(x.double().numpy(), 2, torch.bfloat16)
    torch.save(x, tmp_path / "x.pt")
    result = run_python(["-c", _GUARDED, str(tmp_path / "x.pt")])
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout) == {isa: want for isa in ISAS}


def test_bf16_words_leave_the_callers_denormal_mode_as_it_was():
    """The word loop sets denormals-are-zero for a while on the calling thread
    (a plan under 1 MiB runs there); afterwards torch's own float32 compares
    still see a subnormal as above zero, or as zero where the caller asked
    torch to flush them."""
    x = _bf16_word_cases()["scattered zeros"]
    tiny = torch.full((64,), 1e-40, dtype=torch.float32)
    for flush in (False, True):
        torch.set_flush_denormal(flush)
        try:
            for isa in ISAS:
                _reduce([x], 2.0, isa)
                assert bool((tiny > 0).all()) is not flush, (isa, flush)
        finally:
            torch.set_flush_denormal(False)


def test_bf16_under_the_callers_flush_denormal_mode_every_instruction_set_agrees():
    """With torch.set_flush_denormal(True) on the calling thread (where a plan
    under 1 MiB runs), every loop reads a bfloat16 subnormal as zero, in chunks,
    in short pieces and in tails alike."""
    sub = _bf16_word_cases()["a subnormal among zeros"]
    short = torch.tensor([1.0, 0.0, 2.0**-130, 3.0] * 10, dtype=torch.bfloat16)  # 40: no word loop
    tensors = [sub, short, sub[: BF16_CHUNK + 45]]
    flushed = [
        t.masked_fill((t != 0) & (t.abs() < torch.finfo(torch.bfloat16).smallest_normal), 0) for t in tensors
    ]
    want = [_canonical_sum(t.double().numpy(), 2, torch.bfloat16) for t in flushed]
    torch.set_flush_denormal(True)
    try:
        for isa in ISAS:
            got = [_reduce([t], 2.0, isa)[1].item() for t in tensors]
            assert got == want, isa
    finally:
        torch.set_flush_denormal(False)


_FLOAT_MODES = """
import ctypes, json
import torch
import fastnorm

libm = ctypes.CDLL("libm.so.6")
FE_TONEAREST, FE_UPWARD = 0, 0x800
tiny = [torch.full((65536,), 1e-39) for _ in range(48)]  # float32 subnormals, 12 MiB
g = torch.Generator().manual_seed(3)
# One large tensor sets the norm (about 1e6); clipped to 1e-3, the others'
# values of about 1e-30 become float32 subnormals.
small = [torch.randn(65536, generator=g) * 1e-30 for _ in range(47)] + [torch.full((65536,), 4e3)]
for threads in (1, 2):  # every helper thread started before any mode is set
    torch.set_num_threads(threads)
    fastnorm.total_norm(tiny)
out = {}
for mode in ("default", "flush", "upward"):
    if mode == "flush":
        assert torch.set_flush_denormal(True)
    if mode == "upward":
        assert libm.fesetround(FE_UPWARD) == 0
    seen, clipped = {}, {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        seen[threads] = sorted({fastnorm.total_norm(tiny).item().hex() for _ in range(50)})
        copies = [t.clone() for t in small]
        fastnorm.clip_(copies, 1e-3, gradients=True)
        clipped[threads] = torch.cat(copies).view(torch.int32)
    torch.set_flush_denormal(False)
    libm.fesetround(FE_TONEAREST)
    out[mode] = {"norms": seen, "clipped alike": torch.equal(clipped[1], clipped[2])}
print(json.dumps(out))
"""


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="glibc's fenv through ctypes: Linux")
@pytest.mark.parametrize("pool", ["openmp", "own"])
@pytest.mark.slow
def test_the_callers_floating_point_modes_rule_every_thread(pool):
    """torch.set_flush_denormal(True) (and fesetround) set the calling thread's
    modes only; the helper threads run each call's tasks under the caller's, so
    that any thread count gives one answer, call after call: the issue's 48
    tensors of 65,536 values of 1e-39 read as 0 under flush-to-zero, exactly
    otherwise, and clipping that makes subnormals flushes them alike."""
    env = cpp_env(pool)
    result = run_python(["-c", _FLOAT_MODES], **env)
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout)
    exact = reference.norm([torch.full((65536 * 48,), 1e-39)], 2.0)
    for mode, got in out.items():
        one, two = got["norms"]["1"], got["norms"]["2"]
        assert len(one) == 1 and two == one and got["clipped alike"], (mode, got)
        norm = float.fromhex(one[0])
        if mode == "flush":
            assert norm == 0.0
        else:
            assert norm == pytest.approx(exact, rel=1e-6), mode


_TRAPPING = """
import ctypes, json, math, sys
import torch
from fastnorm._partial import Mode
from fastnorm.backends import cpp

tensors = torch.load(sys.argv[1])
libc = ctypes.CDLL(None)
FE_INVALID, FE_DENORMAL = 0x01, 0x02
out = {}
for isa in cpp._C.supported_isas():
    cpp._C.use_isa(isa)
    plans = [cpp.BACKEND.prepare([t]) for t in tensors]
    libc.feclearexcept(0x3F)
    assert libc.feenableexcept(FE_INVALID) != -1
    roots = [cpp.BACKEND.reduce(plan, Mode.of(2.0), 2.0, torch.float64)[1].item() for plan in plans]
    raised = libc.fetestexcept(FE_INVALID | FE_DENORMAL)
    libc.fedisableexcept(FE_INVALID)
    out[isa] = {"roots": [str(r) for r in roots], "raised": raised}
print(json.dumps(out))
"""


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="glibc's fenv through ctypes: Linux")
@pytest.mark.slow
def test_bf16_words_raise_no_exception_of_their_own(tmp_path):
    """The float32 word of an inf and its neighbour is a signalling NaN, that of
    a zero and its neighbour a subnormal: converting them must neither trap
    where the caller unmasked the invalid exception nor leave a flag behind.
    Run in a child process, which a trap would kill."""
    x = _tiny_bf16(2 * BF16_CHUNK, 15)
    x[BF16_CHUNK + 3] = float("inf")
    zeros = _bf16_word_cases()["scattered zeros"]
    torch.save([x, zeros], tmp_path / "t.pt")
    result = run_python(["-c", _TRAPPING, str(tmp_path / "t.pt")])
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    want = ["inf", str(math.sqrt(_canonical_sum(zeros.double().numpy(), 2, torch.bfloat16)))]
    for isa, got in json.loads(result.stdout).items():
        assert got == {"roots": want, "raised": 0}, isa


# ----------------------------------------------------------------------------
# float64 L2: finite and accurate from subnormals to the largest doubles
# ----------------------------------------------------------------------------

MAGNITUDES = (1e-310, 1e-300, 1e-160, 1e-30, 1.0, 1e20, 1e154, 1e200, 1e300)


@pytest.mark.parametrize("magnitude", MAGNITUDES)
def test_float64_l2_is_accurate_at_every_magnitude(magnitude):
    g = torch.Generator().manual_seed(3)
    tensors = [torch.randn(n, generator=g, dtype=torch.float64) * magnitude for n in (7, 1000, 70001)]
    want = reference.norm(tensors, 2.0)
    results = {isa: _reduce(tensors, 2.0, isa) for isa in ISAS}
    for isa, got in results.items():
        assert _same_bits(got, results["generic"]), isa
        m, s = got[:2].tolist()
        assert math.isfinite(got[2].item()) and got[2].item() == pytest.approx(want, rel=1e-14)
        # The partial's contract: plain where squares neither overflow nor underflow
        # (so m == 0), else m is a power of two near max |x|, and norm^2 = m^2 s.
        if 1e-140 < magnitude < 1e140:
            assert m == 0.0
        else:
            assert math.frexp(m)[0] == 0.5 and 0.5 <= s**0.5 * m / want <= 2.0
        for t, (tm, ts) in zip(tensors, got[3:].reshape(-1, 2).tolist()):
            norm = math.sqrt(ts) * (tm if tm > 0 else 1.0)
            assert norm == pytest.approx(reference.norm([t], 2.0), rel=1e-14)
    assert fastnorm.total_norm(tensors).item() == pytest.approx(want, rel=1e-14)


def test_float64_l2_common_range_keeps_the_plain_sum():
    x = torch.randn(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    for isa in ISAS:
        got = _reduce([x], 2.0, isa)
        assert got[0].item() == 0.0 and got[1].item() == _canonical_sum(x.numpy(), 2, torch.float64)


@pytest.mark.parametrize(
    "parts, want",
    [
        # scales that differ: the smaller moves to the larger
        ([np.full(10, 1e300), np.full(10, 1e-310), np.ones(3)], math.sqrt(10) * 1e300),
        ([np.full(10, 1e-310), np.ones(3)], math.sqrt(3)),
        ([np.full(10, 1e-310), np.full(5, 1e-200)], math.sqrt(5) * 1e-200),
        # inf and NaN stay what they are, whatever the other scales
        ([np.array([math.inf]), np.full(10, 1e300), np.full(4, 1e-310)], math.inf),
        ([np.array([math.nan]), np.full(10, 1e300)], math.nan),
        ([np.full(10, 1e-310), np.array([math.inf])], math.inf),
        # plain sums that overflow only when merged (two tasks of 1e153)
        ([np.full(2 * 32768, 1e153)], 1e153 * math.sqrt(2 * 32768)),
    ],
)
def test_float64_l2_merges(parts, want):
    tensors = [torch.from_numpy(part) for part in parts]
    for isa in ISAS:
        cpp._C.use_isa(isa)
        got = fastnorm.total_norm(tensors).item()
        assert got == want or got == pytest.approx(want, rel=1e-13) or (math.isnan(want) and math.isnan(got))


def test_float64_l2_partials_merge_with_float32_and_16bit_tensors():
    tensors = [
        torch.full((100,), 1e-200, dtype=torch.float64),
        torch.full((100,), 3.0, dtype=torch.float32),
        torch.full((100,), 2.0, dtype=torch.bfloat16),
    ]
    assert fastnorm.total_norm(tensors).item() == pytest.approx(math.sqrt(1300), rel=1e-15)
    tensors[1] = torch.full((100,), 1e-30, dtype=torch.float32)
    tensors[2] = torch.zeros(100, dtype=torch.bfloat16)
    assert fastnorm.total_norm(tensors).item() == pytest.approx(reference.norm(tensors, 2.0), rel=1e-14)


# ----------------------------------------------------------------------------
# Choosing and reporting the instruction set
# ----------------------------------------------------------------------------

_PROBE = """
import json, torch, fastnorm
from fastnorm import _C
x = torch.randn(70001, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
print(json.dumps({"isa": _C.isa(), "norm": fastnorm.total_norm([x]).double().item()}))
"""


@pytest.mark.slow
def test_fastnorm_isa_is_read_once_per_process():
    """The variable (or its older name) picks the kernels of a new process; the
    others are compared in this one (use_isa), bit for bit, above."""
    runs = [run_python(["-c", _PROBE], FASTNORM_ISA="generic")]
    if len(ISAS) > 1:
        runs.append(run_python(["-c", _PROBE], FASTNORM_CPU_ISA=ISAS[1]))
    outs = [json.loads(r.stdout) for r in runs]
    assert [o["isa"] for o in outs] == ISAS[: len(outs)]
    x = torch.randn(70001, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    assert {o["norm"] for o in outs} == {fastnorm.total_norm([x]).double().item()}


_UNKNOWN_ISA = """
import torch, fastnorm
try:
    fastnorm.total_norm([torch.ones(3)])
except ValueError as exc:
    print(exc)
"""


@pytest.mark.parametrize("variable", ["FASTNORM_ISA", "FASTNORM_CPU_ISA"])
@pytest.mark.slow
def test_an_unknown_instruction_set_raises_naming_the_known_ones(variable):
    """A mistyped value raises at every use of the CPU backend, as a mistyped
    FASTNORM_BACKEND does; the torch backend does not silently take over."""
    message = f"{variable}='avx9' is not one of {', '.join(cpp.KNOWN_ISAS)}"
    result = run_python(["-c", _UNKNOWN_ISA], **{variable: "avx9"}, TRITON_INTERPRET="0")
    assert result.stdout.strip() == message, result.stderr[-2000:]
    result = run_python(["-m", "fastnorm", "info"], **{variable: "avx9"}, TRITON_INTERPRET="0")
    assert result.returncode != 0 and message in result.stderr
    with pytest.raises(ValueError, match="is not one of"):
        cpp._C.use_isa("avx9")


def test_every_instruction_set_the_cpu_runs_is_a_known_one():
    assert set(ISAS) <= set(cpp.KNOWN_ISAS)
    if "avx512" in ISAS:
        assert ISAS == list(cpp.KNOWN_ISAS)


_LACKING = """
import warnings, torch, fastnorm
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    print(fastnorm.total_norm([torch.ones(4)]).item())
print(caught[0].message if caught else "no warning")
"""


def test_a_known_instruction_set_the_cpu_lacks_leaves_the_torch_backend_with_a_warning():
    lacking = [isa for isa in cpp.KNOWN_ISAS if isa not in ISAS]
    if not lacking:
        pytest.skip("this CPU runs every instruction set fastnorm knows")
    result = run_python(["-c", _LACKING], FASTNORM_ISA=lacking[0], TRITON_INTERPRET="0")
    assert result.returncode == 0, result.stderr[-2000:]
    norm, warning = result.stdout.strip().splitlines()
    assert float(norm) == 2.0
    assert f"FASTNORM_ISA={lacking[0]} is not supported here" in warning
    assert "using the torch backend" in warning


def _cpuinfo(field: str) -> str | None:
    """The first value of ``field`` in /proc/cpuinfo, None where Linux does not report it."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    match = re.search(rf"^{field}\s*:(.*)$", text, re.MULTILINE)
    return match.group(1).strip() if match else None


def _cpu_flags() -> set[str] | None:
    flags = _cpuinfo("flags")
    return set(flags.split()) if flags is not None else None


def test_the_default_prefetch_distance_follows_the_vendor():
    """Intel 4096 bytes, AMD without AVX-512 (Zen 3) 1024, AMD family 25 with it (Zen 4) none, AMD family 26
    (Zen 5) 4096, others none; this CPU's default is its vendor's and family's (docs/design.md, "Where the
    cycles go")."""
    rule = cpp._C.vendor_prefetch
    assert [rule("intel", False), rule("intel", True), rule("intel", True, 6)] == [4096, 4096, 4096]
    assert [rule("amd", False, 25), rule("amd", True, 25), rule("amd", True)] == [1024, 0, 0]
    assert [rule("amd", True, 26), rule("amd", True, 27), rule("amd", False, 26)] == [4096, 4096, 1024]
    assert [rule("", False), rule("arm", True, 26)] == [0, 0]
    flags = _cpu_flags()
    if flags is None or "sse2" not in flags:
        pytest.skip("this CPU's vendor is read from the x86 flags Linux reports")
    if os.environ.get("FASTNORM_PREFETCH"):
        pytest.skip("FASTNORM_PREFETCH sets the distance")
    name = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(_cpuinfo("vendor_id") or "", "")
    family = int(_cpuinfo("cpu family") or 0)
    assert cpp._C.prefetch_bytes() == rule(name, "avx512f" in flags, family)  # tests that set it restore it


@pytest.mark.slow
def test_info_reports_the_widest_instruction_set_the_cpu_has(capsys):
    flags = _cpu_flags()
    if flags is None or "sse2" not in flags:
        pytest.skip("checks the x86 flags Linux reports")
    expected = ["generic"]
    if {"avx2", "fma", "f16c"} <= flags:
        expected.append("avx2")
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
            expected.append("avx512")
    assert ISAS == expected
    from fastnorm.cli import main

    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"C++ kernels: {expected[-1]}, " in out and f"(this CPU supports {', '.join(expected)})" in out
    ahead = cpp._C.prefetch_bytes()
    assert (f"prefetching {ahead} bytes ahead" if ahead else "no software prefetch") in out


def test_clock_is_measured():
    if "avx2" not in ISAS:
        pytest.skip("measured on x86-64 only")
    assert 2e8 < cpp._C.clock_hz(0.01) < 1e10
