"""Triton kernels of the triton backend (imported on first use).

Every kernel reads its tensors through one int64 table on the device::

    [addr (T) | numel (T) | first chunk of each tensor (T + 1)
     | tensor of each chunk (C) | start of each chunk (C)]

so one launch covers any number of tensors of one dtype. A chunk is at most
``chunk`` elements of one tensor (the host sizes it so that every program gets
many); program ``i`` of ``G`` takes chunks ``i, i+G, i+2G, ...``. Offsets are
int64 end to end: tensors beyond 2^31 elements are read correctly.

A chunk is read in runs of ``R * ROWS * VEC`` elements: one load per run, a
tile of shape ``(R, ROWS, VEC)`` where each of the ROWS threads holds ``R``
vectors of VEC consecutive elements, and consecutive threads read consecutive
vectors. Whole runs are loaded without a mask; only the last run of a tensor
is masked. The ALIGNED kernels read 16-byte vectors and tell the compiler that
they are aligned (the host checks every tensor's address; chunk starts are
multiples of ``chunk``, itself a multiple of a run), so each becomes one
128-bit load; the general ones (VEC = 1) read single elements.

A partial is a pair ``[m, s]``: MODE 0 (p=2) ``norm^2 = scale^2 * s`` with
``scale = m`` when ``m > 0``, else 1; MODE 1 (p=1) ``s = sum |x|``; MODE 2
(p=inf) ``m = max |x|``; MODE 3 (any other p) ``m = max |x|`` and
``s = sum (|x| / m)^p``, so the norm is ``m * s^(1/p)`` and ``|x|^p`` never
overflows. NaN anywhere makes the partial NaN.

Sums of 16-bit and float32 values (MODE 0 and 1) run in float32 within a run,
one sum per thread (its R * VEC values, at most 32), and the runs are carried
in float64: one float64 add per run instead of per element, so the kernel
stays memory-bound on GPUs whose float64 rate is 1/64 of float32. A chunk
whose float32 sums cannot be trusted (a square or sum past float32's range, or
squares so small that they lose their precision) is read again and summed in
float64; a chunk of ordinary values is read once. float64 gradients are summed in float64, and a
chunk whose plain sum of squares would overflow or underflow is summed scaled
by a power of two (MODE 0's ``m``), so the norm is finite and accurate from
1e-310 to 1e300.

Whether the kernels compile for the GPU or run in Triton's interpreter (on
CPU tensors) is fixed by TRITON_INTERPRET when this module is imported.
"""

import torch
import triton
import triton.language as tl
from triton import knobs

INTERPRETED = bool(knobs.runtime.interpret)

TL_DTYPES = {
    torch.float32: tl.float32,
    torch.float64: tl.float64,
    torch.float16: tl.float16,
    torch.bfloat16: tl.bfloat16,
}

# float32 sums of squares are trusted down to this value: below it, squares that
# lost bits to float32's subnormal range (each at most 2^-150 off, at most 2^17 of
# them per chunk) could move the sum by more than 2^-33 of itself.
F32_TRUSTED_MIN = tl.constexpr(2.0**-100)
# The same for float64 squares (2^-1075 per rounding): below it a chunk is summed scaled.
F64_TRUSTED_MIN = tl.constexpr(2.0**-960)
# Finite L2 sums that overflow only when added are summed again at a scale this
# much larger (fastnorm._partial.L2_HEADROOM): 2^-64 fits any number of terms.
L2_HEADROOM = tl.constexpr(2.0**32)


@triton.jit
def _max_nan(a, b):
    """max that returns NaN when either side is NaN (tl.maximum may drop it)."""
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def _abs_bits(x):
    """|x| as an integer of its width: ordered like |x|, and every NaN above inf.

    So an integer max of these is a max of |x| that keeps NaN, in one
    instruction per element (and one NumPy call in Triton's interpreter).
    """
    return tl.abs(x).to(tl.int64 if x.dtype == tl.float64 else tl.int32, bitcast=True)


@triton.jit
def _nan_max(v):
    """The max of every element of v >= 0 (or NaN); NaN when any is NaN (tl.max may drop it)."""
    return tl.max(_abs_bits(v)).to(v.dtype, bitcast=True)


@triton.jit
def _pow_ratio(num, den, p):
    """(num / den)^p for 0 <= num <= den, in float64 (only MODE 3 uses it); 0 when num is 0.

    Float64 throughout: a ratio below float32's range still counts for small p
    ((1e-50)^0.1 is 1e-5). Zero operands are swapped for 1 and the ratio capped
    at 1, so no lane ever computes 0/0, log2(0) or an overflowing power, even
    one the caller masks out (tl.where evaluates both sides).
    """
    ratio = tl.minimum(num / tl.where(den > 0, den, 1.0), 1.0)
    p64 = p * tl.full((), 1.0, tl.float64)  # p arrives as a float32 (a Python float when interpreted)
    power = tl.exp2(p64 * tl.log2(tl.where(ratio > 0, ratio, 1.0)))
    return tl.where(ratio > 0, power, 0.0)


@triton.jit
def _merge_scaled(run_m, run_s, m, s, p):
    """Merges (m, s) into the running (max, scaled sum) of MODE 3.

    Equal maxima merge exactly (inf with inf); NaN sticks in the max.
    """
    up = m > run_m
    new_s = tl.where(
        up,
        run_s * _pow_ratio(run_m, m, p) + s,
        tl.where(m == run_m, run_s + s, tl.where(m > 0, run_s + s * _pow_ratio(m, run_m, p), run_s)),
    )
    new_m = tl.where((m != m) | up, m, run_m)
    return new_m, new_s


@triton.jit
def _block_partial(x, p):
    """The partial (m, s) of one tile of |x| (float64); used by MODE 3 only.

    (x / m)^p as exp2(p * (log2 x - log2 m)): no division per element, and
    zeros (kept out of log2) add nothing.
    """
    m = _nan_max(x)
    p64 = p * tl.full((), 1.0, tl.float64)
    safe_m = tl.where((m > 0) & (m < float("inf")), m, 1.0)
    power = tl.exp2(p64 * (tl.log2(tl.where(x > 0, x, safe_m)) - tl.log2(safe_m)))
    s = tl.sum(tl.where(x > 0, tl.minimum(power, 1.0), 0.0))
    s = tl.where(m < float("inf"), s, 1.0)  # an inf tile: the norm is inf
    return m, s


@triton.jit
def _l2_scale(m):
    """The scale of an L2 partial: m when m > 0, else 1."""
    return tl.where(m > 0, m, 1.0)


@triton.jit
def _l2_rescaled(s, scale, top):
    """s * (scale / top)^2 for scale <= top (powers of two: the ratio is exact).

    Multiplied one factor at a time, so a large s meets a tiny ratio without
    underflowing first; an inf s stays inf (never inf * 0) and an empty one 0.
    """
    ratio = tl.minimum(scale, top) / top  # never above 1, even in lanes tl.where discards
    finite = tl.where(s == float("inf"), 0.0, s)
    return tl.where((s == float("inf")) | (s == 0), s, finite * ratio * ratio)


@triton.jit
def _l2_merge(m1, s1, m2, s2):
    """Two L2 partials as one: the larger scale of the non-empty ones wins.

    With both m == 0 this is s1 + s2 (times 1.0, exact): a plain sum.
    """
    scale1 = _l2_scale(m1)
    scale2 = _l2_scale(m2)
    top = tl.maximum(tl.where(s1 != 0, scale1, 0.0), tl.where(s2 != 0, scale2, 0.0))
    top = tl.where(top > 0, top, 1.0)
    s = _l2_rescaled(s1, scale1, top) + _l2_rescaled(s2, scale2, top)
    wide_top = top * tl.full((), L2_HEADROOM, tl.float64)
    wide = _l2_rescaled(s1, scale1, wide_top) + _l2_rescaled(s2, scale2, wide_top)
    return _l2_settled(top, s, wide_top, wide)


@triton.jit
def _l2_settled(top, plain, wide_top, wide):
    """The merged L2 partial from sums at the scale top (plain) and wide_top
    (wide): the plain one unless it overflowed in the addition alone."""
    overflow = (plain == float("inf")) & (wide < float("inf"))
    m = tl.where(overflow, wide_top, tl.where(top == 1.0, 0.0, top))
    return m, tl.where(overflow, wide, plain)


@triton.jit
def _power_of_two_below(v):
    """The largest power of two <= v, for finite v > 0 (subnormals included), exactly."""
    tiny = v < tl.full((), 2.0**-1000, tl.float64)  # subnormal or close: lift by 2^600 first
    lifted = v * tl.where(tiny, tl.full((), 2.0**600, tl.float64), 1.0)
    power = (lifted.to(tl.int64, bitcast=True) & 0x7FF0000000000000).to(tl.float64, bitcast=True)
    return power * tl.where(tiny, tl.full((), 2.0**-600, tl.float64), 1.0)


@triton.jit
def _widen(x, DTYPE: tl.constexpr):
    """x (of DTYPE) as float32 (float64 for float64), exactly.

    bfloat16 is widened with a shift: the same bits on the GPU and in the
    interpreter (whose own bfloat16 cast mishandles subnormals).
    """
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16
        return bits.to(tl.float32, bitcast=True)
    elif DTYPE == tl.float64:
        return x
    else:
        return x.to(tl.float32)


@triton.jit
def _round_to(x, DTYPE: tl.constexpr):
    """x (float32/float64) in DTYPE, rounded to nearest even like torch.

    bfloat16 is rounded with integer ops: the same bits on the GPU and in the
    interpreter (whose own float32 -> bfloat16 cast truncates).
    """
    if DTYPE == tl.bfloat16:
        u = x.to(tl.uint32, bitcast=True)
        rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        bits = tl.where(x != x, 0x7FC0, rounded).to(tl.uint16)
        return bits.to(tl.bfloat16, bitcast=True)
    else:
        return x.to(DTYPE)


@triton.jit
def _run_offsets(off, R: tl.constexpr, ROWS: tl.constexpr, VEC: tl.constexpr):
    """Element offsets of the run at ``off``: shape (R, ROWS, VEC), VEC-contiguous."""
    r = tl.arange(0, R)[:, None, None]
    row = tl.arange(0, ROWS)[None, :, None]
    v = tl.arange(0, VEC)[None, None, :]
    return off + (r * ROWS + row) * VEC + v


@triton.jit
def _load_run(
    chunk_ptr, off, n, R: tl.constexpr, ROWS: tl.constexpr, VEC: tl.constexpr, MASKED: tl.constexpr
):
    """The run at chunk_ptr + off (masked to the chunk's n elements when MASKED), raw."""
    idx = _run_offsets(off, R, ROWS, VEC)
    if MASKED:
        return tl.load(chunk_ptr + idx, mask=idx < n, other=0.0)
    else:
        return tl.load(chunk_ptr + idx)


@triton.jit
def _chunk_pointer(table_ptr, num_tensors, num_chunks, chunk, c, DTYPE: tl.constexpr, ALIGNED: tl.constexpr):
    """Chunk c's first element and its number of elements (int32: at most ``chunk``)."""
    t = tl.load(table_ptr + 3 * num_tensors + 1 + c)
    start = tl.load(table_ptr + 3 * num_tensors + 1 + num_chunks + c)
    n = tl.minimum(tl.load(table_ptr + num_tensors + t) - start, chunk).to(tl.int32)
    ptr = tl.load(table_ptr + t).to(tl.pointer_type(DTYPE)) + start
    if ALIGNED:
        ptr = tl.multiple_of(ptr, 16)  # bytes: the host checked every address and chunk start
    return ptr, n


@triton.jit
def _run_sum(x, MODE: tl.constexpr, DTYPE: tl.constexpr, CDT: tl.constexpr, scale, SCALED: tl.constexpr):
    """Per thread of a (R, ROWS, VEC) run: the sum of x^2 (MODE 0) or |x| (MODE 1) of its
    R * VEC values in CDT (0 for MODE 2), and their max |x| as _abs_bits."""
    x = _widen(x, DTYPE).to(CDT)
    if SCALED:
        x = x / scale  # a power of two: exact
    top = tl.max(tl.max(_abs_bits(x), 2), 0)
    if MODE == 0:
        part = tl.sum(tl.sum(x * x, 2), 0)
    elif MODE == 1:
        part = tl.sum(tl.sum(tl.abs(x), 2), 0)
    else:
        part = tl.zeros((x.shape[1],), CDT)
    return part, top


@triton.jit
def _chunk_sum(
    chunk_ptr,
    n,
    scale,
    MODE: tl.constexpr,
    DTYPE: tl.constexpr,
    CDT: tl.constexpr,
    SCALED: tl.constexpr,
    R: tl.constexpr,
    ROWS: tl.constexpr,
    VEC: tl.constexpr,
):
    """The chunk's sum (MODE 0, 1) or max |x| (MODE 2, exact), and whether any value is nonzero.

    Whole runs of R tiles are read unmasked, the rest in one masked run (R = 0:
    masked tiles only, for the rare second reads, whose code stays small). Each
    thread carries its runs' sums in float64.
    """
    acc = tl.zeros((ROWS,), tl.float64)
    top = tl.zeros((ROWS,), tl.int64 if CDT == tl.float64 else tl.int32)
    if R > 0:
        RUN: tl.constexpr = R * ROWS * VEC
        num_runs = n // RUN
        for i in range(0, num_runs):
            x = _load_run(chunk_ptr, i * RUN, n, R, ROWS, VEC, False)
            part, run_top = _run_sum(x, MODE, DTYPE, CDT, scale, SCALED)
            acc += part.to(tl.float64)
            top = tl.maximum(top, run_top)
        if num_runs * RUN < n:  # the tail, in one masked run: one memory latency
            x = _load_run(chunk_ptr, num_runs * RUN, n, R, ROWS, VEC, True)
            part, run_top = _run_sum(x, MODE, DTYPE, CDT, scale, SCALED)
            acc += part.to(tl.float64)
            top = tl.maximum(top, run_top)
    else:
        for off in range(0, n, ROWS * VEC):
            x = _load_run(chunk_ptr, off, n, 1, ROWS, VEC, True)
            part, run_top = _run_sum(x, MODE, DTYPE, CDT, scale, SCALED)
            acc += part.to(tl.float64)
            top = tl.maximum(top, run_top)
    top = tl.max(top)
    if MODE == 2:
        total = top.to(CDT, bitcast=True).to(tl.float64)
    else:
        total = tl.sum(acc)
    return total, top > 0


@triton.jit
def _chunk_partial(
    chunk_ptr,
    n,
    p,
    DTYPE: tl.constexpr,
    MODE: tl.constexpr,
    R: tl.constexpr,
    ROWS: tl.constexpr,
    VEC: tl.constexpr,
):
    """The partial (m, s) of one chunk of n elements."""
    m = tl.zeros((), tl.float64)
    s = tl.zeros((), tl.float64)
    if MODE == 3:
        # Compute-bound (a log2 and an exp2 per element): 8 elements per thread per step
        # (4 of float64, whose log2 and exp2 need twice the registers).
        LP_R: tl.constexpr = (4 if DTYPE == tl.float64 else 8) // VEC
        TILE: tl.constexpr = LP_R * ROWS * VEC
        num_tiles = n // TILE
        for i in range(0, num_tiles):
            x = _load_run(chunk_ptr, i * TILE, n, LP_R, ROWS, VEC, False)
            tile_m, tile_s = _block_partial(tl.abs(_widen(x, DTYPE).to(tl.float64)), p)
            m, s = _merge_scaled(m, s, tile_m, tile_s, p)
        if num_tiles * TILE < n:
            x = _load_run(chunk_ptr, num_tiles * TILE, n, LP_R, ROWS, VEC, True)
            tile_m, tile_s = _block_partial(tl.abs(_widen(x, DTYPE).to(tl.float64)), p)
            m, s = _merge_scaled(m, s, tile_m, tile_s, p)
    else:
        WIDE: tl.constexpr = DTYPE == tl.float64
        CDT: tl.constexpr = tl.float64 if WIDE else tl.float32
        one = tl.full((), 1.0, tl.float64)
        total, nonzero = _chunk_sum(chunk_ptr, n, one, MODE, DTYPE, CDT, False, R, ROWS, VEC)
        if MODE == 2:
            m = total
        else:
            m, s = _in_range(chunk_ptr, n, total, nonzero, MODE, DTYPE, ROWS, VEC)
    return m, s


@triton.jit
def _in_range(
    chunk_ptr, n, s, nonzero, MODE: tl.constexpr, DTYPE: tl.constexpr, ROWS: tl.constexpr, VEC: tl.constexpr
):
    """The partial (m, s) of a chunk whose plain sum ``s`` (of squares, MODE 0; of |x|, MODE 1) may
    have left its accumulator's range: float64 squares summed again at a power-of-two scale, bfloat16
    and float32 summed again in float64; ``s`` as it is otherwise (m = 0)."""
    m = tl.zeros((), tl.float64)
    one = tl.full((), 1.0, tl.float64)
    inf = float("inf")
    if DTYPE == tl.float64:
        # Only squares can leave float64's range (a float64 sum of |x| past it is inf).
        if MODE == 0:
            if (s == inf) | (nonzero & (s < tl.full((), F64_TRUSTED_MIN, tl.float64))):
                top, _ = _chunk_sum(chunk_ptr, n, one, 2, DTYPE, tl.float64, False, 0, ROWS, VEC)
                if top < inf:  # else an inf value: the plain sum, inf, is right
                    m = _power_of_two_below(top)
                    s, _ = _chunk_sum(chunk_ptr, n, m, 0, DTYPE, tl.float64, True, 0, ROWS, VEC)
    elif DTYPE == tl.bfloat16 or DTYPE == tl.float32:
        # float16 squares and sums always fit float32; these may not.
        lost = s == inf
        if MODE == 0:
            lost = lost | (nonzero & (s < tl.full((), F32_TRUSTED_MIN, tl.float64)))
        if lost:
            s, _ = _chunk_sum(chunk_ptr, n, one, MODE, DTYPE, tl.float64, False, 0, ROWS, VEC)
    return m, s


@triton.jit
def _merge(run_m, run_s, m, s, p, MODE: tl.constexpr):
    """The partial (m, s) merged into the running one."""
    if MODE == 0:
        return _l2_merge(run_m, run_s, m, s)
    elif MODE == 1:
        return run_m, run_s + s
    elif MODE == 2:
        return _max_nan(m, run_m), run_s
    else:
        return _merge_scaled(run_m, run_s, m, s, p)


@triton.jit(do_not_specialize=["per_chunk"])
def norm_partials_kernel(
    table_ptr,
    num_tensors,
    num_chunks,
    chunk,
    partial_ptr,
    chunk_partial_ptr,
    p,
    per_chunk,
    DTYPE: tl.constexpr,
    MODE: tl.constexpr,
    ALIGNED: tl.constexpr,
    R: tl.constexpr,
    ROWS: tl.constexpr,
    VEC: tl.constexpr,
):
    """Writes this program's partial to partial_ptr[2 * pid : 2 * pid + 2].

    With per_chunk != 0, also each chunk's own partial to chunk_partial_ptr[2 * c:],
    from the same loads (per-tensor norms cost no second pass). The program's
    partial is the chunks' partials merged in order either way.
    """
    pid = tl.program_id(0)
    run_m = tl.zeros((), tl.float64)
    run_s = tl.zeros((), tl.float64)
    for c in range(pid, num_chunks, tl.num_programs(0)):
        chunk_ptr, n = _chunk_pointer(table_ptr, num_tensors, num_chunks, chunk, c, DTYPE, ALIGNED)
        m, s = _chunk_partial(chunk_ptr, n, p, DTYPE, MODE, R, ROWS, VEC)
        if per_chunk != 0:
            tl.store(chunk_partial_ptr + 2 * c, m)
            tl.store(chunk_partial_ptr + 2 * c + 1, s)
        run_m, run_s = _merge(run_m, run_s, m, s, p, MODE)
    tl.store(partial_ptr + 2 * pid, run_m)
    tl.store(partial_ptr + 2 * pid + 1, run_s)


@triton.jit
def _run_small(x, DTYPE: tl.constexpr, CDT: tl.constexpr, TINY_BITS: tl.constexpr):
    """Per thread of a (R, ROWS, VEC) run: its count of nonzero values plus 2^16 times its count
    of values below the smallest normal (TINY_BITS as _abs_bits; zeros included), from the same
    bits of |x| _run_sum takes its max of. One integer carries both (a thread sees at most
    max_chunk / ROWS < 2^16 values of a chunk: stats_launch checks), in one register fewer.
    A masked run's padding is 0: the chunk takes it out (zeros = n - nonzero; subnormal =
    small + nonzero - lanes)."""
    if DTYPE == tl.float64:  # on the two 32-bit words: 64-bit integers would spill registers
        bits = x.to(tl.int64, bitcast=True)
        hi = (bits >> 32).to(tl.int32) & 0x7FFFFFFF  # sign dropped; TINY_BITS's low word is 0
        lo = bits.to(tl.int32)
        both = ((hi | lo) != 0).to(tl.int32) + tl.where(hi < (TINY_BITS >> 32), 65536, 0)
    else:
        b = _abs_bits(_widen(x, DTYPE).to(CDT))
        both = tl.minimum(b, 1) + tl.where(b < TINY_BITS, 65536, 0)
    return tl.sum(tl.sum(both, 2), 0)


@triton.jit
def _chunk_large(
    chunk_ptr,
    n,
    DTYPE: tl.constexpr,
    CDT: tl.constexpr,
    MARGIN_BITS: tl.constexpr,
    INF_BITS: tl.constexpr,
    ROWS: tl.constexpr,
    VEC: tl.constexpr,
):
    """A second read of a chunk that holds a value above the margin: its counts of non-finite and of
    overflowing (finite, above MARGIN_BITS) values, and its largest finite |x| as _abs_bits. Rare (a
    chunk is read twice only where such a value is), so in masked tiles: the code stays small and
    adds no registers to the first read's loop (whole runs here spill on sm_90)."""
    both = tl.zeros((ROWS,), tl.int32)  # non-finite + 2^16 * overflowing, per thread (as _run_small)
    top = tl.zeros((ROWS,), tl.int64 if CDT == tl.float64 else tl.int32)
    for off in range(0, n, ROWS * VEC):
        x = _load_run(chunk_ptr, off, n, 1, ROWS, VEC, True)
        b = _abs_bits(_widen(x, DTYPE).to(CDT))
        finite = b < INF_BITS
        both += tl.sum(tl.sum(tl.where(finite, tl.where(b > MARGIN_BITS, 65536, 0), 1), 2), 0)
        top = tl.maximum(top, tl.max(tl.max(tl.where(finite, b, 0), 2), 0))
    return tl.sum(both & 65535), tl.sum(both >> 16), tl.max(top)


@triton.jit
def norm_stats_kernel(
    table_ptr,
    num_tensors,
    num_chunks,
    chunk,
    partial_ptr,
    chunk_partial_ptr,
    stats_ptr,
    DTYPE: tl.constexpr,
    ALIGNED: tl.constexpr,
    R: tl.constexpr,
    ROWS: tl.constexpr,
    VEC: tl.constexpr,
    TINY_BITS: tl.constexpr,
    MARGIN_BITS: tl.constexpr,
    INF_BITS: tl.constexpr,
):
    """norm_partials_kernel's MODE 0 pass (the same partials, bit for bit: the same runs summed
    the same way) that also counts each chunk's values, into stats_ptr[6 * c:]: [0 (the caller
    takes sum_sq from the chunk's partial), largest finite |x|, non-finite, zeros, subnormal,
    overflowing]; and each chunk's partial into chunk_partial_ptr[2 * c:].

    The thresholds are the bits of |x| (widened as _widen does) at the tensor dtype's smallest
    normal, its overflow margin and inf. Zeros and subnormals are counted from the same loads as
    the sum; the largest |x| is the sum's own max, and only a chunk whose max is above the margin
    (a non-finite or overflowing value: rare) is read again to count those and its finite max.
    """
    pid = tl.program_id(0)
    run_m = tl.zeros((), tl.float64)
    run_s = tl.zeros((), tl.float64)
    WIDE: tl.constexpr = DTYPE == tl.float64
    CDT: tl.constexpr = tl.float64 if WIDE else tl.float32
    RUN: tl.constexpr = R * ROWS * VEC
    one = tl.full((), 1.0, tl.float64)
    for c in range(pid, num_chunks, tl.num_programs(0)):
        chunk_ptr, n = _chunk_pointer(table_ptr, num_tensors, num_chunks, chunk, c, DTYPE, ALIGNED)
        acc = tl.zeros((ROWS,), tl.float64)
        top = tl.zeros((ROWS,), tl.int64 if WIDE else tl.int32)
        both = tl.zeros((ROWS,), tl.int32)  # nonzero + 2^16 * small, per thread
        num_runs = n // RUN
        for i in range(0, num_runs):  # whole runs unmasked, then the tail masked: as _chunk_sum reads them
            x = _load_run(chunk_ptr, i * RUN, n, R, ROWS, VEC, False)
            part, run_top = _run_sum(x, 0, DTYPE, CDT, one, False)
            acc += part.to(tl.float64)
            top = tl.maximum(top, run_top)
            both += _run_small(x, DTYPE, CDT, TINY_BITS)
        if num_runs * RUN < n:
            x = _load_run(chunk_ptr, num_runs * RUN, n, R, ROWS, VEC, True)
            part, run_top = _run_sum(x, 0, DTYPE, CDT, one, False)
            acc += part.to(tl.float64)
            top = tl.maximum(top, run_top)
            both += _run_small(x, DTYPE, CDT, TINY_BITS)
        top_bits = tl.max(top)
        m, s = _in_range(chunk_ptr, n, tl.sum(acc), top_bits > 0, 0, DTYPE, ROWS, VEC)  # as _chunk_partial
        tl.store(chunk_partial_ptr + 2 * c, m)
        tl.store(chunk_partial_ptr + 2 * c + 1, s)
        nonfinite = tl.zeros((), tl.int32)
        over = tl.zeros((), tl.int32)
        if top_bits > MARGIN_BITS:
            nonfinite, over, top_bits = _chunk_large(
                chunk_ptr, n, DTYPE, CDT, MARGIN_BITS, INF_BITS, ROWS, VEC
            )
        row = stats_ptr + 6 * c
        tl.store(row, tl.zeros((), tl.float64))
        tl.store(row + 1, top_bits.to(CDT, bitcast=True).to(tl.float64))
        tl.store(row + 2, nonfinite.to(tl.float64))
        nonzero = tl.sum(both & 65535)
        small = tl.sum(both >> 16)
        tl.store(row + 3, (n - nonzero).to(tl.float64))
        lanes = tl.cdiv(n, RUN) * RUN  # the values read, the tail's padding included
        tl.store(row + 4, (small + nonzero - lanes).to(tl.float64))
        tl.store(row + 5, over.to(tl.float64))
        run_m, run_s = _l2_merge(run_m, run_s, m, s)
    tl.store(partial_ptr + 2 * pid, run_m)
    tl.store(partial_ptr + 2 * pid + 1, run_s)


@triton.jit
def _rows(partial_ptr, off, end, BLOCK: tl.constexpr):
    """Partial rows [off, off + BLOCK) as (m, s) vectors, zeros from row ``end`` on."""
    idx = off + tl.arange(0, BLOCK)
    mask = idx < end
    return tl.load(partial_ptr + 2 * idx, mask=mask, other=0.0), tl.load(
        partial_ptr + 2 * idx + 1, mask=mask, other=0.0
    )


@triton.jit
def _reduce_rows(partial_ptr, start, end, p, MODE: tl.constexpr, BLOCK: tl.constexpr):
    """The partial of partial rows [start, end), reduced in a fixed order."""
    total_m = tl.zeros((), tl.float64)
    total_s = tl.zeros((), tl.float64)
    if MODE == 1:
        acc = tl.zeros((BLOCK,), tl.float64)
        for off in range(start, end, BLOCK):
            _, s = _rows(partial_ptr, off, end, BLOCK)
            acc += s
        total_s = tl.sum(acc, 0)
    elif MODE == 0:
        # The largest scale among non-empty rows, then every row moved to it;
        # rows that are all plain (m == 0) add up as a plain sum.
        top = tl.zeros((BLOCK,), tl.float64)
        for off in range(start, end, BLOCK):
            m, s = _rows(partial_ptr, off, end, BLOCK)
            top = tl.maximum(top, tl.where(s != 0, _l2_scale(m), 0.0))
        scale = tl.max(top, 0)
        scale = tl.where(scale > 0, scale, 1.0)
        wide_scale = scale * tl.full((), L2_HEADROOM, tl.float64)
        acc = tl.zeros((BLOCK,), tl.float64)
        wide = tl.zeros((BLOCK,), tl.float64)
        for off in range(start, end, BLOCK):
            m, s = _rows(partial_ptr, off, end, BLOCK)
            acc += _l2_rescaled(s, _l2_scale(m), scale)
            wide += _l2_rescaled(s, _l2_scale(m), wide_scale)
        total_m, total_s = _l2_settled(scale, tl.sum(acc, 0), wide_scale, tl.sum(wide, 0))
    else:
        top = tl.zeros((BLOCK,), tl.float64)
        for off in range(start, end, BLOCK):
            m, _ = _rows(partial_ptr, off, end, BLOCK)
            top = _max_nan(m, top)
        total_m = _nan_max(top)
        if MODE == 3:
            acc = tl.zeros((BLOCK,), tl.float64)
            for off in range(start, end, BLOCK):
                m, s = _rows(partial_ptr, off, end, BLOCK)
                acc += s * tl.where(m == total_m, 1.0, _pow_ratio(m, total_m, p))
            total_s = tl.sum(acc, 0)
    return total_m, total_s


@triton.jit
def finalize_kernel(
    partial_ptr,
    num_partials,
    out_ptr,
    root_ptr,
    p,
    MODE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Reduces all partials into out_ptr[0:2] and writes the norm to root_ptr.

    One program, no atomics: the same inputs give the same bits every time.
    root_ptr receives the norm in its own dtype (float32 or float64).
    """
    total_m, total_s = _reduce_rows(partial_ptr, 0, num_partials, p, MODE, BLOCK)
    tl.store(out_ptr, total_m)
    tl.store(out_ptr + 1, total_s)
    if MODE == 0:
        root = tl.sqrt(total_s) * _l2_scale(total_m)  # float64 square roots are correctly rounded
    elif MODE == 1:
        root = total_s
    elif MODE == 2:
        root = total_m
    else:
        scaled = tl.exp2(tl.log2(tl.where(total_s > 0, total_s, 1.0)) / (p * tl.full((), 1.0, tl.float64)))
        root = tl.where(total_m == 0, 0.0, total_m * scaled)
    tl.store(root_ptr, root.to(root_ptr.dtype.element_ty))


@triton.jit
def per_tensor_kernel(
    table_ptr,
    num_tensors,
    chunk_partial_ptr,
    out_ptr,
    p,
    MODE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Program t reduces the partials of tensor t's chunks into out_ptr[2 * t:]."""
    t = tl.program_id(0)
    first_chunk_ptr = table_ptr + 2 * num_tensors
    start = tl.load(first_chunk_ptr + t)
    end = tl.load(first_chunk_ptr + t + 1)
    m, s = _reduce_rows(chunk_partial_ptr, start, end, p, MODE, BLOCK)
    tl.store(out_ptr + 2 * t, m)
    tl.store(out_ptr + 2 * t + 1, s)


@triton.jit
def _scale_run(
    chunk_ptr,
    off,
    n,
    c,
    DTYPE: tl.constexpr,
    R: tl.constexpr,
    ROWS: tl.constexpr,
    VEC: tl.constexpr,
    MASKED: tl.constexpr,
):
    idx = _run_offsets(off, R, ROWS, VEC)
    x = _load_run(chunk_ptr, off, n, R, ROWS, VEC, MASKED)
    y = _round_to(_widen(x, DTYPE) * c, DTYPE)
    if MASKED:
        tl.store(chunk_ptr + idx, y, mask=idx < n)
    else:
        tl.store(chunk_ptr + idx, y)


@triton.jit(do_not_specialize=["max_norm_hi", "max_norm_lo"])
def scale_kernel(
    table_ptr,
    num_tensors,
    num_chunks,
    chunk,
    norm_ptr,
    max_norm_hi,
    max_norm_lo,
    DTYPE: tl.constexpr,
    NORM_IS_F64: tl.constexpr,
    ALIGNED: tl.constexpr,
    R: tl.constexpr,
    ROWS: tl.constexpr,
    VEC: tl.constexpr,
):
    """x *= min(1, max_norm / (norm + 1e-6)) in place, for every tensor of the table.

    The norm is read here, on the device, and the coefficient computed as torch
    does (reciprocal, then times max_norm, in the norm's dtype) so the result
    matches torch.nn.utils.clip_grad_norm_ bit for bit. When it is >= 1 the
    program ends without reading or writing any gradient. max_norm arrives as
    the two 32-bit halves of its float64 bits (Triton types a Python int by its
    value, so one 64-bit pattern could arrive as int32), so that float64 norms
    get its exact value.
    """
    bits = (max_norm_hi.to(tl.int64) << 32) | max_norm_lo.to(tl.int64)
    max_norm = bits.to(tl.float64, bitcast=True)
    norm = tl.load(norm_ptr)
    if NORM_IS_F64:
        # float64 division is IEEE-rounded; float32 needs div_rn (its "/" is approximate).
        coef = (1.0 / (norm + tl.full((), 1e-6, tl.float64))) * max_norm
    else:
        one = tl.full((), 1.0, tl.float32)
        coef = tl.math.div_rn(one, norm + tl.full((), 1e-6, tl.float32)) * max_norm.to(tl.float32)
    # clamp(coef, max=1) keeps a NaN coefficient, and torch scales by it.
    if (coef < 1.0) | (coef != coef):
        c = coef.to(tl.float64 if DTYPE == tl.float64 else tl.float32)
        RUN: tl.constexpr = R * ROWS * VEC
        for ci in range(tl.program_id(0), num_chunks, tl.num_programs(0)):
            chunk_ptr, n = _chunk_pointer(table_ptr, num_tensors, num_chunks, chunk, ci, DTYPE, ALIGNED)
            num_runs = n // RUN
            for i in range(0, num_runs):
                _scale_run(chunk_ptr, i * RUN, n, c, DTYPE, R, ROWS, VEC, False)
            for off in range(num_runs * RUN, n, ROWS * VEC):  # the tail: masked tiles (no spills)
                _scale_run(chunk_ptr, off, n, c, DTYPE, 1, ROWS, VEC, True)
