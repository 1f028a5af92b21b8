"""The learning rate as logged: its warmup and its changes, which tell a normal spike from an odd one."""

from __future__ import annotations

from collections import deque


class LrSignal:
    """The learning rate, read one finite value at a time."""

    def __init__(self) -> None:
        self.last: float | None = None
        self.last_step: int | None = None
        self.first: float | None = None
        self.first_step: int | None = None
        self.rising_until: int | None = None  # the last step of the initial rise (warmup)
        self.top: float | None = None  # the largest |rate| read
        self.warming = True
        self._ref: tuple[int, float] | None = None  # (step, value) the next change is measured from
        # (step, before, after, previous reading, since): by `step` the rate moved more than 20% from
        # `before`, the value it had at step `since` (the previous change, or where it was steady); it
        # happened after the previous reading. A ramp is a chain of changes, each since the one before.
        self.changes: deque[tuple[int, float, float, int, int]] = deque(maxlen=256)

    def update(self, step: int, value: float) -> None:
        if self.last_step is not None and step <= self.last_step:
            return  # read already (the monitor logs a window's last rate beside its changes)
        last, self.last = self.last, value
        previous, self.last_step = self.last_step, step
        self.top = abs(value) if self.top is None else max(self.top, abs(value))
        if last is None:
            self.first, self.first_step = value, step
            self._ref = (step, value)
            return
        if self.warming and value > last:
            self.rising_until = step
            self._ref = (step, value)
            return
        self.warming = False  # a warmup rises from the first step on
        since, before = self._ref
        if abs(value - before) > 0.2 * max(abs(before), 1e-300):
            self.changes.append((step, before, value, previous, since))
            self._ref = (step, value)

    @property
    def still_warming(self) -> bool:
        """The rate has risen from its first value and not stopped rising yet."""
        return self.warming and self.rising_until is not None

    def cut(
        self, step: int, last: int, reach: int, factor: float
    ) -> tuple[int, float, float, int, int] | None:
        """The change that cut the rate ``factor`` times or more near ``step`` (from ``reach`` steps before it
        to a quarter of the way from it to ``last``), the rate still that low at the end; None otherwise."""
        if self.last is None:
            return None
        for change in self.changes:
            at, before, after = change[:3]
            low = abs(before) / factor
            near = step - reach <= at <= step + max(reach, (last - step) / 4)
            if near and abs(after) <= low and abs(self.last) <= low:
                return change
        return None

    def context(self, step: int, recover: int, sustain: int) -> str | None:
        """Why a spike at ``step`` may be normal: a warmup or a schedule change the log shows."""
        if self.rising_until is not None and step <= self.rising_until + recover:
            return f"during the learning-rate warmup (rising until step {self.rising_until})"
        for s, before, after, _, _ in reversed(self.changes):
            if s - 1 <= step <= s + sustain:
                return f"at the learning-rate change of step {s} ({before:.3g} to {after:.3g})"
            if s < step:
                break
        return None


class OptimizerSettings:
    """The optimizer's other settings as logged (weight decay, eps, betas, momentum): each one's values
    by step, only where it changed (few in a whole run)."""

    NAMES = ("weight_decay", "eps", "beta1", "beta2", "momentum")

    def __init__(self) -> None:
        self.values: dict[str, list[tuple[int, float]]] = {}

    def update(self, name: str, step: int, value: float) -> None:
        kept = self.values.setdefault(name, [])
        if not kept or kept[-1][1] != value:
            kept.append((step, value))
            del kept[:-64]

    def at(self, name: str, step: int | None = None) -> float | None:
        """The setting in force at ``step`` (the last one read when None); None where never logged."""
        kept = self.values.get(name)
        if not kept:
            return None
        if step is None:
            return kept[-1][1]
        return next((v for s, v in reversed(kept) if s <= step), kept[0][1])

    def __bool__(self) -> bool:
        return bool(self.values)
