"""The objective as evidence: adversarial and reward-driven losses are no floor to stall at or rise from."""

import math
import random

import pytest

import fastnorm
from fastnorm.monitoring.diagnosis import diagnose
from fastnorm.monitoring.diagnosis.objective import from_keys, infer

N = 300


def gan(seed=0, generator_loses=False):
    """A generator's norm and loss: healthy, its norm rising 50x from a small initialisation in the first 20
    steps while its loss rises from ln 2; or a discriminator that wins: the norm falls 1000x in 10 steps."""
    rng = random.Random(seed)
    steps = list(range(N))
    if generator_loses:
        norms = [0.1 * 10 ** (-3 * min(1.0, s / 10)) * math.exp(rng.gauss(0, 0.3)) for s in steps]
        losses = [-0.69 * math.exp(-s / 5) - 1e-4 * rng.random() for s in steps]
    else:
        norms = [0.02 * 50 ** min(1.0, s / 20) * math.exp(rng.gauss(0, 0.3)) for s in steps]
        losses = [0.69 + 0.5 * min(1.0, s / 60) + rng.gauss(0, 0.1) for s in steps]
    return steps, norms, losses


def policy(seed=0, saturates=False):
    """A policy gradient's norm and loss: near 0 of either sign, an exact 0 at every 8th step (a batch whose
    rewards tie); or a policy that saturates, its norm falling 100x in its first 20 steps."""
    rng = random.Random(seed)
    steps = list(range(N))
    fall = [10 ** (-2 * min(1.0, s / 20)) if saturates else 1.0 for s in steps]
    norms = [0.0 if s % 8 == 7 else 0.3 * f * math.exp(rng.gauss(0, 0.3)) for s, f in zip(steps, fall)]
    losses = [rng.gauss(0, 0.1) * f for s, f in zip(steps, fall)]
    return steps, norms, losses


def test_a_healthy_generator_is_stable_once_its_objective_is_known():
    steps, norms, losses = gan()
    # Read as a loss to minimise, its rise is a divergence and its norm's an explosion: a false alarm.
    assert diagnose(steps, norms, loss=(steps, losses)).verdict != "stable"
    for said in ({"objective": "adversarial"}, {"keys": ["gradient_norm", "loss_discriminator"]}):
        d = diagnose(steps, norms, loss=(steps, losses), **said)
        assert d.verdict == "stable" and d.objective == "adversarial", d.report()
    assert "objective: adversarial (the log holds 'loss_discriminator')" in d.report()


def test_a_discriminator_that_wins_is_vanishing_with_its_own_first_action():
    steps, norms, losses = gan(generator_loses=True)
    d = diagnose(steps, norms, loss=(steps, losses), objective="adversarial")
    assert d.verdict == "vanishing" and d.action_ids[0] == "discriminator", d.report()
    assert "fell" in d.events[-1].detail and "first points" in d.events[-1].detail
    # A loss that is negative at every point reads as reward-driven when nothing says otherwise: the fall is
    # then the policy's, not a stable run.
    assert diagnose(steps, norms, loss=(steps, losses)).verdict == "vanishing"


def test_a_policy_gradient_is_read_from_its_negative_loss_and_its_tied_batches_are_ordinary():
    steps, norms, losses = policy()
    d = diagnose(steps, norms, loss=(steps, losses))
    assert d.objective == "reinforcement" and "negative at" in d.objective_read, d.report()
    assert d.verdict == "stable" and not d.events, d.report()
    steps, norms, losses = policy(saturates=True)
    d = diagnose(steps, norms, loss=(steps, losses))
    assert d.verdict == "vanishing" and d.action_ids[0] == "lower_lr", d.report()
    assert "policy" in d.actions[0] and "entropy" in d.actions[0]
    # Said to be a loss to minimise, its exact zeros are read as they are (no tie to pass over).
    assert diagnose(steps, norms, loss=(steps, losses), objective="minimise").objective == "minimise"


def test_a_reward_driven_runs_short_drops_are_tied_batches_not_batches_to_check():
    """GRPO's and PPO's norm falls 100x for a step where most of a group's rewards tied (only the KL term
    and a few samples left): read as a loss to minimise, each drop asks to check that batch; read as
    reward-driven (its 'reward' key), each is said to be a tie, with nothing to do."""
    rng = random.Random(3)
    steps = list(range(N))
    norms = [0.3 * math.exp(rng.gauss(0, 0.2)) * (0.01 if s % 37 == 20 else 1.0) for s in steps]
    losses = [abs(rng.gauss(0, 0.01)) for _ in steps]
    plain = diagnose(steps, norms, loss=(steps, losses), objective="minimise")
    drops = [e for e in plain.events if e.kind == "spike"]
    assert drops and all("check_batch" in [a.id for a in e.actions] for e in drops), plain.report()
    d = diagnose(steps, norms, loss=(steps, losses), keys=["grad_norm", "reward", "kl"])
    assert d.objective == "reinforcement" and d.verdict == "stable", d.report()
    tied = [e for e in d.events if e.kind == "spike"]
    assert len(tied) == len(drops), d.report()
    assert all(not e.actions and "rewards tied" in e.detail for e in tied), d.report()
    assert "check_batch" not in d.action_ids


def test_the_objective_named_by_a_logs_keys():
    assert from_keys(["reward"])[0] == "reinforcement"
    assert from_keys(["train/rewards/format_reward_fn/mean"])[0] == "reinforcement"
    assert from_keys(["policy_loss"])[0] == "reinforcement"
    assert from_keys(["loss_d"])[0] == from_keys(["discriminator/loss"])[0] == "adversarial"
    # DPO's rewards are a preference loss's (minimised), a VAE's kl and a cross-entropy say nothing.
    for keys in (["rewards/chosen", "rewards/margins"], ["kl", "recon"], ["cross_entropy"], ["d_model"]):
        assert from_keys(keys) is None, keys
    # A loss negative at 1 point in 20 is noise around 0, not an objective; at 1 in 5 it is one.
    assert infer([], [1.0] * 19 + [-0.1]) is None
    assert infer([], [1.0] * 4 + [-0.1])[0] == "reinforcement"


def test_an_objective_is_checked_and_reaches_the_monitors_diagnosis():
    with pytest.raises(ValueError, match="objective must be one of"):
        fastnorm.Diagnoser(objective="gan")
    with pytest.raises(ValueError, match="GradNormMonitor: objective"):
        fastnorm.GradNormMonitor(10, objective="maximise")
    steps, norms, losses = gan()
    monitor = fastnorm.GradNormMonitor(25, objective="adversarial", warn=False)
    with monitor:
        for s, v, loss in zip(steps, norms, losses):
            monitor.update(v, s, loss=loss)
    assert monitor.diagnosis.objective == "adversarial" and monitor.diagnosis.verdict == "stable"
