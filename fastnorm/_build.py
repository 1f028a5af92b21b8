"""The fingerprint of the C++ sources: setup.py compiles it into ``fastnorm._C``,
and a source checkout compares it with its own ``csrc/`` before it borrows the
kernels of an installed build (``fastnorm.backends.cpp``). Imports no torch, so
that setup.py can load this file on its own."""

from __future__ import annotations

import hashlib
from pathlib import Path


def source_hash(csrc: Path) -> str:
    """A short digest of every C++ source and header under ``csrc``, names included."""
    digest = hashlib.sha256()
    for path in sorted(csrc.glob("*")):
        if path.suffix in (".h", ".cpp"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]
