"""The CPU backend: ``fastnorm._C``, one threaded pass over every tensor.

All tensors of a call, whatever their dtypes, are split into tasks of about
``TASK_BYTES`` over their concatenated memory; the tasks run on a persistent
pool of ``torch.get_num_threads()`` threads with the GIL released, each loop
accumulating in float64 with the widest instruction set the CPU has (AVX-512,
AVX2 or portable C++, all giving the same bits; ``FASTNORM_ISA`` forces one).
The task split depends only on the sizes, so the result is bitwise the same for
any thread count. The tasks run on torch's own OpenMP threads where the
process has loaded an OpenMP runtime (Linux); a second set of threads would
compete with them, still spinning after the last torch op, for the cores.
``scale_`` reads the norm, and returns without touching the gradients when
the clip coefficient is 1. ``reduce_stats`` (``_C.reduce_stats``) runs, per
piece of the same split, the norm's own loop and then one over the piece's
bits while it is in cache (integer compares against the limit dtype's bounds,
expressed in the element dtype's bits: ``_limits_table``); ``reduce`` is
untouched by it.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from fastnorm import _extension, _stats
from fastnorm._partial import Mode
from fastnorm.backends.fused import fused_reasons

_C = _extension.C
_IMPORT_ERROR = _extension.IMPORT_ERROR
BORROWED_FROM = _extension.BORROWED_FROM
KNOWN_ISAS = _extension.KNOWN_ISAS

DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}

# Results are allocated like these (torch.empty_like costs less than torch.empty,
# which parses its arguments, on calls of a few microseconds).
_PARTIAL = torch.empty(2, dtype=torch.float64)
_ROOTS = {dtype: torch.empty((), dtype=dtype) for dtype in (torch.float32, torch.float64)}

_BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}


def _bits(value: float, dtype: torch.dtype, up: bool) -> int:
    """The bits of the smallest value of ``dtype`` >= ``value`` (``up``), else of the
    largest <= ``value`` (both positive, at most the largest finite value)."""
    if dtype == torch.float64:
        return int(torch.tensor(value, dtype=torch.float64).view(torch.int64))
    near = torch.tensor(value, dtype=torch.float64).to(dtype)
    bits = int(near.view(_BITS[dtype]))
    if up and float(near) < value:
        bits += 1  # the next larger value: positive floats' bits count up with them
    if not up and float(near) > value:
        bits -= 1  # inf, or rounded up
    return bits


def _limits_table() -> torch.Tensor:
    """``csrc/fastnorm.h``'s Limits for each (element dtype code, limit dtype code), as int64 words."""
    dtypes = sorted(DTYPE_CODES, key=DTYPE_CODES.__getitem__)
    rows = []
    for element in dtypes:
        for limit in dtypes:
            tiny, margin = _stats.thresholds(limit)
            rows.append([_bits(tiny, element, True), _bits(margin, element, False)])
    return torch.tensor(rows, dtype=torch.int64)


_THRESHOLDS = _limits_table()
_THRESHOLDS_ADDR = _THRESHOLDS.data_ptr()


def count_stats_args(threads: int) -> tuple[Any, int, int, int]:
    """``(_C.count_stats, threads, TASK_BYTES, thresholds' address)``: what a caller of
    ``_C.count_stats(addr, numel, dtype code, limit code, task, table, out, threads)`` on many
    tensors in a row (the locator, hundreds a pass) holds, instead of looking each up per tensor."""
    return _C.count_stats, threads, TASK_BYTES, _THRESHOLDS_ADDR


_STATS = torch.empty((0, len(_stats.COLUMNS)), dtype=torch.float64)
# Limit-dtype codes of recent calls that name some (int32, one per tensor).
_LIMIT_CODES: dict[tuple[torch.dtype | None, ...], torch.Tensor] = {}
_LIMIT_CODES_KEPT = 64


def _limit_codes(limits: list[torch.dtype | None]) -> torch.Tensor | None:
    """The int32 codes of ``limits`` (-1: the tensor's own dtype), None when every one is."""
    if limits.count(None) == len(limits):
        return None
    key = tuple(limits)
    codes = _LIMIT_CODES.get(key)
    if codes is None:
        if len(_LIMIT_CODES) >= _LIMIT_CODES_KEPT:
            _LIMIT_CODES.pop(next(iter(_LIMIT_CODES)))
        codes = torch.tensor([-1 if d is None else DTYPE_CODES[d] for d in limits], dtype=torch.int32)
        _LIMIT_CODES[key] = codes
    return codes


# 256 KiB: large enough that a task's fixed cost vanishes, small enough to
# balance 2 to 64 threads on a 100 MB model and to stay in L2 while scaled.
TASK_BYTES = 1 << 18


def isa() -> str | None:
    """The instruction set the kernels use here (``avx512``, ``avx2`` or ``generic``), or None."""
    return None if _C is None else _C.isa()


def kernels_line() -> str:
    """One line for ``fastnorm info``: the instruction set and where the kernels come
    from, or exactly why they are missing and what to run."""
    if _C is None:
        return f"C++ kernels: not available: {_IMPORT_ERROR}"
    ahead = _C.prefetch_bytes()
    prefetch = f"prefetching {ahead} bytes ahead" if ahead else "no software prefetch"
    line = f"C++ kernels: {_C.isa()}, {prefetch} (this CPU supports {', '.join(_C.supported_isas())})"
    if BORROWED_FROM is not None:
        line += f", from the installed build in {BORROWED_FROM} (same sources as this tree)"
    elif _extension.tree_hash() not in (None, _C.source_hash()):
        line += "; WARNING: built from older sources than csrc/: rerun `pip install -e .`"
    return line


def _loaded_openmp_runtime() -> str | None:
    """The path of the OpenMP runtime loaded in this process, torch's first."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(maxsplit=5)[-1].strip() for line in maps if "omp" in line}
    except OSError:  # not Linux
        return None
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    runtimes = [
        path for path in sorted(paths) if os.path.basename(path).startswith(("libgomp", "libiomp5", "libomp"))
    ]
    runtimes.sort(key=lambda path: not path.startswith(torch_lib))  # torch's, when there are several
    return runtimes[0] if runtimes else None


def threads_source() -> str:
    """Whose threads run the parallel tasks: torch's OpenMP runtime, or our own pool."""
    if _C is not None and _C.uses_openmp():
        return f"the OpenMP runtime torch loaded ({_OPENMP})"
    return "fastnorm's own thread pool"


_OPENMP = None if _C is None or os.environ.get("FASTNORM_OWN_THREADS") else _loaded_openmp_runtime()
if _OPENMP is not None and not _C.attach_openmp(_OPENMP):
    _OPENMP = None


class CppBackend:
    name = "cpp"
    cacheable = True  # a task split over addresses, rebuilt when an address changes

    def not_supported_reasons(
        self, device: torch.device, mode: Mode | None = None, dense: bool = True
    ) -> list[str]:
        if _extension.BAD_SETTING is not None and device.type == "cpu":
            raise ValueError(_extension.BAD_SETTING)
        reasons = fused_reasons(mode, dense)
        if _C is None:
            reasons.append(f"the extension fastnorm._C is not built ({_IMPORT_ERROR})")
        if device.type != "cpu":
            reasons.append(f"it serves CPU tensors, not {device.type}")
        return reasons

    def prepare(self, tensors: list[torch.Tensor]) -> _C.TaskSplit:
        return _C.TaskSplit(
            [t.data_ptr() for t in tensors],
            [t.numel() for t in tensors],
            [DTYPE_CODES[t.dtype] for t in tensors],
            TASK_BYTES,
        )

    def reduce(
        self,
        prepared: _C.TaskSplit,
        mode: Mode,
        p: float,
        result_dtype: torch.dtype,
        per_tensor: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        partial = torch.empty_like(_PARTIAL)
        root = torch.empty_like(_ROOTS[result_dtype])
        tensors = torch.empty((prepared.num_tensors, 2), dtype=torch.float64) if per_tensor else None
        _C.reduce(
            prepared,
            int(mode),
            p,
            partial.data_ptr(),
            root.data_ptr(),
            result_dtype == torch.float64,
            tensors.data_ptr() if tensors is not None else 0,
            torch.get_num_threads(),
        )
        return partial, root, tensors

    def reduce_stats(
        self,
        prepared: _C.TaskSplit,
        mode: Mode,
        p: float,
        result_dtype: torch.dtype,
        limits: list[torch.dtype | None],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        partial = torch.empty_like(_PARTIAL)
        root = torch.empty_like(_ROOTS[result_dtype])
        stats = _STATS.new_empty((prepared.num_tensors, len(_stats.COLUMNS)))
        codes = _limit_codes(limits)
        _C.reduce_stats(
            prepared,
            int(mode),
            p,
            partial.data_ptr(),
            root.data_ptr(),
            result_dtype == torch.float64,
            _THRESHOLDS.data_ptr(),
            0 if codes is None else codes.data_ptr(),
            stats.data_ptr(),
            torch.get_num_threads(),
        )
        return partial, root, stats

    def gate(self, prepared: _C.TaskSplit, first_item: list[int]) -> bool:
        prepared.set_gates(first_item)
        return True

    def reduce_checked(
        self,
        prepared: _C.TaskSplit,
        snapshot: Any,
        items: list[Any],
        written: list[torch.Tensor] | None,
        mode: Mode,
        p: float,
        result_dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor, None] | None:
        """See ``fastnorm.backends.CheckedReduce``: on torch's OpenMP threads the
        calling thread checks while the others read; on fastnorm's own pool the
        check runs first (``_C.reduce_checked``)."""
        partial = torch.empty_like(_PARTIAL)
        root = torch.empty_like(_ROOTS[result_dtype])
        ok = _C.reduce_checked(
            snapshot,
            items,
            written,
            prepared,
            int(mode),
            p,
            partial.data_ptr(),
            root.data_ptr(),
            result_dtype == torch.float64,
            torch.get_num_threads(),
        )
        return (partial, root, None) if ok else None

    def scale_(self, prepared: _C.TaskSplit, norm: torch.Tensor, max_norm: float) -> None:
        _C.scale_by_norm(
            prepared, norm.data_ptr(), norm.dtype == torch.float64, max_norm, torch.get_num_threads()
        )


BACKEND = CppBackend()
