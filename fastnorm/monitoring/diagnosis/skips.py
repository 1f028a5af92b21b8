"""Non-finite norms, the optimizer's skip flags, a loss scaler's scale, and invalid values.

Non-finite norms with a finite loss, after which the norm comes back, are steps a
loss scaler (or an inf check) skipped: counted, not a collapse. A non-finite
loss, or non-finite norms that persist to the end of the log (with a finite
loss: for more than ``max_skip_run`` points or steps, whichever ends first),
are a collapse. Steps skipped for a spike (a :class:`~fastnorm.SpikeGuard`, flag 2)
are counted; a run of skipped steps that lasts to the end of the log for more than
``max_skip_run`` flags is a stalled run (nothing learned since), however the norm
looks. Where the optimizer's skip flag was logged
(``StepClipper.skipped``) it settles the question: non-finite norms at steps it
skipped are skipped steps, also at the end of the log and with a non-finite
loss there (a bad batch), unless they persist to the end for more than
``max_skip_run`` points or steps (nothing learned since); a non-finite norm at
the end of the log whose step was applied is a collapse, whatever the loss.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from fastnorm.monitoring.diagnosis.advice import (
    CHECK_DATA_NAN,
    CHECKPOINT,
    INVALID_ACTION,
    LOWER_LR,
    SKIP_NONFINITE,
    Action,
)
from fastnorm.monitoring.diagnosis.events import INVALID, NONFINITE, SKIPPED, STALLED, Event, num
from fastnorm.monitoring.diagnosis.robust import held

# Every norm non-finite, the loss finite: no step's update was applied; the gradients overflow from the
# first step, whatever the rate (a rate that blows up the weights makes the loss non-finite too).
NEVER_FINITE = Action(
    "precision",
    "The gradient norm was never finite while the loss stayed finite: every step's update was skipped (a "
    "loss scaler or an inf check), so nothing was learned. The backward pass overflows from the first "
    "step: in fp16, train in bf16 (bf16-mixed) or fp32; already in bf16 or fp32, an inf is born in the "
    "backward pass: fastnorm.Locator(model) names the first module and tensor where it appears.",
)

_UNFLAGGED = 4096  # non-finite steps kept waiting for a skip flag that comes after their norm
SPIKE_CODE = 2.0  # a skip flag's value (gradient_norm_skipped) at a step skipped for a spike alone
_SKIP_RUNS = 4096  # runs of skipped steps kept (the oldest go first)


@dataclass
class Run:
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

    def longer_than(self, n: int) -> bool:
        """It has held for more than ``n`` points or more than ``n`` steps, whichever came first."""
        return held(self.count, self.end - self.start + 1, n + 1)

    @property
    def all_skipped(self) -> bool:
        """Every step of the run was flagged as skipped by the optimizer."""
        return self.skipped == self.count


def extend(runs: list[Run], step: int, value: Any) -> None:
    """Adds ``step`` to the open run of ``runs``, or opens one."""
    if runs and runs[-1].open:
        runs[-1].end = step
        runs[-1].count += 1
    else:
        runs.append(Run(step, step, 1, value))


def overlap(a: Run, b: Run) -> bool:
    return a.start <= b.end and b.start <= a.end


def close_run(runs: list[Run]) -> None:
    if runs and runs[-1].open:
        runs[-1].open = False


class SkipSignal:
    """The runs of non-finite and of invalid norms, the skip flags and the loss scale."""

    def __init__(self, max_skip_run: int) -> None:
        self.max_skip_run = max_skip_run
        self.nonfinite: list[Run] = []
        self.invalid: list[Run] = []
        self._flags: deque[tuple[int, bool]] = deque()  # skip flags of steps whose norm is not read yet
        self._unflagged: dict[int, Run] = {}  # recent non-finite steps read without a flag yet
        self.flags_read = False
        # Runs of consecutive skip flags; each Run's `skipped` counts those skipped for a spike.
        self.skip_runs: deque[Run] = deque(maxlen=_SKIP_RUNS)
        # Recent steps skipped for a spike: their loss is the bad batch's, not the model's (left out).
        self.spiked_steps: dict[int, None] = {}
        self.scale: deque[tuple[int, float]] = deque(maxlen=4096)

    # -- input ---------------------------------------------------------------

    def invalid_value(self, step: int, raw: Any) -> None:
        extend(self.invalid, step, raw)

    def valid_value(self) -> None:
        close_run(self.invalid)

    def nonfinite_value(self, step: int, value: float) -> None:
        extend(self.nonfinite, step, value)
        run = self.nonfinite[-1]
        flag = self._flag_of(step)
        if flag is not None:
            run.flag(flag)
        else:
            self._unflagged[step] = run
            if len(self._unflagged) > _UNFLAGGED:
                del self._unflagged[next(iter(self._unflagged))]

    def finite_value(self) -> None:
        close_run(self.nonfinite)

    def flag(self, step: int, flag: bool, last_step: int | None, spike: bool = False) -> None:
        """The optimizer's skip flag of ``step`` (``spike``: skipped for a spike), read before or after its norm."""
        self.flags_read = True
        runs = self.skip_runs
        if flag:
            if runs and runs[-1].open:
                runs[-1].end, runs[-1].count = step, runs[-1].count + 1
            else:
                runs.append(Run(step, step, 1, None))
            runs[-1].skipped += spike
            if spike:
                self.spiked_steps[step] = None
                if len(self.spiked_steps) > _SKIP_RUNS:
                    del self.spiked_steps[next(iter(self.spiked_steps))]
        elif runs:
            runs[-1].open = False
        if last_step is None or step > last_step:
            self._flags.append((step, flag))
            return
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

    def scale_value(self, step: int, value: float) -> None:
        if not self.scale or self.scale[-1][1] != value:
            self.scale.append((step, value))  # only the changes: few in a whole run

    # -- output --------------------------------------------------------------

    def invalid_events(self) -> list[Event]:
        return [
            Event(
                INVALID,
                r.start,
                r.end,
                f"{r.count} invalid value(s): negative or not a number (the first {r.first!r}), "
                "left out of the diagnosis",
                (INVALID_ACTION,),
                r.count,
            )
            for r in self.invalid
        ]

    def events(
        self, last: int | None, loss_logged: bool, loss_nonfinite: list[Run], first: int | None
    ) -> list[Event]:
        """Skipped steps and collapses, from the runs of non-finite norms and losses (``first``: the first
        step read)."""
        events = []

        def skipped(r: Run) -> bool:  # the optimizer skipped every step: the weights are intact
            return r.all_skipped and not (r.open and r.longer_than(self.max_skip_run))

        collapses = []
        for r in loss_nonfinite:
            norm_too = [n for n in self.nonfinite if overlap(n, r)]
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
        for r in self.nonfinite:
            if any(overlap(lr, r) for lr in collapses):
                continue  # part of the collapse the loss shows
            if r.all_skipped:
                events.append(self._skipped_by_optimizer(r, last, loss_nonfinite))
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
            persists = r.open and (not loss_logged or r.longer_than(self.max_skip_run))
            if persists:
                detail = (
                    f"{r.count} non-finite norms from step {r.start} to the last step, the first {r.first}"
                )
                actions: tuple[Action, ...] = (CHECKPOINT, CHECK_DATA_NAN)
                if loss_logged:
                    detail += " (the loss stayed finite: every step from there on was skipped)"
                    if r.start == first:  # not one finite norm: no update was ever applied
                        detail += "; not one norm of the run was finite"
                        actions = (NEVER_FINITE, CHECKPOINT, CHECK_DATA_NAN)
                events.append(Event(NONFINITE, r.start, last, detail, actions))
                continue
            detail = f"{r.count} non-finite norm(s) ({r.first}): "
            detail += "skipped steps, the loss staying finite" if loss_logged else "the norm came back finite"
            detail += " (a dynamic loss scaler skips each overflowing step and lowers its scale)"
            detail += self._scale_note(r) + ("; not back by the last step" if r.open else "")
            events.append(Event(SKIPPED, r.start, r.end, detail, count=r.count))
        return events

    def guard_events(self, last: int | None) -> list[Event]:
        """The runs of skipped steps with spikes among them (the non-finite ones are the norm's runs)."""
        events = []
        for r in self.skip_runs:
            if not r.skipped:
                continue
            if r.open and r.longer_than(self.max_skip_run):
                detail = (
                    f"the optimizer skipped every step from step {r.start} to the last ({r.count} steps, "
                    f"{r.skipped} for a spike): nothing has been learned since; the spike guard's band no "
                    "longer fits the run (a lasting change of level: the learning rate, the data)"
                )
                events.append(Event(STALLED, r.start, last, detail, (LOWER_LR, CHECKPOINT), r.count))
                continue
            detail = f"{r.skipped} step(s) skipped for a spike (the norm or the loss above the guard's band)"
            if r.count > r.skipped:
                detail += f", {r.count - r.skipped} more for a non-finite norm"
            if r.longer_than(self.max_skip_run):
                detail += f"; {r.count} in a row, more than {self.max_skip_run}: the band did not fit the run"
            detail += ", the weights left as they were" + ("; still skipping at the last step" if r.open else "")
            events.append(Event(SKIPPED, r.start, r.end, detail, count=r.skipped))
        return events

    def _skipped_by_optimizer(self, r: Run, last: int | None, loss_nonfinite: list[Run]) -> Event:
        """A run of non-finite norms at steps the optimizer's flag says it skipped."""
        if r.open and r.longer_than(self.max_skip_run):
            detail = (
                f"{r.count} non-finite norms from step {r.start} to the last step, the first {r.first}: "
                "the optimizer skipped every step from there on, so nothing has been learned since"
            )
            return Event(NONFINITE, r.start, last, detail, (CHECKPOINT, CHECK_DATA_NAN))
        bad_loss = any(overlap(lr, r) for lr in loss_nonfinite)
        detail = f"{r.count} non-finite norm(s) ({r.first}): steps the optimizer skipped (its flag logged)"
        detail += ", the loss non-finite there too (bad batches)" if bad_loss else ""
        detail += ", the weights left as they were"
        detail += self._scale_note(r) + ("; not back by the last step" if r.open else "")
        return Event(SKIPPED, r.start, r.end, detail, count=r.count)

    def _scale_note(self, r: Run) -> str:
        if not self.scale:
            return ""
        before = next((v for s, v in reversed(self.scale) if s <= r.start), self.scale[0][1])
        after = next((v for s, v in self.scale if s > r.end), None)
        if after is None or after >= before:
            return f"; loss scale {num(before)}"
        return f"; the loss scale fell from {num(before)} to {num(after)}"
