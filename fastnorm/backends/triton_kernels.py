"""Triton kernels of the triton backend (imported on first use).

Every kernel reads its tensors through one int64 table on the device::

    [addr (T) | numel (T) | first chunk of each tensor (T + 1)
     | tensor of each chunk (C) | start of each chunk (C)]

so one launch covers any number of tensors of one dtype. A chunk is at most
CHUNK elements of one tensor; program ``i`` of ``G`` takes chunks ``i, i+G,
i+2G, ...`` and walks each in BLOCK-sized tiles. Offsets are int64 end to end:
tensors beyond 2^31 elements are read correctly.

A partial is a pair ``[m, s]``: MODE 0 (p=2) ``s = sum x^2``, MODE 1 (p=1)
``s = sum |x|``, MODE 2 (p=inf) ``m = max |x|``, MODE 3 (any other p)
``m = max |x|`` and ``s = sum (|x| / m)^p``, so the norm is ``m * s^(1/p)``
and ``|x|^p`` never overflows. Values are widened to float64 first: no float32
gradient overflows or underflows when squared (1e20^2 is fine). NaN anywhere
makes the partial NaN.

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


@triton.jit
def _nan_max(v):
    """max of a vector that returns NaN when any element is NaN (tl.max may drop it)."""
    nan = tl.sum(tl.where(v != v, v, 0.0), 0)  # NaN iff some element is NaN, else 0
    return tl.max(tl.where(v != v, 0.0, v), 0) + nan


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
    """The partial (m, s) of one tile of |x| (float64); used by MODE 3 only."""
    m = _nan_max(x)
    s = tl.sum(tl.where(m > 0, _pow_ratio(x, m, p), 0.0), 0)
    s = tl.where(m < float("inf"), s, 1.0)  # an inf tile: the norm is inf
    return m, s


@triton.jit
def _vector_partial(acc, MODE: tl.constexpr):
    """The partial (m, s) of a per-lane accumulator of MODE 0, 1 or 2."""
    if MODE == 2:
        return _nan_max(acc), tl.zeros((), tl.float64)
    else:
        return tl.zeros((), tl.float64), tl.sum(acc, 0)


@triton.jit
def _accumulate(acc, x, MODE: tl.constexpr):
    """One tile of |x| into a per-lane accumulator of MODE 0, 1 or 2."""
    if MODE == 0:
        return acc + x * x
    elif MODE == 1:
        return acc + x
    else:
        return tl.where((x > acc) | (x != x), x, acc)


@triton.jit
def norm_partials_kernel(
    table_ptr,
    num_tensors,
    num_chunks,
    partial_ptr,
    chunk_partial_ptr,
    p,
    DTYPE: tl.constexpr,
    MODE: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
    PER_CHUNK: tl.constexpr,
):
    """Writes this program's partial to partial_ptr[2 * pid : 2 * pid + 2].

    With PER_CHUNK, also each chunk's own partial to chunk_partial_ptr[2 * c:],
    from the same loads (per-tensor norms cost no second pass). The program's
    partial is accumulated the same way either way.
    """
    pid = tl.program_id(0)
    numel_ptr = table_ptr + num_tensors
    chunk_tensor_ptr = table_ptr + 3 * num_tensors + 1
    chunk_start_ptr = chunk_tensor_ptr + num_chunks

    acc = tl.zeros((BLOCK,), tl.float64)
    run_m = tl.zeros((), tl.float64)
    run_s = tl.zeros((), tl.float64)
    for c in range(pid, num_chunks, tl.num_programs(0)):
        t = tl.load(chunk_tensor_ptr + c)
        start = tl.load(chunk_start_ptr + c)
        end = tl.minimum(start + CHUNK, tl.load(numel_ptr + t))
        base = tl.load(table_ptr + t).to(tl.pointer_type(DTYPE))
        chunk_acc = tl.zeros((BLOCK,), tl.float64)
        chunk_m = tl.zeros((), tl.float64)
        chunk_s = tl.zeros((), tl.float64)
        for off in range(start, end, BLOCK):
            idx = off + tl.arange(0, BLOCK)
            x = tl.abs(_widen(tl.load(base + idx, mask=idx < end, other=0.0), DTYPE).to(tl.float64))
            if MODE == 3:
                m, s = _block_partial(x, p)
                run_m, run_s = _merge_scaled(run_m, run_s, m, s, p)
                if PER_CHUNK:
                    chunk_m, chunk_s = _merge_scaled(chunk_m, chunk_s, m, s, p)
            else:
                acc = _accumulate(acc, x, MODE)
                if PER_CHUNK:
                    chunk_acc = _accumulate(chunk_acc, x, MODE)
        if PER_CHUNK:
            if MODE != 3:
                chunk_m, chunk_s = _vector_partial(chunk_acc, MODE)
            tl.store(chunk_partial_ptr + 2 * c, chunk_m)
            tl.store(chunk_partial_ptr + 2 * c + 1, chunk_s)

    if MODE != 3:
        run_m, run_s = _vector_partial(acc, MODE)
    tl.store(partial_ptr + 2 * pid, run_m)
    tl.store(partial_ptr + 2 * pid + 1, run_s)


@triton.jit
def _reduce_rows(partial_ptr, start, end, p, MODE: tl.constexpr, BLOCK: tl.constexpr):
    """The partial of partial rows [start, end), reduced in a fixed order."""
    total_m = tl.zeros((), tl.float64)
    total_s = tl.zeros((), tl.float64)
    if MODE <= 1:
        acc = tl.zeros((BLOCK,), tl.float64)
        for off in range(start, end, BLOCK):
            idx = off + tl.arange(0, BLOCK)
            acc += tl.load(partial_ptr + 2 * idx + 1, mask=idx < end, other=0.0)
        total_s = tl.sum(acc, 0)
    else:
        top = tl.zeros((BLOCK,), tl.float64)
        for off in range(start, end, BLOCK):
            idx = off + tl.arange(0, BLOCK)
            m = tl.load(partial_ptr + 2 * idx, mask=idx < end, other=0.0)
            top = tl.where((m > top) | (m != m), m, top)
        total_m = _nan_max(top)
        if MODE == 3:
            acc = tl.zeros((BLOCK,), tl.float64)
            for off in range(start, end, BLOCK):
                idx = off + tl.arange(0, BLOCK)
                mask = idx < end
                m = tl.load(partial_ptr + 2 * idx, mask=mask, other=0.0)
                s = tl.load(partial_ptr + 2 * idx + 1, mask=mask, other=0.0)
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
        root = tl.sqrt(total_s)  # float64 square roots are correctly rounded
    elif MODE == 1:
        root = total_s
    elif MODE == 2:
        root = total_m
    else:
        scaled = tl.exp2(tl.log2(total_s) / (p * tl.full((), 1.0, tl.float64)))
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


@triton.jit(do_not_specialize=["max_norm_hi", "max_norm_lo"])
def scale_kernel(
    table_ptr,
    num_tensors,
    num_chunks,
    norm_ptr,
    max_norm_hi,
    max_norm_lo,
    DTYPE: tl.constexpr,
    NORM_IS_F64: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
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
        pid = tl.program_id(0)
        numel_ptr = table_ptr + num_tensors
        chunk_tensor_ptr = table_ptr + 3 * num_tensors + 1
        chunk_start_ptr = chunk_tensor_ptr + num_chunks
        for ci in range(pid, num_chunks, tl.num_programs(0)):
            t = tl.load(chunk_tensor_ptr + ci)
            start = tl.load(chunk_start_ptr + ci)
            end = tl.minimum(start + CHUNK, tl.load(numel_ptr + t))
            base = tl.load(table_ptr + t).to(tl.pointer_type(DTYPE))
            for off in range(start, end, BLOCK):
                idx = off + tl.arange(0, BLOCK)
                mask = idx < end
                x = tl.load(base + idx, mask=mask)
                tl.store(base + idx, _round_to(_widen(x, DTYPE) * c, DTYPE), mask=mask)
