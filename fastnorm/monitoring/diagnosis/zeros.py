"""Nothing trains: a gradient norm of exactly 0 at every step, or at every step from one on.

An exact 0 is no small gradient: no gradient reached any weight the norm was
given (a loss computed apart from the model, a ``.detach()`` or a
``torch.no_grad()`` forward, an adapter that is not attached, a head replaced
after the optimizer was built), or fp16 gradients underflowed. It is the
loudest finding there is: whatever else the log shows, the weights do not move.
One exact 0 now and then is ordinary (a policy-gradient batch whose rewards
tie); the rule wants the zeros to hold to the last step read, over ``sustain``
points or steps (3 points at least), or every point of the run.
"""

from __future__ import annotations

import math

from fastnorm.monitoring.diagnosis.advice import Action, Evidence
from fastnorm.monitoring.diagnosis.events import VANISHING, Event

NO_GRADIENT = Action(
    "no_gradient",
    "Nothing trains: check that the loss is computed from the model being trained (no .detach(), "
    "torch.no_grad() or a frozen copy in its path), that the parameters given to the optimizer and to the "
    "norm are those in the graph (an adapter attached, a head replaced before the optimizer was built, "
    "requires_grad left True), and that loss.backward() runs before the norm is read.",
)


class ZeroSignal:
    """The run of exact zeros that the series ends on, and whether any norm before it was not 0."""

    def __init__(self) -> None:
        self.points = 0
        self.run = 0  # trailing exact zeros, in points
        self.run_start: int | None = None  # the step the trailing run began at
        self.nonzero = False  # a finite norm > 0 was read before the trailing run

    def point(self, step: int, value: float) -> None:
        """One finite norm >= 0."""
        self.points += 1
        if value == 0.0:
            if self.run == 0:
                self.run_start = step
            self.run += 1
        else:
            self.nonzero = True
            self.run, self.run_start = 0, None

    def event(self, ev: Evidence, last: int, sustain: int) -> Event | None:
        """The finding, when the zeros hold: at every point, or to the last step over ``sustain`` points or
        steps (3 points at least). None otherwise, and where an fp16 run with no loss scale logged already
        says the gradients underflow (see :func:`~fastnorm.monitoring.diagnosis.advice.vanish_actions`)."""
        if self.run_start is None:
            return None
        need = max(3, min(sustain, math.ceil(sustain / max(1, ev.interval))))
        if not self.nonzero:
            detail = (
                f"nothing trains: the gradient norm is exactly 0 at every one of the {self.points} points "
                "logged: no gradient reaches the weights it was given"
            )
            return Event(VANISHING, self.run_start, last, detail, (NO_GRADIENT,))
        if self.run < need:
            return None
        if ev.kind in ("fp16", "fp16-mixed") and not ev.scaled:
            return None
        detail = (
            f"nothing trains from step {self.run_start}: the gradient norm is exactly 0 at each of the "
            f"{self.run} points from there to the last"
        )
        if ev.kind is not None:
            return Event(VANISHING, self.run_start, last, detail + f" (in {ev.kind})", (NO_GRADIENT,))
        tell = Action(
            "precision",
            f"Exactly 0 from step {self.run_start}: either fp16 gradients underflowing (no GradScaler) or "
            "the loss no longer reaching the weights; the log does not hold the precision to tell them apart: "
            "log it (GradNormMonitor(precision=...)), and with fp16 add a torch.amp.GradScaler or use bf16.",
            unless="no_gradient",
        )
        return Event(VANISHING, self.run_start, last, detail, (tell, NO_GRADIENT))
