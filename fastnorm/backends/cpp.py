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
the clip coefficient is 1.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from fastnorm import _extension
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
    line = f"C++ kernels: {_C.isa()} (this CPU supports {', '.join(_C.supported_isas())})"
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
        if _extension.UNKNOWN_ISA is not None and device.type == "cpu":
            raise ValueError(_extension.UNKNOWN_ISA)
        reasons = fused_reasons(mode, dense)
        if _C is None:
            reasons.append(f"the extension fastnorm._C is not built ({_IMPORT_ERROR})")
        if device.type != "cpu":
            reasons.append(f"it serves CPU tensors, not {device.type}")
        return reasons

    def prepare(self, tensors: list[torch.Tensor]) -> _C.Plan:
        return _C.Plan(
            [t.data_ptr() for t in tensors],
            [t.numel() for t in tensors],
            [DTYPE_CODES[t.dtype] for t in tensors],
            TASK_BYTES,
        )

    def reduce(
        self,
        prepared: _C.Plan,
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

    def gate(self, prepared: _C.Plan, first_item: list[int]) -> bool:
        prepared.set_gates(first_item)
        return True

    def reduce_checked(
        self,
        prepared: _C.Plan,
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

    def scale_(self, prepared: _C.Plan, norm: torch.Tensor, max_norm: float) -> None:
        _C.scale_by_norm(
            prepared, norm.data_ptr(), norm.dtype == torch.float64, max_norm, torch.get_num_threads()
        )


BACKEND = CppBackend()
