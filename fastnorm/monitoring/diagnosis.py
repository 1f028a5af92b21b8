"""What a gradient-norm series means, and what to do about it.

Pure Python over plain numbers (no torch, no numpy), so it runs anywhere a
metrics file can be read and is testable without a device.

The series is read in log10 ("orders of magnitude"), against a running
baseline: the median of the last ``window`` points that lay inside the band,
where the band is ``max(band_mads * sigma, min_band)`` around that median and
sigma is the robust (median-based) noise scale of consecutive differences.
Points outside the band do not enter the baseline, so the baseline holds still
while the norm departs from it, and a departure is measured against what was
normal before it. A departure ends after ``recover`` consecutive points back in
the band. Then:

* ``nonfinite``: a NaN or inf value; one event per run of them.
* ``exploding`` / ``vanishing``: a departure above (below) the band whose
  sustained level (the median of its last ``sustain`` points) reaches
  ``explode_orders`` (``vanish_orders``) orders of magnitude, or one that ran
  into non-finite values after reaching that far; also a baseline that drifts
  that far within ``horizon`` points (growth too slow to leave the band).
* ``spike``: a departure of at least ``spike_orders`` orders of magnitude that
  returns to the band without reaching a sustained level as above (normal
  during warmup and at learning-rate schedule changes).

A departure that stays out of the band for ``window`` points without reaching
the exploding or vanishing level is a new normal (a level shift): the baseline
restarts from it, and no event is reported.

The verdict is the most severe kind among the events: nonfinite > exploding >
vanishing > stable. Spikes alone leave the verdict ``stable``; they are still
listed as events.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace

STABLE = "stable"
EXPLODING = "exploding"
VANISHING = "vanishing"
NONFINITE = "nonfinite"
SPIKE = "spike"

UNSTABLE = (NONFINITE, EXPLODING, VANISHING)  # most severe first

ACTIONS: dict[str, tuple[str, ...]] = {
    EXPLODING: (
        "Lower the learning rate (by 3-10x), or lengthen its warmup.",
        "Switch to a more stable precision: bf16-mixed instead of fp16 (16-mixed), or 32-true.",
    ),
    VANISHING: (
        "Raise the learning rate, especially for small models (about 10M parameters or fewer).",
        "Check the input normalisation: inputs scaled to roughly zero mean and unit variance.",
    ),
    NONFINITE: (
        "Re-run from the latest checkpoint.",
        "If it reproduces, run in full fp32 (32-true) to see whether reduced precision causes it.",
    ),
}

_MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation
_ZERO = 1e-30  # a zero norm is read as this, so that log10 stays finite


@dataclass(frozen=True)
class Event:
    """One stretch of the series that is not ordinary noise.

    Attributes:
        kind (str): ``"nonfinite"``, ``"exploding"``, ``"vanishing"`` or ``"spike"``.
        start_step (int): the first step of the event.
        end_step (int): its last step: for an explosion or a vanishing that
            had not ended, the last finite step; for non-finite values that
            had not ended, the last step.
        detail (str): what happened, in numbers.
    """

    kind: str
    start_step: int
    end_step: int
    detail: str


@dataclass(frozen=True)
class Diagnosis:
    """The verdict on a series, the events behind it and the next actions.

    Attributes:
        verdict (str): ``"stable"``, ``"exploding"``, ``"vanishing"`` or ``"nonfinite"``.
        events (tuple of Event): every event, by start step.
        actions (tuple of str): what a practitioner would try next; empty when stable.
        steps (int): how many points were read.
    """

    verdict: str
    events: tuple[Event, ...] = ()
    actions: tuple[str, ...] = ()
    steps: int = 0

    @property
    def unstable(self) -> bool:
        """True for every verdict but ``stable``."""
        return self.verdict != STABLE

    def to_dict(self) -> dict:
        """The diagnosis as plain JSON-ready data."""
        return {
            "verdict": self.verdict,
            "events": [asdict(e) for e in self.events],
            "actions": list(self.actions),
            "steps": self.steps,
        }

    def report(self) -> str:
        """A few lines for a person: the verdict, each event, the next actions."""
        if self.steps == 0:
            return "verdict: stable (no values read)"
        lines = [f"verdict: {self.verdict} ({self.steps} steps read)"]
        for e in self.events:
            where = (
                f"step {e.start_step}" if e.start_step == e.end_step else f"steps {e.start_step}-{e.end_step}"
            )
            lines.append(f"  {e.kind:9s} {where}: {e.detail}")
        if self.actions:
            lines.append("next actions:")
            lines.extend(f"  - {a}" for a in self.actions)
        return "\n".join(lines)


@dataclass
class _Departure:
    """Consecutive finite points on one side of the band, against a frozen baseline."""

    side: int  # +1 above the band, -1 below
    start: int
    origin: float  # the baseline (log10) when it began
    recent: deque  # the last `sustain` deviations from origin
    xs: deque  # the last `window` log10 values, to restart the baseline from
    end: int = 0
    count: int = 0
    peak: float = 0.0  # the largest deviation on its side, in orders of magnitude
    level: float = 0.0  # the largest sustained deviation (median of `recent`)
    nonfinite: bool = False  # non-finite values came while it was out of the band
    pending: list = field(default_factory=list)  # (step, log10) back in the band, not yet `recover` of them

    def add(self, step: int, x: float, sustain: int) -> None:
        dev = self.side * (x - self.origin)
        self.end = step
        self.count += 1
        self.peak = max(self.peak, dev)
        self.recent.append(dev)
        self.xs.append(x)
        if self.count >= sustain:
            self.level = max(self.level, _median(sorted(self.recent)))


@dataclass
class _Drift:
    kind: str
    start: int
    end: int
    low: float
    high: float


def _median(ordered: list[float]) -> float:
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


class _Baseline:
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
        self.median = _median(self.ordered)
        if self.ordered_diffs:
            # For normal noise the median |difference| is 0.6745 * sqrt(2) * sigma.
            self.sigma = _MAD_TO_SIGMA * _median(self.ordered_diffs) / math.sqrt(2.0)
        self.band = max(self.band_mads * self.sigma, self.min_band)

    def restart(self, xs: Iterable[float]) -> None:
        for q in (self.values, self.ordered, self.diffs, self.ordered_diffs):
            q.clear()
        for x in xs:
            self.add(x)


class _Extremes:
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


class Diagnoser:
    r"""Diagnoses a gradient-norm series as it arrives, in constant memory.

    :func:`diagnose` reads a whole series at once; ``Diagnoser`` takes it in
    pieces (``GradNormMonitor`` feeds it each window), keeping only the running
    baseline, so a long run costs no more per point than a short one.

    Args:
        window (int): points in the running baseline. Default: 50.
        warmup (int): points read before anything is judged. Default: 10.
        band_mads (float): half-width of the band, in robust standard
            deviations of the baseline's log10 values (from the median
            absolute difference of consecutive values). Default: 5.
        min_band (float): the narrowest half-width, in orders of magnitude
            (0.3 is a factor of 2). Default: 0.3.
        spike_orders (float): how far a short departure must reach to be a
            spike, in orders of magnitude. Default: 1 (10x).
        explode_orders (float): the sustained rise that is an explosion.
            Default: 2 (100x).
        vanish_orders (float): the sustained fall that is vanishing.
            Default: 3 (1000x); healthy runs often fall 10-100x early on.
        sustain (int): points over which a level counts as sustained: a
            departure's level is the median of its last ``sustain`` points,
            so shorter excursions never make it. Default: 10.
        recover (int): consecutive points back in the band that end a
            departure; a shorter dip belongs to it. Default: 3.
        horizon (int): points over which a slow drift of the baseline itself
            is measured. Default: 1000.

    Example::

        >>> d = Diagnoser()
        >>> d.update(range(100), [1.0 + 0.01 * (i % 7) for i in range(100)])
        >>> d.result().verdict
        'stable'
    """

    def __init__(
        self,
        *,
        window: int = 50,
        warmup: int = 10,
        band_mads: float = 5.0,
        min_band: float = 0.3,
        spike_orders: float = 1.0,
        explode_orders: float = 2.0,
        vanish_orders: float = 3.0,
        sustain: int = 10,
        recover: int = 3,
        horizon: int = 1000,
    ) -> None:
        for name, value in (
            ("window", window),
            ("warmup", warmup),
            ("sustain", sustain),
            ("recover", recover),
            ("horizon", horizon),
        ):
            if int(value) != value or value < 1:
                raise ValueError(f"Diagnoser: {name} must be a positive integer, got {value!r}")
        for name, value in (
            ("band_mads", band_mads),
            ("min_band", min_band),
            ("spike_orders", spike_orders),
            ("explode_orders", explode_orders),
            ("vanish_orders", vanish_orders),
        ):
            if not value > 0:
                raise ValueError(f"Diagnoser: {name} must be > 0, got {value!r}")
        if warmup > window:
            raise ValueError(f"Diagnoser: warmup ({warmup}) cannot exceed window ({window})")
        self.window = int(window)
        self.warmup = int(warmup)
        self.spike_orders = spike_orders
        self.explode_orders = explode_orders
        self.vanish_orders = vanish_orders
        self.sustain = int(sustain)
        self.recover = int(recover)
        self._base = _Baseline(self.window, band_mads, min_band)
        self._drift_ref = _Extremes(int(horizon))
        self._recent: deque[tuple[int, float]] = deque(maxlen=self.window)  # (step, log10) before now
        self._events: list[Event] = []
        self._dep: _Departure | None = None
        self._drift: _Drift | None = None
        self._nonfinite: list = []  # [start, end, count, first value] of the open run
        self._count = 0
        self._finite = 0
        self._last_step: int | None = None

    # -- input ---------------------------------------------------------------

    def update(self, steps: Iterable[int], values: Iterable[float]) -> None:
        """Reads more points, in step order.

        Args:
            steps (iterable of int): the step of each value.
            values (iterable of float): gradient norms (>= 0; NaN and inf allowed).
        """
        steps, values = list(steps), list(values)
        if len(steps) != len(values):
            raise ValueError(f"diagnose: {len(steps)} steps but {len(values)} values")
        for step, value in zip(steps, values):
            self._point(int(step), float(value))

    def _point(self, step: int, value: float) -> None:
        self._count += 1
        self._last_step = step
        if not math.isfinite(value):
            if self._nonfinite:
                self._nonfinite[1] = step
                self._nonfinite[2] += 1
            else:
                self._nonfinite = [step, step, 1, value]
            if self._dep is not None:
                self._dep.nonfinite = True
            return
        if value < 0:
            raise ValueError(f"diagnose: a norm cannot be negative, got {value} at step {step}")
        if self._nonfinite:
            start, end, count, first = self._nonfinite
            self._events.append(
                Event(NONFINITE, start, end, f"{count} non-finite value(s), the first {first}")
            )
            self._nonfinite = []
        x = math.log10(max(value, _ZERO))
        self._finite += 1
        base = self._base
        if len(base) < self.warmup:
            base.add(x)
            self._recent.append((step, x))
            return
        dev = x - base.median
        side = 0 if abs(dev) <= base.band else (1 if dev > 0 else -1)
        self._recent.append((step, x))
        dep = self._dep
        if dep is not None:
            if side == dep.side:
                for s, px in dep.pending:  # a dip into the band too short to count as a return
                    dep.add(s, px, self.sustain)
                dep.pending.clear()
            elif side == 0 and len(dep.pending) + 1 < self.recover:
                dep.pending.append((step, x))
                return
            else:
                self._close(dep, returned=True)
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
            dep = self._dep = _Departure(
                side,
                self._walk_back(step, side),
                base.median,
                deque(maxlen=self.sustain),
                deque(maxlen=self.window),
            )
        dep.add(step, x, self.sustain)
        if dep.count >= self.window and not self._alarming(dep):
            # Out of the band for a whole window and still short of an explosion: a new normal.
            base.restart(dep.xs)
            self._dep = None
            self._track_drift(step)

    def _walk_back(self, step: int, side: int) -> int:
        """Where a departure began: back over the points already two sigmas out on its side,
        so that a gradual rise is dated from near its foot, not from where it crossed the band."""
        start = step
        bound = self._base.median + 2.0 * side * self._base.sigma
        for s, x in itertools.islice(reversed(self._recent), 1, None):  # before this point
            if side * (x - bound) <= 0:
                break
            start = s
        return start

    def _track_drift(self, step: int) -> None:
        base, ref = self._base, self._drift_ref
        ref.push(self._finite, step, base.median)
        rise = base.median - ref.low[0][2]
        fall = ref.high[0][2] - base.median
        kind = EXPLODING if rise >= self.explode_orders else VANISHING if fall >= self.vanish_orders else None
        drift = self._drift
        if drift is not None and drift.kind != kind:
            self._events.append(self._drift_event(drift))
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

    def _alarming(self, dep: _Departure) -> bool:
        return dep.level >= self._threshold(dep.side)

    def _classify(self, dep: _Departure, returned: bool) -> Event | None:
        base = 10.0**dep.origin
        extreme = 10.0 ** (dep.origin + dep.side * dep.peak)
        how = "rose" if dep.side > 0 else "fell"
        if self._alarming(dep) or (dep.nonfinite and dep.peak >= self._threshold(dep.side)):
            kind = EXPLODING if dep.side > 0 else VANISHING
            ending = "returned to the band" if returned else "had not returned by the last step"
            if dep.nonfinite:
                ending += ", running into non-finite values"
            detail = (
                f"{how} {dep.peak:.1f} orders of magnitude (to {extreme:.3g}) from the running "
                f"baseline {base:.3g}; {ending}"
            )
            return Event(kind, dep.start, dep.end, detail)
        if dep.peak >= self.spike_orders and (returned or dep.count < self.sustain):
            ending = "back in the band" if returned else "not back in the band by the last step"
            detail = (
                f"{how} {dep.peak:.1f} orders of magnitude (to {extreme:.3g}) from the running "
                f"baseline {base:.3g}, {ending} (normal during warmup or a learning-rate change)"
            )
            return Event(SPIKE, dep.start, dep.end, detail)
        return None

    def _close(self, dep: _Departure, returned: bool) -> None:
        event = self._classify(dep, returned)
        if event is not None:
            self._events.append(event)

    def _drift_event(self, drift: _Drift) -> Event:
        how = "grew" if drift.kind == EXPLODING else "shrank"
        detail = (
            f"the running baseline {how} from {10.0**drift.low:.3g} to {10.0**drift.high:.3g} "
            f"({abs(drift.high - drift.low):.1f} orders of magnitude)"
        )
        return Event(drift.kind, drift.start, drift.end, detail)

    # -- output --------------------------------------------------------------

    def result(self) -> Diagnosis:
        """The diagnosis of everything read so far; events still open end at the last step read
        (an explosion or a vanishing at its last finite step)."""
        events = list(self._events)
        if self._nonfinite:
            start, _, count, first = self._nonfinite
            events.append(
                Event(NONFINITE, start, self._last_step, f"{count} non-finite value(s), the first {first}")
            )
        if self._dep is not None:
            event = self._classify(self._dep, returned=bool(self._dep.pending))
            if event is not None:
                events.append(event)
        if self._drift is not None:
            events.append(replace(self._drift_event(self._drift), end_step=self._last_step))
        events = _merge(sorted(events, key=lambda e: (e.start_step, e.end_step)))
        kinds = {e.kind for e in events}
        verdict = next((k for k in UNSTABLE if k in kinds), STABLE)
        return Diagnosis(verdict, tuple(events), ACTIONS.get(verdict, ()), self._count)


def _merge(events: list[Event]) -> list[Event]:
    """One event for overlapping events of one kind (a departure and the drift it caused)."""
    merged: list[Event] = []
    for e in events:
        for i, m in enumerate(merged):
            if m.kind == e.kind and e.start_step <= m.end_step and m.start_step <= e.end_step:
                merged[i] = Event(
                    m.kind, min(m.start_step, e.start_step), max(m.end_step, e.end_step), m.detail
                )
                break
        else:
            merged.append(e)
    return merged


def diagnose(steps: Iterable[int], values: Iterable[float], **thresholds: float) -> Diagnosis:
    r"""Diagnoses a gradient-norm series: stable, exploding, vanishing or nonfinite.

    Reads the series against a robust running baseline (see the module's
    description, and :class:`Diagnoser` for the thresholds and their defaults)
    and reports every event with its kind and step range, the verdict (the
    most severe kind present; spikes alone leave it ``stable``), and the next
    actions for an unstable verdict.

    Args:
        steps (iterable of int): the step of each value, in order.
        values (iterable of float): the gradient norms (>= 0; NaN and inf allowed).
        **thresholds: keyword arguments of :class:`Diagnoser`.

    Returns:
        Diagnosis: the verdict, the events and the actions.

    Example::

        >>> import math
        >>> steps = range(200)
        >>> values = [1.0 + 0.1 * math.sin(i) for i in steps[:150]] + [1e4] * 50
        >>> fastnorm.diagnose(steps, values).verdict
        'exploding'
    """
    d = Diagnoser(**thresholds)
    d.update(steps, values)
    return d.result()
