"""The loss's shape: its initial level, its best, where it went back up, and what the norm did then.

The loss, when logged, is a second signal: a norm departure followed by a loss
that jumps and stays up, or that climbs above its initial level and has to learn
again, is a divergence, as is a loss that climbs above its initial level and
stays there above chance, whatever the norm did; a loss that never improves
(over at least 200 steps), returns to its initial level or settles at chance, or
stops early far above where it can go (a plateau), is a stall; a norm that rises
(or falls) by orders of magnitude while the loss falls is healthy (a model
leaving a small initialisation; a loss approaching its minimum, also one that
falls by fractions of its own level near 0).
"""

from __future__ import annotations

import bisect
import math
from typing import NamedTuple

from fastnorm.monitoring.diagnosis.events import DIVERGED, EXPLODING, MIN_POINTS, STALLED, num
from fastnorm.monitoring.diagnosis.norm import Found
from fastnorm.monitoring.diagnosis.robust import (
    MAD_TO_SIGMA,
    NOISY,
    Thinned,
    held,
    median,
    rolling_median,
    trend,
)
from fastnorm.monitoring.diagnosis.skips import Run, close_run, extend

_LOSS_POINTS = 1024  # the loss is kept at most this finely (pairs averaged beyond)
MIN_LOSS_POINTS = 20  # fewer losses say nothing about the run's course, unless they span this many steps:
_SHORT_SPAN = 40  # a log of every 10th step reads its first 5 losses 40 steps into the run
# A loss flat for fewer steps may just not have started (a warmup). Counted in steps, not logged points,
# so that logging every 10th step (a trainer's logging_steps) reads the same run the same way.
_NEVER_STEPS = 200
# A plateau's loss still falling along its least-squares line at this many standard errors is learning.
TREND_ERRORS = 4.0


class LossSignal:
    """The training loss: its finite values thinned to bounded memory, and its runs of non-finite ones."""

    def __init__(self) -> None:
        self.thinned = Thinned(_LOSS_POINTS)
        self.nonfinite: list[Run] = []
        self.read = False

    def update(self, step: int, value: float) -> None:
        self.read = True
        if math.isfinite(value):
            close_run(self.nonfinite)
            self.thinned.add(step, value)
        else:
            extend(self.nonfinite, step, value)

    def all(self) -> list[tuple[int, float]]:
        """The finite losses kept, ``(step, loss)``."""
        return self.thinned.all()

    def view(self, stall_fraction: float, judge_start: bool) -> LossView | None:
        """The loss's shape, or None while too few losses were read to say anything."""
        points = self.thinned.all()
        short = len(points) < MIN_POINTS or points[-1][0] - points[0][0] < _SHORT_SPAN
        if len(points) < MIN_LOSS_POINTS and short:
            return None
        return LossView(self.thinned.all(), stall_fraction, judge_start)


class Shape(NamedTuple):
    """How a loss failed, as :meth:`LossView.shape` reads it."""

    never: bool  # it never improved
    start: int  # the step it started
    detail: str
    end: int | None = None  # where a relapse ended; None for a loss that stayed there
    above: bool = False  # it ended above where it began (read over its first points too, when noisy)


class LossView:
    """The shape of a (thinned) loss series: its initial level, best, final level and noise."""

    def __init__(self, points: list[tuple[int, float]], stall_fraction: float, judge_start: bool) -> None:
        self.judge_start = judge_start and points[-1][0] - points[0][0] + 1 >= _NEVER_STEPS
        self.steps = [s for s, _ in points]
        ys = [v for _, v in points]
        n = len(ys)
        w = max(5, n // 25) | 1
        self.w = w
        self.smooth = rolling_median(ys, w)
        diffs = sorted(abs(b - a) for a, b in zip(ys, ys[1:]))
        sigma = MAD_TO_SIGMA * median(diffs) / math.sqrt(2.0) if diffs else 0.0
        level = median(sorted(abs(y) for y in ys))
        # The step-to-step noise as a fraction of the loss's level: a batch's own noise.
        self.noise = median(diffs) / level if diffs and level > 0 else 0.0
        # The initial level: the points of the first 5 steps (one, for a log of every 10th step, whose 5th
        # point may be 40 steps into a loss that falls fast).
        head = [y for s, y in points[:5] if s - points[0][0] < 5]
        self.first = median(sorted(head))
        best = min(range(n), key=self.smooth.__getitem__)
        self.best, self.best_step, self._best_index = self.smooth[best], self.steps[best], best
        if self.first < self.best:  # never below where it began
            self.best, self.best_step, self._best_index = self.first, self.steps[0], 0
        self.final = median(sorted(ys[-w:]))
        self.noise_tol = 3.0 * sigma / math.sqrt(w)  # a smoothed point's noise: three sigmas over sqrt(w)
        self.stall_fraction = stall_fraction
        self.tol = max(self.noise_tol, stall_fraction * abs(self.first))
        # Whether the loss ever improved is read from where it started to its best. A loss whose steps move
        # by half its level or more (each step follows its batch) is read otherwise at both ends: 5 points
        # do not pin its start down (their median lies off its level by about the level itself, and a few
        # high first batches read as learning), and its best is the least of its noise. Its first w points
        # are read against its last w: whether it ended below where it began.
        self.noisy = self.noise >= NOISY
        start = ys[:w] if self.noisy else head
        self.improvement = median(sorted(start)) - (self.final if self.noisy else self.best)
        # The start is itself a median of a few noisy points: progress below its own noise (two standard
        # errors of a median of len(start) points) is no progress.
        self.progress_tol = self.tol + 2.0 * 1.25 * sigma / math.sqrt(len(start))
        # Above this, the loss is above its initial level: a margin beyond the noise of a smoothed point.
        self.ceiling = self.first + max(self.tol, 0.1 * abs(self.first))
        self.ys = ys

    def chance(self) -> int | None:
        """k where the loss began at ln k (chance for a classifier of k classes) and ended there.

        k is read from where the loss ended (see :meth:`ended_at_chance`). The start is not noise-bound: a
        net's first losses sit above ln k by about half the variance of its initial logits, an offset of
        the initialisation that no averaging removes, so it must only name k: lie within half the gaps to
        ln(k - 1) and ln(k + 1).
        """
        k = self.ended_at_chance()
        if k is None:
            return None
        at, up, down = math.log(k), 0.5 * math.log1p(1 / k), 0.5 * math.log(k / (k - 1))
        return k if -down <= self.first - at <= up else None

    def ended_at_chance(self) -> int | None:
        """k where the loss ended at ln k, where a model that predicts nothing (uniform outputs) settles.

        The end is a median of w points: it must lie within the loss's own noise of ln k (``noise_tol``,
        three sigmas of a step over sqrt(w)), and that noise must be narrower than half the gap from ln k
        to ln(k + 1), or the loss could as well be at another k's chance (a noisy regression loss near 0.7
        is no classifier at ln 2).
        """
        if not 0.5 < self.final < math.log(100_000.5):  # past ln 100000, exp would overflow on a blow-up
            return None
        k = round(math.exp(self.final))
        if not 2 <= k <= 100_000:
            return None
        at, up = math.log(k), 0.5 * math.log1p(1 / k)
        return k if self.noise_tol < up and abs(self.final - at) <= self.noise_tol else None

    def early_blowup(self) -> tuple[int, float, float] | None:
        """``(step, loss, level before)`` of the first loss 5x its level before (the median of up to 20
        points) and above every loss before it, still 5x at the next step where that is logged, within the
        run's first fifth (its first 50 steps while it is shorter), where a healthy loss is at its highest;
        None if none."""
        early = max((self.steps[-1] - self.steps[0]) / 5, 50)
        ys = self.ys
        for i in range(1, len(ys)):
            if self.steps[i] - self.steps[0] > early:
                break
            before = median(sorted(ys[max(0, i - 20) : i]))
            # Above every loss before it, the run's first included: a healthy loss is highest at its start,
            # so a batch 5x the level that stays below where the run began has undone nothing (one bad
            # batch of a loss that fell fast), and a blow-up that lost what the run knew climbs above it.
            if not (before > 0 and ys[i] > 5 * before and ys[i] > max(ys[:i])):
                continue
            # The model's, not one batch's: the next step's loss, another batch through the updated model, is
            # 5x the level too (one outlier batch, 900x, is followed by a normal loss; a rate far too high
            # leaves the next steps as high). A thinned log, whose next point comes steps later, when a
            # model that blew up may have recovered already, cannot tell the two apart: its point stands.
            nxt = i + 1
            if nxt < len(ys) and self.steps[nxt] - self.steps[i] <= 1 and not ys[nxt] > 5 * before:
                continue
            # Beyond the loss's own step-to-step moves (a batch of 2 moves it 5x), measured outside the
            # blow-up: without the points still 5x above the level before it, whose way down is its own
            # (on a log of every 10th step, the only moves its first window holds).
            j = i + 1
            while j < len(ys) and ys[j] > 5 * before:
                j += 1
            rest = ys[:i] + ys[j:]
            moves = sorted(abs(b - a) for a, b in zip(rest, rest[1:]))
            if not moves or ys[i] - before > 10 * median(moves):
                return self.steps[i], ys[i], before
        return None

    def jumped(self, step: int, sustain: int, reach: int) -> tuple[int, float, float] | None:
        """``(start, before, after)`` where the loss, within ``reach`` steps after ``step``, held at 10x or
        more its level before (the median of the 20 points up to ``step``) for ``sustain`` points or
        steps (see :func:`~fastnorm.monitoring.diagnosis.robust.held`), ``after`` the median there, and is
        still that high at the end; None otherwise."""
        i = bisect.bisect_right(self.steps, step)
        if i == 0:
            return None
        before = median(sorted(self.ys[max(0, i - 20) : i]))
        if not self.final >= 10 * before:
            return None
        for j in range(i, len(self.ys)):
            if self.steps[j] - step > reach:
                break
            span = []
            for k in range(j, len(self.ys)):
                span.append(self.ys[k])
                if held(len(span), self.steps[k] - self.steps[j] + 1, sustain):
                    after = median(sorted(span))
                    if after >= 10 * before and after - before > self.tol:
                        return self.steps[j], before, after
                    break
        return None

    def rose_at_once(self) -> tuple[int, float, float] | None:
        """``(step, loss, least later level)`` where the loss was at its lowest at its first point and every
        later smoothed level lies 1.5x or more above it: the updates made the model worse from the first
        ones, as a rate far too high does. A rate too low, or labels that cannot be learned, leave the loss
        where it began. A loss that follows its batches (``noisy``) has no first point to trust; None
        otherwise too."""
        ys = self.ys
        if self.noisy or len(ys) < 3 * self.w or not ys[0] > 0:
            return None
        later = min(self.smooth[self.w :])
        return (self.steps[0], ys[0], later) if later >= 1.5 * ys[0] else None

    def plateau(self, deep: bool = False) -> tuple[int, float] | None:
        """``(step, level)`` where the loss, after falling early (within the first tenth of the run), stopped
        for good far above its start's half: a plateau of two thirds of the run and 200 steps or more, over
        which it no longer falls.

        "Stopped" is read on the plateau's two halves, each the median of its points: a loss whose later half
        lies ``stall_fraction`` (5%) or more of its level below its earlier half is still learning, however
        early it came near where it ended. One smoothed point says less: a loss whose batches move it by a
        quarter of its level (a regression near its floor) comes within 5% of its end by noise alone, 250
        steps before it gets there (a diabetes regression, 0.46 over steps 18-159 and 0.42 over the rest,
        read as a post-LN plateau, whose halves lie within 2% of each other).

        ``deep``: also a loss that fell by more than half first, or stopped after the run's first tenth (its
        last two thirds flat all the same), which alone cannot be told from one that reached its floor early
        or is slow to start (the caller brings the evidence: a learning rate cut where it stopped).
        """
        span = self.steps[-1] - self.steps[0]
        if self.first - self.final <= self.tol or (self.final < 0.5 * self.first and not deep):
            return None
        # Where it came within 5% of where it ended: a converging run gets there late, still learning.
        i = next(i for i, y in enumerate(self.smooth) if y <= 1.05 * self.final)
        flat = self.steps[-1] - self.steps[i]
        if (self.steps[i] - self.steps[0] > span / 10 and not deep) or flat < max(200, 2 * span / 3):
            return None
        rest = self.ys[i:]
        half = len(rest) // 2
        earlier, later = median(sorted(rest[:half])), median(sorted(rest[half:]))
        if earlier - later >= self.stall_fraction * abs(earlier):
            return None
        # The halves' medians differ by about half of a steady fall over the plateau: a loss that still
        # falls by the stall fraction along its least-squares line, beyond its noise, is learning slowly (a
        # masked LM from 3.1 to 2.85 over 280 steps, its batches +-0.2, halves within 3%).
        change, errors = trend(self.steps[i:], rest)
        if -change >= self.stall_fraction * abs(earlier) and errors <= -TREND_ERRORS:
            return None
        return self.steps[i], self.smooth[i]

    def shape(self) -> Shape | None:
        """How the loss failed: it never improved, went back up and stayed there, or climbed above its
        initial level and had to learn again (a relapse); None for a loss that learned and held."""
        progress = self.first - self.best
        s = (
            f"{num(self.first)} at the start, {num(self.best)} at best (step {self.best_step}), "
            f"{num(self.final)} at the end"
        )
        regained = self.final - self.best
        above = self.final > self.ceiling
        never = self.improvement < self.progress_tol and self.judge_start
        if not above and self.noisy and never:
            # A loss that follows its batches ended where it began: how far it went back up from its best,
            # the least of its noise, says nothing.
            return Shape(True, self.steps[0], f"the loss never improved: {s}")
        if not above and (progress < self.tol or regained < max(0.5 * progress, self.tol)):
            if never:
                return Shape(True, self.steps[0], f"the loss never improved: {s}")
            return self._relapse(s)
        # Dated where the smoothed loss left the neighbourhood of its best for good.
        i = len(self.smooth) - 1
        while i > self._best_index and self.smooth[i] > self.best + self.tol:
            i -= 1
        start = self.steps[min(i + 1, len(self.steps) - 1)]
        if above:
            # Where the smoothed loss crossed its initial level for good, which is not where it left its best.
            k = len(self.smooth) - 1
            while k > self._best_index and self.smooth[k - 1] > self.first:
                k -= 1
            detail = (
                f"the loss left its best from step {start} and rose above its initial level "
                f"({num(self.first)}) from step {self.steps[k]} and stayed there: {s}"
            )
            # A loss that follows its batches has a start its first 5 points do not pin down (see
            # ``improvement``): it ended above where it began only when above its first w points too.
            start_level = median(sorted(self.ys[: self.w]))
            robust = not self.noisy or self.final > start_level + max(self.tol, 0.1 * abs(start_level))
            return Shape(False, start, detail, above=robust)
        if self.final >= self.first - 0.1 * progress:
            what = "returned to its initial level"
        else:
            what = f"went back up by {regained / progress:.0%} of what it had gained"
        return Shape(False, start, f"the loss left its best from step {start} and {what}: {s}")

    def _relapse(self, s: str) -> Shape | None:
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
                    crossed = next(j for j in range(i, k + 1) if self.smooth[j] > self.first)
                    detail = (
                        f"the loss left its low ({num(low)}) from step {self.steps[i]}, rose above its "
                        f"initial level ({num(self.first)}) at step {self.steps[crossed]} (to "
                        f"{num(self.smooth[top])} at step {self.steps[top]}), then came down again: {s}"
                    )
                    return Shape(False, self.steps[i], detail, self.steps[end])
                k = end
            k += 1
        return None

    def at(self, step: int) -> float:
        i = max(0, bisect.bisect_right(self.steps, step) - 1)
        return self.smooth[i]

    def held(self, start: int, end: int) -> str | None:
        """``"a to b"`` when the smoothed loss never rose beyond its noise over ``[start, end]``."""
        a = self.at(start)
        i, j = bisect.bisect_left(self.steps, start), bisect.bisect_right(self.steps, end)
        top = max(self.smooth[i:j], default=a)
        if top <= a + self.tol:
            return f"{a:.3g} to {self.at(end):.3g}"
        return None

    def fell(self, start: int, end: int, stayed: bool = True) -> str | None:
        """``"a to b"`` when the loss fell over ``[start, end]`` (and, with ``stayed``, stayed below
        where it began to the end)."""
        a, b = self.at(start), self.at(end)
        if self._below(b, a) and (not stayed or self._below(self.final, a)):
            return f"{a:.3g} to {b:.3g}"
        return None

    def improved_after(self, step: int, until: int) -> bool:
        """The loss reached its best after ``step`` and by ``until``, below where it stood at ``step`` by more
        than its tolerance there: 5% of its start, or its noise over those steps (three sigmas of a step
        over sqrt(w)). Read there, not over the whole run, whose blow-up, later, moves the loss by its
        whole level from step to step and would bury a fall of a few hundredths before it."""
        if not step < self.best_step <= until:
            return False
        i, j = bisect.bisect_left(self.steps, step), bisect.bisect_right(self.steps, until)
        part = self.ys[i:j]
        diffs = sorted(abs(b - a) for a, b in zip(part, part[1:]))
        if not diffs:
            return False
        sigma = MAD_TO_SIGMA * median(diffs) / math.sqrt(2.0)
        tol = max(3.0 * sigma / math.sqrt(self.w), self.stall_fraction * abs(self.first))
        return self.at(step) - self.best > tol

    def _below(self, b: float, a: float) -> bool:
        """``b`` lies below ``a`` by more than the loss's tolerance (5% of its start, or its noise), or,
        beyond its noise, by half of ``a`` or more. A loss already near its minimum (0 for a cross-entropy
        or a squared error) moves by fractions of where it stands, not of where it began: one at 0.2% of
        its start that falls 100x more has fallen, although by less than 5% of its start."""
        return b < a - self.tol or (b <= 0.5 * a and b < a - self.noise_tol)


class LossEvent(NamedTuple):
    """What the loss shows: a stall, or a divergence with the norm's rise that went with it."""

    kind: str  # STALLED or DIVERGED
    start: int
    end: int | None  # where a relapse ended; None for a loss that stayed there
    detail: str
    never: bool  # a stall: the loss never improved
    peak: float | None = None  # a divergence: the norm's peak and the level before it (log10)
    base: float | None = None
    consumed: frozenset[int] = frozenset()  # the norm's events (indices in `found`) it takes in
    turn: int | None = None  # a divergence: where the loss itself turned (its start is the norm's rise)
    norm_rose: bool = True  # a divergence: the norm rose with the loss (else the loss alone shows it)


def loss_event(
    loss: LossView,
    found: list[Found],
    ups: list[tuple[int, int, float]],
    levels: list[tuple[int, float]],
    spike_orders: float,
) -> LossEvent | None:
    """The event the loss shows (diverged or stalled), and which of the norm's events it takes in."""
    shape = loss.shape()
    if shape is None:
        return None
    never, start, detail, end, _ = shape
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

    # A rise long under way while the loss still fell, or went on to its best (a model leaving a small
    # initialisation; a recurrent net whose norm grows tenfold as it learns, then blowing up for another
    # reason) goes into the divergence but does not date it: the run was still learning after it began.
    def under_way(a: int) -> bool:
        return a < start - near and (
            loss.fell(a, start - near, stayed=False) or loss.improved_after(a, start)
        )

    dating = [i for i in ours if not under_way(found[i].event.start_step)]
    linked = [(found[i].event.start_step, found[i].extreme - found[i].base) for i in dating]
    linked += [
        (a, peak) for a, b, peak in ups if a <= start + near and b >= start - near and not under_way(a)
    ]
    before = sorted(x for s, x in levels if start - 4 * near <= s < start) or sorted(
        x for _, x in levels[: 4 * near]
    )
    after = [x for s, x in levels if s >= start]
    rise = median(sorted(after[: 4 * near])) - median(before) if after and before else 0.0
    strong = max((peak for _, peak in linked), default=0.0) >= spike_orders or rise >= 0.5
    # A loss that climbed above where the run began, and stayed there above chance, does worse than a model
    # that predicts nothing: a divergence, also where the norm stayed within its band (a recurrent net's
    # bursts widen that band until it holds the rise a learning-rate jump brings). One that settled at ln k
    # (outputs collapsed to uniform as the weights decayed to nothing, above a start that had already
    # fallen within its first 5 points) or returned to its initial level (a data pipeline that changed) is
    # a stall.
    lost = shape.above and end is None and loss.ended_at_chance() is None
    if never or not (strong or lost):
        if end is not None:  # a relapse without the norm is no stall: the loss came down again
            return None
        return LossEvent(STALLED, start, None, detail, never)
    # The norm went up with a loss that jumped and stayed up (or relapsed): a divergence, from the rise.
    # Dated by the norm, read every step, not by the loss, whose start blurs with its noise and smoothing
    # (a noisy loss wandering up from its best dated a blow-up 35 steps early).
    onset = min(a for a, _ in linked) if linked else start
    peak = max([found[i].extreme for i in ours] + after, default=None)
    base = median(before) if before else None
    return LossEvent(DIVERGED, onset, end, detail, never, peak, base, frozenset(ours), start, strong)
