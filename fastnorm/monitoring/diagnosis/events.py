"""The results of a diagnosis: the kinds of event, :class:`Event`, :class:`Diagnosis` and its report.

Also how numbers are written for a person (3 significant digits, an exact zero as 0), so
that every line of a report reads the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

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
TOO_FEW = "too few points"
FAILED = "diagnosis failed"  # the diagnosis raised (online, the monitor reports it and diagnoses on)

UNSTABLE = (NONFINITE, DIVERGED, EXPLODING, VANISHING, STALLED)  # most severe first
HEADLINES = {
    NONFINITE: "non-finite values appeared",
    DIVERGED: "the run diverged",
    EXPLODING: "the gradient norm is exploding",
    VANISHING: "the gradients are vanishing",
    STALLED: "the loss has stalled",
    STABLE: "the run is stable",
    TOO_FEW: "too few points to judge the run",
    FAILED: "the diagnosis failed: the run is not judged",
}
MIN_POINTS = 5  # fewer norms than this are too few to judge: the verdict says so, never "stable"
KINDS = (*UNSTABLE, SPIKE, SKIPPED, GROWTH, DECAY, INVALID)

_ZERO = 1e-45  # a zero norm is read as this (below float32's least subnormal), so that log10 stays finite
LOG_ZERO = math.log10(_ZERO)


def log_norm(value: float) -> float:
    """A finite norm >= 0 in log10, a zero as :data:`LOG_ZERO`."""
    return math.log10(max(value, _ZERO))


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
            ``"scale"``, ``"reward"``, ``"layers"``, ``"skipped"``.
        error (str): for the verdict ``"diagnosis failed"``, what failed; empty otherwise.
        objective (str): what the loss is: ``"minimise"`` (a loss to a floor), ``"adversarial"``,
            ``"reinforcement"`` or ``"contrastive"``, as given or read from the log.
        objective_read (str): where it was read from the log, how ("" when given or the default).
        located (tuple of str): where the run first went non-finite or
            overflowed, as a :class:`~fastnorm.Locator` logged it (one line each).
        notes (tuple of str): what the log cannot tell apart, said rather than
            guessed, with what to log to tell (one line each; no verdict rests on them).
    """

    verdict: str
    events: tuple[Event, ...] = ()
    actions: tuple[str, ...] = ()
    steps: int = 0
    signals: tuple[str, ...] = ()
    error: str = ""
    objective: str = "minimise"
    objective_read: str = ""  # how the objective was read from the log ("" where given, or the default)
    located: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def unstable(self) -> bool:
        """True for every verdict but ``stable``: also for ``"too few points"`` and ``"diagnosis failed"``,
        so that a log that cannot be judged never passes ``--fail-on-unstable``."""
        return self.verdict != STABLE

    @property
    def judged(self) -> bool:
        """False while too few points were read to judge anything, or when the diagnosis failed."""
        return self.verdict not in (TOO_FEW, FAILED)

    @property
    def action_ids(self) -> tuple[str, ...]:
        """The stable id of each of :attr:`actions` (``"lower_lr"``, ``"check_labels"``, ...)."""
        return tuple(_id(a) for a in self.actions)

    @property
    def action_candidates(self) -> tuple[tuple[str, ...], ...]:
        """For each of :attr:`actions`, the causes it names: its own id alone, or two ids where it says the
        log cannot tell them apart (and what to log to tell)."""
        return tuple(_candidates(a) for a in self.actions)

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
        words = HEADLINES[self.verdict]
        if self.verdict == STALLED and self.objective == "reinforcement":
            words = "the reward has stalled"  # a reward-driven loss sits near 0 by design: it never stalls
        return words + (f" (since step {onset})" if onset is not None else "")

    def to_dict(self) -> dict:
        """The diagnosis as plain JSON-ready data."""
        return {
            "verdict": self.verdict,
            "onset": self.onset,
            "events": [
                {
                    **asdict(e),
                    "actions": list(e.actions),
                    "action_ids": [_id(a) for a in e.actions],
                    "action_candidates": [list(_candidates(a)) for a in e.actions],
                }
                for e in self.events
            ],
            "actions": list(self.actions),
            "action_ids": list(self.action_ids),
            "action_candidates": [list(c) for c in self.action_candidates],
            "steps": self.steps,
            "signals": list(self.signals),
            "skipped_steps": self.skipped_steps,
            **({"error": self.error} if self.error else {}),
            "objective": self.objective,
            "objective_read": self.objective_read,
            "located": list(self.located),
            "notes": list(self.notes),
        }

    def report(self) -> str:
        """A few lines for a person: the verdict, then each event with its actions."""
        if self.verdict == TOO_FEW:
            read = (
                "no value read"
                if self.steps == 0
                else f"{self.steps} step{'s' if self.steps > 1 else ''} read"
            )
            text = f"verdict: {TOO_FEW} ({read}; at least {MIN_POINTS} are needed to judge a run)"
            return "\n".join([text, *(f"  where: {line}" for line in self.located)])
        if self.verdict == FAILED:
            return f"verdict: {FAILED} ({self.steps} steps read): {self.error}; the run is not judged"
        read = f"{self.steps} steps read"
        if self.signals:
            names = {
                "loss": "the loss",
                "lr": "the learning rate",
                "scale": "the loss scale",
                "reward": "the reward",
                "layers": "per-layer norms",
                "skipped": "the optimizer's skip flags",
            }
            read += " with " + ", ".join(names[s] for s in self.signals)
        lines = [f"verdict: {self.verdict} ({read})"]
        if self.objective != "minimise" or self.objective_read:
            how = f" ({self.objective_read})" if self.objective_read else ""
            lines.append(f"  objective: {self.objective}{how}")
        for e in self.events:
            if e.kind in (SKIPPED, INVALID):  # sparse runs: every one of a kind on one line, at the first
                same = [s for s in self.events if s.kind == e.kind]
                if e is not same[0]:
                    continue
                spans = ", ".join(span(s) for s in same[:12]) + (", ..." if len(same) > 12 else "")
                count = sum(s.count for s in same)
                where = f"{count} step{'s' if count != 1 else ''} ({spans})"
                detail = e.detail.split(": ", 1)[-1]
            else:
                where = at_steps(e)
                detail = e.detail
            lines.append(f"  {e.kind:9s} {where}: {detail}")
            lines.extend(f"    - {a}" for a in e.actions)
        if not self.events:
            lines.append("  no event: the norm stayed within its band")
        lines.extend(f"  note: {line}" for line in self.notes)
        lines.extend(f"  where: {line}" for line in self.located)
        return "\n".join(lines)


# The locator's keys (fastnorm.locate.finding): locate_<kind>/<site>, locate_<kind>_frames/<offset>/<site>.
LOCATE = "locate_"


def located_lines(found: Mapping[str, Any]) -> tuple[str, ...]:
    """The locator's logged keys (name -> value, without the monitor's prefix) as sentences, then the
    per-layer window keys' (:func:`layers_lines`).

    ``locate_nonfinite/<pass>:<module>:<role>:<dtype>:<limit>`` holds the step,
    ``locate_nonfinite_frames/<offset>/<site>`` each frame's largest finite |x|
    (``locate_overflow`` alike); keys that do not parse are passed over.
    """

    def where(site: str) -> str:
        pass_, module, role, dtype, limit = site.split(":")
        module = "the model" if module == "-" else f"`{module}`"
        judged = f", judged by {limit}" if limit != dtype else ""
        return f"{pass_}, {module}, {role}, {dtype}{judged}"

    lines = []
    for kind, what in (("nonfinite", "first non-finite"), ("overflow", "first overflow")):
        try:
            sites = [(k.split("/", 1)[1], v) for k, v in found.items() if k.startswith(f"{LOCATE}{kind}/")]
            if not sites:
                continue
            site, step = sites[0]
            text = f"{what}: {where(site)}, step {int(step)}"
            frames = {}
            for k, v in found.items():
                if k.startswith(f"{LOCATE}{kind}_frames/"):
                    _, offset, frame = k.split("/", 2)
                    frames[int(offset)] = (frame, v)
            if -1 in frames:
                frame, value = frames[-1]
                text += f"; finite on its way in ({where(frame)}), max |x| {value:.3g}"
            if 1 in frames:
                frame, value = frames[1]
                text += f"; next: {where(frame)}"
            lines.append(text)
        except (ValueError, TypeError):
            continue
    return (*lines, *layers_lines(found))


# Each layer's gradient over the monitor's window (GradNormMonitor(layer_stats=...), see
# fastnorm.monitoring.layer_stats): locate_layers_nonfinite/<layer> (the steps it was non-finite on),
# ..._nonfinite_first/<layer> (the first), ..._nonfinite_steps (the window's steps), ..._nonfinite_more
# (layers not named); locate_layers_overflow/<layer>, ..._overflow_max/<layer> (its largest |g|), alike.
LAYERS = f"{LOCATE}layers_"


def layers_lines(found: Mapping[str, Any]) -> tuple[str, ...]:
    """The per-layer window keys (``LAYERS...``, without the monitor's prefix) as sentences: the layer that
    went non-finite first (or those that did at the same step) and the others, then the layers whose
    gradient came near overflowing. Keys that do not parse are passed over."""

    def of(kind: str) -> tuple[dict[str, float], int, int]:
        head = f"{LAYERS}{kind}/"
        named = {k[len(head) :]: v for k, v in found.items() if k.startswith(head)}
        return named, int(found.get(f"{LAYERS}{kind}_steps", 0)), int(found.get(f"{LAYERS}{kind}_more", 0))

    def steps(count: float) -> str:
        return f"{int(count)} step{'s' if count != 1 else ''}"

    def others(names: list[str], named: dict[str, float], more: int) -> str:
        text = ", ".join(f"`{n}` ({steps(named[n])})" for n in names)
        if more:
            text += f"{', ' if text else ''}{more} more layer{'s' if more != 1 else ''}"
        return text

    lines = []
    try:
        named, window, more = of("nonfinite")
        if named:
            firsts = {n: int(found.get(f"{LAYERS}nonfinite_first/{n}", -1)) for n in named}
            at = min(firsts.values())
            first = [n for n in named if firsts[n] == at]
            rest = [n for n in named if firsts[n] != at]
            if len(first) == 1:
                text = (
                    f"layers: `{first[0]}`'s gradient went non-finite first, at step {at}, "
                    f"on {int(named[first[0]])} of the window's {window} steps"
                )
            else:
                text = (
                    f"layers: gradients went non-finite first at step {at} in {len(first)} layers at once: "
                    + others(first, named, 0) + f" of the window's {window} steps"
                )
            if rest or more:
                text += "; also non-finite: " + others(rest, named, more)
            lines.append(text)
        named, window, _ = of("overflow")
        if named:
            top = max(named, key=lambda n: (named[n], found.get(f"{LAYERS}overflow_max/{n}", 0.0)))
            largest = float(found.get(f"{LAYERS}overflow_max/{top}", float("nan")))
            text = (
                f"layers: `{top}`'s gradient came within 16x of its dtype's largest value on "
                f"{int(named[top])} of the window's {window} steps (max |g| {largest:.3g})"
            )
            rest = [n for n in named if n != top]
            if rest or more:
                text += "; also: " + others(rest, named, of("overflow")[2])
            lines.append(text)
    except (ValueError, TypeError):
        pass
    return tuple(lines)


def _id(action: str) -> str:
    """An action's id (plain strings, from a custom diagnoser, have none)."""
    return getattr(action, "id", "other")


def _candidates(action: str) -> tuple[str, ...]:
    return getattr(action, "candidates", (_id(action),))


def span(e: Event) -> str:
    return str(e.start_step) if e.start_step == e.end_step else f"{e.start_step}-{e.end_step}"


def at_steps(e: Event) -> str:
    return f"step {e.start_step}" if e.start_step == e.end_step else f"steps {span(e)}"


def num(value: float) -> str:
    """A norm or loss for a person, with 3 significant digits; an exact zero as 0."""
    return "0" if value == 0 else f"{value:.3g}"


def level(x: float | None) -> str:
    """A norm read in log10, or "?" where none was read."""
    return "?" if x is None else from_log(x)


def from_log(x: float) -> str:
    """A norm read in log10: the zeros (read as LOG_ZERO) printed as 0, never as the stand-in."""
    return "0" if x <= LOG_ZERO else num(10.0**x)


def led_into(events: list[Event], verdict: str, gap: int) -> Event | None:
    """The divergence or rise of the norm that ran into the first collapse to non-finite values (begun
    before it, lasting to within ``gap`` steps of it): the collapse's cause, whose actions lead. A NaN at
    the end of a divergence is where it ended, not another fault."""
    if verdict != NONFINITE:
        return None
    collapse = next((e for e in events if e.kind == NONFINITE), None)
    if collapse is None:
        return None
    return next(
        (
            e
            for e in events
            if e.kind in (DIVERGED, EXPLODING)
            and e.start_step < collapse.start_step
            and e.end_step >= collapse.start_step - gap
        ),
        None,
    )
