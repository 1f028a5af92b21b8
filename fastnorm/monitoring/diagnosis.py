"""What a gradient-norm series means, and what to do about it.

Pure Python over plain numbers (no torch, no numpy, nothing else of fastnorm),
so it runs anywhere a metrics file can be read and is testable without a device.

**The norm** is read in log10 ("orders of magnitude"), against a running
baseline: the median of the last ``window`` points that lay inside the band,
where the band is ``max(band_mads * sigma, min_band)`` around that median and
sigma is the robust (median-based) noise scale of consecutive differences.
Points outside the band do not enter the baseline, so the baseline holds still
while the norm departs from it, and a departure is measured against what was
normal before it. A departure ends after ``recover`` consecutive points back in
the band. A departure whose sustained level (the median of its last
``sustain`` points) reaches ``explode_orders`` above (``vanish_orders`` below)
is exploding (vanishing), as is a baseline that drifts that far within
``horizon`` points; a shorter one of at least ``spike_orders`` is a spike; one
that stays out for ``window`` points short of those levels is a new normal.

**Non-finite norms** with a finite loss, after which the norm comes back, are
steps a loss scaler (or an inf check) skipped: counted, not a collapse. A
non-finite loss, or non-finite norms that persist to the end of the log (with a
finite loss: for more than ``max_skip_run`` points), are a collapse. Where the
optimizer's skip flag was logged (``StepClipper.skipped``) it settles the
question: non-finite norms at steps it skipped are skipped steps, also at the
end of the log and with a non-finite loss there (a bad batch), unless they
persist to the end for more than ``max_skip_run`` points (nothing learned
since); a non-finite norm at the end of the log whose step was applied is a
collapse, whatever the loss.

**The loss**, when logged, is a second signal: a norm departure followed by a
loss that jumps and stays up, or that climbs above its initial level and has to
learn again, is a divergence; a loss that never improves (over at least 200
steps), or returns to its initial level, is a stall; a norm that rises (or falls) by
orders of magnitude while the loss falls is healthy (a model leaving a small
initialisation; a loss approaching its minimum).

**Per-layer norms**, when logged, show vanishing gradients that a flat total
hides: a spread of ``layer_orders`` orders of magnitude between layers, or
layers whose gradient became exactly 0.

**The learning rate**, when logged, tells a spike at a warmup or a schedule
change (normal if it settles) from an isolated one (check that batch).

The verdict is the most severe kind among the events: nonfinite > diverged >
exploding > vanishing > stalled > stable. Every event carries its own actions.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, NamedTuple, Union

from fastnorm import checks

STABLE = "stable"
NONFINITE = "nonfinite"
DIVERGED = "diverged"
EXPLODING = "exploding"
VANISHING = "vanishing"
STALLED = "stalled"
SPIKE = "spike"
SKIPPED = "skipped"
GROWTH = "growth"
DECAY = "decay"
INVALID = "invalid"

UNSTABLE = (NONFINITE, DIVERGED, EXPLODING, VANISHING, STALLED)  # most severe first
HEADLINES = {
    NONFINITE: "non-finite values appeared",
    DIVERGED: "the run diverged",
    EXPLODING: "the gradient norm is exploding",
    VANISHING: "the gradients are vanishing",
    STALLED: "the loss has stalled",
    STABLE: "the run is stable",
}
KINDS = (*UNSTABLE, SPIKE, SKIPPED, GROWTH, DECAY, INVALID)

_MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation
_ZERO = 1e-45  # a zero norm is read as this (below float32's least subnormal), so that log10 stays finite
_LOG_ZERO = math.log10(_ZERO)
_F32_EPS = 2.0**-24  # below this fraction of the largest layer norm, float32 cannot even add it
_LOSS_POINTS = 1024  # the loss is kept at most this finely (pairs averaged beyond)
_MIN_LOSS_POINTS = 20  # fewer losses say nothing about the run's course
# A loss flat for fewer steps may just not have started (a warmup). Counted in steps, not logged points,
# so that logging every 10th step (a trainer's logging_steps) reads the same run the same way.
_NEVER_STEPS = 200
_UNFLAGGED = 4096  # non-finite steps kept waiting for a skip flag that comes after their norm

Track = Union[Mapping[int, float], tuple[Iterable[int], Iterable[Any]]]


# ----------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """One stretch of the series that is not ordinary noise, and what to do about it.

    Attributes:
        kind (str): one of :data:`KINDS`: ``"nonfinite"``, ``"diverged"``,
            ``"exploding"``, ``"vanishing"``, ``"stalled"`` (unstable), or
            ``"spike"``, ``"skipped"``, ``"growth"``, ``"decay"``, ``"invalid"``.
        start_step (int): the first step of the event.
        end_step (int): its last step (the last step read, for an event that had not ended).
        detail (str): what happened, in numbers.
        actions (tuple of str): what to try next for this event; empty when nothing is needed.
        count (int): for ``"skipped"`` and ``"invalid"``, how many values it holds; 0 otherwise.
    """

    kind: str
    start_step: int
    end_step: int
    detail: str
    actions: tuple[str, ...] = ()
    count: int = 0


@dataclass(frozen=True)
class Diagnosis:
    """The verdict on a series, the events behind it and the next actions.

    Attributes:
        verdict (str): ``"stable"``, or the most severe unstable kind among the events.
        events (tuple of Event): every event, by start step.
        actions (tuple of str): the actions of every event, each once, the
            verdict's event first.
        steps (int): how many norm values were read.
        signals (tuple of str): what else was read: ``"loss"``, ``"lr"``,
            ``"scale"``, ``"layers"``, ``"skipped"``.
    """

    verdict: str
    events: tuple[Event, ...] = ()
    actions: tuple[str, ...] = ()
    steps: int = 0
    signals: tuple[str, ...] = ()

    @property
    def unstable(self) -> bool:
        """True for every verdict but ``stable``."""
        return self.verdict != STABLE

    @property
    def skipped_steps(self) -> int:
        """How many steps had a non-finite norm that was skipped rather than a collapse."""
        return sum(e.count for e in self.events if e.kind == SKIPPED)

    @property
    def onset(self) -> int | None:
        """The first step of the first unstable event; None when stable."""
        return next((e.start_step for e in self.events if e.kind in UNSTABLE), None)

    def headline(self) -> str:
        """The verdict in words, with its onset: ``"the run diverged (since step 450)"``."""
        onset = self.onset
        return HEADLINES[self.verdict] + (f" (since step {onset})" if onset is not None else "")

    def to_dict(self) -> dict:
        """The diagnosis as plain JSON-ready data."""
        return {
            "verdict": self.verdict,
            "onset": self.onset,
            "events": [{**asdict(e), "actions": list(e.actions)} for e in self.events],
            "actions": list(self.actions),
            "steps": self.steps,
            "signals": list(self.signals),
            "skipped_steps": self.skipped_steps,
        }

    def report(self) -> str:
        """A few lines for a person: the verdict, then each event with its actions."""
        if self.steps == 0:
            return "verdict: stable (no values read)"
        read = f"{self.steps} steps read"
        if self.signals:
            names = {
                "loss": "the loss",
                "lr": "the learning rate",
                "scale": "the loss scale",
                "layers": "per-layer norms",
                "skipped": "the optimizer's skip flags",
            }
            read += " with " + ", ".join(names[s] for s in self.signals)
        lines = [f"verdict: {self.verdict} ({read})"]
        for e in self.events:
            if e.kind in (SKIPPED, INVALID):  # sparse runs: every one of a kind on one line, at the first
                same = [s for s in self.events if s.kind == e.kind]
                if e is not same[0]:
                    continue
                spans = ", ".join(_span(s) for s in same[:12]) + (", ..." if len(same) > 12 else "")
                count = sum(s.count for s in same)
                where = f"{count} step{'s' if count != 1 else ''} ({spans})"
                detail = e.detail.split(": ", 1)[-1]
            else:
                where = _where(e)
                detail = e.detail
            lines.append(f"  {e.kind:9s} {where}: {detail}")
            lines.extend(f"    - {a}" for a in e.actions)
        if not self.events:
            lines.append("  no event: the norm stayed within its band")
        return "\n".join(lines)


def _span(e: Event) -> str:
    return str(e.start_step) if e.start_step == e.end_step else f"{e.start_step}-{e.end_step}"


def _where(e: Event) -> str:
    return f"step {e.start_step}" if e.start_step == e.end_step else f"steps {_span(e)}"


def _num(value: float) -> str:
    """A norm or loss for a person, with 3 significant digits; an exact zero as 0."""
    return "0" if value == 0 else f"{value:.3g}"


def _level(x: float | None) -> str:
    """A norm read in log10, or "?" where none was read."""
    return "?" if x is None else _from_log(x)


def _from_log(x: float) -> str:
    """A norm read in log10: the zeros (read as _ZERO) printed as 0, never as the stand-in."""
    return "0" if x <= _LOG_ZERO else _num(10.0**x)


# ----------------------------------------------------------------------------
# The actions (after the model-instability guide fastnorm serves)
# ----------------------------------------------------------------------------

LOWER_LR = "Lower the learning rate (by 3-10x), or lengthen its warmup."
PRECISION = "Use a more stable precision: bf16-mixed instead of fp16 (16-mixed), or full fp32 (32-true)."
RAISE_LR = "Raise the learning rate, especially for small models (about 10M parameters or fewer)."
NORMALISATION = (
    "Check the input normalisation (inputs scaled to about zero mean and unit variance), the "
    "normalisation layers (LayerNorm/BatchNorm between deep layers) and the initialisation "
    "(Kaiming or Xavier, matched to the activation)."
)
CHECKPOINT = (
    "Re-run from the latest checkpoint; if it reproduces, switch to fp32 (32-true) to isolate "
    "reduced-precision arithmetic."
)
SKIP_NONFINITE = (
    "Skip the steps whose norm is not finite instead of applying them: fastnorm.StepClipper(optimizer, "
    "max_norm) does it inside torch's fused optimizer step, without a host sync."
)
CHECK_DATA_NAN = (
    "Check the data for NaN/inf (inputs and labels) and the loss scaler (with fp16, use a dynamic "
    "one such as torch.amp.GradScaler)."
)
INVALID_ACTION = "Check what is logged as the gradient norm: a norm is a number >= 0."
LOG_LOSS = (
    "Log the loss beside the norm (GradNormMonitor.update(norm, loss=loss)): a norm that rises by orders "
    "of magnitude while the loss falls steadily is a model leaving a small initialisation, not an explosion."
)


def _clipping(max_norm: float | None, peak: str, base: str) -> str:
    if max_norm is None:
        return (
            "Enable gradient clipping: no max_norm was set for this run "
            "(e.g. fastnorm.clip_(model.parameters(), max_norm=1.0))."
        )
    return (
        f"Tighten the gradient clipping: max_norm={max_norm:g} is set while the norm went from {base} "
        f"to {peak}; a max_norm near its healthy level ({base}) bounds every update."
    )


# ----------------------------------------------------------------------------
# The streaming parts
# ----------------------------------------------------------------------------


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


@dataclass(frozen=True)
class _Found:
    """A norm event as detected: the event, and what its actions depend on."""

    event: Event
    side: int
    base: float  # log10 of the baseline it departed from
    extreme: float  # log10 of its peak (or trough)
    nonfinite: bool = False


@dataclass
class _Drift:
    kind: str
    start: int
    end: int
    low: float
    high: float


@dataclass
class _Run:
    """Consecutive steps with one property (non-finite, invalid)."""

    start: int
    end: int
    count: int
    first: Any
    open: bool = True
    skipped: int = 0  # of its steps, those the optimizer's flag says were skipped
    applied: int = 0  # and those it says were applied

    def flag(self, skipped: bool) -> None:
        if skipped:
            self.skipped += 1
        else:
            self.applied += 1

    @property
    def all_skipped(self) -> bool:
        """Every step of the run was flagged as skipped by the optimizer."""
        return self.skipped == self.count


def _median(ordered: list[float]) -> float:
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def _number(value: Any) -> float | None:
    """The value as a float, or None when it is not a number (a string, None, a bool)."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


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


class _Thinned:
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
        self.points.append((pending[0][0], math.fsum(v for _, v in pending) / len(pending)))
        if len(self.points) >= 2 * self.limit:
            self.points = [(a[0], 0.5 * (a[1] + b[1])) for a, b in zip(self.points[::2], self.points[1::2])]
            self.stride *= 2

    def all(self) -> list[tuple[int, float]]:
        if not self._pending:
            return list(self.points)
        tail = (self._pending[0][0], math.fsum(v for _, v in self._pending) / len(self._pending))
        return [*self.points, tail]

    def __len__(self) -> int:
        return len(self.points) + bool(self._pending)


@dataclass
class _Layers:
    """What the per-layer snapshots showed: the current vanishing streak and the latest snapshot."""

    seen: set = field(default_factory=set)  # layers that had a non-zero gradient at some snapshot
    streak_start: int | None = None  # the first snapshot of the current vanishing streak
    streak_first: bool = False  # that streak began at the very first snapshot
    streak_detail: str = ""
    streak_end: int | None = None
    closed: list = field(default_factory=list)  # (start, end, from_first, detail) of past streaks
    snapshots: int = 0


# ----------------------------------------------------------------------------
# The diagnoser
# ----------------------------------------------------------------------------


class Diagnoser:
    r"""Diagnoses a gradient-norm series as it arrives, in constant memory.

    :func:`diagnose` reads a whole series at once; ``Diagnoser`` takes it in
    pieces (``GradNormMonitor`` feeds it each window), keeping only running
    summaries: the baseline, the open departure, the runs of non-finite values,
    the loss thinned to at most 2048 points, the latest per-layer reading. A
    long run costs no more per point than a short one.

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
            Default: 1 (10x): held for ``sustain`` points over a robust
            baseline, that is far outside the noise and no single batch; the
            healthy rises this large (a model leaving a small initialisation)
            are told apart by the loss. A learning-rate jump of 10x commonly
            lifts the norm 30x for tens of steps, then lets it settle 2x
            higher: at a higher threshold it passed for a new normal.
        vanish_orders (float): the sustained fall that is vanishing.
            Default: 3 (1000x); healthy runs often fall 10-100x early on.
        sustain (int): points over which a level counts as sustained: a
            departure's level is the median of its last ``sustain`` points,
            so shorter excursions never make it. Default: 10.
        recover (int): consecutive points back in the band that end a
            departure; a shorter dip belongs to it. Default: 3.
        horizon (int): points over which a slow drift of the baseline itself
            is measured. Default: 1000.
        layer_orders (float): the spread between per-layer norms, in orders
            of magnitude, that is vanishing. Default: 6.
        max_skip_run (int): the longest run of non-finite norms with a finite
            loss, still running at the last step, read as skipped steps rather
            than a collapse (a dynamic loss scaler starting at 2**32 halves its
            way down for a dozen steps or more). Default: 40.
        stall_fraction (float): a loss that never improves by this fraction of
            its initial value (and by more than its noise) has stalled. Default: 0.05.
        max_norm (float, optional): the clipping threshold of the run, for the
            advice (enable or tighten clipping). Default: None (not clipped).

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
        explode_orders: float = 1.0,
        vanish_orders: float = 3.0,
        sustain: int = 10,
        recover: int = 3,
        horizon: int = 1000,
        layer_orders: float = 6.0,
        max_skip_run: int = 40,
        stall_fraction: float = 0.05,
        max_norm: float | None = None,
    ) -> None:
        for name, value in (
            ("window", window),
            ("warmup", warmup),
            ("sustain", sustain),
            ("recover", recover),
            ("horizon", horizon),
            ("max_skip_run", max_skip_run),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Diagnoser: {name} must be a positive int, got {value!r}")
        for name, value in (
            ("band_mads", band_mads),
            ("min_band", min_band),
            ("spike_orders", spike_orders),
            ("explode_orders", explode_orders),
            ("vanish_orders", vanish_orders),
            ("layer_orders", layer_orders),
            ("stall_fraction", stall_fraction),
        ):
            checks.positive_number(value, name, "Diagnoser")
        if warmup > window:
            raise ValueError(f"Diagnoser: warmup ({warmup}) cannot exceed window ({window})")
        max_norm = checks.max_norm(max_norm, "Diagnoser", optional=True)
        self.window = window
        self.warmup = warmup
        self.spike_orders = spike_orders
        self.explode_orders = explode_orders
        self.vanish_orders = vanish_orders
        self.sustain = sustain
        self.recover = recover
        self.layer_orders = layer_orders
        self.max_skip_run = max_skip_run
        self.stall_fraction = stall_fraction
        self.max_norm = None if max_norm is None else float(max_norm)
        self._base = _Baseline(window, band_mads, min_band)
        self._drift_ref = _Extremes(horizon)
        self._recent: deque[tuple[int, float]] = deque(maxlen=window)  # (step, log10) before now
        self._found: list[_Found] = []
        self._ups: deque[tuple[int, int, float]] = deque(maxlen=256)  # (start, end, peak) upwards
        self._dep: _Departure | None = None
        self._drift: _Drift | None = None
        self._nonfinite: list[_Run] = []
        self._flags: deque[tuple[int, bool]] = deque()  # skip flags of steps whose norm is not read yet
        self._unflagged: dict[int, _Run] = {}  # recent non-finite steps read without a flag yet
        self._flags_read = False
        self._invalid: list[_Run] = []
        self._count = 0
        self._finite = 0
        self._first_step: int | None = None
        self._last_step: int | None = None
        self._levels = _Thinned(_LOSS_POINTS)  # log10 of the finite norms, for levels around a loss jump
        self._loss = _Thinned(_LOSS_POINTS)
        self._loss_nonfinite: list[_Run] = []
        self._loss_read = False
        self._lr_last: float | None = None
        self._lr_rising_until: int | None = None  # the last step of the initial rise (warmup)
        self._lr_warming = True
        self._lr_changes: deque[tuple[int, float, float]] = deque(maxlen=256)  # (step, before, after)
        self._scale: deque[tuple[int, float]] = deque(maxlen=4096)
        self._layers = _Layers()

    # -- input: the norm ---------------------------------------------------------

    def update(self, steps: Iterable[int], values: Iterable[Any]) -> None:
        """Reads more norm values, in step order.

        Args:
            steps (iterable of int): the step of each value.
            values (iterable): gradient norms (>= 0; NaN and inf allowed). A
                negative or non-numeric value is counted and reported as
                invalid, never raised on and never dropped silently.
        """
        for step, value in _pairs(steps, values):
            self._point(step, value)

    def _point(self, step: int, raw: Any) -> None:
        self._count += 1
        if self._first_step is None:
            self._first_step = step
        self._last_step = step
        value = _number(raw)
        if value is None or value < 0:
            _extend(self._invalid, step, raw)
            return
        _close_run(self._invalid)
        if not math.isfinite(value):
            _extend(self._nonfinite, step, value)
            run = self._nonfinite[-1]
            flag = self._flag_of(step)
            if flag is not None:
                run.flag(flag)
            else:
                self._unflagged[step] = run
                if len(self._unflagged) > _UNFLAGGED:
                    del self._unflagged[next(iter(self._unflagged))]
            if self._dep is not None:
                self._dep.nonfinite = True
            return
        _close_run(self._nonfinite)
        x = math.log10(max(value, _ZERO))
        self._finite += 1
        self._levels.add(step, x)
        base = self._base
        self._recent.append((step, x))
        if len(base) < self.warmup:
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
            elif side == 0 and len(dep.pending) + 1 < self.recover:
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
            if dep.side > 0:
                self._ups.append((dep.start, dep.end, dep.peak))
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

    # -- input: the other signals --------------------------------------------------

    def update_skipped(self, steps: Iterable[int], flags: Iterable[Any]) -> None:
        """Reads whether the optimizer skipped each step (e.g. ``StepClipper.skipped``), in step order.

        Given before or after the norms of the same steps. A flag says what became of a step
        with a non-finite norm: skipped (the weights untouched) or applied.

        Args:
            steps (iterable of int): the step of each flag.
            flags (iterable): true or nonzero where the step was skipped; false or 0 where it
                was applied. Anything else (None, text) is passed over.
        """
        for step, raw in _pairs(steps, flags, "skipped"):
            value = raw if isinstance(raw, bool) else _number(raw)
            if value is None:
                continue
            self._flags_read = True
            flag = value != 0
            if self._last_step is None or step > self._last_step:
                self._flags.append((step, flag))
                continue
            run = self._unflagged.pop(step, None)
            if run is not None:
                run.flag(flag)

    def _flag_of(self, step: int) -> bool | None:
        """The flag given ahead for ``step``, if any; flags of earlier steps, whose norm never came, go."""
        flags = self._flags
        while flags and flags[0][0] < step:
            flags.popleft()
        if flags and flags[0][0] == step:
            return flags.popleft()[1]
        return None

    def update_loss(self, steps: Iterable[int], losses: Iterable[Any]) -> None:
        """Reads the training loss at some steps, in step order (non-numeric values are skipped).

        Args:
            steps (iterable of int): the step of each loss.
            losses (iterable of float): the losses (NaN and inf allowed).
        """
        for step, raw in _pairs(steps, losses, "loss"):
            value = _number(raw)
            if value is None:
                continue
            self._loss_read = True
            if math.isfinite(value):
                _close_run(self._loss_nonfinite)
                self._loss.add(step, value)
            else:
                _extend(self._loss_nonfinite, step, value)

    def update_lr(self, steps: Iterable[int], lrs: Iterable[Any]) -> None:
        """Reads the learning rate at some steps, in step order: it dates warmups and schedule changes."""
        for step, raw in _pairs(steps, lrs, "lr"):
            value = _number(raw)
            if value is None or not math.isfinite(value):
                continue
            last, self._lr_last = self._lr_last, value
            if last is None:
                continue
            if self._lr_warming and value > last:
                self._lr_rising_until = step
            else:
                self._lr_warming = False  # a warmup rises from the first step on
            if self._lr_rising_until != step and abs(value - last) > 0.2 * max(abs(last), 1e-300):
                self._lr_changes.append((step, last, value))

    def update_scale(self, steps: Iterable[int], scales: Iterable[Any]) -> None:
        """Reads a loss scaler's scale at some steps (e.g. ``GradScaler.get_scale()``), in step order."""
        for step, raw in _pairs(steps, scales, "scale"):
            value = _number(raw)
            if value is not None and (not self._scale or self._scale[-1][1] != value):
                self._scale.append((step, value))  # only the changes: few in a whole run

    def update_layers(self, step: int, norms: Mapping[str, Any]) -> None:
        """Reads one step's per-layer norms (name -> norm), e.g. the ``gradient_norm_layer/<name>``
        the monitor logs once per window. Layers whose norm is always 0 (frozen or unused) are ignored."""
        lay = self._layers
        values = {name: _number(v) for name, v in norms.items()}
        values = {n: v for n, v in values.items() if v is not None and math.isfinite(v) and v >= 0}
        lay.snapshots += 1
        zeros = [n for n, v in values.items() if v == 0 and n in lay.seen]
        lay.seen.update(n for n, v in values.items() if v > 0)
        positive = {n: v for n, v in values.items() if v > 0}
        detail = ""
        if positive:
            top_name = max(positive, key=positive.get)
            top = positive[top_name]
            low_name = min(positive, key=positive.get)
            spread = math.log10(top / positive[low_name])
            tiny = [n for n, v in values.items() if n in lay.seen and v < top * _F32_EPS]
            if spread >= self.layer_orders or zeros:
                detail = (
                    f"at step {step} the per-layer norms span {spread:.0f} orders of magnitude, from "
                    f"{low_name!r} ({_num(positive[low_name])}) to {top_name!r} ({_num(top)})"
                )
                if zeros:
                    detail += f"; exactly 0: {_names(zeros)}"
                below = [n for n in tiny if n not in zeros]
                if below:
                    detail += f"; below float32 resolution against the largest: {_names(below)}"
        if detail:
            if lay.streak_start is None:
                lay.streak_start = step
                lay.streak_first = lay.snapshots == 1
            lay.streak_detail = detail
            lay.streak_end = step
        elif lay.streak_start is not None:
            lay.closed.append((lay.streak_start, lay.streak_end, lay.streak_first, lay.streak_detail))
            lay.streak_start = None

    # -- classification ------------------------------------------------------

    def _threshold(self, side: int) -> float:
        return self.explode_orders if side > 0 else self.vanish_orders

    def _alarming(self, dep: _Departure) -> bool:
        return dep.level >= self._threshold(dep.side)

    def _classify(self, dep: _Departure, returned: bool) -> _Found | None:
        extreme = dep.origin + dep.side * dep.peak
        how = "rose" if dep.side > 0 else "fell"
        if extreme <= _LOG_ZERO:
            moved = f"fell to exactly 0 from the running baseline {_from_log(dep.origin)}"
        else:
            moved = (
                f"{how} {dep.peak:.1f} orders of magnitude (to {_from_log(extreme)}) from the running "
                f"baseline {_from_log(dep.origin)}"
            )
        if self._alarming(dep) or (dep.nonfinite and dep.peak >= self._threshold(dep.side)):
            kind = EXPLODING if dep.side > 0 else VANISHING
            ending = "returned to the band" if returned else "had not returned by the last step"
            if dep.nonfinite:
                ending += ", running into non-finite values"
            event = Event(kind, dep.start, dep.end, f"{moved}; {ending}")
            return _Found(event, dep.side, dep.origin, extreme, dep.nonfinite)
        if dep.peak >= self.spike_orders and (returned or dep.count < self.sustain):
            ending = "back in the band" if returned else "not back in the band by the last step"
            event = Event(SPIKE, dep.start, dep.end, f"{moved}, {ending}")
            return _Found(event, dep.side, dep.origin, extreme)
        return None

    def _close(self, dep: _Departure, returned: bool, found: list, ups: Any) -> None:
        """Adds a departure to the norm's events (``found``) and, when upwards, to its rises (``ups``)."""
        if dep.side > 0:
            ups.append((dep.start, dep.end, dep.peak))
        event = self._classify(dep, returned)
        if event is not None:
            found.append(event)

    def _drift_found(self, drift: _Drift) -> _Found:
        how = "grew" if drift.kind == EXPLODING else "shrank"
        detail = (
            f"the running baseline {how} from {_from_log(drift.low)} to {_from_log(drift.high)} "
            f"({abs(drift.high - drift.low):.1f} orders of magnitude)"
        )
        side = 1 if drift.kind == EXPLODING else -1
        return _Found(Event(drift.kind, drift.start, drift.end, detail), side, drift.low, drift.high)

    # -- output --------------------------------------------------------------

    def result(self) -> Diagnosis:
        """The diagnosis of everything read so far; events still open end at the last step read."""
        last = self._last_step
        found = list(self._found)
        ups = list(self._ups)
        if self._dep is not None:
            self._close(self._dep, bool(self._dep.pending), found, ups)
        if self._drift is not None:
            drift = self._drift_found(self._drift)
            found.append(replace(drift, event=replace(drift.event, end_step=last)))
        found = _merge(sorted(found, key=lambda f: (f.event.start_step, f.event.end_step)))
        loss = None
        if len(self._loss) >= _MIN_LOSS_POINTS:
            warming = self._lr_warming and self._lr_rising_until is not None  # the lr still rising
            loss = _LossView(self._loss.all(), self.stall_fraction, judge_start=not warming)
        events: list[Event] = []
        events += self._nonfinite_events(last, loss is not None or self._loss_read)
        events += [
            Event(
                INVALID,
                r.start,
                r.end,
                f"{r.count} invalid value(s): negative or not a number (the first {r.first!r}), "
                "left out of the diagnosis",
                (INVALID_ACTION,),
                r.count,
            )
            for r in self._invalid
        ]
        loss_event, consumed = self._loss_event(found, ups, loss, last) if loss is not None else (None, set())
        events += [self._norm_event(f, loss, found) for i, f in enumerate(found) if i not in consumed]
        events += [loss_event] if loss_event is not None else []
        events += self._layer_events(last)
        events.sort(key=lambda e: (e.start_step, KINDS.index(e.kind), e.end_step))
        kinds = {e.kind for e in events}
        verdict = next((k for k in UNSTABLE if k in kinds), STABLE)
        actions: list[str] = []
        for e in sorted(events, key=lambda e: e.kind != verdict):
            actions += [a for a in e.actions if a not in actions]
        signals = tuple(
            name
            for name, read in (
                ("loss", self._loss_read),
                ("lr", self._lr_last is not None),
                ("scale", bool(self._scale)),
                ("layers", self._layers.snapshots > 0),
                ("skipped", self._flags_read),
            )
            if read
        )
        return Diagnosis(verdict, tuple(events), tuple(actions), self._count, signals)

    def _nonfinite_events(self, last: int | None, loss_logged: bool) -> list[Event]:
        """Skipped steps and collapses, from the runs of non-finite norms and losses."""
        events = []

        def skipped(r: _Run) -> bool:  # the optimizer skipped every step: the weights are intact
            return r.all_skipped and not (r.open and r.count > self.max_skip_run)

        collapses = []
        for r in self._loss_nonfinite:
            norm_too = [n for n in self._nonfinite if _overlap(n, r)]
            if norm_too and all(skipped(n) for n in norm_too):
                continue  # bad batches whose steps were skipped: reported with the norm's runs
            collapses.append(r)
            until = "to the last step" if r.open else f"until step {r.end}"
            detail = f"the loss is non-finite ({r.first}) from step {r.start} {until}"
            if norm_too:
                detail += f"; the norm from step {norm_too[0].start}"
            events.append(
                Event(NONFINITE, r.start, r.end if not r.open else last, detail, (CHECKPOINT, CHECK_DATA_NAN))
            )
        for r in self._nonfinite:
            if any(_overlap(lr, r) for lr in collapses):
                continue  # part of the collapse the loss shows
            if r.all_skipped:
                events.append(self._skipped_by_optimizer(r, last))
                continue
            if r.open and r.applied:
                detail = (
                    f"{r.count} non-finite norm(s) from step {r.start} to the last step, the first "
                    f"{r.first}; the optimizer applied {r.applied} of these steps (skip flag 0), so the "
                    "weights may hold NaN/inf"
                )
                actions = (CHECKPOINT, CHECK_DATA_NAN, SKIP_NONFINITE)
                events.append(Event(NONFINITE, r.start, last, detail, actions))
                continue
            persists = r.open and (not loss_logged or r.count > self.max_skip_run)
            if persists:
                detail = (
                    f"{r.count} non-finite norms from step {r.start} to the last step, the first {r.first}"
                )
                if loss_logged:
                    detail += " (the loss stayed finite: every step from there on was skipped)"
                events.append(Event(NONFINITE, r.start, last, detail, (CHECKPOINT, CHECK_DATA_NAN)))
                continue
            detail = f"{r.count} non-finite norm(s) ({r.first}): "
            detail += "skipped steps, the loss staying finite" if loss_logged else "the norm came back finite"
            detail += " (a dynamic loss scaler skips each overflowing step and lowers its scale)"
            detail += self._scale_note(r) + ("; not back by the last step" if r.open else "")
            events.append(Event(SKIPPED, r.start, r.end, detail, count=r.count))
        return events

    def _skipped_by_optimizer(self, r: _Run, last: int | None) -> Event:
        """A run of non-finite norms at steps the optimizer's flag says it skipped."""
        if r.open and r.count > self.max_skip_run:
            detail = (
                f"{r.count} non-finite norms from step {r.start} to the last step, the first {r.first}: "
                "the optimizer skipped every step from there on, so nothing has been learned since"
            )
            return Event(NONFINITE, r.start, last, detail, (CHECKPOINT, CHECK_DATA_NAN))
        bad_loss = any(_overlap(lr, r) for lr in self._loss_nonfinite)
        detail = f"{r.count} non-finite norm(s) ({r.first}): steps the optimizer skipped (its flag logged)"
        detail += ", the loss non-finite there too (bad batches)" if bad_loss else ""
        detail += ", the weights left as they were"
        detail += self._scale_note(r) + ("; not back by the last step" if r.open else "")
        return Event(SKIPPED, r.start, r.end, detail, count=r.count)

    def _scale_note(self, r: _Run) -> str:
        if not self._scale:
            return ""
        before = next((v for s, v in reversed(self._scale) if s <= r.start), self._scale[0][1])
        after = next((v for s, v in self._scale if s > r.end), None)
        if after is None or after >= before:
            return f"; loss scale {_num(before)}"
        return f"; the loss scale fell from {_num(before)} to {_num(after)}"

    def _loss_event(
        self, found: list[_Found], ups: list[tuple[int, int, float]], loss: _LossView, last: int | None
    ) -> tuple[Event | None, set[int]]:
        """The event the loss shows (diverged or stalled), and which of the norm's events it takes in."""
        shape = loss.shape()
        if shape is None:
            return None, set()
        never, start, detail, end = shape
        near = max(10, loss.w)
        # The norm's rises that go with the loss's: around its jump, or sustained while it stayed up.
        ours = {
            i
            for i, f in enumerate(found)
            if f.side > 0
            and (
                (f.event.start_step <= start + near and f.event.end_step >= start - near)
                or (f.event.kind == EXPLODING and f.event.end_step >= start - near)
            )
        }
        linked = [(found[i].event.start_step, found[i].extreme - found[i].base) for i in ours]
        linked += [(a, peak) for a, b, peak in ups if a <= start + near and b >= start - near]
        levels = self._levels.all()
        before = sorted(x for s, x in levels if start - 4 * near <= s < start) or sorted(
            x for _, x in levels[: 4 * near]
        )
        after = [x for s, x in levels if s >= start]
        rise = _median(sorted(after[: 4 * near])) - _median(before) if after and before else 0.0
        strong = max((peak for _, peak in linked), default=0.0) >= self.spike_orders or rise >= 0.5
        if never or not strong:
            if end is not None:  # a relapse without the norm is no stall: the loss came down again
                return None, set()
            return Event(STALLED, start, last, detail, self._stall_actions(never)), set()
        # The norm went up with a loss that jumped and stayed up (or relapsed): a divergence, from the rise.
        # Dated by the norm, read every step, not by the loss, whose start blurs with its noise and smoothing
        # (a noisy loss wandering up from its best dated a blow-up 35 steps early).
        onset = min(a for a, _ in linked) if linked else start
        peak = max([found[i].extreme for i in ours] + after, default=None)
        base = _median(before) if before else None
        resume = f"Resume from a checkpoint saved before step {onset}, with the changes above."
        event = Event(
            DIVERGED,
            onset,
            last if end is None else end,
            f"the norm rose from step {onset} (from {_level(base)} to {_level(peak)}); {detail}",
            (*self._explode_actions(peak, base, onset, found), resume),
        )
        return event, ours

    def _norm_event(self, f: _Found, loss: _LossView | None, found: list[_Found]) -> Event:
        """A norm event with its context and actions: a rise or fall the falling loss calls healthy."""
        e = f.event
        if loss is not None and e.kind in (EXPLODING, VANISHING) and not f.nonfinite:
            fell = loss.fell(e.start_step, e.end_step)
            if fell is not None:
                kind, how, why = (
                    (GROWTH, "rose", "a model leaving a small initialisation")
                    if f.side > 0
                    else (DECAY, "fell", "the gradient shrinks as the loss approaches its minimum")
                )
                detail = (
                    f"the norm {how} from {_from_log(f.base)} to {_from_log(f.extreme)} "
                    f"while the loss fell from {fell}: healthy: {why}"
                )
                return Event(kind, e.start_step, e.end_step, detail)
        if e.kind == EXPLODING:
            actions = self._explode_actions(f.extreme, f.base, e.start_step, found)
            return replace(e, actions=actions + (() if self._loss_read else (LOG_LOSS,)))
        if e.kind == VANISHING:
            return replace(e, actions=(RAISE_LR, NORMALISATION))
        return self._spike(f)

    def _explode_actions(self, peak: float | None, base: float | None, start: int, found: list[_Found]):
        actions = [LOWER_LR, _clipping(self.max_norm, _level(peak), _level(base)), PRECISION]
        isolated = [
            f.event.start_step
            for f in found
            if f.event.kind == SPIKE
            and f.side > 0
            and f.event.start_step < start
            and self._lr_context(f.event.start_step) is None
        ]
        if isolated:
            actions.append(
                "Check the data for outliers: isolated spikes came first (step "
                + ", ".join(map(str, isolated[:5]))
                + ("..." if len(isolated) > 5 else "")
                + ")."
            )
        return tuple(actions)

    def _stall_actions(self, never: bool) -> tuple[str, ...]:
        layers = self._layers
        if layers.snapshots == 0:
            vanishing = (
                "Check for vanishing gradients: log per-layer norms (fastnorm.LayerNorms) and look for "
                "layers orders of magnitude below the others."
            )
        elif layers.streak_start is not None or layers.closed:
            vanishing = (
                "The per-layer norms show vanishing gradients (see the vanishing event): "
                + NORMALISATION[0].lower()
                + NORMALISATION[1:]
            )
        else:
            vanishing = (
                "The per-layer norms show no vanishing layer: look at the learning rate and the data first."
            )
        if never:
            lr = (
                "Raise the learning rate (it may be far too low), and check that the optimizer steps the "
                "parameters at all (a schedule at 0, frozen parameters, zero_grad between backward and step)."
            )
        else:
            lr = (
                "Check the learning rate and the weight decay: a loss that climbs back to where it "
                "started follows a rate too high for this stage, or a decay that shrinks the weights "
                "to nothing; a change in the data pipeline does the same."
            )
        data = (
            "Check the data: labels that match their inputs, shuffling, a loss function that fits the task."
        )
        return (lr, data, vanishing)

    def _lr_context(self, step: int) -> str | None:
        """Why a spike at ``step`` may be normal: a warmup or a schedule change the lr log shows."""
        if self._lr_rising_until is not None and step <= self._lr_rising_until + self.recover:
            return f"during the learning-rate warmup (rising until step {self._lr_rising_until})"
        for s, before, after in reversed(self._lr_changes):
            if s - 1 <= step <= s + self.sustain:
                return f"at the learning-rate change of step {s} ({before:.3g} to {after:.3g})"
            if s < step:
                break
        return None

    def _spike(self, f: _Found) -> Event:
        e = f.event
        context = self._lr_context(e.start_step)
        where = _where(e)
        if context is not None:
            return replace(e, detail=f"{e.detail}; {context}: normal if it settles")
        if f.side > 0:
            action = f"Isolated spike: check that batch ({where}) for outliers or mislabelled samples."
        else:
            action = f"A short drop: check that batch ({where}): empty, padded or repeated samples?"
        return replace(e, actions=(action,))

    def _layer_events(self, last: int | None) -> list[Event]:
        lay = self._layers
        streaks = list(lay.closed)
        if lay.streak_start is not None:
            streaks.append((lay.streak_start, last, lay.streak_first, lay.streak_detail))
        events = []
        for start, end, from_first, detail in streaks:
            if from_first:
                # Already so at the first per-layer reading: dated from the first step read.
                start = min(start, self._first_step if self._first_step is not None else start)
                detail += " (so from the first per-layer reading)"
            events.append(Event(VANISHING, start, end, detail, (RAISE_LR, NORMALISATION)))
        return events


def _names(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "") + f" ({len(names)})"


def _extend(runs: list[_Run], step: int, value: Any) -> None:
    if runs and runs[-1].open:
        runs[-1].end = step
        runs[-1].count += 1
    else:
        runs.append(_Run(step, step, 1, value))


def _overlap(a: _Run, b: _Run) -> bool:
    return a.start <= b.end and b.start <= a.end


def _close_run(runs: list[_Run]) -> None:
    if runs and runs[-1].open:
        runs[-1].open = False


def _pairs(steps: Iterable[int], values: Iterable[Any], what: str = "") -> list[tuple[int, Any]]:
    steps, values = list(steps), list(values)
    if len(steps) != len(values):
        raise ValueError(f"diagnose: {len(steps)} steps but {len(values)} {what + ' ' if what else ''}values")
    return [(int(s), v) for s, v in zip(steps, values)]


def _merge(found: list[_Found]) -> list[_Found]:
    """One event for overlapping events of one kind (a departure and the drift it caused)."""
    merged: list[_Found] = []
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


class _Shape(NamedTuple):
    """How a loss failed, as :meth:`_LossView.shape` reads it."""

    never: bool  # it never improved
    start: int  # the step it started
    detail: str
    end: int | None = None  # where a relapse ended; None for a loss that stayed there


class _LossView:
    """The shape of a (thinned) loss series: its initial level, best, final level and noise."""

    def __init__(self, points: list[tuple[int, float]], stall_fraction: float, judge_start: bool) -> None:
        self.judge_start = judge_start and points[-1][0] - points[0][0] + 1 >= _NEVER_STEPS
        self.steps = [s for s, _ in points]
        ys = [v for _, v in points]
        n = len(ys)
        w = max(5, n // 25) | 1
        self.w = w
        self.smooth = _rolling_median(ys, w)
        self.first = _median(sorted(ys[:5]))
        best = min(range(n), key=self.smooth.__getitem__)
        self.best, self.best_step, self._best_index = self.smooth[best], self.steps[best], best
        if self.first < self.best:  # never below where it began
            self.best, self.best_step, self._best_index = self.first, self.steps[0], 0
        self.final = _median(sorted(ys[-w:]))
        diffs = sorted(abs(b - a) for a, b in zip(ys, ys[1:]))
        sigma = _MAD_TO_SIGMA * _median(diffs) / math.sqrt(2.0) if diffs else 0.0
        self.tol = max(3.0 * sigma / math.sqrt(w), stall_fraction * abs(self.first))
        # Above this, the loss is above its initial level: a margin beyond the noise of a smoothed point.
        self.ceiling = self.first + max(self.tol, 0.1 * abs(self.first))

    def shape(self) -> _Shape | None:
        """How the loss failed: it never improved, went back up and stayed there, or climbed above its
        initial level and had to learn again (a relapse); None for a loss that learned and held."""
        progress = self.first - self.best
        s = (
            f"{_num(self.first)} at the start, {_num(self.best)} at best (step {self.best_step}), "
            f"{_num(self.final)} at the end"
        )
        regained = self.final - self.best
        above = self.final > self.ceiling
        if not above and (progress < self.tol or regained < max(0.5 * progress, self.tol)):
            if progress < self.tol and self.judge_start:
                return _Shape(True, self.steps[0], f"the loss never improved: {s}")
            return self._relapse(s)
        # Dated where the smoothed loss left the neighbourhood of its best for good.
        i = len(self.smooth) - 1
        while i > self._best_index and self.smooth[i] > self.best + self.tol:
            i -= 1
        start = self.steps[min(i + 1, len(self.steps) - 1)]
        if above:
            what = "rose above its initial level"
        elif self.final >= self.first - 0.1 * progress:
            what = "returned to its initial level"
        else:
            what = f"went back up by {regained / progress:.0%} of what it had gained"
        return _Shape(False, start, f"the loss {what} from step {start} and stayed there: {s}")

    def _relapse(self, s: str) -> _Shape | None:
        """A loss that, after real progress, rose above its initial level and came down again slowly.

        A model whose loss climbed above where it started has lost all it had learned: a divergence
        the run recovered from, whatever the loss did later. Such a model has to learn again, so its
        loss comes down gradually; a loss that drops straight back to its low was high because of the
        batches, not the model (a spike). The smoothed loss is read, so one bad batch never counts,
        and it must clear the initial level by the margin that tells "above" from noise.
        """
        low, low_index = self.smooth[0], 0
        n = len(self.smooth)
        k = 0
        while k < n:
            y = self.smooth[k]
            if y < low:
                low, low_index = y, k
            elif self.first - low >= self.tol and y > self.ceiling:
                end = k
                while end + 1 < n and self.smooth[end + 1] > self.ceiling:
                    end += 1
                if end + 1 < n and self.smooth[end + 1] > low + 0.5 * (self.first - low):  # learning again
                    i = k  # dated where it left the neighbourhood of its low
                    while i > low_index and self.smooth[i - 1] > low + self.tol:
                        i -= 1
                    top = max(range(k, end + 1), key=self.smooth.__getitem__)
                    detail = (
                        f"the loss rose above its initial level from step {self.steps[i]} (to "
                        f"{_num(self.smooth[top])} at step {self.steps[top]}, from {_num(low)}), then came "
                        f"down again: {s}"
                    )
                    return _Shape(False, self.steps[i], detail, self.steps[end])
                k = end
            k += 1
        return None

    def at(self, step: int) -> float:
        i = max(0, bisect.bisect_right(self.steps, step) - 1)
        return self.smooth[i]

    def fell(self, start: int, end: int) -> str | None:
        """``"a to b"`` when the loss fell over ``[start, end]`` and stayed below where it began."""
        a, b = self.at(start), self.at(end)
        if b < a - self.tol and self.final < a - self.tol:
            return f"{a:.3g} to {b:.3g}"
        return None


def _rolling_median(ys: list[float], w: int) -> list[float]:
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
        out.append(_median(window))
    return out


def _track(value: Track | None, what: str) -> list[tuple[int, Any]]:
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
    return _pairs(steps, values, what)


def diagnose(
    steps: Iterable[int],
    values: Iterable[Any],
    *,
    loss: Track | None = None,
    lr: Track | None = None,
    scale: Track | None = None,
    layers: Mapping[int, Mapping[str, Any]] | None = None,
    skipped: Track | None = None,
    max_norm: float | None = None,
    **thresholds: Any,
) -> Diagnosis:
    r"""Diagnoses a gradient-norm series: stable, or nonfinite, diverged, exploding, vanishing, stalled.

    Reads the series against a robust running baseline (see the module's
    description, and :class:`Diagnoser` for the thresholds and their defaults),
    with the loss, the learning rate, a loss scaler's scale, per-layer norms
    and the optimizer's skip flags when given, and reports every event with its kind, step range and actions,
    and the verdict (the most severe kind present).

    Args:
        steps (iterable of int): the step of each value, in order.
        values (iterable): the gradient norms (>= 0; NaN and inf allowed;
            anything else is reported as invalid).
        loss, lr, scale (optional): the training loss, the learning rate and a
            loss scaler's scale, each a ``(steps, values)`` pair or a mapping
            step -> value.
        layers (mapping, optional): step -> {layer name: norm}, the per-layer
            norms at the steps they were logged.
        skipped (optional): whether the optimizer skipped each step (1 or
            True: skipped, 0 or False: applied), a ``(steps, values)`` pair or a
            mapping step -> value, as ``GradNormMonitor`` logs it under
            ``gradient_norm_skipped``.
        max_norm (float, optional): the run's clipping threshold, for the advice.
        **thresholds: the other keyword arguments of :class:`Diagnoser`.

    Returns:
        Diagnosis: the verdict, the events and the actions.

    Example::

        >>> import math
        >>> steps = range(200)
        >>> values = [1.0 + 0.1 * math.sin(i) for i in steps[:150]] + [1e4] * 50
        >>> fastnorm.diagnose(steps, values).verdict
        'exploding'
    """
    d = Diagnoser(max_norm=max_norm, **thresholds)
    flags = _track(skipped, "skipped")
    if flags:
        d.update_skipped([s for s, _ in flags], [v for _, v in flags])
    d.update(steps, values)
    for track, what, method in (
        (loss, "loss", d.update_loss),
        (lr, "lr", d.update_lr),
        (scale, "scale", d.update_scale),
    ):
        pairs = _track(track, what)
        if pairs:
            method([s for s, _ in pairs], [v for _, v in pairs])
    for step in sorted(layers or {}):
        d.update_layers(step, layers[step])
    return d.result()
