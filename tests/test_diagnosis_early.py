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


def shifting(seed=3, rise=True):
    """A noisy norm (its batches +-50%, so its band spans about 8x) steady for 190 steps, then lifted 1.2x a
    step for its last 10 (a rate that keeps growing: 6x by the end, its median 2.5x, inside its band); the
    loss learns to step 100, holds, and turns up 20% over the last 15 steps (or holds on)."""
    rng = random.Random(seed)
    steps = list(range(200))
    norms = [math.exp(rng.gauss(0, 0.4)) * (1.2 ** max(0, i - 189) if rise else 1.0) for i in steps]

    def loss(i, turns=True):
        level = 3.0 - 0.01 * i if i < 100 else 2.0 + (0.04 * (i - 184) if turns and i >= 185 else 0.0)
        return level + rng.gauss(0, 0.05)

    return steps, norms, [loss(i) for i in steps], [loss(i, turns=False) for i in steps]


def test_a_noisy_norm_lifted_inside_its_band_warns_as_the_loss_turns():
    steps, norms, losses, held = shifting()
    d = diagnose(steps, norms, loss=(steps, losses))
    assert d.verdict == "exploding", d.report()
    assert d.events[0].detail.startswith("rising: its last 10 points at"), d.report()
    assert d.events[0].start_step == 190 and d.action_ids[0] == "lower_lr", d.report()
    # The same noise unlifted, or lifted while the loss holds: nothing to say.
    flat = shifting(rise=False)
    assert diagnose(flat[0], flat[1], loss=(flat[0], flat[2])).verdict == "stable"
    assert diagnose(steps, norms, loss=(steps, held)).verdict == "stable"
    # Lifted 4x over its 10 points before the last 10, 3x over those: high, but no longer rising.
    base = flat[1]
    fell = [n * (4.0 if 180 <= i < 190 else 3.0 if i >= 190 else 1.0) for i, n in zip(steps, base)]
    lifted = [n * (2.0 if 180 <= i < 190 else 3.0 if i >= 190 else 1.0) for i, n in zip(steps, base)]
    assert diagnose(steps, lifted, loss=(steps, losses)).verdict == "exploding"
    assert diagnose(steps, fell, loss=(steps, losses)).verdict == "stable"
    # Its last point out of the band, a departure one point old: the shift it ends still warns.
    out = lifted[:-1] + [base[-1] * 40.0]
    d = diagnose(steps, out, loss=(steps, losses))
    assert d.verdict == "exploding" and d.events[0].detail.startswith("rising: its last 10"), d.report()


def test_a_shift_reads_no_fall_and_no_window_shorter_than_its_points():
    # A norm lifted inside its band, then out of it downwards at the last step: no rise.
    rng = random.Random(0)
    base = [10 ** rng.uniform(-0.4, 0.4) for _ in range(200)]
    lift = [10 ** (0.5 + rng.uniform(-0.1, 0.1) + 0.01 * i) for i in range(10)]
    d = diagnose(range(211), base + lift + [1e-4])
    assert not any(e.detail.startswith("rising") for e in d.events), d.report()
    # A window no longer than the points a shift is read over: nothing to compare, nothing raised.
    values = [1.0, 1.2, 0.9, 1.1, 1.0, 1.3, 0.8, 1.0, 1.1, 1.2]
    assert diagnose(range(10), values, window=10, sustain=10, warmup=5).verdict == "stable"
    for n in range(20, 32):
        diagnose(range(n), [1.0 + 0.1 * (i % 3) for i in range(n)], window=20, sustain=30)
