"""Early warnings: a norm whose baseline climbs once the loss stopped learning warns before the blow-up."""

import math
import random

from fastnorm.monitoring.diagnosis import diagnose


def climbing(seed=5):
    """The norm steady to step 140, then its baseline climbing 1.7% a step inside its band (a rate that
    grows a little each step); the loss learns to step 100, holds, and turns up from step 150."""
    rng = random.Random(seed)
    steps = list(range(200))
    norms = [math.exp(rng.gauss(0, 0.1)) * (1.0 if i < 140 else 1.017 ** (i - 140)) for i in steps]

    def loss(i, turns=True):
        level = 2.0 - 0.01 * i if i < 100 else 1.0 + (0.006 * (i - 150) if turns and i >= 150 else 0.0)
        return level + rng.gauss(0, 0.02)

    return steps, norms, [loss(i) for i in steps], [loss(i, turns=False) for i in steps]


def test_a_baseline_climbing_as_the_loss_turns_warns_before_the_loss_blows_up():
    steps, norms, losses, _ = climbing()
    d = diagnose(steps, norms, loss=(steps, losses))
    # The loss is up 30% (no divergence yet), the norm's baseline 1.8x, inside its band all the way.
    assert d.verdict == "exploding" and d.events[0].detail.startswith("rising: the running baseline grew")
    assert d.action_ids[0] == "lower_lr", d.report()
    # Before the climb: nothing to say. Without the loss logged, the climb alone warns.
    assert diagnose(steps[:140], norms[:140], loss=(steps[:140], losses[:140])).verdict == "stable"
    assert diagnose(steps, norms).verdict == "exploding"


def test_a_climb_the_loss_does_not_follow_or_an_objective_without_a_floor_warns_of_nothing():
    steps, norms, losses, held = climbing()
    # The loss held where it was: logits that sharpen, a model growing; no warning.
    assert diagnose(steps, norms, loss=(steps, held)).verdict == "stable"
    # A policy's or a generator's norm swings by design.
    assert diagnose(steps, norms, loss=(steps, losses), objective="reinforcement").verdict == "stable"
