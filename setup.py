"""Builds fastnorm._C, the CPU kernels, from csrc/ with pybind11.

The extension takes raw addresses and never links libtorch, so building needs
no torch. Environment switches:

* ``FASTNORM_SKIP_CPP_BUILD=1``: do not build the extension (the torch backend
  serves CPU tensors instead).
* ``FASTNORM_FORCE_CPP_BUILD=1``: fail the install when the extension does not
  build, instead of warning and installing without it.
"""

import os
import sys
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup


def _source_hash() -> str:
    """fastnorm/_build.py's fingerprint of csrc/, loaded without importing fastnorm (and torch)."""
    spec = spec_from_file_location("_fastnorm_build", Path(__file__).parent / "fastnorm" / "_build.py")
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.source_hash(Path(__file__).parent / "csrc")


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


class OptionalBuildExt(build_ext):
    """A missing or broken compiler only warns: fastnorm still works without _C."""

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # compiler errors surface as several distutils types
            if _flag("FASTNORM_FORCE_CPP_BUILD"):
                raise
            print(
                f"WARNING: fastnorm._C did not build ({exc}); CPU tensors will use the torch "
                "backend. Set FASTNORM_FORCE_CPP_BUILD=1 to make this an error.",
                file=sys.stderr,
            )


if sys.platform == "win32":
    extra_compile_args = ["/O2"]
else:
    # -ffp-contract=off: the compiler fuses no multiply-add of its own accord; the kernels fuse
    # only where that is exact (csrc/isa_avx2.h), so every instruction set rounds alike.
    extra_compile_args = ["-O3", "-ffp-contract=off", "-fvisibility=hidden"]

ext_modules = []
if not _flag("FASTNORM_SKIP_CPP_BUILD"):
    ext_modules.append(
        Pybind11Extension(
            "fastnorm._C",
            ["csrc/bindings.cpp", "csrc/kernels.cpp", "csrc/snapshot.cpp"],
            depends=sorted(str(p) for p in Path("csrc").glob("*.h")),
            cxx_std=17,
            define_macros=[("FASTNORM_SOURCE_HASH", f'"{_source_hash()}"')],
            extra_compile_args=extra_compile_args,
            # dlopen/dlsym (in libc itself from glibc 2.34, in libdl before)
            libraries=["dl"] if sys.platform.startswith("linux") else [],
        )
    )

setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})
