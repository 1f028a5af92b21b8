"""The diagnosis of runs where nothing trains: a gradient norm of exactly 0 at every step, or from one on."""

import math
import random

import pytest

from fastnorm.monitoring.diagnosis import diagnose


def series(n=200, zero_from=None, seed=0, loss_level=2.3):
    """A healthy-looking norm near 1 and a slowly falling loss; the norm exactly 0 from ``zero_from``."""
    rng = random.Random(seed)
    steps = list(range(n))
    norms = [0.0 if zero_from is not None and s >= zero_from else math.exp(rng.gauss(0, 0.2)) for s in steps]
    losses = [loss_level * (1 - 0.001 * s) + rng.gauss(0, 0.02) for s in steps]
    return steps, norms, losses


@pytest.mark.parametrize("precision", [None, "fp32"])
def test_a_norm_of_exactly_0_at_every_step_is_nothing_training_whatever_the_loss(precision):
    steps, _, losses = series()
    d = diagnose(steps, [0.0] * len(steps), loss=(steps, losses), precision=precision)
    assert d.verdict == "vanishing" and d.action_ids[0] == "no_gradient", d.report()
    assert "exactly 0 at every one of the 200 points" in d.report()
    # Without the loss too: the zeros alone say it.
    assert diagnose(steps, [0.0] * len(steps)).action_ids[0] == "no_gradient"


def test_zeros_from_one_step_on_name_both_causes_where_the_precision_is_not_logged():
    steps, norms, losses = series(zero_from=150)
    d = diagnose(steps, norms, loss=(steps, losses))
    assert d.verdict == "vanishing" and d.action_ids[:2] == ("precision", "no_gradient"), d.report()
    assert "step 150" in d.actions[0] and "GradNormMonitor(precision=" in d.actions[0]
    # The precision logged, fp32 or bf16: no underflow to suspect.
    for precision in ("fp32", "bf16-mixed"):
        d = diagnose(steps, norms, loss=(steps, losses), precision=precision)
        assert d.action_ids[0] == "no_gradient", (precision, d.report())
    # fp16 with no loss scale: the underflow the existing advice names.
    d = diagnose(steps, norms, loss=(steps, losses), precision="fp16-mixed")
    assert d.action_ids[0] == "grad_scaler", d.report()


def test_a_few_exact_zeros_are_ordinary_and_zeros_that_end_are_no_finding():
    # A policy gradient whose batches' rewards tie now and then: runs of up to 4 exact zeros.
    steps, norms, losses = series()
    for s in (20, 21, 22, 23, 90, 91, 197, 198, 199):
        norms[s] = 0.0
    d = diagnose(steps, norms, loss=(steps, losses))
    assert "no_gradient" not in d.action_ids, d.report()
    # Zeros held for 30 steps that then end: the weights move again, no "nothing trains".
    steps, norms, losses = series()
    norms[100:130] = [0.0] * 30
    assert "no_gradient" not in diagnose(steps, norms, loss=(steps, losses)).action_ids
