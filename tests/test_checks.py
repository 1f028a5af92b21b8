"""One rule per argument for every owner: the core, StepClipper, the monitor, the diagnosis."""

import numpy as np
import pytest
import torch

import fastnorm


def _owners():
    model = torch.nn.Linear(2, 2)
    model(torch.randn(3, 2)).sum().backward()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    return {
        "clip_": lambda bound: fastnorm.clip_(model.parameters(), bound),
        "StepClipper": lambda bound: fastnorm.StepClipper(optimizer, bound).remove(),
        "GradNormMonitor": lambda bound: fastnorm.GradNormMonitor(1, max_norm=bound).close(),
        "diagnose": lambda bound: fastnorm.diagnose([0, 1], [1.0, 1.0], max_norm=bound),
    }


@pytest.mark.parametrize("owner", ["clip_", "StepClipper", "GradNormMonitor", "diagnose"])
@pytest.mark.parametrize(
    "bound, error",
    [
        ("1.0", TypeError),
        (True, TypeError),
        (torch.tensor(1.0), TypeError),
        (-1.0, ValueError),
        (float("nan"), ValueError),
    ],
)
def test_max_norm_is_refused_alike_everywhere(owner, bound, error):
    with pytest.raises(error, match="max_norm must be"):
        _owners()[owner](bound)


@pytest.mark.parametrize("owner", ["clip_", "StepClipper", "GradNormMonitor", "diagnose"])
@pytest.mark.parametrize("bound", [0, 1, 2.5, float("inf"), np.float32(1.0), np.int64(3)])
def test_max_norm_takes_every_real_number_everywhere(owner, bound):
    _owners()[owner](bound)
