"""Shared test setup.

Tests import the installed fastnorm (this folder, not the repository root, is
on sys.path), so they check what users get. Without a GPU, the Triton kernels
run in Triton's interpreter on CPU tensors: TRITON_INTERPRET must be set
before triton is first imported, so it is set here. With a GPU, the kernels
are compiled and the CUDA tests (marked ``cuda``) run instead; the
interpreter tests on CPU tensors are skipped.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from helpers import (  # noqa: E402
    INTERPRETED,
    patch_triton_language_once_per_launch,
    skip_discarded_overflow_checks,
    use_backend,
)

if INTERPRETED:  # helpers read TRITON_INTERPRET, set above
    patch_triton_language_once_per_launch()
    skip_discarded_overflow_checks()

# Whole modules that are slow by nature; with the cases that run on the triton
# backend in Triton's interpreter, they are marked ``slow``, so that
# ``pytest -m "not slow"`` is a fast inner loop. The full suite runs everything.
SLOW_MODULES = {
    "test_triton_kernels": "the Triton kernels, in Triton's interpreter",
    "test_kernels_compile": "ahead-of-time compiles for real GPU targets",
    "test_distributed": "gloo process groups of 2 and 4 ranks",
    "test_examples": "the examples under torchrun",
    "test_source_tree": "a copy of the checkout and a child process",
    "test_stacks_hf": "importing transformers and accelerate, and training in them",
    "test_stacks_lightning": "training inside Lightning and Fabric",
    "test_stacks_torchtitan": "importing torchtitan, and training in it",
    "test_stacks_vision": "timm and LightlyTrain, in their own environment",
    "test_compile": "torch.compile (inductor)",
}


def _interpreted(item) -> bool:
    """A case on the triton backend with CPU tensors: Triton's interpreter."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(isinstance(v, str) and v.split("-")[-1] == "triton" for v in params.values())


# Modules whose tests wait on work started in the background at collection:
# they run last, so that the work has the whole suite to finish in.
LAST_MODULES = ("test_kernels_compile",)


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.module.__name__ in LAST_MODULES)  # stable: the order otherwise kept
    for item in items:
        if item.module.__name__ in SLOW_MODULES or (not torch.cuda.is_available() and _interpreted(item)):
            item.add_marker(pytest.mark.slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=["cpp", "triton", "torch"])
def backend(request, monkeypatch):
    """Each backend in turn, on CPU tensors."""
    return use_backend(request.param, monkeypatch)


@pytest.fixture(params=["auto", "torch"])
def mixing(request, monkeypatch):
    """Calls whose tensors two backends share on the CPU (auto: cpp for dense
    tensors, torch for the others), and torch alone for comparison."""
    if request.param == "auto":
        from fastnorm.backends import cpp

        if cpp._C is None:
            pytest.skip("the C++ kernels are not built")
    monkeypatch.setenv("FASTNORM_BACKEND", request.param)
    return request.param


@pytest.fixture(params=["cpp", "triton"])
def fused(request, monkeypatch):
    """Each fused backend in turn, on CPU tensors, with an empty plan cache."""
    import fastnorm

    fastnorm.clear_cache()
    return use_backend(request.param, monkeypatch)


@pytest.fixture
def one_thread():
    """One intra-op thread: for tiny models, on a busy 2-core machine more threads only contend."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
