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


def test_a_loss_the_updates_made_worse_from_its_first_point_is_a_rate_too_high_not_too_low():
    # DPO's loss is ln 2 at its first point (the policy equals its reference); a rate far too high sends it
    # to about 4x that within a few steps, where it stays: a stall that never improved, but one that the
    # updates made worse, which a rate too low never does.
    steps, norms, _ = flat()
    rng = random.Random(1)
    losses = [math.log(2), 0.77] + [2.7 + rng.gauss(0, 0.3) for _ in steps[2:]]
    for lr in ({0: 3.0}, None):
        d = diagnose(steps, norms, loss=(steps, losses), lr=lr)
        assert d.verdict in ("stalled", "diverged") and d.action_ids[0] == "lower_lr", d.report()
        assert "made the model worse" in d.actions[0] and "raise_lr" not in d.action_ids, d.report()
    # The same start without the rise: at chance, the labels lead and a rate too low is among the causes.
    d = diagnose(steps, norms, loss=(steps, [math.log(2)] + [0.693 + rng.gauss(0, 0.01) for _ in steps[1:]]))
    assert d.action_ids[0] == "check_labels" and "raise_lr" in d.action_ids, d.report()
    assert "made the model worse" not in d.report()


def test_a_loss_flat_after_an_early_fall_in_a_log_without_the_rate_is_said_not_judged():
    # Falls from 4.5 to 2 by step 40, then flat to the end: a model that converged early, or a rate cut to
    # near zero. Without the rate the log cannot tell: no verdict rests on it, the report says so.
    rng = random.Random(2)
    steps = list(range(300))
    losses = [2.0 + 2.5 * max(0.0, 1 - i / 40) + rng.gauss(0, 0.05) for i in steps]
    norms = [math.exp(rng.gauss(0, 0.2)) for _ in steps]
    d = diagnose(steps, norms, loss=(steps, losses))
    assert d.verdict == "stable" and len(d.notes) == 1, d.report()
    assert "no learning rate to tell them apart" in d.notes[0] and "GradNormMonitor(optimizer=" in d.notes[0]
    assert "  note: " in d.report() and d.to_dict()["notes"] == list(d.notes)
    # A constant rate logged: the loss converged, nothing to say; a loss still falling: nothing either.
    assert diagnose(steps, norms, loss=(steps, losses), lr={0: 1e-3}).notes == ()
    falling = [4.5 - 1.5 * i / 300 + rng.gauss(0, 0.05) for i in steps]
    assert diagnose(steps, norms, loss=(steps, falling)).notes == ()


def test_an_action_that_cannot_tell_two_causes_apart_names_both_in_its_candidates(tmp_path):
    import json
    import pickle

    steps, norms, losses = flat()
    d = diagnose(steps, norms, loss=(steps, losses))
    assert d.action_candidates[:2] == (("raise_lr", "weight_decay"), ("weight_decay",)), d.report()
    assert d.to_dict()["action_candidates"][0] == ["raise_lr", "weight_decay"]
    told = diagnose(steps, norms, loss=(steps, losses), lr={0: 1e-6})
    assert told.action_candidates[0] == ("raise_lr",), told.report()
    # a norm exactly 0 from one step on, the precision not logged: fp16 underflow or a detached loss
    zeros = [n if s < 150 else 0.0 for s, n in zip(steps, norms)]
    z = diagnose(steps, zeros, loss=(steps, losses))
    assert z.verdict == "vanishing" and z.action_candidates[0] == ("precision", "no_gradient"), z.report()
    assert json.loads(json.dumps(z.to_dict()))["action_candidates"][0] == ["precision", "no_gradient"]
    first = pickle.loads(pickle.dumps(z.actions[0]))
    assert first == z.actions[0] and first.candidates == ("precision", "no_gradient") and first.uncertain
    logged = diagnose(steps, zeros, loss=(steps, losses), precision="fp32")
    assert logged.action_candidates[0] == ("no_gradient",), logged.report()


def test_an_action_id_outside_the_documented_ones_is_refused_by_name():
    import pytest

    from fastnorm.monitoring.diagnosis.advice import IDS, Action

    with pytest.raises(ValueError, match="'lower_the_lr'"):
        Action("lower_the_lr", "text")
    with pytest.raises(ValueError, match="unless='lower_lr'"):
        Action("lower_lr", "text", unless="lower_lr")
    assert {"no_gradient", "discriminator"} <= set(IDS)
