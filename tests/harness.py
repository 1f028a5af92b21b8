"""Helpers shared by the tests (pytest puts this folder on sys.path)."""

from __future__ import annotations

import os

import pytest

# conftest.py decides this before triton is imported.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def use_backend(name: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Forces a backend for CPU tensors; triton needs the interpreter for those."""
    if name == "triton" and not INTERPRETED:
        pytest.skip("the triton backend runs on CPU tensors only under TRITON_INTERPRET=1")
    monkeypatch.setenv("FASTNORM_BACKEND", name)
    return name
