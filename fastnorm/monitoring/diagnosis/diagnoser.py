"""The composing :class:`Diagnoser`: each signal read by its own module, the events joined into a verdict.

The verdict is the most severe kind among the events: nonfinite > diverged >
exploding > vanishing > stalled > stable ("too few points" below 5 norms). Every
event carries its own actions, the first chosen from :class:`~fastnorm.monitoring.
diagnosis.advice.Evidence`: what the log showed of the learning rate, the
optimizer's settings, the precision and the loss (see ``advice``). A blow-up in
the loss's first steps is a divergence from the run's start, not a stall (one
outlier batch, the next step's loss back at its level, is no blow-up); a
blow-up that follows a learning-rate change is dated from the change (a jump's
step, a ramp's foot); a burst of the norm that came back while the loss held is
a spike the run rode out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from fastnorm import checks
from fastnorm.monitoring.diagnosis import advice
from fastnorm.monitoring.diagnosis import objective as objectives
from fastnorm.monitoring.diagnosis.events import (
    DECAY,
    DIVERGED,
    EXPLODING,
    GROWTH,
    KINDS,
    LOG_ZERO,
    MIN_POINTS,
    NONFINITE,
    SPIKE,
    STABLE,
    STALLED,
    TOO_FEW,
    UNSTABLE,
    VANISHING,
    Diagnosis,
    Event,
    at_steps,
    from_log,
    led_into,
    level,
    located_lines,
    log_norm,
    num,
)
from fastnorm.monitoring.diagnosis.layers import LayerSignal
from fastnorm.monitoring.diagnosis.loss import LossSignal, LossView, loss_event
from fastnorm.monitoring.diagnosis.norm import Found, NormSignal
from fastnorm.monitoring.diagnosis.robust import Thinned, median, number, pairs, times
from fastnorm.monitoring.diagnosis.schedule import LrSignal, OptimizerSettings
from fastnorm.monitoring.diagnosis.skips import SPIKE_CODE, SkipSignal
from fastnorm.monitoring.diagnosis.zeros import ZeroSignal


class Diagnoser:
    r"""Diagnoses a gradient-norm series as it arrives, in constant memory.

    :func:`diagnose` reads a whole series at once; ``Diagnoser`` takes it in
    pieces (``GradNormMonitor`` feeds it each window), keeping only running
    summaries: the baseline, the open departure, the runs of non-finite values,
    the loss thinned to at most 2048 points, the latest per-layer reading. A
    long run costs no more per point than a short one.

    Every rule below that something must hold "for N points" (``warmup``,
    ``sustain``, ``recover``, ``window``'s new normal, ``max_skip_run``) counts
    N points or N steps, whichever ends first, over 3 points at least: a log of
    every 10th step sustains a level in 3 points (30 steps), not in 10 (100
    steps), and never on one point.

    Args:
        window (int): points in the running baseline; a departure short of an
            explosion that stays out of the band this long is a new normal.
            Default: 50.
        warmup (int): points that form the first baseline before the norm
            is judged, or as many steps, whichever ends first (3 points at
            least): a log of every 10th step judges its 4th point, not its
            11th. Default: 10. Fewer than 5 norms in all are too few to judge:
            the verdict is ``"too few points"``.
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
        sustain (int): points (or steps) over which a level counts as
            sustained: a departure's level is the median of its last
            ``sustain`` points or steps, whichever are fewer, so shorter
            excursions never make it. A loss that held 10x above its level
            this long just after a jump of the learning rate is a divergence.
            Default: 10.
        recover (int): consecutive points (or steps) back in the band that
            end a departure; a shorter dip belongs to it. Default: 3.
        horizon (int): points over which a slow drift of the baseline itself
            is measured. Default: 1000.
        layer_orders (float): the spread between per-layer norms, in orders
            of magnitude, that is vanishing. Default: 6.
        max_skip_run (int): the longest run of non-finite norms (points or
            steps) with a finite loss, still running at the last step, read as
            skipped steps rather than a collapse (a dynamic loss scaler
            starting at 2**32 halves its way down for a dozen steps or more).
            Default: 40.
        stall_fraction (float): a loss that never improves by this fraction of
            its initial value (and by more than its noise) has stalled. Default: 0.05.
        max_norm (float, optional): the clipping threshold of the run, for the
            advice (enable or tighten clipping). Default: None (not clipped).
        precision (str, optional): the run's precision (see
            :class:`~fastnorm.GradNormMonitor`), for the advice; also read from
            :meth:`update_settings`. Default: None (not known).
        objective (str, optional): what the loss is: ``"minimise"`` (a loss
            to a floor), ``"adversarial"`` (a GAN generator's), ``"reinforcement"``
            (a policy gradient's) or ``"contrastive"`` (see
            :mod:`~fastnorm.monitoring.diagnosis.objective`). Default: None (read
            from the log's keys, :meth:`update_keys`, and from a loss that goes
            negative; a loss to minimise where the log says nothing).

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
        precision: str | None = None,
        objective: str | None = None,
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
        self.spike_orders = spike_orders
        self.sustain = sustain
        self.recover = recover
        self.stall_fraction = stall_fraction
        self.max_norm = max_norm
        self.precision = checks.precision(precision, "Diagnoser")
        self.objective = objectives.check(objective, "Diagnoser")
        self._keys: tuple[str, ...] = ()
        # ((losses read, rewards given), reward-driven) when last inferred
        self._rl_read: tuple[tuple[int, bool], bool] | None = None
        self._losses_read = 0
        self._rewards = Thinned(objectives.REWARD_KEPT)  # a reward-driven run's finite rewards, in step order
        self._norm = NormSignal(
            window=window,
            warmup=warmup,
            band_mads=band_mads,
            min_band=min_band,
            spike_orders=spike_orders,
            explode_orders=explode_orders,
            vanish_orders=vanish_orders,
            sustain=sustain,
            recover=recover,
            horizon=horizon,
        )
        self._skips = SkipSignal(max_skip_run)
        self._loss = LossSignal()
        self._lr = LrSignal()
        self._settings = OptimizerSettings()
        self._located: dict[str, Any] = {}  # the locator's keys of the first window with each kind of finding
        self._layers = LayerSignal(layer_orders)
        self._zeros = ZeroSignal()
        self._count = 0
        self._first_step: int | None = None
        self._last_step: int | None = None

    # -- input ---------------------------------------------------------------

    def update(self, steps: Iterable[int], values: Iterable[Any]) -> None:
        """Reads more norm values, in step order.

        Args:
            steps (iterable of int): the step of each value.
            values (iterable): gradient norms (>= 0; NaN and inf allowed). A
                negative or non-numeric value is counted and reported as
                invalid, never raised on and never dropped silently.
        """
        for step, value in pairs(steps, values):
            self._point(step, value)

    def _point(self, step: int, raw: Any) -> None:
        self._count += 1
        if self._first_step is None:
            self._first_step = step
        self._last_step = step
        value = number(raw)
        skips = self._skips
        if value is None or value < 0:
            skips.invalid_value(step, raw)
            return
        skips.valid_value()
        if not math.isfinite(value):
            skips.nonfinite_value(step, value)
            self._norm.nonfinite()
            return
        skips.finite_value()
        self._zeros.point(step, value)
        if value == 0.0 and self._ties_are_ordinary():
            return  # a policy-gradient batch whose rewards tie: no level of the norm
        self._norm.point(step, log_norm(value))

    def update_skipped(self, steps: Iterable[int], flags: Iterable[Any]) -> None:
        """Reads whether the optimizer skipped each step (e.g. ``StepClipper.skipped``), in step order.

        Given before or after the norms of the same steps. A flag says what became of a step
        with a non-finite norm: skipped (the weights untouched) or applied.

        Args:
            steps (iterable of int): the step of each flag.
            flags (iterable): true or nonzero where the step was skipped (2: skipped for a spike
                alone, by a :class:`~fastnorm.SpikeGuard`); false or 0 where it was applied.
                Anything else (None, text) is passed over.
        """
        for step, raw in pairs(steps, flags, "skipped"):
            value = raw if isinstance(raw, bool) else number(raw)
            if value is not None:
                self._skips.flag(step, value != 0, self._last_step, spike=value == SPIKE_CODE)

    def update_loss(self, steps: Iterable[int], losses: Iterable[Any]) -> None:
        """Reads the training loss at some steps, in step order (non-numeric values are skipped).

        The loss of a step already flagged as skipped for a spike (:meth:`update_skipped`, flag 2)
        is left out: it is the bad batch's, and the weights did not take it.

        Args:
            steps (iterable of int): the step of each loss.
            losses (iterable of float): the losses (NaN and inf allowed).
        """
        spiked = self._skips.spiked_steps
        for step, raw in pairs(steps, losses, "loss"):
            value = number(raw)
            if value is not None and step not in spiked:
                self._loss.update(step, value)
                self._losses_read += 1

    def update_reward(self, steps: Iterable[int], rewards: Iterable[Any]) -> None:
        """Reads a reward-driven run's mean reward at some steps, in step order (non-numeric and
        non-finite values are skipped). Given before the norms of the same steps, it says their exact
        zeros are batches whose rewards tied. A run given a reward is reward-driven unless its
        ``objective`` or its log says otherwise; there, a reward that never rose is a stall, one that
        fell well below its start a divergence.

        Args:
            steps (iterable of int): the step of each reward.
            rewards (iterable of float): the rewards.
        """
        for step, raw in pairs(steps, rewards, "reward"):
            value = number(raw)
            if value is not None and math.isfinite(value):
                self._rewards.add(step, value)

    def update_lr(self, steps: Iterable[int], lrs: Iterable[Any]) -> None:
        """Reads the learning rate at some steps, in step order: it dates warmups and schedule changes."""
        for step, raw in pairs(steps, lrs, "lr"):
            value = number(raw)
            if value is not None and math.isfinite(value):
                self._lr.update(step, value)

    def update_scale(self, steps: Iterable[int], scales: Iterable[Any]) -> None:
        """Reads a loss scaler's scale at some steps (e.g. ``GradScaler.get_scale()``), in step order."""
        for step, raw in pairs(steps, scales, "scale"):
            value = number(raw)
            if value is not None:
                self._skips.scale_value(step, value)

    def update_settings(self, step: int, settings: Mapping[str, Any]) -> None:
        """Reads what the monitor knows of the run at ``step`` (its window's ``settings``): ``lr``,
        ``weight_decay``, ``eps``, ``beta1``, ``beta2``, ``momentum`` and ``precision/<name>``.

        Args:
            step (int): the step they were read at.
            settings (mapping): name -> value; names not listed above, and values that are not
                numbers, are passed over.
        """
        for name, raw in settings.items():
            value = number(raw)
            if value is None:
                continue
            if name == "lr":
                self.update_lr([step], [value])
            elif name in OptimizerSettings.NAMES and math.isfinite(value):
                self._settings.update(name, step, value)
            elif name.startswith("precision/") and value and self.precision is None:
                self.precision = checks.precision(name.split("/", 1)[1], "Diagnoser.update_settings")
        # The locator's findings (locate_<kind>/..., see events.located_lines): the run's first of each kind.
        def kind(key: str) -> str:
            return key.split("/", 1)[0].removesuffix("_frames")

        kept = {kind(k) for k in self._located}
        new = {k: v for k, v in settings.items() if k.startswith("locate_") and kind(k) not in kept}
        self._located.update(new)

    def update_keys(self, keys: Iterable[str]) -> None:
        """Reads the names of the metrics the log holds (``reward``, ``loss_discriminator``, ...): where
        no objective was given, they say what the loss is."""
        self._keys = (*self._keys, *(str(k) for k in keys if str(k) not in self._keys))
        self._rl_read = None

    def update_layers(self, step: int, norms: Mapping[str, Any]) -> None:
        """Reads one step's per-layer norms (name -> norm), e.g. the ``gradient_norm_layer/<name>``
        the monitor logs once per window. Layers whose norm is always 0 (frozen or unused) are ignored."""
        self._layers.update(step, norms)

    # -- output --------------------------------------------------------------

    def result(self) -> Diagnosis:
        """The diagnosis of everything read so far; events still open end at the last step read."""
        signals = tuple(
            name
            for name, read_ in (
                ("loss", self._loss.read),
                ("lr", self._lr.last is not None),
                ("scale", bool(self._skips.scale)),
                ("reward", bool(self._rewards)),
                ("layers", self._layers.snapshots > 0),
                ("skipped", self._skips.flags_read),
            )
            if read_
        )
        if self._count < MIN_POINTS:
            located = located_lines(self._located)
            return Diagnosis(TOO_FEW, steps=self._count, signals=signals, located=located)
        last = self._last_step
        found, ups = self._norm.found(last)
        self._ev = self._evidence()
        objective, read_as = self._objective()
        loss = self._loss.view(self.stall_fraction, judge_start=not self._lr.still_warming)
        if objective in objectives.NOT_A_FLOOR:
            loss = None  # no floor to stall at, no rise that is a divergence: the norm is read alone
            # whose level swings by design (a policy's, a generator's): its baseline's climb warns of nothing
            found = [f for f in found if not f.climbing]
        elif loss is not None:
            # A climb is a warning where the loss rose with it (beyond its noise), before it blows up: a norm
            # that climbs while the loss learns or holds is growth (logits that sharpen, a model leaving its
            # initialisation).
            now = loss.at(last) - loss.tol
            found = [f for f in found if not f.climbing or now > loss.at(f.event.start_step)]
        notes: list[str] = []
        events = self._skips.events(last, self._loss.read, self._loss.nonfinite, self._first_step)
        events += self._skips.invalid_events()
        guard = self._skips.guard_events(last)
        events += guard
        # A guard that skips every step to the end: nothing learned since, whatever the norm did there.
        stall = next((e for e in guard if e.kind == STALLED), None)
        read = (
            loss_event(loss, found, ups, self._norm.levels.all(), self.spike_orders)
            if loss is not None
            else None
        )
        consumed = read.consumed if read is not None else frozenset()
        blowup = loss.early_blowup() if loss is not None and (read is None or read.kind != DIVERGED) else None
        # A loss that jumped after the learning rate did: a divergence, also where it then reads as a stall
        # (a blow-up that left the loss at chance).
        jump = (
            self._lr_jump(loss, found, last)
            if loss is not None and blowup is None and (read is None or read.kind == STALLED)
            else None
        )
        if blowup is not None:
            # Blown up in the first steps: a divergence (whatever the run learned after), which takes in the
            # norm's own events of those steps (the wild swings, the dead units after).
            consumed = frozenset(range(len(found)))
            events.append(self._early_blowup(blowup, loss, found, last))
        elif jump is not None:
            events.append(jump)
            # The norm's rises from the change on are the divergence's.
            consumed = frozenset(
                i for i, f in enumerate(found) if f.side > 0 and f.event.end_step >= jump.start_step
            )
        elif read is not None:
            events.append(self._loss_event(read, loss, found, last))
        elif loss is not None and (plateau := self._plateau_found(loss, last)) is not None:
            events.append(self._plateau(plateau, loss, found, last))
        elif loss is not None:
            notes += self._unlogged_plateau(loss, last)
        events += [self._norm_event(f, loss, found) for i, f in enumerate(found) if i not in consumed]
        if objective in objectives.NOT_A_FLOOR:
            events = [self._for_objective(e, objective) for e in events]
            fall = None if VANISHING in {e.kind for e in events} else self._fall_from_start(objective, last)
            if fall is not None:
                events.append(fall)
            rewarded = objective == objectives.REINFORCEMENT
            reward = objectives.reward_event(self._rewards.all()) if rewarded else None
            if reward is not None:
                events.append(reward)
        early = self._early_collapse(events, last)
        if early is not None:
            events.append(early)
        vanish = advice.vanish_actions(self._ev, None)
        events += [replace(e, actions=vanish) for e in self._layers.events(self._first_step, last)]
        checkpoint = advice.checkpoint_action(self._ev)
        if checkpoint is not advice.CHECKPOINT:  # the run's precision is known: said in its terms
            events = [
                replace(e, actions=tuple(checkpoint if a == advice.CHECKPOINT else a for a in e.actions))
                for e in events
            ]
        zero = self._zeros.event(self._ev, last, self.sustain)
        if zero is not None:
            # The norm's own fall to 0 is this finding, said once.
            events = [e for e in events if not (e.kind == VANISHING and e.end_step >= zero.start_step)]
            collapse = next((e for e in events if e.kind == NONFINITE), None)
            if collapse is not None and collapse.start_step <= zero.start_step:
                # Zeros from a step at or after non-finite values: the collapse's aftermath (the gradients
                # of a NaN loss skipped or zeroed), not a run in which nothing trains. Said, never leading.
                after = f", after the non-finite values from step {collapse.start_step}"
                events.append(replace(zero, detail=zero.detail + after))
                zero = None
            else:
                events.append(zero)
        events.sort(key=lambda e: (e.start_step, KINDS.index(e.kind), e.end_step))
        kinds = {e.kind for e in events}
        verdict = next((k for k in UNSTABLE if k in kinds), STABLE)
        actions: list[str] = []
        if zero is not None:
            # Nothing trains: the loudest finding, whatever the loss did (short of non-finite values).
            verdict = NONFINITE if NONFINITE in kinds else VANISHING
            actions += zero.actions
        elif stall is not None and verdict != NONFINITE:
            verdict = STALLED
            actions += stall.actions
        cause = led_into(events, verdict, self.sustain * self._ev.interval)
        for e in sorted(events, key=lambda e: (e is not cause, e.kind != verdict)):
            actions += [a for a in e.actions if a not in actions]
        return Diagnosis(
            verdict, tuple(events), tuple(actions), self._count, signals, objective=objective, objective_read=read_as,
            located=located_lines(self._located), notes=tuple(notes) if verdict == STABLE else (),
        )

    def _unlogged_plateau(self, loss: LossView, last: int) -> list[str]:
        """A loss that stopped falling early and stayed put, in a log without the learning rate: said (in a
        run judged stable, where nothing else explains it), not judged. It reads the same as a model that
        converged early (healthy runs of the families corpus do) and as a rate cut to near zero (a
        schedule's mistake); only the rate tells them apart."""
        plateau = loss.plateau(deep=True)
        if plateau is None or self._lr.first is not None:
            return []
        step, at = plateau
        span = max(1, last - loss.steps[0])
        return [
            f"the loss fell less than {loss.stall_fraction:.0%} from step {step} ({num(at)}, from "
            f"{num(loss.first)} at the start) to the end: {last - step} steps, {(last - step) / span:.0%} of "
            "the run. A model that converged early and a learning rate cut to near zero read the same; the "
            "log holds no learning rate to tell them apart: log it (GradNormMonitor(optimizer=...))"
        ]

    def _ties_are_ordinary(self) -> bool:
        """A reward-driven run, as far as read: its exact zeros are batches whose rewards tied."""
        if self.objective is not None:
            return self.objective == objectives.REINFORCEMENT
        read_so_far = (self._losses_read, bool(self._rewards))
        if self._rl_read is None or self._rl_read[0] != read_so_far:
            self._rl_read = (read_so_far, self._objective()[0] == objectives.REINFORCEMENT)
        return self._rl_read[1]

    def _objective(self) -> tuple[str, str]:
        """The objective, and how it was read from the log ("" when given or by default)."""
        if self.objective is not None:
            return self.objective, ""
        read = objectives.infer(self._keys, [v for _, v in self._loss.all() if math.isfinite(v)])
        if read is None and self._rewards:
            return objectives.REINFORCEMENT, "a reward was given"
        return read if read is not None else (objectives.MINIMISE, "")

    def _fall_from_start(self, objective: str, last: int) -> Event | None:
        """An adversarial or reward-driven run whose norm fell 10x and more from its first 3 points to the
        median of its last third: the discriminator won, the policy saturated. Its loss says nothing of it
        (the generator's rises, the policy's sits near 0), and a fall in the first steps hides in the norm's
        own baseline."""
        levels = self._norm.levels.all()
        if len(levels) < 15:
            return None
        start = median([x for _, x in levels[:3]])
        end = median([x for _, x in levels[len(levels) - len(levels) // 3 :]])
        if end > start - objectives.FALL_ORDERS:
            return None
        who = "the generator's" if objective == objectives.ADVERSARIAL else "the policy's"
        detail = (
            f"{who} gradient norm fell {10 ** (start - end):.0f}x from its first points "
            f"({from_log(start)}) to its last third ({from_log(end)})"
        )
        event = Event(VANISHING, self._first_step, last, detail, advice.vanish_actions(self._ev, None))
        return self._for_objective(event, objective)

    def _for_objective(self, e: Event, objective: str) -> Event:
        """A norm's event in an adversarial or reward-driven run, said in its terms: a rise in its first
        steps is the generator or policy leaving its initialisation (its loss cannot say so); a fall is
        the discriminator winning, the policy saturating."""
        early = self._first_step + 0.1 * ((self._last_step or 0) - self._first_step)
        if e.kind == EXPLODING and e.start_step <= early:
            detail = f"{e.detail}: {objective} run leaving its initialisation"
            return Event(GROWTH, e.start_step, e.end_step, detail)
        if e.kind != VANISHING or any(getattr(a, "id", "") == "no_gradient" for a in e.actions):
            return e
        adversarial = objective == objectives.ADVERSARIAL
        first = objectives.DISCRIMINATOR if adversarial else objectives.POLICY_SATURATED
        rest = tuple(a for a in e.actions if getattr(a, "id", "") not in ("raise_lr", first.id))
        return replace(e, actions=(first, *rest))

    def _evidence(self) -> advice.Evidence:
        """What the advice rests on, from every signal read."""
        lr, settings = self._lr, self._settings
        levels = sorted(x for _, x in self._norm.levels.all())
        span = (self._last_step or 0) - (self._first_step or 0)
        return advice.Evidence(
            max_norm=self.max_norm,
            precision=self.precision,
            scaled=bool(self._skips.scale) or bool(self._skips.nonfinite),
            lr_first=lr.first,
            lr_top=lr.top,
            lr_first_step=lr.first_step,
            warmup_until=lr.rising_until,
            lr_changes=list(lr.changes),
            weight_decay=settings.at("weight_decay"),
            eps=settings.at("eps"),
            adam=settings.at("beta2") is not None,
            norm_level=10.0 ** median(levels) if levels else None,
            span=span,
            interval=max(1, round(span / (self._count - 1))) if self._count > 1 else 1,
        )

    def _lr_onset(self, start: int, until: int | None = None) -> int:
        """A blow-up's start, or the start of the learning-rate change that caused it (see
        :meth:`~fastnorm.monitoring.diagnosis.advice.Evidence.blowup_cause`): the norm responds steps after a
        jump and tens of steps into a ramp, and a bursty norm may have left its band before either; the
        cause, logged, says when the fault began (a jump's step, a ramp's foot)."""
        change = self._ev.blowup_cause(start, self._reach(), until)
        return start if change is None else self._ev.cause_start(change, start)

    def _reach(self) -> int:
        """How far (in steps) a cause may lie from what it caused: ``sustain`` points, or two windows of
        the learning rate's readings."""
        return 3 * self.sustain * self._ev.interval + self._lr_gap()

    def _lr_gap(self) -> int:
        return max((c[0] - c[3] for c in self._lr.changes), default=0)

    def _loss_event(self, read, loss: LossView, found: list[Found], last: int | None) -> Event:
        if read.kind != DIVERGED:
            return self._stall(read.never, read.start, read.detail, loss, found, last)
        onset = self._lr_onset(read.start, read.turn)  # a cause logged before the loss turned dates it
        if read.norm_rose:
            detail = f"the norm rose from step {onset} (from {level(read.base)} to {level(read.peak)}); "
        else:
            detail = (
                f"the loss lost all it had learned from step {onset}, without a rise of the norm to go with "
                f"it ({level(read.base)} before, {level(read.peak)} at most after); "
            )
        return Event(
            DIVERGED,
            onset,
            last if read.end is None else read.end,
            detail + read.detail,
            (*self._explode_actions(read.peak, read.base, onset, found), advice.resume_action(onset)),
        )

    def _stall(
        self, never: bool, start: int, detail: str, loss: LossView, found: list[Found], last, plateau=None
    ) -> Event:
        norm_steady = not any(f.event.kind in (EXPLODING, VANISHING) for f in found)
        plateau = loss.plateau() if plateau is None else plateau
        stall = advice.Stall(
            never, loss.first, start, loss.chance(), loss.noise, plateau, loss.best, loss.rose_at_once()
        )
        actions = advice.stall_actions(
            self._ev, stall, self._layers.snapshots, self._layers.vanished, norm_steady
        )
        if actions[0].id == "weight_decay" and self._first_step is not None:
            # A decay too strong from the first step: the stall is its doing from there, whatever the loss
            # did while the weights were still large.
            start = self._first_step
            detail += "; the weight decay was this strong from the first step"
        return Event(STALLED, start, last, detail, actions)

    def _plateau_found(self, loss: LossView, last: int) -> tuple[int, float] | None:
        """The loss's plateau where it is a stall: not while the learning rate still rose through the first
        half of it (a loss flat under a rate still warming up may not have started); a warmup that ended as
        the plateau began hides nothing (a schedule that cut the rate 10^4x after 20 steps of warmup, the
        loss flat for the last 90% of the run). A loss that fell by more than half before it stopped is a
        plateau only where the log shows why: the rate cut 100x or more where it stopped, still that low
        at the end (alone, it cannot be told from a loss that reached its floor early)."""
        plateau = loss.plateau()
        if plateau is None:
            plateau = loss.plateau(deep=True)
            if plateau is None or self._lr_cut(plateau[0], last, 100.0) is None:
                return None
        until = self._lr.rising_until
        return plateau if until is None or until < plateau[0] + (last - plateau[0]) / 2 else None

    def _plateau(self, plateau: tuple[int, float], loss: LossView, found: list[Found], last: int | None) -> Event:
        step, at = plateau
        detail = (
            f"the loss fell from {num(loss.first)} to {num(at)} by step {step}, then stopped: "
            f"{num(loss.final)} at the end, {last - step} steps later"
        )
        change = self._lr_cut(step, last)
        # A logged cut of the rate where the loss stopped is the stall's cause: dated from it. Otherwise
        # from the first step: a rate too high for the stage (no warmup) was so from the start.
        start = change[0] if change is not None else self._first_step
        stall = self._stall(False, start, detail, loss, found, last, plateau)
        if change is None:
            return stall
        rest = tuple(a for a in stall.actions if a.id != "lr_schedule")
        return replace(stall, actions=(advice.schedule_cut(change, self._lr.last), *rest))

    def _lr_cut(self, step: int, last: int | None, factor: float = 10.0) -> tuple | None:
        """The logged change of the schedule that cut the rate where the loss stopped falling at ``step``
        (``LrSignal.cut``), or None."""
        return None if last is None else self._lr.cut(step, last, self._reach(), factor)

    def _lr_jump(self, loss: LossView, found: list[Found], last: int | None) -> Event | None:
        """A loss that jumped 10x over its level just after a jump of the learning rate (more than 2x, or to
        a negative rate) and is still up: diverged from the change, as soon as ``sustain`` points or steps
        of the loss hold it, whether or not the norm has left its band yet (a log of every 10th step may
        hold a norm so noisy that its band spans orders of magnitude)."""
        for change in self._lr.changes:
            step, before, after, previous, _ = change
            if self._ev.ramp(change) or not (after < 0 or abs(after) > 2 * abs(before)):
                continue
            jump = loss.jumped(step, self.sustain, self._reach())
            if jump is None:
                continue
            start, low, high = jump
            onset = self._ev.cause_start(change, start)
            levels = self._norm.levels.all()
            before_change = sorted(x for s, x in levels if s <= step)
            base = median(before_change) if before_change else None
            peak = max((x for s, x in levels if s > step), default=None)
            detail = (
                f"the learning rate went from {num(before)} to {num(after)} "
                f"{advice.read_at(step, previous)}; the loss held at {num(high)} from step {start}, "
                f"{times(high, low, '.0f')} its level before ({num(low)}), and had not come back by the last step"
            )
            actions = (*self._explode_actions(peak, base, onset, found), advice.resume_action(onset))
            return Event(DIVERGED, onset, last, detail, actions)
        return None

    def _early_collapse(self, events: list[Event], last: int | None) -> Event | None:
        """A loss that rose 5x from its first value and went non-finite, with no divergence read into it:
        diverged from the start. Either within the run's first ``MIN_POINTS`` losses (too few finite
        points for a divergence), or over more, rising from its best in its first points to its worst
        at its last finite one: straight into the non-finite values (a divergence's own reading wants
        finite points after the rise, and there are none)."""
        collapse = next((e for e in events if e.kind == NONFINITE), None)
        if collapse is None or led_into(events, NONFINITE, self.sustain * self._ev.interval) is not None:
            return None
        before = [(s, y) for s, y in self._loss.all() if s < collapse.start_step]
        if not before or not 0 < 5 * before[0][1] < max(y for _, y in before):
            return None
        if len(before) >= MIN_POINTS:
            values = [y for _, y in before]
            best_early = min(values) == min(values[:3])
            if not (best_early and values[-1] == max(values)):
                return None
        (first_step, first), (step, worst) = before[0], max(before, key=lambda p: p[1])
        detail = (
            f"the loss rose from {num(first)} at step {first_step} to {num(worst)} at step {step} and was "
            f"non-finite from step {collapse.start_step}: blown up from the start"
        )
        return Event(DIVERGED, first_step, last, detail, advice.early_collapse_actions(self._ev))

    def _early_blowup(self, blowup, loss: LossView, found: list[Found], last: int | None) -> Event:
        """A loss that blew up in the run's first steps and never learned after: diverged, not stalled.
        Dated from the first step: a run that blows up that soon was unstable from its start."""
        step, value, before = blowup
        onset = self._first_step if self._first_step is not None else step
        detail = (
            f"the loss jumped to {num(value)} at step {step} ({times(value, before, '.0f')} its level before, "
            f"{num(before)}) in the run's first steps: {num(loss.first)} at the start, {num(loss.final)} "
            "at the end"
        )
        levels = self._norm.levels.all()
        base = levels[0][1] if levels else None
        peak = max((x for _, x in levels), default=None)
        return Event(DIVERGED, onset, last, detail, self._explode_actions(peak, base, onset, found))

    def _norm_event(self, f: Found, loss: LossView | None, found: list[Found]) -> Event:
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
                    f"the norm {how} from {from_log(f.base)} to {from_log(f.extreme)} "
                    f"while the loss fell from {fell}: healthy: {why}"
                )
                return Event(kind, e.start_step, e.end_step, detail)
        if e.kind == EXPLODING and f.returned and loss is not None and not f.nonfinite:
            held = loss.held(e.start_step, e.end_step)
            if held is not None:
                # A burst of large gradients that came back while the loss never rose (an RNN's): the run
                # rode it out, as a spike; online it was exploding until it came back, and is withdrawn.
                return self._spike(
                    replace(f, event=replace(e, kind=SPIKE, detail=f"{e.detail}; the loss held ({held})"))
                )
        if e.kind == EXPLODING:
            start = self._lr_onset(e.start_step)
            actions = self._explode_actions(f.extreme, f.base, start, found)
            actions += () if self._loss.read else (advice.LOG_LOSS,)
            return replace(e, start_step=start, actions=actions)
        if e.kind == VANISHING:
            zeros = e.start_step if f.extreme <= LOG_ZERO else None
            return replace(e, actions=advice.vanish_actions(self._ev, zeros))
        return self._spike(f)

    def _explode_actions(self, peak: float | None, base: float | None, start: int, found: list[Found]):
        isolated = [
            f.event.start_step
            for f in found
            if f.event.kind == SPIKE
            and f.side > 0
            and f.event.start_step < start
            and self._lr_context(f.event.start_step) is None
        ]
        return advice.explode_actions(self._ev, level(peak), level(base), start, self._reach(), isolated)

    def _lr_context(self, step: int) -> str | None:
        return self._lr.context(step, self.recover, self.sustain)

    def _spike(self, f: Found) -> Event:
        e = f.event
        context = self._lr_context(e.start_step)
        if context is not None:
            return replace(e, detail=f"{e.detail}; {context}: normal if it settles")
        if f.side < 0 and self._ties_are_ordinary():
            # A group whose rewards (nearly) all tied has (nearly) no advantage: only the KL term and the
            # few samples left move the policy, a drop of orders of magnitude for that step, not a bad batch.
            tie = "in a reward-driven run: a batch whose rewards tied: ordinary"
            return replace(e, detail=f"{e.detail}; {tie}")
        return replace(e, actions=(advice.spike_action(f.side, at_steps(e)),))
