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

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from fastnorm import _build
from fastnorm.backends import Mode

_PACKAGE = Path(__file__).resolve().parent.parent
_TREE = _PACKAGE.parent  # the repository root, when running from a source checkout


def _installed_builds() -> list[Path]:
    """The built extensions of other fastnorm copies Python could import (site-packages,
    an editable install elsewhere), which this source tree hides."""
    spec_paths = [p for p in sys.path if Path(p or ".").resolve() != _TREE]
    specs = [importlib.machinery.PathFinder.find_spec("fastnorm", spec_paths)]
    for finder in sys.meta_path:
        if finder is not importlib.machinery.PathFinder and hasattr(finder, "find_spec"):
            try:
                specs.append(finder.find_spec("fastnorm", None))
            except Exception:  # a third-party finder that cannot answer
                continue
    builds = []
    for spec in specs:
        for location in (spec.submodule_search_locations or []) if spec else []:
            if Path(location).resolve() != _PACKAGE:
                for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                    builds += [p for p in Path(location).glob("_C*" + suffix) if p.name == "_C" + suffix]
    return builds


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("fastnorm._C", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["fastnorm._C"] = module
    return module


def _tree_hash() -> str | None:
    """The fingerprint of this source checkout's csrc/, or None for an installed package."""
    return _build.source_hash(_TREE / "csrc") if (_TREE / "csrc").is_dir() else None


def _import_extension() -> tuple[Any, ImportError | None, str | None]:
    """``(fastnorm._C, None, where)``, or ``(None, why, None)`` with what to run.

    ``where`` is None for the build inside this package. A source checkout
    without a build of its own (``python -m fastnorm`` in the repository root
    imports the tree, not the installed package) uses an installed build
    compiled from the same sources, and says so; one compiled from other
    sources is never used.
    """
    tree_hash = _tree_hash()
    if importlib.util.find_spec("fastnorm._C") is None:
        if tree_hash is None:
            return None, ImportError("fastnorm was installed without its C++ kernels (fastnorm._C)"), None
        candidates = _installed_builds()
    else:
        try:
            from fastnorm import _C
        except ImportError as exc:  # a broken build, an unsupported FASTNORM_ISA
            return None, exc, None
        where = Path(_C.__file__).resolve().parent
        if where == _PACKAGE or tree_hash is None:
            return _C, None, None
        del sys.modules["fastnorm._C"]  # an editable install's finder handed over its own build
        candidates = [Path(_C.__file__)]
    others = []
    for path in candidates:
        try:
            module = _load(path)
        except ImportError as exc:
            others.append(f"{path} ({exc})")
            continue
        if module.source_hash() == tree_hash:
            return module, None, str(path.parent)
        del sys.modules["fastnorm._C"]
        others.append(f"{path.parent} (built from other sources)")
    found = f"; the installed fastnorm cannot stand in: {', '.join(others)}" if others else ""
    return (
        None,
        ImportError(
            f"this source tree ({_TREE}) has no build of fastnorm._C{found}; run `pip install -e .` "
            "there (it builds the kernels in place), or run from another directory to use an "
            "installed fastnorm"
        ),
        None,
    )


# The instruction sets csrc/kernels.cpp has kernels for (on x86-64), whether or not this CPU runs them.
KNOWN_ISAS = ("generic", "avx2", "avx512")


def _unknown_isa() -> str | None:
    """Why FASTNORM_ISA (or its older name FASTNORM_CPU_ISA, read when the first is
    unset) names no instruction set at all, or None. A known one this CPU lacks is
    the extension's to refuse: then the C++ kernels are unavailable, and say why."""
    for variable in ("FASTNORM_ISA", "FASTNORM_CPU_ISA"):
        value = os.environ.get(variable, "")
        if value:
            if value in KNOWN_ISAS:
                return None
            return f"{variable}={value!r} is not one of {', '.join(KNOWN_ISAS)}"
    return None


# A mistyped FASTNORM_ISA raises at every use of the CPU backend, as a mistyped
# FASTNORM_BACKEND does, instead of handing every CPU tensor to the torch backend.
_UNKNOWN_ISA = _unknown_isa()

# Built without the extension, a broken build, or an unsupported FASTNORM_ISA.
if _UNKNOWN_ISA is None:
    _C, _IMPORT_ERROR, BORROWED_FROM = _import_extension()
else:
    _C, _IMPORT_ERROR, BORROWED_FROM = None, ValueError(_UNKNOWN_ISA), None

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
    elif _tree_hash() not in (None, _C.source_hash()):
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

    def not_supported_reasons(self, device: torch.device) -> list[str]:
        if _UNKNOWN_ISA is not None and device.type == "cpu":
            raise ValueError(_UNKNOWN_ISA)
        reasons = []
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
        plan: _C.Plan,
        mode: Mode,
        p: float,
        result_dtype: torch.dtype,
        per_tensor: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        partial = torch.empty_like(_PARTIAL)
        root = torch.empty_like(_ROOTS[result_dtype])
        tensors = torch.empty((plan.num_tensors, 2), dtype=torch.float64) if per_tensor else None
        _C.reduce(
            plan,
            int(mode),
            p,
            partial.data_ptr(),
            root.data_ptr(),
            result_dtype == torch.float64,
            tensors.data_ptr() if tensors is not None else 0,
            torch.get_num_threads(),
        )
        return partial, root, tensors

    def reduce_checked(
        self,
        snapshot: Any,
        items: list[Any],
        written: list[torch.Tensor] | None,
        plan: _C.Plan,
        mode: Mode,
        p: float,
        result_dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor, None] | None:
        """``reduce``, run while ``snapshot`` checks ``items`` (see
        ``_plan.cached_norm``): None, with nothing read at an address that
        failed the check, where they no longer match."""
        partial = torch.empty_like(_PARTIAL)
        root = torch.empty_like(_ROOTS[result_dtype])
        ok = _C.reduce_checked(
            snapshot,
            items,
            written,
            plan,
            int(mode),
            p,
            partial.data_ptr(),
            root.data_ptr(),
            result_dtype == torch.float64,
            torch.get_num_threads(),
        )
        return (partial, root, None) if ok else None

    def scale_(self, plan: _C.Plan, norm: torch.Tensor, max_norm: float) -> None:
        _C.scale_by_norm(
            plan, norm.data_ptr(), norm.dtype == torch.float64, max_norm, torch.get_num_threads()
        )


BACKEND = CppBackend()
