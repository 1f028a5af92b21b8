"""What a row of per-tensor statistics holds, shared by every backend.

A row is six float64 values, in the order of ``COLUMNS``:

* ``sum_sq``: the sum of squares, accumulated as the norm accumulates it (the
  backend's own L2 partial of the tensor, moved to scale 1: for float32 and
  16-bit tensors the plain float64 sum on the CPU, and on Triton float32 sums
  of at most 32 squares carried in float64, within about 1e-7 of it; a float64
  tensor whose squares overflow float64 gives inf here while the norm stays
  finite). NaN where the
  tensor holds a NaN, inf where it holds an inf and no NaN;
* ``max_abs``: the largest |x| of the *finite* values (0 when there is none):
  ``nonfinite`` says whether there are others, and the finite maximum says how
  close the rest came to overflowing, which a NaN would hide;
* ``nonfinite``: the number of NaN and infinite values;
* ``zeros``: the number of values equal to 0 (either sign);
* ``subnormal``: the number of nonzero values with |x| below the smallest
  normal number of the *limit dtype*;
* ``overflow``: the number of finite values with |x| above the limit dtype's
  overflow margin, ``finfo(limit).max / OVERFLOW_HEADROOM``.

The limit dtype of a tensor is its own dtype unless the caller names another:
an activation computed in float32 under float16 autocast is judged by
float16's range, into which the next op casts it. Counts are exact: float64
holds every integer up to 2^53.
"""

from __future__ import annotations

import torch

COLUMNS = ("sum_sq", "max_abs", "nonfinite", "zeros", "subnormal", "overflow")
SUM_SQ, MAX_ABS, NONFINITE, ZEROS, SUBNORMAL, OVERFLOW = range(len(COLUMNS))

# A value within a factor 16 of the largest finite one is one doubling of a
# loss scale, a sum of 16 such values or a square's exponent step away from
# inf: float16's margin is 4094 (65504 / 16), close enough to be a warning and
# far above the values of a healthy run.
OVERFLOW_HEADROOM = 2.0**4

LIMIT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def thresholds(limit: torch.dtype) -> tuple[float, float]:
    """``(smallest normal, overflow margin)`` of ``limit``, both exact in float64."""
    info = torch.finfo(limit)
    return float(info.tiny), float(info.max) / OVERFLOW_HEADROOM


def check_limits(limit_dtypes: object, count: int, fn: str) -> list[torch.dtype | None]:
    """``limit_dtypes`` as a list of ``count`` entries (None: the tensor's own dtype).

    Raises a TypeError or ValueError that names the bad entry.
    """
    if limit_dtypes is None:
        return [None] * count
    if isinstance(limit_dtypes, (torch.dtype, str)):
        raise TypeError(f"{fn}: limit_dtypes must be a sequence with one dtype (or None) per tensor")
    limits = list(limit_dtypes)  # type: ignore[call-overload]
    if len(limits) != count:
        raise ValueError(f"{fn}: limit_dtypes has {len(limits)} entries for {count} tensors")
    for i, limit in enumerate(limits):
        if limit is not None and limit not in LIMIT_DTYPES:
            raise TypeError(
                f"{fn}: limit_dtypes[{i}] is {limit!r}; it must be None or one of "
                + ", ".join(map(str, LIMIT_DTYPES))
            )
    return limits
