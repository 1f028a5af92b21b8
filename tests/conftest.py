"""Shared test setup.

Without a GPU, the Triton kernels run in Triton's interpreter on CPU tensors:
TRITON_INTERPRET must be set before triton is first imported, so it is set
here. With a GPU, the kernels are compiled and the CUDA tests (marked
``cuda``) run instead; the interpreter tests on CPU tensors are skipped.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def use_backend(name: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Forces a backend for CPU tensors; triton needs the interpreter for those."""
    if name == "triton" and not INTERPRETED:
        pytest.skip("the triton backend runs on CPU tensors only under TRITON_INTERPRET=1")
    monkeypatch.setenv("FASTNORM_BACKEND", name)
    return name


@pytest.fixture(params=["cpp", "triton", "torch"])
def backend(request, monkeypatch):
    """Each backend in turn, on CPU tensors."""
    return use_backend(request.param, monkeypatch)


@pytest.fixture(params=["cpp", "triton"])
def fused(request, monkeypatch):
    """Each fused backend in turn, on CPU tensors, with an empty plan cache."""
    import fastnorm

    fastnorm.clear_cache()
    return use_backend(request.param, monkeypatch)
