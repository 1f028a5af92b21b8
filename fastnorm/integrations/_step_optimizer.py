"""A trainer's optimizer as a monitor reads it when a step is recorded after the scheduler moved on.

HF's Trainer and Lightning both step their learning-rate scheduler before a
callback has the step's loss to record it with: by then the groups' rates are
the next step's, and a schedule's jump would be dated one step early.
"""

from __future__ import annotations

from typing import Any


class StepOptimizer:
    """The optimizer's ``param_groups``, each with the learning rate of the step being recorded.

    Args:
        optimizer (torch.optim.Optimizer): the trainer's.
    """

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer
        self.lrs: list = []  # the recorded step's rate of each group

    def rates(self) -> list:
        """Each group's rate now: read when the step is taken, before the scheduler's step, the step's."""
        return [group.get("lr") for group in self.optimizer.param_groups]

    @property
    def param_groups(self) -> list[dict]:
        """The groups, each with the recorded step's rate (as they are, before any step is recorded)."""
        groups = self.optimizer.param_groups
        if len(self.lrs) != len(groups):
            return groups
        return [{**group, "lr": lr} for group, lr in zip(groups, self.lrs)]
