"""Triton kernels of the triton backend (imported on first use).

Every kernel reads its tensors through one int64 table on the device::

    [addr_0 .. addr_{T-1} | numel_0 .. numel_{T-1} | tensor_of_chunk_0 .. | start_of_chunk_0 ..]

so one launch covers any number of tensors of one dtype. A chunk is at most
CHUNK elements of one tensor; program ``i`` of ``G`` takes chunks ``i, i+G,
i+2G, ...`` and walks each in BLOCK-sized tiles. Offsets are int64 end to end:
tensors beyond 2^31 elements are read correctly.

Whether they compile for the GPU or run in Triton's interpreter (on CPU
tensors) is fixed by TRITON_INTERPRET when this module is imported.
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
    """(num / den)^p for 0 <= num <= den, in float32 (only LP norms use it); 0 when num is 0.

    Zero operands are swapped for 1 before dividing and taking the log, so no
    lane ever computes 0/0 or log2(0), even one the caller masks out.
    """
    ratio = (num / tl.where(den > 0, den, 1.0)).to(tl.float32)
    power = tl.exp2(p * tl.log2(tl.where(ratio > 0, ratio, 1.0)))
    return tl.where(ratio > 0, power, 0.0).to(tl.float64)


@triton.jit
def _merge_scaled(run_m, run_s, m, s, p):
    """Merges a block with max m and scaled sum s into the running (max, scaled sum).

    The scaled sum is sum (|x| / max)^p, so |x|^p itself never overflows. Equal
    maxima merge exactly (inf with inf), NaN sticks in the max.
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
def norm_partials_kernel(
    table_ptr,
    num_tensors,
    num_chunks,
    partial_ptr,
    p,
    DTYPE: tl.constexpr,
    MODE: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Writes this program's partial [m, s] of a p-norm to partial_ptr[2 * pid].

    MODE 0: s = sum x^2, 1: s = sum |x|, 2: m = max |x|, 3 (any p): m = max |x|
    and s = sum (|x| / m)^p. Values are widened to float64 before squaring, so
    no float32 gradient overflows or underflows (1e20^2 is fine).
    """
    pid = tl.program_id(0)
    numel_ptr = table_ptr + num_tensors
    chunk_tensor_ptr = table_ptr + 2 * num_tensors
    chunk_start_ptr = chunk_tensor_ptr + num_chunks

    acc = tl.zeros((BLOCK,), tl.float64)
    run_m = tl.zeros((), tl.float64)
    run_s = tl.zeros((), tl.float64)
    for c in range(pid, num_chunks, tl.num_programs(0)):
        t = tl.load(chunk_tensor_ptr + c)
        start = tl.load(chunk_start_ptr + c)
        end = tl.minimum(start + CHUNK, tl.load(numel_ptr + t))
        base = tl.load(table_ptr + t).to(tl.pointer_type(DTYPE))
        for off in range(start, end, BLOCK):
            idx = off + tl.arange(0, BLOCK)
            x = tl.abs(tl.load(base + idx, mask=idx < end, other=0.0).to(tl.float64))
            if MODE == 0:
                acc += x * x
            elif MODE == 1:
                acc += x
            elif MODE == 2:
                acc = tl.where((x > acc) | (x != x), x, acc)
            else:
                m = _nan_max(x)
                s = tl.sum(tl.where(m > 0, _pow_ratio(x, m, p), 0.0), 0)
                s = tl.where(m - m == 0.0, s, 1.0)  # an inf block (inf - inf is NaN): the norm is inf
                run_m, run_s = _merge_scaled(run_m, run_s, m, s, p)

    if MODE <= 1:
        run_s = tl.sum(acc, 0)
    elif MODE == 2:
        run_m = _nan_max(acc)
    tl.store(partial_ptr + 2 * pid, run_m)
    tl.store(partial_ptr + 2 * pid + 1, run_s)


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
    """Reduces num_partials partials, in a fixed order, into out_ptr[0:2] and the norm.

    One program, no atomics: the same inputs give the same bits every time.
    root_ptr receives the norm in its own dtype (float32 or float64).
    """
    total_m = tl.zeros((), tl.float64)
    total_s = tl.zeros((), tl.float64)
    if MODE <= 1:
        acc = tl.zeros((BLOCK,), tl.float64)
        for off in range(0, num_partials, BLOCK):
            idx = off + tl.arange(0, BLOCK)
            acc += tl.load(partial_ptr + 2 * idx + 1, mask=idx < num_partials, other=0.0)
        total_s = tl.sum(acc, 0)
    else:
        top = tl.zeros((BLOCK,), tl.float64)
        for off in range(0, num_partials, BLOCK):
            idx = off + tl.arange(0, BLOCK)
            m = tl.load(partial_ptr + 2 * idx, mask=idx < num_partials, other=0.0)
            top = tl.where((m > top) | (m != m), m, top)
        total_m = _nan_max(top)
        if MODE == 3:
            acc = tl.zeros((BLOCK,), tl.float64)
            for off in range(0, num_partials, BLOCK):
                idx = off + tl.arange(0, BLOCK)
                mask = idx < num_partials
                m = tl.load(partial_ptr + 2 * idx, mask=mask, other=0.0)
                s = tl.load(partial_ptr + 2 * idx + 1, mask=mask, other=0.0)
                ratio = tl.where(m == total_m, 1.0, _pow_ratio(m, total_m, p))
                acc += s * ratio
            total_s = tl.sum(acc, 0)
    tl.store(out_ptr, total_m)
    tl.store(out_ptr + 1, total_s)

    if MODE == 0:
        root = tl.sqrt(total_s)  # float64 square roots are correctly rounded
    elif MODE == 1:
        root = total_s
    elif MODE == 2:
        root = total_m
    else:
        scaled = tl.exp2(tl.log2(total_s.to(tl.float32)) / p).to(tl.float64)
        root = tl.where(total_m == 0, 0.0, total_m * scaled)
    tl.store(root_ptr, root.to(root_ptr.dtype.element_ty))


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


@triton.jit(do_not_specialize=["max_norm_bits"])
def scale_kernel(
    table_ptr,
    num_tensors,
    num_chunks,
    norm_ptr,
    max_norm_bits,
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
    the bits of a float64 so that float64 norms get its exact value.
    """
    max_norm = max_norm_bits.to(tl.float64, bitcast=True)
    norm = tl.load(norm_ptr)
    if NORM_IS_F64:
        # float64 division is IEEE-rounded; float32 needs div_rn (its "/" is approximate).
        coef = (1.0 / (norm + tl.full((), 1e-6, tl.float64))) * max_norm
    else:
        one = tl.full((), 1.0, tl.float32)
        coef = tl.math.div_rn(one, norm + tl.full((), 1e-6, tl.float32)) * max_norm.to(tl.float32)
    # clamp(coef, max=1) keeps a NaN coefficient, and torch scales by it.
    if (coef < 1.0) | (coef != coef):
        if DTYPE == tl.float64:
            c = coef.to(tl.float64)
        else:
            c = coef.to(tl.float32)
        pid = tl.program_id(0)
        numel_ptr = table_ptr + num_tensors
        chunk_tensor_ptr = table_ptr + 2 * num_tensors
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
                tl.store(base + idx, _round_to(x.to(c.dtype) * c, DTYPE), mask=mask)
