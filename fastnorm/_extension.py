"""``fastnorm._C``, the compiled extension: found, loaded, and checked to match the sources.

The extension holds the C++ kernels (the cpp backend, ``fastnorm/backends/cpp.py``)
and the snapshot the plan cache checks gradients with (``fastnorm/_plan.py``),
so it is loaded here, below both. ``C`` is None where it cannot be used, and
``IMPORT_ERROR`` says why, with what to run.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from fastnorm import _build

_PACKAGE = Path(__file__).resolve().parent
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


def tree_hash() -> str | None:
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
    source = tree_hash()
    if importlib.util.find_spec("fastnorm._C") is None:
        if source is None:
            return None, ImportError("fastnorm was installed without its C++ kernels (fastnorm._C)"), None
        candidates = _installed_builds()
    else:
        try:
            from fastnorm import _C
        except ImportError as exc:  # a broken build, an unsupported FASTNORM_ISA
            return None, exc, None
        where = Path(_C.__file__).resolve().parent
        if where == _PACKAGE or source is None:
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
        if module.source_hash() == source:
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


def _bad_prefetch() -> str | None:
    """Why FASTNORM_PREFETCH (the kernels' prefetch distance in bytes, csrc/prefetch.h)
    is not a whole number of 64-byte lines from 0 to 65536, or None (unset, or fine)."""
    value = os.environ.get("FASTNORM_PREFETCH", "")
    if not value:
        return None
    # Digits only, as the extension reads it (no sign, space or underscore).
    if value.isascii() and value.isdigit() and int(value) <= 1 << 16 and int(value) % 64 == 0:
        return None
    return f"FASTNORM_PREFETCH={value!r} is not a whole number of 64-byte lines from 0 to 65536 (bytes)"


# A mistyped FASTNORM_ISA or FASTNORM_PREFETCH: the CPU backend raises this at
# every use (as a mistyped FASTNORM_BACKEND raises), instead of handing every CPU
# tensor to torch.
BAD_SETTING = _unknown_isa() or _bad_prefetch()

# None: built without the extension, a broken build, an unsupported or unknown FASTNORM_ISA.
if BAD_SETTING is None:
    C, IMPORT_ERROR, BORROWED_FROM = _import_extension()
else:
    C, IMPORT_ERROR, BORROWED_FROM = None, ImportError(BAD_SETTING), None
