"""What the printed advice says: every action the diagnosis can give, each with a stable id, chosen from
the evidence the log holds.

The texts follow the model-instability guide fastnorm serves. An :class:`Action`
is its text (it compares and prints as a ``str``) with an ``id`` that scripts can
rely on (``Diagnosis.to_dict()["action_ids"]``, ``fastnorm diagnose --json``).
Which action comes first follows from :class:`Evidence`, what the signal modules
measured (the learning rate and its changes, the optimizer's settings, the
precision, the loss against its initial and chance level), and the first action
of a verdict says what it rests on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fastnorm.checks import PRECISIONS
from fastnorm.monitoring.diagnosis.robust import NOISY, ratio, times


class Action(str):
    """An action's text, with its stable ``id``; it compares, hashes and prints as its text.

    ``candidates`` are the causes it cannot tell apart, its own ``id`` first: ``(id,)`` for an action the
    evidence points at alone, two ids for one that says the log cannot tell them apart and what to log to
    tell ("either fp16 gradients underflowing or the loss no longer reaching the weights: log the
    precision"). It never names more than two.
    """

    id: str
    candidates: tuple[str, ...]

    def __new__(cls, id: str, text: str, *, unless: str | None = None) -> Action:
        if id not in IDS:
            raise ValueError(f"Action: id={id!r} is none of the known ids (advice.IDS)")
        if unless is not None and (unless == id or unless not in IDS):
            raise ValueError(f"Action {id!r}: unless={unless!r} is not another action's id")
        action = super().__new__(cls, text)
        action.id = id
        action.candidates = (id,) if unless is None else (id, unless)
        return action

    @property
    def uncertain(self) -> bool:
        """True where the action names two causes the log cannot tell apart."""
        return len(self.candidates) > 1

    def __reduce__(self):
        unless = self.candidates[1] if self.uncertain else None
        return _action, (self.id, str(self), unless)


def _action(id: str, text: str, unless: str | None) -> Action:
    return Action(id, text, unless=unless)


# Every id an action can have, with what it asks for (the docs' table lists them).
IDS = {
    "lower_lr": "lower the learning rate (or lengthen its warmup)",
    "raise_lr": "raise the learning rate",
    "lr_schedule": "check the learning-rate schedule",
    "warmup": "add (or lengthen) a learning-rate warmup",
    "clip": "enable or tighten gradient clipping",
    "precision": "a more stable precision",
    "bf16": "bf16 instead of fp16",
    "grad_scaler": "a dynamic loss scaler (GradScaler) with fp16",
    "weight_decay": "lower the weight decay",
    "adam_eps": "lower Adam's eps (or scale the loss up)",
    "batch_size": "larger batches (or a normalisation that does not depend on them)",
    "check_labels": "check that the labels match the inputs (a reward-driven run's: that its reward pays)",
    "check_data": "check the data (NaN/inf, outliers, the pipeline)",
    "check_batch": "check one batch",
    "normalisation": "check the input normalisation, the normalisation layers and the initialisation",
    "checkpoint": "resume from a checkpoint",
    "skip_nonfinite": "skip non-finite steps (StepClipper)",
    "log_loss": "log the loss beside the norm",
    "log_layers": "log per-layer norms",
    "log_every_step": "log every step's norm",
    "check_logging": "check what is logged as the norm",
    "no_gradient": "check that the loss reaches the trained weights (nothing detached, frozen or left out)",
    "discriminator": "slow or regularise a GAN's discriminator (it wins: the generator's gradient vanished)",
    "none": "nothing: look at the learning rate and the data first",
}

LOWER_LR = Action("lower_lr", "Lower the learning rate (by 3-10x), or lengthen its warmup.")
PRECISION = Action(
    "precision", "Use a more stable precision: bf16-mixed instead of fp16 (16-mixed), or full fp32 (32-true)."
)
RAISE_LR = Action(
    "raise_lr", "Raise the learning rate, especially for small models (about 10M parameters or fewer)."
)
NORMALISATION = Action(
    "normalisation",
    "Check the input normalisation (inputs scaled to about zero mean and unit variance), the "
    "normalisation layers (LayerNorm/BatchNorm between deep layers) and the initialisation "
    "(Kaiming or Xavier, matched to the activation).",
)


def early_collapse_actions(ev: Evidence) -> tuple[Action, ...]:
    """A loss that rose from its first value and went non-finite within a few steps: a learning rate far
    too high or an initialisation that blows up; the norm and the loss alone cannot tell them apart."""
    lr = (
        f" (it started at {ev.lr_first:.3g})"
        if ev.lr_first is not None
        else " (and log it: GradNormMonitor(optimizer=...))"
    )
    return (
        Action(
            "lower_lr",
            "The run blew up in its first steps: a learning rate far too high, or an initialisation that "
            f"explodes; the log cannot tell them apart. Lower the learning rate 10x{lr} and re-run: if it "
            "still blows up in the first steps, it is the initialisation (next).",
            unless="normalisation",
        ),
        Action(
            "normalisation",
            "Compare the first loss with its chance level (ln of the number of classes for a cross-entropy): "
            "far above it, check the initialisation and the normalisation layers of deep or residual "
            "stacks (LayerNorm/BatchNorm between blocks, Kaiming or Xavier matched to the activation).",
        ),
    )


CHECKPOINT = Action(
    "checkpoint",
    "Re-run from the latest checkpoint; if it reproduces, switch to fp32 (32-true) to isolate "
    "reduced-precision arithmetic.",
)
SKIP_NONFINITE = Action(
    "skip_nonfinite",
    "Skip the steps whose norm is not finite instead of applying them: fastnorm.StepClipper(optimizer, "
    "max_norm) does it inside torch's fused optimizer step, without a host sync.",
)
CHECK_DATA_NAN = Action(
    "check_data",
    "Check the data for NaN/inf (inputs and labels) and the loss scaler (with fp16, use a dynamic "
    "one such as torch.amp.GradScaler).",
)
INVALID_ACTION = Action(
    "check_logging", "Check what is logged as the gradient norm: a norm is a number >= 0."
)
LOG_LOSS = Action(
    "log_loss",
    "Log the loss beside the norm (GradNormMonitor.update(norm, loss=loss)): a norm that rises by orders "
    "of magnitude while the loss falls steadily is a model leaving a small initialisation, not an explosion.",
)
CHECK_DATA = Action(
    "check_data",
    "Check the data: labels that match their inputs, shuffling, a loss function that fits the task.",
)


def _g(value: float) -> str:
    return f"{value:.3g}"


def _same_way(a: tuple, b: tuple) -> bool:
    """Two learning-rate changes in the same direction (both up, or both down)."""
    return (a[2] > a[1]) == (b[2] > b[1])


def read_at(step: int, previous: int) -> str:
    """Where a change was seen: at a step, or between two readings."""
    return (
        f"at step {step}" if step - previous <= 1 else f"between the readings of steps {previous} and {step}"
    )


@dataclass
class Evidence:
    """What the log showed beyond the norm and the loss's shape, for the advice to rest on."""

    max_norm: float | None = None
    precision: str | None = None  # as given or logged (a key of fastnorm.checks.PRECISIONS)
    scaled: bool = False  # a loss scale was logged, or steps with non-finite norms were skipped
    lr_first: float | None = None  # the first learning rate logged, and its step
    lr_first_step: int | None = None
    lr_top: float | None = None  # the largest |learning rate| logged
    warmup_until: int | None = None  # the last step of an initial rise of the learning rate
    lr_changes: list = field(
        default_factory=list
    )  # as LrSignal.changes: (step, before, after, previous, since)
    weight_decay: float | None = None
    eps: float | None = None
    adam: bool = False  # Adam-like: betas were logged
    norm_level: float | None = None  # the norm's median, over the finite values
    span: int = 0  # steps from the first to the last norm read
    interval: int = 1  # the median gap between logged steps

    @property
    def kind(self) -> str | None:
        """The precision in fastnorm's names (fp32, bf16-mixed, ...), None when not known."""
        return PRECISIONS[self.precision][0] if self.precision is not None else None

    @property
    def lightning(self) -> bool:
        return self.precision is not None and PRECISIONS[self.precision][1]

    def blowup_cause(self, start: int, reach: int, until: int | None = None) -> tuple | None:
        """The learning-rate change that may have caused a blow-up from ``start``: one that could (a rate
        turned negative, or raised more than 2x, a ramp by its whole chain), read within ``reach`` steps of
        ``start`` or inside the blow-up up to ``until`` (a change read at step s happened after the reading
        before it). A norm that bursts by itself (a recurrent net's) leaves its band before the change that
        blows it up, so a change inside the departure is its cause all the same. A sign flip first, then
        the largest; None when none could.
        """
        end = max(start, until if until is not None else start) + reach

        def moved(c: tuple) -> float:  # how far up, in e-foldings, from where its chain began
            return math.log(max(ratio(abs(c[2]), abs(self.chain_first(c)[1])), 1e-300))

        causes = [c for c in self.lr_changes if c[3] < end and c[0] >= start - reach]
        causes = [c for c in causes if c[2] < 0 or moved(c) > math.log(2.0)]
        return max(causes, key=lambda c: (c[2] < 0, moved(c)), default=None)

    def cause_start(self, change: tuple, start: int) -> int:
        """When the fault a learning-rate change caused began, ``start`` the blow-up's own start: a ramp's
        foot (see :meth:`change_start`); a jump's step, which is the reading that shows it (the monitor logs
        the rate at every step where it changed; a log read less often holds the jump somewhere after the
        reading before, and the reading that shows it bounds it), unless the blow-up began inside that gap,
        after the jump and before its reading."""
        if self.ramp(change):
            return self.change_start(change)
        step, previous = change[0], change[3]
        return start if previous < start <= step else step

    def change_start(self, change: tuple) -> int:
        """The step a learning-rate change began: after the reading before it, for a jump; for a steady
        ramp (a chain of changes, each since the one before), where the ramp's own rate puts its foot."""
        first = self.chain_first(change)
        later = next((c for c in self.lr_changes if c[4] == first[0] and _same_way(c, first)), None)
        if later is None or min(first[1], first[2], later[1], later[2]) <= 0:
            return first[3] + 1
        rate = ratio(math.log(ratio(later[2], later[1])), later[0] - later[4])  # per step, from the next change
        steps_in = ratio(math.log(ratio(first[2], first[1])), rate) if rate > 0 else 0.0
        if not math.isfinite(steps_in):
            return first[4] + 1
        return max(first[4] + 1, round(first[0] - steps_in))

    def chain_first(self, change: tuple) -> tuple:
        """The first change of the chain ``change`` belongs to (itself when it is a jump)."""
        by_step = {c[0]: c for c in self.lr_changes}
        first = change
        while first[4] in by_step and by_step[first[4]] is not first and _same_way(by_step[first[4]], change):
            first = by_step[first[4]]
        return first

    def ramp(self, change: tuple) -> bool:
        """The change is one of a chain (the rate kept moving the same way, change after change)."""
        return any(
            c is not change and _same_way(c, change) and (c[4] == change[0] or c[0] == change[4])
            for c in self.lr_changes
        )

    def decay_steps(self) -> float | None:
        """How many e-foldings the weight decay alone shrinks the weights by over the run (lr * wd *
        steps)."""
        if self.weight_decay is None or self.lr_first is None or self.weight_decay <= 0:
            return None
        return abs(self.lr_first) * self.weight_decay * max(self.span, 1)


# ----------------------------------------------------------------------------
# Precision: what to say depends on what the run is in, and who runs it
# ----------------------------------------------------------------------------


def _bf16(ev: Evidence) -> str:
    if ev.lightning:
        return "Trainer(precision='bf16-mixed')"
    return "torch.autocast(device_type, dtype=torch.bfloat16)"


def precision_action(ev: Evidence) -> Action | None:
    """A more stable precision, worded for the run's precision; None for a run already in fp32 or fp64."""
    kind = ev.kind
    if kind in ("fp32", "fp64"):
        return None
    if kind == "fp16-mixed":
        return Action(
            "bf16",
            f"Use bf16 instead of fp16 where the hardware has it ({_bf16(ev)}): same speed, "
            "the range of fp32, no loss scale to tune.",
        )
    if kind in ("fp16", "bf16"):
        mixed = "Trainer(precision='bf16-mixed')" if ev.lightning else "fp32 weights under torch.autocast"
        return Action(
            "precision",
            f"Keep the weights in fp32 ({mixed}): pure {kind} rounds small updates away "
            "and overflows sooner.",
        )
    return PRECISION


def checkpoint_action(ev: Evidence) -> Action:
    """Re-run from a checkpoint, and isolate reduced precision only in a run that has it."""
    kind = ev.kind
    if kind in ("fp32", "fp64"):
        return Action(
            "checkpoint",
            f"Re-run from the latest checkpoint; the run is in {kind}, so a non-finite value that reproduces "
            "comes from the data or the arithmetic (a log of 0, a division by 0), not from the precision.",
        )
    if kind is None:
        return CHECKPOINT
    fp32 = "Trainer(precision='32-true')" if ev.lightning else "fp32 weights and no autocast"
    return Action(
        "checkpoint",
        f"Re-run from the latest checkpoint; if it reproduces, switch to fp32 ({fp32}) to isolate the "
        f"reduced-precision arithmetic of {kind}.",
    )


def grad_scaler_action(ev: Evidence, where: str) -> Action:
    if ev.lightning:
        how = "Trainer(precision='16-mixed') scales the loss by itself"
    else:
        how = "torch.amp.GradScaler: scaler.scale(loss).backward(), scaler.step(optimizer), scaler.update()"
    return Action(
        "grad_scaler",
        f"Scale the loss in fp16 ({how}): {where}; or use bf16 ({_bf16(ev)}), which needs no scaling.",
    )


# ----------------------------------------------------------------------------
# Actions by verdict
# ----------------------------------------------------------------------------


def clipping(max_norm: float | None, peak: str, base: str) -> Action:
    if max_norm is None:
        return Action(
            "clip",
            "Enable gradient clipping: no max_norm was set for this run "
            "(e.g. fastnorm.clip_(model.parameters(), max_norm=1.0)).",
        )
    return Action(
        "clip",
        f"Tighten the gradient clipping: max_norm={max_norm:g} is set while the norm went from {base} "
        f"to {peak}; a max_norm near its healthy level ({base}) bounds every update.",
    )


def schedule_cut(change: tuple[int, float, float, int, int], last: float) -> Action:
    """A loss that stopped where the schedule cut the rate (``LrSignal.cut``): check the schedule."""
    step, before, after, previous, _ = change
    return Action(
        "lr_schedule",
        f"Check the learning-rate schedule: the learning rate fell {times(abs(before), abs(after))} "
        f"{read_at(step, previous)} ({_g(before)} to {_g(after)}), where the loss stopped falling, and was "
        f"still {_g(last)} at the end: a rate that small moves nothing. Keep it near {_g(before)} (a decay "
        "to its end, not a cut at the start).",
    )


def lr_cause(ev: Evidence, onset: int, reach: int) -> Action | None:
    """The learning rate as the cause of a blow-up at ``onset``: a change just before it (a jump, a sign
    flip), or a rate that was this high from the first step without a warmup."""
    change = ev.blowup_cause(onset, reach)
    if change is not None:
        step, before, after, previous, _ = change
        if after < 0:
            return Action(
                "lr_schedule",
                "Check the learning-rate schedule: the learning rate turned negative "
                f"{read_at(step, previous)} "
                f"({_g(before)} to {_g(after)}), so each step climbs the loss instead of descending it.",
            )
        if ev.ramp(change):
            before = ev.chain_first(change)[1]
            how = (
                f"kept rising from about step {ev.change_start(change)}, {_g(before)} to {_g(after)} "
                f"by step {step},"
            )
        else:
            how = (
                f"jumped {times(abs(after), abs(before))} {read_at(step, previous)} ({_g(before)} to "
                f"{_g(after)})"
            )
        return Action(
            "lower_lr",
            f"Lower the learning rate: it {how} just before the blow-up; keep it at {_g(before)} "
            "(check the schedule that raised it).",
        )
    if ev.lr_first is not None and ev.warmup_until is None and onset <= (ev.lr_first_step or 0) + reach:
        return Action(
            "lower_lr",
            f"Lower the learning rate (by 3-10x): it was {_g(ev.lr_first)} from the first step, with no "
            "warmup, and the run blew up at once; or warm it up over the first hundred steps.",
        )
    return None


def explode_actions(ev: Evidence, peak: str, base: str, onset: int, reach: int, isolated: list[int]):
    """What to do about a norm that exploded from ``base`` to ``peak`` from ``onset``."""
    first = lr_cause(ev, onset, reach) or LOWER_LR
    actions = [first]
    if first.id != "lower_lr":
        actions.append(LOWER_LR)
    actions.append(clipping(ev.max_norm, peak, base))
    precision = precision_action(ev)
    if precision is not None:
        actions.append(precision)
    if isolated:
        actions.append(
            Action(
                "check_data",
                "Check the data for outliers: isolated spikes came first (step "
                + ", ".join(map(str, isolated[:5]))
                + ("..." if len(isolated) > 5 else "")
                + ").",
            )
        )
    return tuple(actions)


@dataclass(frozen=True)
class Stall:
    """What the loss did in a stall, for its advice."""

    never: bool  # it never improved (else it went back to its initial level)
    first: float  # its initial level
    start: int  # the step the stall is dated from
    chance: int | None = None  # k where the loss began near ln k and ended at it (see LossView.chance)
    noise: float = 0.0  # the loss's step-to-step noise, as a fraction of its level
    plateau: tuple[int, float] | None = None  # (step, level) where an early fall stopped for good
    best: float | None = None  # its best (smoothed) level, where it went back up from
    rose: tuple[int, float, float] | None = None  # (step, loss, least later level): see LossView.rose_at_once

    def learned(self) -> bool:
        """A loss that went back to chance after it had fallen a quarter below it: the labels matched its
        inputs well enough to be learned, so the return is not theirs."""
        return (
            not self.never
            and self.plateau is None
            and self.chance is not None
            and self.best is not None
            and self.best < 0.75 * math.log(self.chance)
        )


def weight_decay_action(ev: Evidence, consequence: str = "") -> Action | None:
    """Lower the weight decay, when it alone shrinks the weights by e^3 or more over the steps logged
    (``consequence`` says what that did, for the verdict at hand); None otherwise."""
    decay = ev.decay_steps()
    if decay is None or decay < 3.0:
        return None
    return Action(
        "weight_decay",
        f"Lower the weight decay: {_g(ev.weight_decay)} at a learning rate of {_g(ev.lr_first)} shrinks the "
        f"weights by e^{decay:.0f} over the {ev.span} steps logged{consequence}.",
    )


def unlogged_plateau_actions(plateau: tuple[int, float], norm_steady: bool) -> tuple[Action, Action]:
    """A loss that fell, then stopped far above where it can go, in a log without the learning rate: the
    two commonest causes, which the log cannot tell apart, in the order the norm points at.

    A rate cut to near zero (a schedule that decays too early or too far) freezes the weights: the norm
    stays in its band. A rate too high for the stage (no warmup) leaves its band too, by spikes or growth.
    """
    step, at = plateau
    cut = Action(
        "lr_schedule",
        f"Check the learning-rate schedule: the loss stopped falling at {_g(at)} from step {step}, far above "
        "where it can go, and the log holds no learning rate to tell a rate cut to near zero (a decay too "
        "early or too far: raise it) from one too high for this stage (warm it up)"
        + ("; the norm stayed in its band, as it does when the weights stop moving" if norm_steady else "")
        + ". Log the rate: GradNormMonitor(optimizer=...).",
        unless="warmup",
    )
    warm = Action(
        "warmup",
        "If the learning rate was constant from the first step, warm it up (or lower it): post-LN "
        "transformers and deep nets stall at a rate too high for their first steps"
        + (
            "."
            if norm_steady
            else "; the norm left its band, as such a rate makes it. The log holds no learning rate to tell "
            "this from a rate its schedule cut (next): log it (GradNormMonitor(optimizer=...))."
        ),
        unless=None if norm_steady else "lr_schedule",
    )
    return (cut, warm) if norm_steady else (warm, cut)


# Adam moves each weight by about its learning rate a step at most: a rate whose steps add up to less than
# this cannot move a weight enough to change what it computes.
ADAM_STILL = 1e-3


def still_rate_action(ev: Evidence) -> Action | None:
    """``raise_lr`` where the logged rate of an Adam-like optimizer (its betas logged) could not move any
    weight: its largest value times the run's steps under ``ADAM_STILL``."""
    if not ev.adam or ev.lr_first is None:
        return None
    top = ev.lr_top if ev.lr_top is not None else abs(ev.lr_first)
    steps = ev.span + 1
    if top * steps >= ADAM_STILL:
        return None
    return Action(
        "raise_lr",
        f"Raise the learning rate: Adam moves each weight by about its rate a step at most, and at "
        f"{_g(top)} (the largest logged) over these {steps} steps no weight moved more than "
        f"{_g(top * steps)}: too little to change what the model computes.",
    )


def stall_actions(ev: Evidence, stall: Stall, layer_snapshots: int, layers_vanished: bool, norm_steady: bool):
    """What to do about a stalled loss, the action the evidence points at first."""
    causes = []
    if stall.rose is not None:
        step, first, later = stall.rose
        rate = f" (it is {_g(ev.lr_first)})" if ev.lr_first is not None else ""
        causes.append(
            Action(
                "lower_lr",
                f"Lower the learning rate{rate}: the loss was {_g(first)} at its first point (step {step}) "
                f"and {_g(later)} or more at every later one, so the updates made the model worse from the "
                "first ones, as a rate far too high does (a rate too low, or labels that cannot be learned, "
                "leave the loss where it began).",
            )
        )
    decay = weight_decay_action(ev, ", holding them near zero")
    if decay is not None:
        causes.append(decay)
    if ev.adam and ev.eps is not None and ev.norm_level is not None and ev.norm_level < 100 * ev.eps:
        causes.append(
            Action(
                "adam_eps",
                f"Lower Adam's eps (or scale the loss up): the whole gradient's norm ({_g(ev.norm_level)}) "
                "is "
                f"within 100x of eps={_g(ev.eps)}, so eps dominates Adam's denominator and the effective "
                "learning rate is far below the one set.",
            )
        )
    still = still_rate_action(ev) if stall.never else None
    if still is not None:
        causes.append(still)
    if stall.learned() and ev.warmup_until is not None and ev.warmup_until >= stall.start:
        causes.append(
            Action(
                "lower_lr",
                "Lower the peak learning rate, or warm it up more slowly: the loss fell to "
                f"{_g(stall.best)}, well below chance (ln {stall.chance} = {_g(math.log(stall.chance))}), "
                f"so the labels can be learned, then went back to chance from step {stall.start} while the "
                f"learning rate was still rising (to step {ev.warmup_until}): a rate too high for this stage "
                "threw away what was learned.",
            )
        )
    elif stall.chance is not None and norm_steady:
        # A rate far too low leaves a loss where it began too, which for a classifier is chance: only the
        # logged rate tells the two apart.
        blind = stall.never and ev.lr_first is None
        causes.append(
            Action(
                "check_labels",
                f"Check that the labels match the inputs: the loss stayed at {_g(math.log(stall.chance))} = "
                f"ln {stall.chance} (chance for {stall.chance} classes) from step {stall.start} "
                f"({_g(stall.first)} at the start) while the norm stayed in its band: the gradients are "
                "normal, yet nothing is learned"
                + (
                    ". The log holds no learning rate, and one far too low leaves the loss where it began "
                    "too: log it (GradNormMonitor(optimizer=...)) to tell them apart."
                    if blind
                    else "."
                ),
                unless="raise_lr" if blind else None,
            )
        )
    if (stall.never or stall.plateau is not None) and stall.noise >= NOISY:
        causes.append(
            Action(
                "batch_size",
                f"Use larger batches: the loss moves by {stall.noise:.0%} of its level from one step to the "
                "next, so each step follows its batch's noise (BatchNorm over so few samples normalises "
                "by noise too).",
            )
        )
    if stall.plateau is not None and ev.warmup_until is None and ev.lr_first is not None:
        step, at = stall.plateau
        causes.append(
            Action(
                "warmup",
                f"Warm the learning rate up (or lower it): the loss stopped falling at {_g(at)} from step "
                f"{step}, "
                f"far above where it can go, with the learning rate {_g(ev.lr_first)} from the first step and "
                "no warmup (post-LN transformers and deep nets need one).",
            )
        )
    elif stall.plateau is not None and ev.warmup_until is None:
        causes.extend(unlogged_plateau_actions(stall.plateau, norm_steady))
    blind = ev.lr_first is None and ev.weight_decay is None and not ev.adam  # no setting of the optimizer
    if stall.never and blind and not causes:
        # The log cannot tell the two commonest causes apart: said so, with what to log.
        lr_action = Action(
            "raise_lr",
            "Raise the learning rate, or lower the weight decay if one is set: the log holds neither, so it "
            "cannot tell a rate too low from a decay too strong; log them (GradNormMonitor(optimizer=...)).",
            unless="weight_decay",
        )
        causes.append(lr_action)
        causes.append(
            Action(
                "weight_decay",
                "If a weight decay is set, lower it: one too strong holds the weights near zero and the loss "
                "where it began (the log does not hold it).",
            )
        )
    elif stall.never:
        lr_action = Action(
            "raise_lr",
            "Raise the learning rate (it may be far too low), and check that the optimizer steps the "
            "parameters at all (a schedule at 0, frozen parameters, zero_grad between backward and step).",
        )
    else:
        lr_action = Action(
            "lower_lr",
            "Check the learning rate and the weight decay: a loss that climbs back to where it "
            "started follows a rate too high for this stage, or a decay that shrinks the weights "
            "to nothing; a change in the data pipeline does the same.",
        )
    if layer_snapshots == 0:
        vanishing = Action(
            "log_layers",
            "Check for vanishing gradients: log per-layer norms (fastnorm.LayerGradNorms) and look for "
            "layers orders of magnitude below the others.",
        )
    elif layers_vanished:
        vanishing = Action(
            "normalisation",
            "The per-layer norms show vanishing gradients (see the vanishing event): "
            + NORMALISATION[0].lower()
            + NORMALISATION[1:],
        )
    else:
        vanishing = Action(
            "none",
            "The per-layer norms show no vanishing layer: look at the learning rate and the data first.",
        )
    # A loss the updates made worse from the first ones rules out a rate too low.
    actions = [*causes, *([lr_action] if stall.rose is None and still is None else []), CHECK_DATA, vanishing]
    if ev.interval > 1:
        actions.append(log_every_step(ev))
    first = {}
    for action in actions:  # one action per id, the first
        first.setdefault(action.id, action)
    return tuple(first.values())


def vanish_actions(ev: Evidence, zeros_at: int | None) -> tuple[Action, ...]:
    """What to do about vanishing gradients: an fp16 underflow, a weight decay, or the usual suspects."""
    actions = []
    if ev.kind in ("fp16", "fp16-mixed") and not ev.scaled:
        where = (
            f"the norm fell to exactly 0 at step {zeros_at} in an fp16 run with no loss scale logged"
            if zeros_at is not None
            else "the norm fell by orders of magnitude in an fp16 run with no loss scale logged"
        )
        actions.append(grad_scaler_action(ev, where + ": the gradients underflow fp16"))
    decay = weight_decay_action(ev)
    if decay is not None:
        actions.append(decay)
    return (*actions, RAISE_LR, NORMALISATION)


def spike_action(side: int, where: str) -> Action:
    """What to do about a short excursion above (``side`` > 0) or below the band, at ``where``."""
    if side > 0:
        return Action(
            "check_batch", f"Isolated spike: check that batch ({where}) for outliers or mislabelled samples."
        )
    return Action(
        "check_batch", f"A short drop: check that batch ({where}): empty, padded or repeated samples?"
    )


def resume_action(onset: int) -> Action:
    return Action(
        "checkpoint", f"Resume from a checkpoint saved before step {onset}, with the changes above."
    )


def log_every_step(ev: Evidence) -> Action:
    return Action(
        "log_every_step",
        f"Log every step's norm (GradNormMonitor.update at each step): this log holds one step in "
        f"{ev.interval}, so a spike or an early blow-up between its points goes unseen.",
    )
