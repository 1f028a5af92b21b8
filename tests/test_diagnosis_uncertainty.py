"""Honest uncertainty: where the log cannot tell two causes apart, the first action says so and what to log."""

import math
import random

from fastnorm.monitoring.diagnosis import diagnose


def flat(n=300, seed=0):
    """A loss that never improves (at 1.7, no chance level ln k) and a norm that stays in its band."""
    rng = random.Random(seed)
    steps = list(range(n))
    return steps, [math.exp(rng.gauss(0, 0.2)) for _ in steps], [1.7 + rng.gauss(0, 0.02) for _ in steps]


def test_a_stall_whose_log_holds_no_optimizer_setting_names_both_causes_and_what_to_log():
    steps, norms, losses = flat()
    d = diagnose(steps, norms, loss=(steps, losses))
    assert d.verdict == "stalled" and d.action_ids[:2] == ("raise_lr", "weight_decay"), d.report()
    assert "cannot tell a rate too low from a decay too strong" in d.actions[0]
    assert "GradNormMonitor(optimizer=" in d.actions[0]


def test_a_stall_whose_log_holds_the_learning_rate_is_not_told_to_log_it():
    steps, norms, losses = flat()
    d = diagnose(steps, norms, loss=(steps, losses), lr={0: 1e-6})
    assert d.verdict == "stalled" and d.action_ids[0] == "raise_lr", d.report()
    assert "cannot tell" not in d.actions[0] and "weight_decay" not in d.action_ids
