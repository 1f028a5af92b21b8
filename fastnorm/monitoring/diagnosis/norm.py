"""The norm's own signal: departures from its running baseline, and slow drifts of the baseline itself.

The norm is read in log10 ("orders of magnitude") against a running baseline:
the median of the last ``window`` points that lay inside the band, where the
band is ``max(band_mads * sigma, min_band)`` around that median and sigma is the
robust noise scale of consecutive differences. Points outside the band do not
enter the baseline, so the baseline holds still while the norm departs from it,
and a departure is measured against what was normal before it. A departure ends
after ``recover`` consecutive points back in the band. A departure whose
sustained level (the median of its last ``sustain`` points) reaches
``explode_orders`` above (``vanish_orders`` below) is exploding (vanishing), as
is a baseline that drifts that far within ``horizon`` points; a shorter one of
at least ``spike_orders`` is a spike; one that stays out for ``window`` points
short of those levels is a new normal.

Every such "for N points" (the warm-up, ``sustain``, ``recover``, ``window``)
is N points or N steps, whichever ends first, over 3 points at least
(:func:`~fastnorm.monitoring.diagnosis.robust.held`): a log of every 10th step
sustains a level over 3 points (30 steps), not 10 (100 steps), and reads the
same run as a log of every step does.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field, replace

from fastnorm.monitoring.diagnosis.events import EXPLODING, LOG_ZERO, SPIKE, VANISHING, Event, from_log
from fastnorm.monitoring.diagnosis.robust import MIN_HELD, Baseline, Extremes, Thinned, held, median

_LEVEL_POINTS = 1024  # the norm's levels are kept at most this finely (pairs averaged beyond)
# A baseline still climbing: up this far (1.6x) over its last ``window`` points, at its highest at the last.
CLIMB_ORDERS = 0.2
# A shift of the last points' median (NormSignal._shifted) counts at this many of its standard errors; the
# median of n normal points has 1.25 sigma / sqrt(n) of them.
SHIFT_ERRORS = 3.0
MEDIAN_NOISE = 1.2533


@dataclass
class Departure:
    """Consecutive finite points on one side of the band, against a frozen baseline."""

    side: int  # +1 above the band, -1 below
    start: int
    origin: float  # the baseline (log10) when it began
    recent: deque  # (step, deviation from origin) of its last `sustain` points
    xs: deque  # the last `window` log10 values, to restart the baseline from
    first: int | None = None  # the step of its first point (`start` may be walked back before it)
    end: int = 0
    count: int = 0
    peak: float = 0.0  # the largest deviation on its side, in orders of magnitude
    level: float = 0.0  # the largest sustained deviation (median of `recent`)
    nonfinite: bool = False  # non-finite values came while it was out of the band
    pending: list = field(default_factory=list)  # (step, log10) back in the band, not yet `recover` of them

    def add(self, step: int, x: float, sustain: int) -> None:
        dev = self.side * (x - self.origin)
        if self.first is None:
            self.first = step
        self.end = step
        self.count += 1
        self.peak = max(self.peak, dev)
        self.recent.append((step, dev))
        self.xs.append(x)
        if self.held(sustain):
            self.level = max(self.level, median(sorted(self._tail(sustain))))

    def held(self, n: int) -> bool:
        """Out of the band for ``n`` points or ``n`` steps, whichever came first (see :func:`held`)."""
        return held(self.count, self.end - self.first + 1, n)

    def _tail(self, sustain: int) -> list[float]:
        """The deviations of its last ``sustain`` points or ``sustain`` steps, whichever are fewer
        (``MIN_HELD`` points at least)."""
        tail = []
        for step, dev in reversed(self.recent):
            if len(tail) >= MIN_HELD and self.end - step + 1 > sustain:
                break
            tail.append(dev)
        return tail


@dataclass(frozen=True)
class Found:
    """A norm event as detected: the event, and what its actions depend on."""

    event: Event
    side: int
    base: float  # log10 of the baseline it departed from
    extreme: float  # log10 of its peak (or trough)
    nonfinite: bool = False
    returned: bool = False  # it came back to the band
    climbing: bool = False  # the baseline still climbing at the last point read (NormSignal._climbing)


@dataclass
class _Drift:
    kind: str
    start: int
    end: int
    low: float
    high: float


class NormSignal:
    """The finite norms, read one at a time (in log10), and the departures and drifts they show."""

    def __init__(
        self,
        *,
        window: int,
        warmup: int,
        band_mads: float,
        min_band: float,
        spike_orders: float,
        explode_orders: float,
        vanish_orders: float,
        sustain: int,
        recover: int,
        horizon: int,
    ) -> None:
        self.window = window
        self.warmup = warmup
        self.spike_orders = spike_orders
        self.explode_orders = explode_orders
        self.vanish_orders = vanish_orders
        self.sustain = sustain
        self.recover = recover
        self._base = Baseline(window, band_mads, min_band)
        self._drift_ref = Extremes(horizon)
        self._climb: deque[tuple[int, float]] = deque(maxlen=window)  # (step, baseline) as points entered it
        # (step, log10) of the latest points, this one included: a departure's walk back reads the last
        # `window` of them, a shift (_shifted) all
        self._latest: deque[tuple[int, float]] = deque(maxlen=window + sustain)
        self._found: list[Found] = []
        self._ups: deque[tuple[int, int, float]] = deque(maxlen=256)  # (start, end, peak) upwards
        self._dep: Departure | None = None
        self._drift: _Drift | None = None
        self.finite = 0
        self.levels = Thinned(_LEVEL_POINTS)  # log10 of the finite norms, for levels around a loss jump
        self._first: int | None = None  # the step of the first finite norm
        self._previous: int | None = None  # the step of the finite norm before this one

    def nonfinite(self) -> None:
        """A non-finite norm came: it marks the open departure."""
        if self._dep is not None:
            self._dep.nonfinite = True

    def point(self, step: int, x: float) -> None:
        """Reads one finite norm, ``x`` its log10."""
        self.finite += 1
        self.levels.add(step, x)
        base = self._base
        self._latest.append((step, x))
        if self._first is None:
            self._first = step
        warming = self._warming()
        self._previous = step
        if warming:
            base.add(x)
            return
        dev = x - base.median
        side = 0 if abs(dev) <= base.band else (1 if dev > 0 else -1)
        dep = self._dep
        if dep is not None:
            if side == dep.side:
                for s, px in dep.pending:  # a dip into the band too short to count as a return
                    dep.add(s, px, self.sustain)
                dep.pending.clear()
            elif side == 0 and not self._returned(dep, step):
                dep.pending.append((step, x))
                return
            else:
                self._close(dep, True, self._found, self._ups)
                self._dep = None
                for s, px in dep.pending:
                    base.add(px)
                    self._track_drift(s)
        if side == 0:
            base.add(x)
            self._track_drift(step)
            return
        dep = self._dep
        if dep is None:
            dep = self._dep = Departure(
                side,
                self._walk_back(step, side),
                base.median,
                deque(maxlen=self.sustain),
                deque(maxlen=self.window),
            )
        dep.add(step, x, self.sustain)
        if dep.held(self.window) and not self._alarming(dep):
            # Out of the band for a whole window and still short of an explosion: a new normal.
            if dep.side > 0:
                self._ups.append((dep.start, dep.end, dep.peak))
            base.restart(dep.xs)
            self._dep = None
            self._track_drift(step)

    def _warming(self) -> bool:
        """The baseline is still being formed: ``warmup`` points, or ``warmup`` steps, whichever ends first
        (a log of every 10th step judges its 4th point, not its 11th, 100 steps in), and 3 points at least.
        Every point before the warm-up's end is in the baseline: those up to the one before this."""
        if self._previous is None:
            return True
        return not held(len(self._base), self._previous - self._first + 1, self.warmup)

    def _returned(self, dep: Departure, step: int) -> bool:
        """Back in the band for ``recover`` points or steps, this one included: the departure has ended."""
        since = dep.pending[0][0] if dep.pending else step
        return held(len(dep.pending) + 1, step - since + 1, self.recover)

    def _walk_back(self, step: int, side: int) -> int:
        """Where a departure began: back over the points already two sigmas out on its side,
        so that a gradual rise is dated from near its foot, not from where it crossed the band."""
        start = step
        bound = self._base.median + 2.0 * side * self._base.sigma
        for s, x in itertools.islice(reversed(self._latest), 1, self.window):  # the window before this point
            if side * (x - bound) <= 0:
                break
            start = s
        return start

    def _track_drift(self, step: int) -> None:
        base, ref = self._base, self._drift_ref
        self._climb.append((step, base.median))
        ref.push(self.finite, step, base.median)
        rise = base.median - ref.low[0][2]
        fall = ref.high[0][2] - base.median
        kind = EXPLODING if rise >= self.explode_orders else VANISHING if fall >= self.vanish_orders else None
        drift = self._drift
        if drift is not None and drift.kind != kind:
            self._found.append(self._drift_found(drift))
            drift = self._drift = None
        if kind is None:
            return
        if drift is None:
            side = 1 if kind == EXPLODING else -1
            anchor = ref.low[0][2] if side > 0 else ref.high[0][2]
            start = ref.left(anchor + side * base.sigma, side)
            drift = self._drift = _Drift(kind, start, step, anchor, base.median)
        drift.end = step
        drift.high = base.median

    # -- classification ------------------------------------------------------

    def _threshold(self, side: int) -> float:
        return self.explode_orders if side > 0 else self.vanish_orders

    def _alarming(self, dep: Departure) -> bool:
        return dep.level >= self._threshold(dep.side)

    def _classify(self, dep: Departure, returned: bool) -> Found | None:
        extreme = dep.origin + dep.side * dep.peak
        how = "rose" if dep.side > 0 else "fell"
        if extreme <= LOG_ZERO:
            moved = f"fell to exactly 0 from the running baseline {from_log(dep.origin)}"
        else:
            moved = (
                f"{how} {dep.peak:.1f} orders of magnitude (to {from_log(extreme)}) from the running "
                f"baseline {from_log(dep.origin)}"
            )
        if self._alarming(dep) or (dep.nonfinite and dep.peak >= self._threshold(dep.side)):
            kind = EXPLODING if dep.side > 0 else VANISHING
            ending = "returned to the band" if returned else "had not returned by the last step"
            if dep.nonfinite:
                ending += ", running into non-finite values"
            event = Event(kind, dep.start, dep.end, f"{moved}; {ending}")
            return Found(event, dep.side, dep.origin, extreme, dep.nonfinite, returned)
        if dep.peak >= self.spike_orders and (returned or not dep.held(self.sustain)):
            ending = "back in the band" if returned else "not back in the band by the last step"
            event = Event(SPIKE, dep.start, dep.end, f"{moved}, {ending}")
            return Found(event, dep.side, dep.origin, extreme)
        return None

    def _close(self, dep: Departure, returned: bool, found: list, ups: deque | list) -> None:
        """Adds a departure to the norm's events (``found``) and, when upwards, to its rises (``ups``)."""
        if dep.side > 0:
            ups.append((dep.start, dep.end, dep.peak))
        event = self._classify(dep, returned)
        if event is not None:
            found.append(event)

    def _climbing(self, last: int | None) -> list[Found]:
        """The baseline still climbing at the last point read, short of a drift: up ``CLIMB_ORDERS`` or more
        over its last ``window`` points and at its highest at the last one. Exploding while it climbs, so
        that the warning comes before the loss turns (a slow rise of the rate lifts the norm's baseline, in
        its band, for tens of steps before the blow-up); a baseline that levels off is no longer climbing,
        and the warning is withdrawn."""
        climb = self._climb
        if len(climb) < climb.maxlen or last is None or climb[-1][0] != last:
            return []
        low_step, low = min(climb, key=lambda c: c[1])
        high = climb[-1][1]
        if high - low < CLIMB_ORDERS or high < max(b for _, b in climb):
            return []
        detail = (
            f"rising: the running baseline grew from {from_log(low)} at step {low_step} to {from_log(high)} "
            f"({10 ** (high - low):.1f}x), and was still growing at the last step"
        )
        return [Found(Event(EXPLODING, low_step, last, detail), 1, low, high, climbing=True)]

    def _shifted(self, last: int | None, before_step: int | None = None) -> list[Found]:
        """The norm's last ``sustain`` points above the ``window`` before them, inside a band too wide for a
        departure (a noisy norm's) or just leaving it, still rising: their median up ``CLIMB_ORDERS`` or more
        and ``SHIFT_ERRORS`` of its standard errors (the two medians' noise, from the baseline's sigma) from
        the median before, and above the median of the ``sustain`` points before them. A rate that keeps
        rising lifts a noisy norm 2-3x in ten steps, faster than its baseline (the median of its band's
        points) follows: a masked LM's 1.4 to 3.7 within its band of 8x, 17 steps before its loss blew up.
        ``before_step``: a departure began there, too young to be judged: the points before it (a norm
        already rising inside its band before it left it; a jump out of it is no shift)."""
        pts, k = list(self._latest), self.sustain
        if last is None or not pts or pts[-1][0] != last:
            return []
        if before_step is not None:
            pts = [p for p in pts if p[0] < before_step]
        if len(pts) < self._latest.maxlen - k or len(pts) - k < MIN_HELD:  # a window no longer than sustain
            return []
        xs = [x for _, x in pts]
        before, now = median(sorted(xs[:-k])), median(sorted(xs[-k:]))
        previous = median(sorted(xs[-2 * k : -k]))
        errors = SHIFT_ERRORS * MEDIAN_NOISE * self._base.sigma * math.sqrt(1 / k + 1 / (len(xs) - k))
        if now - before < max(CLIMB_ORDERS, errors) or now <= previous:
            return []
        start = pts[-k][0]
        detail = (
            f"rising: its last {k} points at {from_log(now)}, {10 ** (now - before):.1f}x the "
            f"{from_log(before)} of the {len(xs) - k} before them, and still rising at the last step"
        )
        return [Found(Event(EXPLODING, start, last, detail), 1, before, now, climbing=True)]

    def _drift_found(self, drift: _Drift) -> Found:
        how = "grew" if drift.kind == EXPLODING else "shrank"
        detail = (
            f"the running baseline {how} from {from_log(drift.low)} to {from_log(drift.high)} "
            f"({abs(drift.high - drift.low):.1f} orders of magnitude)"
        )
        side = 1 if drift.kind == EXPLODING else -1
        return Found(Event(drift.kind, drift.start, drift.end, detail), side, drift.low, drift.high)

    # -- output --------------------------------------------------------------

    def found(self, last: int | None) -> tuple[list[Found], list[tuple[int, int, float]]]:
        """The norm's events so far, merged and by start step (those still open end at ``last``),
        and its rises ``(start, end, peak)``."""
        found = list(self._found)
        ups = list(self._ups)
        if self._dep is not None:
            self._close(self._dep, bool(self._dep.pending), found, ups)
            if self._dep.side > 0 and not self._dep.held(self.sustain):  # too young: the shift before it
                found += self._shifted(last, self._dep.first)
        if self._drift is not None:
            drift = self._drift_found(self._drift)
            found.append(replace(drift, event=replace(drift.event, end_step=last)))
        elif self._dep is None:
            found += self._climbing(last) or self._shifted(last)
        return _merge(sorted(found, key=lambda f: (f.event.start_step, f.event.end_step))), ups


def _merge(found: list[Found]) -> list[Found]:
    """One event for overlapping events of one kind (a departure and the drift it caused)."""
    merged: list[Found] = []
    for f in found:
        e = f.event
        for i, m in enumerate(merged):
            me = m.event
            if me.kind == e.kind and e.start_step <= me.end_step and me.start_step <= e.end_step:
                span = replace(
                    me, start_step=min(me.start_step, e.start_step), end_step=max(me.end_step, e.end_step)
                )
                merged[i] = replace(
                    m,
                    event=span,
                    extreme=max(m.extreme, f.extreme) if m.side > 0 else min(m.extreme, f.extreme),
                )
                break
        else:
            merged.append(f)
    return merged
