"""Robust streaming statistics: running medians, a noise band, sliding extremes, a thinned series.

Pure Python; each structure keeps bounded memory however long the run.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, Union

# Another metric given to :func:`~fastnorm.diagnose`: a ``(steps, values)`` pair or a mapping step -> value.
ByStep = Union[Mapping[int, float], tuple[Iterable[int], Iterable[Any]]]

MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation
# The fewest points a rule counted in steps is judged on: a median of 3 needs two of them to agree, so one
# point of a log of every 10th step never makes a level, a return or a baseline on its own.
MIN_HELD = 3
# A loss whose step-to-step moves are this fraction of its level or more follows its batches (BatchNorm over
# 2 samples, a batch of 1): its level is read over more points, and larger batches are asked for first.
NOISY = 0.5


def midpoint(a: float, b: float) -> float:
    """``(a + b) / 2`` of two finite floats, finite however large they are (near 1.8e308 the sum is not)."""
    total = a + b
    return 0.5 * total if math.isfinite(total) else 0.5 * a + 0.5 * b


def mean(values: list[float]) -> float:
    """The exactly rounded mean of finite floats, finite however large they are (``math.fsum`` of values
    near 1.8e308 raises OverflowError; their shares of the mean do not overflow)."""
    try:
        return math.fsum(values) / len(values)
    except OverflowError:
        return _halved_mean(values)


def mean_of_shares(values: list[float]) -> float:
    """The mean of finite floats as the sum of their shares ``v / n`` (a window's logged mean), finite
    however large they are: the shares of values near 1.8e308 can round up past the largest float."""
    try:
        return math.fsum(v / len(values) for v in values)
    except OverflowError:
        return _halved_mean(values)


def _halved_mean(values: list[float]) -> float:
    """Twice the sum of halves of the shares (at most half the largest float), within the values."""
    half = 2.0 * math.fsum(v / (2 * len(values)) for v in values)
    return min(max(half, min(values)), max(values))  # within the values, whatever the rounding


def median(ordered: list[float]) -> float:
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else midpoint(ordered[mid - 1], ordered[mid])


def ratio(top: float, bottom: float) -> float:
    """``top / bottom`` for logged values, which may be 0 (a learning rate frozen at 0, a loss at 0): never
    raises. A nonzero over 0 is inf with the sign of ``top``, 0 over 0 is NaN (no ratio), and a quotient
    past the float range is inf, as float arithmetic has it. Every division by a logged value in the
    diagnosis goes through it; comparisons then read inf as "far more", NaN as "not more".
    """
    if bottom == 0:
        if top == 0 or math.isnan(top):
            return math.nan
        return math.copysign(math.inf, top) * math.copysign(1.0, bottom)
    return top / bottom


def times(top: float, bottom: float, spec: str = ".3g") -> str:
    """How many times ``bottom`` is ``top``, for a person: ``"12x"``; ``"infinitely many times"`` from 0."""
    r = ratio(top, bottom)
    if math.isfinite(r):
        return f"{r:{spec}}x"
    return "infinitely many times" if not math.isnan(r) else "an undefined multiple"


def number(value: Any) -> float | None:
    """The value as a float, or None when it is not a number (a string, None, a bool)."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def held(points: int, steps: int, n: int) -> bool:
    """Whether something has held for ``n`` points or ``n`` steps, whichever ends first, over
    ``min(n, MIN_HELD)`` points at least: a log of every 10th step reads 10 steps in 3 points, not 10.

    Args:
        points (int): how many points it has held for.
        steps (int): how many steps those points cover.
        n (int): the points (or steps) it must hold for.
    """
    return points >= n or (points >= MIN_HELD and steps >= n)


class Baseline:
    """The median of the last ``window`` in-band values, and the band around it.

    The noise scale comes from the differences between consecutive values, not
    from their spread around the median: a gradual trend inflates the spread,
    and a band that widened with it would follow an explosion instead of
    letting it leave.
    """

    def __init__(self, window: int, band_mads: float, min_band: float) -> None:
        self.values: deque[float] = deque()
        self.ordered: list[float] = []
        self.diffs: deque[float] = deque()
        self.ordered_diffs: list[float] = []
        self.window = window
        self.band_mads = band_mads
        self.min_band = min_band
        self.median = 0.0
        self.sigma = 0.0
        self.band = min_band

    def __len__(self) -> int:
        return len(self.values)

    def add(self, x: float) -> None:
        if len(self.values) == self.window:
            self.ordered.pop(bisect.bisect_left(self.ordered, self.values.popleft()))
            self.ordered_diffs.pop(bisect.bisect_left(self.ordered_diffs, self.diffs.popleft()))
        if self.values:
            d = abs(x - self.values[-1])
            self.diffs.append(d)
            bisect.insort(self.ordered_diffs, d)
        self.values.append(x)
        bisect.insort(self.ordered, x)
        self.median = median(self.ordered)
        if self.ordered_diffs:
            # For normal noise the median |difference| is 0.6745 * sqrt(2) * sigma.
            self.sigma = MAD_TO_SIGMA * median(self.ordered_diffs) / math.sqrt(2.0)
        self.band = max(self.band_mads * self.sigma, self.min_band)

    def restart(self, xs: Iterable[float]) -> None:
        for q in (self.values, self.ordered, self.diffs, self.ordered_diffs):
            q.clear()
        for x in xs:
            self.add(x)


class Extremes:
    """Sliding minimum and maximum of (index, step, value) over the last ``horizon`` indices."""

    def __init__(self, horizon: int) -> None:
        self.horizon = horizon
        self.low: deque[tuple[int, int, float]] = deque()
        self.high: deque[tuple[int, int, float]] = deque()
        self.history: deque[tuple[int, int, float]] = deque()

    def push(self, index: int, step: int, value: float) -> None:
        entry = (index, step, value)
        for dq, worse in ((self.low, lambda v: v >= value), (self.high, lambda v: v <= value)):
            while dq and worse(dq[-1][2]):
                dq.pop()
            dq.append(entry)
            while dq[0][0] <= index - self.horizon:
                dq.popleft()
        self.history.append(entry)
        while self.history[0][0] <= index - self.horizon:
            self.history.popleft()

    def left(self, bound: float, side: int) -> int:
        """The step after the last entry still within ``bound`` (from ``side``'s view)."""
        after = self.history[-1][1]
        for _, step, value in reversed(self.history):
            if side * (value - bound) <= 0:
                return after
            after = step
        return after


class Thinned:
    """A series kept at most ``2 * limit`` points long: beyond, neighbours are averaged in pairs.

    Constant memory however long the run; exact for runs of up to ``2 * limit`` points.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.points: list[tuple[int, float]] = []
        self.stride = 1  # how many original points each kept point averages
        self._pending: list[tuple[int, float]] = []

    def add(self, step: int, value: float) -> None:
        self._pending.append((step, value))
        if len(self._pending) < self.stride:
            return
        pending, self._pending = self._pending, []
        self.points.append((pending[0][0], mean([v for _, v in pending])))
        if len(self.points) >= 2 * self.limit:
            self.points = [(a[0], midpoint(a[1], b[1])) for a, b in zip(self.points[::2], self.points[1::2])]
            self.stride *= 2

    def all(self) -> list[tuple[int, float]]:
        if not self._pending:
            return list(self.points)
        tail = (self._pending[0][0], mean([v for _, v in self._pending]))
        return [*self.points, tail]

    def __len__(self) -> int:
        return len(self.points) + bool(self._pending)


def rolling_median(ys: list[float], w: int) -> list[float]:
    """The centered running median of width ``w`` (narrower at the ends)."""
    half = w // 2
    out = []
    window: list[float] = []
    lo = hi = 0  # window holds ys[lo:hi], sorted
    for i in range(len(ys)):
        while hi < min(len(ys), i + half + 1):
            bisect.insort(window, ys[hi])
            hi += 1
        while lo < i - half:
            window.pop(bisect.bisect_left(window, ys[lo]))
            lo += 1
        out.append(median(window))
    return out


def trend(steps: list[int], ys: list[float]) -> tuple[float, float]:
    """The least-squares line through ``(steps, ys)``: its change over the steps' span, and that change in
    standard errors (``(0, 0)`` for fewer than 3 points or no spread). The errors are widened for the
    correlation of neighbouring points' residuals (a logger's smoothing, a slow wander): a lag-1
    correlation r leaves n (1 - r) / (1 + r) points' worth of evidence."""
    n = len(ys)
    if n < 3:
        return 0.0, 0.0
    mx, my = sum(steps) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in steps)
    if sxx <= 0:
        return 0.0, 0.0
    slope = sum((x - mx) * (y - my) for x, y in zip(steps, ys)) / sxx
    res = [y - my - slope * (x - mx) for x, y in zip(steps, ys)]
    ss = sum(r * r for r in res)
    if ss <= 0:
        return slope * (steps[-1] - steps[0]), math.copysign(math.inf, slope) if slope else 0.0
    r1 = max(0.0, sum(a * b for a, b in zip(res, res[1:])) / ss)
    worth = max(3.0, n * (1 - r1) / (1 + r1))
    se = math.sqrt(ss / (n - 2) / sxx * n / worth)
    return slope * (steps[-1] - steps[0]), slope / se


def pairs(steps: Iterable[int], values: Iterable[Any], what: str = "") -> list[tuple[int, Any]]:
    """``(step, value)`` pairs of two equally long sequences; a ValueError naming ``what`` otherwise."""
    steps, values = list(steps), list(values)
    if len(steps) != len(values):
        raise ValueError(f"diagnose: {len(steps)} steps but {len(values)} {what + ' ' if what else ''}values")
    return [(int(s), v) for s, v in zip(steps, values)]


def by_step(value: ByStep | None, what: str) -> list[tuple[int, Any]]:
    """A mapping step -> value or a ``(steps, values)`` pair as sorted ``(step, value)`` pairs."""
    if value is None:
        return []
    if isinstance(value, Mapping):
        return sorted((int(s), v) for s, v in value.items())
    try:
        steps, values = value
    except (TypeError, ValueError):
        raise TypeError(
            f"diagnose: {what} must be a (steps, values) pair or a mapping step -> value"
        ) from None
    return pairs(steps, values, what)
