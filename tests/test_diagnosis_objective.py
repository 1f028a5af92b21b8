"""The objective as evidence: adversarial and reward-driven losses are no floor to stall at or rise from."""

import math
import random
import sys

import pytest

import fastnorm
from fastnorm.monitoring.diagnosis import diagnose
from fastnorm.monitoring.diagnosis.events import DIVERGED, STALLED
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


def rewards(seed=0, shape="rises"):
    """A policy gradient's mean reward over N steps, a batch's mean of 16 Bernoulli draws: its success
    probability rising from 0.3 to 0.8, staying at 0.3, or falling from 0.7 to 0.2 after step 100."""
    rng = random.Random(seed)
    out = []
    for s in range(N):
        p = {
            "rises": 0.3 + 0.5 * min(1.0, s / 150),
            "flat": 0.3,
            "falls": 0.7 - 0.5 * min(1.0, max(0, s - 100) / 100),
        }[shape]
        out.append(sum(rng.random() < p for _ in range(16)) / 16)
    return out


def test_a_reward_that_never_rose_is_a_stall_and_one_that_fell_a_divergence():
    """The loss of a policy gradient says nothing of what it learned; its logged reward does. Its norm and
    loss the same healthy ones in every case: only the reward tells them apart."""
    steps, norms, losses = policy()
    for seed in range(3):
        d = diagnose(steps, norms, loss=(steps, losses), reward=(steps, rewards(seed)))
        assert d.verdict == "stable" and "reward" in d.signals, d.report()
        d = diagnose(steps, norms, loss=(steps, losses), reward=(steps, rewards(seed, "flat")))
        assert d.verdict == "stalled" and d.action_ids[:2] == ("check_labels", "raise_lr"), d.report()
        assert "reward never rose" in d.events[-1].detail and "by hand" in d.actions[0]
        assert d.headline().startswith("the reward has stalled")
        d = diagnose(steps, norms, loss=(steps, losses), reward=(steps, rewards(seed, "falls")))
        assert d.verdict == "diverged" and d.action_ids[0] == "lower_lr", d.report()
        assert "reward fell" in d.events[-1].detail
    # A reward that never moved at all (a reward function that never pays out): a stall, not a division by 0.
    d = diagnose(steps, norms, loss=(steps, losses), reward=(steps, [-1.0] * N))
    assert d.verdict == "stalled" and "-1 over its first" in d.events[-1].detail, d.report()
    # Too few rewards to judge, non-finite ones, and a run that is not reward-driven: the reward is not read.
    assert diagnose(steps, norms, loss=(steps, losses), reward=(steps[:19], [0.3] * 19)).verdict == "stable"
    noisy = [math.nan if s % 2 else r for s, r in enumerate(rewards(0))]
    assert diagnose(steps, norms, loss=(steps, losses), reward=(steps, noisy)).verdict == "stable"
    gan_steps, gan_norms, gan_losses = gan()
    flat = (gan_steps, rewards(0, "flat"))
    d = diagnose(gan_steps, gan_norms, loss=(gan_steps, gan_losses), objective="adversarial", reward=flat)
    assert d.verdict == "stable", d.report()


def test_the_reward_is_read_from_a_trainer_state_and_reaches_the_report(tmp_path):
    """TRL's GRPO logs ``reward`` beside ``loss`` and ``grad_norm`` (DPO's ``rewards/chosen`` is no reward):
    ``fastnorm diagnose`` reads it, says so and judges it."""
    import json

    steps, norms, losses = policy()
    flat = rewards(1, "flat")
    history = [
        {"step": s + 1, "grad_norm": n or 1e-3, "loss": loss, "reward": r, "rewards/chosen": 0.5}
        for s, n, loss, r in zip(steps, norms, losses, flat)
    ]
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"log_history": history}))
    series = fastnorm.read_series(path)
    assert series.reward is not None and series.reward.key == "reward" and len(series.reward.steps) == N
    from fastnorm.monitoring.command import diagnose_series

    d = diagnose_series(series)
    assert d.verdict == "stalled" and d.objective == "reinforcement", d.report()
    assert "the reward" in d.report().splitlines()[0]
    dpo = [{k: v for k, v in h.items() if k != "reward"} for h in history]
    path.write_text(json.dumps({"log_history": dpo}))
    assert fastnorm.read_series(path).reward is None


def test_a_monitor_given_the_reward_logs_it_and_judges_it_online(tmp_path):
    """GradNormMonitor.update(..., reward=) keeps the reward on the device with the norm, logs it as
    gradient_norm_reward, reads the run as reward-driven (its tied batches' exact zeros no level) and
    judges the reward online as offline; the log it wrote is diagnosed the same."""
    import torch

    from fastnorm.monitoring.command import diagnose_series

    steps, norms, losses = policy()
    flat = rewards(2, "flat")
    path = tmp_path / "metrics.jsonl"
    monitor = fastnorm.GradNormMonitor(25, loggers=[fastnorm.JsonlLogger(path)], warn=False)
    with monitor:
        for s, v, loss, r in zip(steps, norms, losses, flat):
            monitor.update(torch.tensor(v), s, loss=loss, reward=torch.tensor(r))
    online = monitor.diagnosis
    assert online.verdict == "stalled" and online.objective == "reinforcement", online.report()
    assert online.action_ids[:2] == ("check_labels", "raise_lr") and "reward" in online.signals
    series = fastnorm.read_series(path)
    assert series.reward is not None and series.reward.key == "gradient_norm_reward"
    assert list(series.reward.values) == pytest.approx(flat)
    assert diagnose_series(series).to_dict() == online.to_dict()
    with pytest.raises(TypeError, match="reward"):
        fastnorm.GradNormMonitor(10).update(1.0, 0, reward="high")


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


@pytest.mark.parametrize("scale", [1.0, 1e300, 8.5e307, -8.5e307, 1.7e308])
def test_a_reward_near_the_largest_float_is_judged_as_the_same_reward_near_1(scale):
    """A flat reward, a falling one and one rising across the whole float range: the verdict of each
    does not depend on the reward's scale (near 1.8e308 their sums and differences pass the largest
    float, where inf - inf read as neither a fall nor a stall), and the report gives its true level."""
    from fastnorm.monitoring.diagnosis.objective import reward_event

    wobble = [((i * 7) % 11) / 11 for i in range(60)]  # no trend
    flat = [(i, min(scale * (1.0 + 0.01 * w), sys.float_info.max)) for i, w in enumerate(wobble)]
    falling = [(i, scale * (1.0 - 0.5 * i / 60 + 0.001 * w)) for i, w in enumerate(wobble)]
    found = reward_event(flat)
    assert found is not None and found.kind == STALLED, found
    assert f"{abs(scale):.2g}".split("e")[-1] in found.detail  # the level as logged, not scaled
    fell = reward_event(falling)
    if scale > 0:
        assert fell is not None and fell.kind == DIVERGED, fell
    else:
        assert fell is None  # a negative reward falling in size rises
    top = sys.float_info.max
    assert reward_event([(i, top * (2 * i / 59 - 1)) for i in range(60)]) is None  # it rose
