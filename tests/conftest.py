"""Shared test setup.

Triton's interpreter must be chosen before triton is first imported, so it is
set here, at the top of the first module pytest loads. CUDA tests are marked
with ``cuda`` and skip cleanly where there is no GPU.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
