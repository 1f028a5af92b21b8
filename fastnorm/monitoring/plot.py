"""The picture of a diagnosis: the norm over steps on a log scale, events shaded.

matplotlib is imported only here, through its object-oriented API with the Agg
canvas, so drawing neither needs a display nor changes the caller's pyplot
backend.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fastnorm.monitoring.diagnosis import EXPLODING, NONFINITE, SPIKE, VANISHING, Diagnosis

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_COLORS = {EXPLODING: "tab:red", VANISHING: "tab:blue", NONFINITE: "tab:purple", SPIKE: "tab:orange"}


def plot(
    steps: Sequence[int],
    values: Sequence[float],
    diagnosis: Diagnosis,
    path: str | os.PathLike,
    *,
    max_norm: float | None = None,
    title: str | None = None,
) -> Figure:
    """Draws the series and its diagnosis into a PNG file.

    Non-finite steps are marked along the top edge (a log axis cannot show
    them), each event is shaded over its step range, and the clipping
    threshold is drawn as a dashed line when known.

    Args:
        steps (sequence of int): the steps.
        values (sequence of float): the gradient norms.
        diagnosis (Diagnosis): what :func:`~fastnorm.diagnose` said of them.
        path (str or PathLike): the PNG to write.
        max_norm (float, optional): the clipping threshold.
        title (str, optional): the title, followed by the verdict. Default:
            the verdict alone.

    Returns:
        Figure: the matplotlib figure drawn, for further use.

    Raises:
        ImportError: matplotlib is not installed (``pip install matplotlib``).
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError("plotting needs matplotlib: pip install matplotlib") from exc

    fig = Figure(figsize=(8, 3.6), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    shown = [(s, v) for s, v in zip(steps, values) if math.isfinite(v) and v > 0]
    if shown:
        xs, ys = zip(*shown)
        ax.plot(xs, ys, lw=0.8, color="tab:gray", label="gradient norm")
    ax.set_yscale("log")
    shaded = set()
    for e in diagnosis.events:
        # A one-step event still gets a visible band.
        ax.axvspan(
            e.start_step - 0.5,
            e.end_step + 0.5,
            color=_COLORS[e.kind],
            alpha=0.2,
            lw=0,
            label=None if e.kind in shaded else e.kind,
        )
        shaded.add(e.kind)
    bad = [s for s, v in zip(steps, values) if not math.isfinite(v)]
    if bad:
        ax.plot(
            bad,
            [1.0] * len(bad),
            "|",
            color="tab:purple",
            ms=6,
            transform=ax.get_xaxis_transform(),
            clip_on=False,
        )
    if max_norm is not None:
        ax.axhline(max_norm, ls="--", lw=1, color="tab:green", label=f"max_norm={max_norm:g}")
    ax.set_xlabel("step")
    ax.set_ylabel("gradient norm")
    verdict = f"verdict: {diagnosis.verdict}"
    ax.set_title(f"{title} ({verdict})" if title else verdict)
    ax.grid(True, which="major", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize="small")
    fig.savefig(os.fspath(path))
    return fig
