"""The picture of a diagnosis: the norm over steps on a log scale, events shaded, the loss beside it.

matplotlib is imported only here, through its object-oriented API with the Agg
canvas, so drawing neither needs a display nor changes the caller's pyplot
backend.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fastnorm.monitoring.diagnosis import (
    DECAY,
    DIVERGED,
    EXPLODING,
    GROWTH,
    INVALID,
    NONFINITE,
    SKIPPED,
    SPIKE,
    STALLED,
    VANISHING,
    Diagnosis,
)
from fastnorm.monitoring.diagnosis.robust import number

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLORS = {
    NONFINITE: "tab:purple",
    DIVERGED: "tab:red",
    EXPLODING: "tab:red",
    VANISHING: "tab:blue",
    STALLED: "tab:brown",
    SPIKE: "tab:orange",
    SKIPPED: "tab:olive",
    GROWTH: "tab:green",
    DECAY: "tab:green",
    INVALID: "black",
}
# The largest magnitude drawn: matplotlib's axes overflow near the largest float (a log axis puts a
# tick at 1e309, a linear one cannot span -1e308 to 1e308), so a norm beyond it is marked on the top
# edge with the non-finite ones, and a loss or threshold beyond it is left out.
CEILING = 1e300
MIN_WIDTH = (
    0.006  # the narrowest event band, as a fraction of the steps shown: a one-step event stays visible
)


def plot(
    steps: Sequence[int],
    values: Sequence[Any],
    diagnosis: Diagnosis,
    path: str | os.PathLike,
    *,
    max_norm: float | None = None,
    title: str | None = None,
    loss: tuple[Sequence[int], Sequence[Any]] | None = None,
) -> Figure:
    """Draws the series and its diagnosis into a PNG file.

    Each event is shaded over its step range, at least ``MIN_WIDTH`` of the
    axis wide so that a one-step event shows at any length. A log axis cannot
    show zero or non-finite values: zero norms are marked on the bottom edge,
    non-finite ones (and those above ``CEILING``, which matplotlib cannot
    draw) on the top edge. The clipping threshold is drawn dashed when known,
    and the loss on a second axis when given.

    Args:
        steps (sequence of int): the steps.
        values (sequence of float): the gradient norms.
        diagnosis (Diagnosis): what :func:`~fastnorm.diagnose` said of them.
        path (str or PathLike): the PNG to write.
        max_norm (float, optional): the clipping threshold.
        title (str, optional): the title, followed by the verdict. Default:
            the verdict alone.
        loss ((steps, values), optional): the training loss, drawn on a second axis.

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
    numbers = [(s, number(v)) for s, v in zip(steps, values)]
    # A gap in the line wherever the log axis cannot go (zero, non-finite, invalid).
    ys = [v if v is not None and 0 < v <= CEILING else math.nan for _, v in numbers]
    if any(not math.isnan(y) for y in ys):
        ax.plot(list(steps), ys, lw=0.8, color="tab:gray", label="gradient norm")
    ax.set_yscale("log")
    edge = ax.get_xaxis_transform()  # x in steps, y in axis fractions
    zeros = [s for s, v in numbers if v == 0]
    if zeros:
        ax.plot(
            zeros,
            [0.0] * len(zeros),
            "v",
            color="tab:blue",
            ms=5,
            transform=edge,
            clip_on=False,
            label="zero norm",
        )
    bad = [s for s, v in numbers if v is not None and not abs(v) <= CEILING]
    if bad:
        ax.plot(bad, [1.0] * len(bad), "|", color="tab:purple", ms=6, transform=edge, clip_on=False)
    least = 1.0
    if steps:
        lo, hi = min(steps), max(steps)
        ax.set_xlim(lo - 0.5, hi + 0.5)
        least = MIN_WIDTH * max(hi - lo + 1, 1)
    shaded = set()
    for e in diagnosis.events:
        left, right = e.start_step - 0.5, e.end_step + 0.5
        if right - left < least:
            middle = 0.5 * (left + right)
            left, right = middle - 0.5 * least, middle + 0.5 * least
        ax.axvspan(
            left, right, color=COLORS[e.kind], alpha=0.2, lw=0, label=None if e.kind in shaded else e.kind
        )
        shaded.add(e.kind)
    if max_norm is not None and max_norm <= CEILING:
        ax.axhline(max_norm, ls="--", lw=1, color="tab:green", label=f"max_norm={max_norm:g}")
    ax.set_xlabel("step")
    ax.set_ylabel("gradient norm")
    verdict = f"verdict: {diagnosis.verdict}"
    ax.set_title(f"{title} ({verdict})" if title else verdict)
    ax.grid(True, which="major", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if loss is not None:
        points = [(s, number(v)) for s, v in zip(*loss)]
        points = [(s, v) for s, v in points if v is not None and abs(v) <= CEILING]
        if points:
            twin = ax.twinx()
            xs, ls = zip(*points)
            (line,) = twin.plot(xs, ls, lw=0.8, color="tab:cyan", alpha=0.7, label="loss")
            if min(ls) > 0 and max(ls) / min(ls) > 100:
                twin.set_yscale("log")
            twin.set_ylabel("loss")
            handles, labels = [*handles, line], [*labels, "loss"]
    if handles:
        ax.legend(handles, labels, loc="best", fontsize="small")
    fig.savefig(os.fspath(path))
    return fig
