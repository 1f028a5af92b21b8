"""What the tests that train inside the stacks share: three runs of one training, and their comparison.

Each training runs three times from the same seed, with torch's clip functions
as ``torch`` (torch's own), ``float64`` (torch's own recipe with the norm
accumulated in float64, fastnorm's documented numerics; written here, sharing
no code with fastnorm) and ``fastnorm`` (inside ``fastnorm.patch()``). A
``Spy`` on ``torch.nn.utils`` records every call the framework makes and which
implementation served it, so each test also shows that the framework reached
fastnorm, and how often. The runs agree when the fastnorm run is bit for bit
the float64 one and within 1e-5 (relative) of torch's.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.utils.clip_grad as clip_grad
from torch import Tensor

import fastnorm
from fastnorm.integrations import patch as patching

RUNS = ("torch", "float64", "fastnorm")
NAMES = ("clip_grad_norm_", "get_total_norm", "clip_grads_with_norm_")
# torch's own functions, taken before any test patches them.
TORCH = {name: getattr(torch.nn.utils, name) for name in NAMES}


def _dtensor(t: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def _norm64(tensors, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """torch's get_total_norm, each tensor's norm and their norm accumulated in float64."""
    tensors = [tensors] if isinstance(tensors, Tensor) else list(tensors)
    if not tensors:
        return torch.tensor(0.0)
    norms = [torch.linalg.vector_norm(t, norm_type, dtype=torch.float64) for t in tensors]
    total = torch.linalg.vector_norm(torch.stack(norms), norm_type)
    if error_if_nonfinite and not bool(torch.isfinite(total.full_tensor() if _dtensor(total) else total)):
        raise RuntimeError(f"The total norm of order {float(norm_type)} for gradients is non-finite")
    return total.to(torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32)


def _clip64(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    parameters = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    norm = _norm64([p.grad for p in parameters if p.grad is not None], norm_type, error_if_nonfinite)
    TORCH["clip_grads_with_norm_"](parameters, max_norm, norm, foreach)
    return norm


@contextlib.contextmanager
def _attributes(values: dict[tuple[Any, str], Any]) -> Iterator[None]:
    before = {key: getattr(*key) for key in values}
    for (owner, name), value in values.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for (owner, name), value in before.items():
            setattr(owner, name, value)


@contextlib.contextmanager
def clipping(run: str, monitor: Any = None) -> Iterator[Any]:
    """torch's clip functions as ``run`` has them (see the module docstring); yields the patch handle."""
    if run == "torch":
        yield None
    elif run == "float64":
        values = {
            (torch.nn.utils, "clip_grad_norm_"): _clip64,
            (clip_grad, "clip_grad_norm_"): _clip64,
            (torch.nn.utils, "get_total_norm"): _norm64,
            (clip_grad, "_get_total_norm"): _norm64,
        }
        with _attributes(values):
            yield None
    else:
        with fastnorm.patch(monitor=monitor) as handle:
            yield handle


@dataclass
class Call:
    name: str
    served_by: str  # the module of the function that ran
    value: float  # the norm it returned or was given


# The clip functions that take a step's norm (clip_grads_with_norm_ is handed one).
MEASURING = ("clip_grad_norm_", "get_total_norm")


class Spy:
    """Records every call of torch's three clip functions through ``torch.nn.utils``
    (as frameworks call them), in order, with the implementation that served it."""

    def __init__(self) -> None:
        self.calls: list[Call] = []

    @staticmethod
    def _value(t: Tensor) -> float:
        return float((t.full_tensor() if _dtensor(t) else t).double())

    def _wrap(self, name: str, fn: Callable) -> Callable:
        def spied(*args: Any, **kwargs: Any) -> Any:
            result = fn(*args, **kwargs)
            norm = args[2] if name == "clip_grads_with_norm_" and len(args) > 2 else result
            if name == "clip_grads_with_norm_" and len(args) <= 2:
                norm = kwargs["total_norm"]
            self.calls.append(Call(name, fn.__module__, self._value(norm)))
            return result

        return spied

    @contextlib.contextmanager
    def watching(self) -> Iterator[Spy]:
        values = {(torch.nn.utils, n): self._wrap(n, getattr(torch.nn.utils, n)) for n in NAMES}
        with _attributes(values):
            yield self

    def served(self) -> set[str]:
        return {c.served_by for c in self.calls}

    def count(self, name: str) -> int:
        return sum(c.name == name for c in self.calls)

    def measured(self) -> int:
        """The norms taken: by ``clip_grad_norm_``, or by ``get_total_norm`` where a framework
        composes the clip from torch's two halves (accelerate from 1.16 on)."""
        return sum(c.name in MEASURING for c in self.calls)


class Monitor:
    """Stands for a GradNormMonitor: keeps what ``patch(monitor=...)`` hands it."""

    def __init__(self) -> None:
        self.norms: list[Tensor] = []

    def update(self, norm: Tensor) -> None:
        # What a GradNormMonitor can copy into its buffer: a plain tensor of one value.
        assert type(norm) is Tensor and norm.numel() == 1, type(norm)
        self.norms.append(norm)

    def values(self) -> list[float]:
        return [float(n.double()) for n in self.norms]


@dataclass
class Run:
    """What one training produced: per step losses and norms, and the final parameters."""

    losses: list[float]
    params: dict[str, Tensor]
    spy: Spy
    monitor: Monitor | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def norms(self) -> list[float]:
        """The norms measured, one per step (not the norm handed back to ``clip_grads_with_norm_``)."""
        return [c.value for c in self.spy.calls if c.name in MEASURING]


def params_of(module: torch.nn.Module) -> dict[str, Tensor]:
    out = {}
    for name, p in module.named_parameters():
        value = p.detach().full_tensor() if _dtensor(p) else p.detach()
        out[name] = value.clone().cpu()
    return out


def run_three(train: Callable[[str, Spy, Any], Run]) -> dict[str, Run]:
    """``train(run, spy, monitor)`` for each run, each inside its ``clipping(run)``."""
    results = {}
    for run in RUNS:
        spy, monitor = Spy(), (Monitor() if run == "fastnorm" else None)
        with clipping(run, monitor) as handle:
            assert handle is None or torch.nn.utils.clip_grad_norm_ is patching.clip_grad_norm_
            with spy.watching():
                result = train(run, spy, monitor)
        result.monitor = monitor
        results[run] = result
    return results


def _close(a: float, b: float, rtol: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= rtol * max(abs(a), abs(b))


def drift(results: dict[str, Run]) -> dict[str, float]:
    """How far fastnorm's run is from torch's: the largest relative difference of a loss and of a
    norm over the steps, and the parameters' norm-wise distance over the whole model."""
    ours, theirs = results["fastnorm"], results["torch"]

    def worst(a: list[float], b: list[float]) -> float:
        return max((abs(x - y) / max(abs(x), abs(y), 1e-30) for x, y in zip(a, b) if x != y), default=0.0)

    squares = sum(float((ours.params[n] - p).double().square().sum()) for n, p in theirs.params.items())
    size = sum(float(p.double().square().sum()) for p in theirs.params.values())
    return {
        "loss": worst(ours.losses, theirs.losses),
        "norm": worst(ours.norms, theirs.norms),
        "params": math.sqrt(squares / size) if size else 0.0,
    }


def assert_runs_agree(results: dict[str, Run], rtol: float = 1e-5, amplified: float | None = None) -> None:
    """fastnorm's run is the float64 recipe's bit for bit, and within ``rtol`` of torch's: the
    losses and norms of every step and every final parameter. Where the training amplifies
    rounding, ``amplified`` bounds the drift from torch's run instead (see ``drift``). Each run
    is served by its own functions, called in the same order."""
    ours, f64, theirs = results["fastnorm"], results["float64"], results["torch"]
    assert ours.spy.calls, "the framework never called torch's clip functions"
    assert ours.spy.served() == {"fastnorm.integrations.patch"}, ours.spy.served()
    assert theirs.spy.served() <= {"torch.nn.utils.clip_grad"}, theirs.spy.served()
    names = [[c.name for c in r.spy.calls] for r in (ours, f64, theirs)]
    assert names[0] == names[1] == names[2]
    assert len(ours.losses) == len(theirs.losses) > 0
    assert ours.params.keys() == theirs.params.keys()
    assert ours.losses == f64.losses
    assert ours.norms == f64.norms
    for name in ours.params:
        assert torch.equal(ours.params[name], f64.params[name]), name
    if amplified is not None:
        measured = drift(results)
        assert max(measured.values()) <= amplified, measured
        return
    for a, b in zip(ours.losses + ours.norms, theirs.losses + theirs.norms):
        assert _close(a, b, rtol), (a, b)
    for name in ours.params:
        torch.testing.assert_close(ours.params[name], theirs.params[name], rtol=rtol, atol=1e-7)


@contextlib.contextmanager
def one_rank() -> Iterator[None]:
    """A gloo process group of this process alone, for DTensors on the CPU."""
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
