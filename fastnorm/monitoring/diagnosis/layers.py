"""The per-layer norms: vanishing gradients that a flat total hides.

A spread of ``layer_orders`` orders of magnitude between layers, or layers whose
gradient became exactly 0 (after having been non-zero: frozen or unused layers,
always 0, are ignored), is vanishing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from fastnorm.monitoring.diagnosis.events import VANISHING, Event, num
from fastnorm.monitoring.diagnosis.robust import number

_F32_EPS = 2.0**-24  # below this fraction of the largest layer norm, float32 cannot even add it


class LayerSignal:
    """What the per-layer snapshots showed: the current vanishing streak and the past ones."""

    def __init__(self, layer_orders: float) -> None:
        self.layer_orders = layer_orders
        self.seen: set[str] = set()  # layers that had a non-zero gradient at some snapshot
        self.streak_start: int | None = None  # the first snapshot of the current vanishing streak
        self.streak_first = False  # that streak began at the very first snapshot
        self.streak_detail = ""
        self.streak_end: int | None = None
        self.closed: list[tuple[int, int, bool, str]] = []  # (start, end, from_first, detail) of past streaks
        self.snapshots = 0

    @property
    def vanished(self) -> bool:
        """Some snapshot showed vanishing layers."""
        return self.streak_start is not None or bool(self.closed)

    def update(self, step: int, norms: Mapping[str, Any]) -> None:
        values = {name: number(v) for name, v in norms.items()}
        values = {n: v for n, v in values.items() if v is not None and math.isfinite(v) and v >= 0}
        self.snapshots += 1
        zeros = [n for n, v in values.items() if v == 0 and n in self.seen]
        self.seen.update(n for n, v in values.items() if v > 0)
        positive = {n: v for n, v in values.items() if v > 0}
        detail = ""
        if positive:
            top_name = max(positive, key=positive.get)
            top = positive[top_name]
            low_name = min(positive, key=positive.get)
            spread = math.log10(top / positive[low_name])
            tiny = [n for n, v in values.items() if n in self.seen and v < top * _F32_EPS]
            if spread >= self.layer_orders or zeros:
                detail = (
                    f"at step {step} the per-layer norms span {spread:.0f} orders of magnitude, from "
                    f"{low_name!r} ({num(positive[low_name])}) to {top_name!r} ({num(top)})"
                )
                if zeros:
                    detail += f"; exactly 0: {_names(zeros)}"
                below = [n for n in tiny if n not in zeros]
                if below:
                    detail += f"; below float32 resolution against the largest: {_names(below)}"
        if detail:
            if self.streak_start is None:
                self.streak_start = step
                self.streak_first = self.snapshots == 1
            self.streak_detail = detail
            self.streak_end = step
        elif self.streak_start is not None:
            self.closed.append((self.streak_start, self.streak_end, self.streak_first, self.streak_detail))
            self.streak_start = None

    def events(self, first_step: int | None, last: int | None) -> list[Event]:
        """The vanishing streaks, as events without actions (the diagnoser chooses them)."""
        streaks = list(self.closed)
        if self.streak_start is not None:
            streaks.append((self.streak_start, last, self.streak_first, self.streak_detail))
        events = []
        for start, end, from_first, detail in streaks:
            if from_first:
                # Already so at the first per-layer reading: dated from the first step read.
                start = min(start, first_step if first_step is not None else start)
                detail += " (so from the first per-layer reading)"
            events.append(Event(VANISHING, start, end, detail))
        return events


def _names(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "") + f" ({len(names)})"
