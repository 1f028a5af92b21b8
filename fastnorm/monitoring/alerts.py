"""The monitor's warnings: an unstable run, a recovery, a part of its job it could not do; and the online
alarms, given once per new event and withdrawn once the run is stable again."""

from __future__ import annotations

import sys
import warnings

from fastnorm.monitoring.diagnosis import UNSTABLE, Diagnosis, Event

_OWN = {__file__}  # the modules whose frames a warning points past, to the caller's


def own_frames(path: str) -> None:
    """Registers a module (its ``__file__``) whose frames a warning points past."""
    _OWN.add(path)


class UnstableGradientWarning(UserWarning):
    """The gradient-norm diagnosis turned unstable (diverged, exploding, vanishing, nonfinite or stalled), or
    found a new unstable event: one that began after the last warning, or a new kind and first action."""


class RecoveredWarning(UserWarning):
    """A run the monitor warned about recovered: its verdict is stable again, the warning is withdrawn."""


class MonitorWarning(UserWarning):
    """The monitor could not do part of its job (a logger failed, a value was invalid); training goes on."""


def _warn(message: str, category: type[Warning]) -> None:
    """Warns at the first frame outside this module: the caller's ``update``, ``close`` or ``with``."""
    frame, level = sys._getframe(1), 2  # stacklevel 1 is this function, 2 its caller
    while frame is not None and frame.f_code.co_filename in _OWN:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def _key(event: Event) -> tuple[str, str]:
    """An unstable event's kind and cause (its first action's id)."""
    return event.kind, getattr(event.actions[0], "id", str(event.actions[0])) if event.actions else ""


class Alerts:
    """The online alarms of a recorder: what was warned of (``alarms``, ``warned_of``, ``warned_at``)."""

    alarms: list[str]
    warned_of: set[tuple[str, str]]
    warned_at: int | None

    def alert(self, d: Diagnosis, step: int) -> None:
        """Warns of what is new in the diagnosis at ``step``; withdraws every warning once the run is stable.

        A warning is given for an unstable event not warned of yet: the first, one that began after the last
        warning (a new onset: a fault that comes while an earlier alarm stands), or one whose kind and first
        action were not warned of (a new cause). An earlier event seen again, however its dates are refined
        window by window, is no news.
        """
        if d.unstable:  # too few points to judge are unstable too, with no event to warn of
            unstable = [e for e in d.events if e.kind in UNSTABLE]
            new = [
                e
                for e in unstable
                if self.warned_at is None or e.start_step > self.warned_at or _key(e) not in self.warned_of
            ]
            if not new:
                return
            text = f"fastnorm: {d.headline()}"
            if self.warned_at is not None:
                news = ", ".join(f"{e.kind} from step {e.start_step}" for e in new)
                text += f"; new since the warning of step {self.warned_at}: {news}"
            self.warned_of.update(_key(e) for e in unstable)
            self.warned_at = step
            if d.verdict not in self.alarms:
                self.alarms.append(d.verdict)
            _warn(f"{text}.\n{d.report()}", UnstableGradientWarning)
        elif not d.unstable and self.alarms:
            names = " and ".join(f"'{v}'" for v in self.alarms)
            _warn(
                f"fastnorm: the run recovered: {d.headline()} at step {step}; the {names} "
                f"warning{'s are' if len(self.alarms) > 1 else ' is'} withdrawn.",
                RecoveredWarning,
            )
            self.alarms, self.warned_of, self.warned_at = [], set(), None
