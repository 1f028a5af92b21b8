"""Each layer's gradient statistics over every step of the monitor's window, kept on the device.

``GradNormMonitor.update(total, layer_stats=stats)`` takes, at any step, one
row per layer of the columns of ``fastnorm.stats.COLUMNS`` (what
:meth:`LayerGradNorms.with_stats <fastnorm.LayerGradNorms.with_stats>` gives
from the norm's own pass). :func:`fold` folds it into ``ROWS`` rows of the
monitor's device buffer with a few device ops and no read: the window's largest
finite |g| of each layer, its counts of non-finite, zero, subnormal and
overflowing values, the number of steps on which each layer had a non-finite
or an overflowing value, and the first of the window's slots where it went
non-finite. These rows share the buffer of the window's norms, so they cross to
the host in the window's one transfer: every step of the window is counted, not
a sample of them. :func:`read` turns the host values into a :class:`LayerWindow`,
whose :meth:`~LayerWindow.metrics` are the keys the monitor logs (only those of
layers that went non-finite or overflowed) and the diagnosis reads back.

Only tensors are received here; the compute side is never imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from fastnorm.monitoring.diagnosis.events import LAYERS, layers_lines

# The columns of a row given (fastnorm.stats.COLUMNS, in that order; a test holds the two together).
GIVEN = ("sum_sq", "max_abs", "nonfinite", "zeros", "subnormal", "overflow")
# The rows kept per layer over the window, each ``len(layer_names)`` long in the buffer.
KEPT = (
    "max_abs",  # the largest finite |g|
    "nonfinite",  # the counts of values, summed over the window's steps
    "zeros",
    "subnormal",
    "overflow",
    "nonfinite_steps",  # the steps with a non-finite value
    "overflow_steps",  # the steps with an overflowing value
    "first_nonfinite",  # the first slot of the window with a non-finite value (the window's length: none)
)
ROWS = len(KEPT)
_MAX, _FIRST = 0, ROWS - 1
# Layers named per kind in the logged keys; the others are counted (a model gone NaN everywhere is not
# logged as hundreds of keys).
NAMED = 8


def check(value: Any, layers: int) -> Tensor:
    """A ``(layers, len(GIVEN))`` real floating tensor, checked before anything is recorded."""
    if not isinstance(value, Tensor):
        raise TypeError(
            "GradNormMonitor.update: layer_stats must be a Tensor (e.g. the third value of "
            f"LayerGradNorms.with_stats()), got {type(value).__name__}"
        )
    if layers == 0:
        raise ValueError("GradNormMonitor.update: layer_stats needs layer_names (one row per layer)")
    if value.shape != (layers, len(GIVEN)):
        raise ValueError(
            f"GradNormMonitor.update: layer_stats must be a tensor of shape ({layers}, {len(GIVEN)}) "
            f"(a row of fastnorm.stats.COLUMNS per name of layer_names), got {tuple(value.shape)}"
        )
    if value.is_meta or value.layout != torch.strided or not value.is_floating_point():
        raise TypeError(
            f"GradNormMonitor.update: layer_stats must be a dense floating tensor, got a {value.dtype} "
            f"{'meta' if value.is_meta else str(value.layout).replace('torch.', '')} tensor"
        )
    return value


def reset(region: Tensor, n: int) -> None:
    """The rows of a window that has no step yet (``region``: ``(ROWS, layers)``)."""
    region.zero_()
    region[_FIRST].fill_(n)


def fold(region: Tensor, stats: Tensor, slot: int, n: int) -> None:
    """Folds one step's rows into the window's (on the device, no read)."""
    s = stats.detach().to(region.dtype)
    torch.maximum(region[_MAX], s[:, 1], out=region[_MAX])
    region[1:5] += s[:, 2:6].T  # nonfinite, zeros, subnormal, overflow
    flags = s[:, 2::3] > 0  # a non-finite (column 2) or an overflowing (5) value
    region[5:7] += flags.T
    first = region[_FIRST]  # the slots only grow: the first flagged one is the one met while still n
    first.masked_fill_(flags[:, 0] & (first == n), slot)


@dataclass(frozen=True)
class LayerWindow:
    """Each layer's gradient statistics over the steps of one window that gave them.

    Attributes:
        steps (int): the window's steps that gave ``layer_stats``.
        layers (dict): name -> {column of ``KEPT``: value}; ``first_nonfinite``
            is the step where the layer first went non-finite in the window, None
            where it did not.
    """

    steps: int
    layers: dict[str, dict[str, Any]] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """The keys logged (with the monitor's ``gradient_norm_`` prefix): for the layers that went
        non-finite, the steps they did on and the first; for those that came near overflowing, the steps
        and their largest |g|; and each kind's number of window steps. Nothing for a healthy window."""
        out: dict[str, float] = {}
        bad = sorted(
            (n for n, c in self.layers.items() if c["nonfinite_steps"] > 0),
            key=lambda n: (self.layers[n]["first_nonfinite"], -self.layers[n]["nonfinite_steps"]),
        )
        near = sorted(
            (n for n, c in self.layers.items() if c["overflow_steps"] > 0),
            key=lambda n: (-self.layers[n]["overflow_steps"], -self.layers[n]["max_abs"]),
        )
        for kind, names in (("nonfinite", bad), ("overflow", near)):
            if not names:
                continue
            out[f"{LAYERS}{kind}_steps"] = float(self.steps)
            for name in names[:NAMED]:
                c = self.layers[name]
                out[f"{LAYERS}{kind}/{name}"] = float(c[f"{kind}_steps"])
                if kind == "nonfinite":
                    out[f"{LAYERS}nonfinite_first/{name}"] = float(c["first_nonfinite"])
                else:
                    out[f"{LAYERS}overflow_max/{name}"] = float(c["max_abs"])
            if len(names) > NAMED:
                out[f"{LAYERS}{kind}_more"] = float(len(names) - NAMED)
        return out

    def report(self) -> str:
        """The layers that went non-finite (the first of them named first) and those that came near
        overflowing, as sentences; a line saying there is none otherwise."""
        lines = layers_lines(self.metrics())
        return "\n".join(lines) if lines else f"no layer went non-finite or near overflow in {self.steps} steps"


def read(host: list[float], names: list[str], steps: list[int], given: int) -> LayerWindow | None:
    """The window's rows from the host (``ROWS`` rows of ``len(names)``), None where no step gave any."""
    if given == 0:
        return None
    k, n = len(names), len(steps)
    layers = {}
    for i, name in enumerate(names):
        c = {col: host[r * k + i] for r, col in enumerate(KEPT)}
        slot = int(c["first_nonfinite"])
        c["first_nonfinite"] = steps[slot] if slot < n else None
        layers[name] = c
    return LayerWindow(given, layers)
