"""The diagnosis on synthetic series with known answers (see synthetic.py); real runs: test_corpus.py."""

import json
import math
import random
import re
import subprocess
import sys

import pytest

from fastnorm.monitoring.diagnosis import CHECKPOINT, INVALID_ACTION, LOWER_LR, Diagnoser, diagnose
from synthetic import NAMES, K, N, case, noise, scaled

SEEDS = [0, 1, 2]


def kinds(d):
    return [e.kind for e in d.events]


def only(d, kind):
    found = [e for e in d.events if e.kind == kind]
    assert len(found) == 1, d.report()
    return found[0]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("sigma", [0.05, 0.2])
def test_stable_noise(seed, sigma):
    d = diagnose(range(N), noise(seed, sigma=sigma))
    assert d.verdict == "stable"
    assert d.events == ()
    assert d.actions == ()
    assert d.steps == N


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", NAMES)
def test_known_verdict_and_event_steps(name, seed):
    values, verdict, expected = case(name, seed)
    d = diagnose(range(N), values)
    assert d.verdict == verdict, d.report()
    if expected is None:
        assert d.events == ()
        return
    kind, first, last, end = expected
    assert kinds(d) == [kind], d.report()
    assert first <= d.events[0].start_step <= last
    assert d.events[0].end_step == end


def test_actions_of_each_unstable_verdict():
    exploding = diagnose(range(N), case("exploding", 0)[0]).actions
    assert any("Lower the learning rate" in a for a in exploding)
    assert any("bf16-mixed" in a and "32-true" in a for a in exploding)
    assert any("Enable gradient clipping: no max_norm was set" in a for a in exploding)
    clipped = diagnose(range(N), case("exploding", 0)[0], max_norm=5.0).actions
    assert any(a.startswith("Tighten the gradient clipping: max_norm=5 is set") for a in clipped)
    assert not any("Enable gradient clipping" in a for a in clipped)
    vanishing = diagnose(range(N), case("vanishing", 0)[0]).actions
    assert any("Raise the learning rate" in a and "10M" in a for a in vanishing)
    assert any("normalisation layers" in a and "initialisation" in a for a in vanishing)
    nonfinite = diagnose(range(N), case("nonfinite", 0)[0]).actions
    assert any("latest checkpoint" in a and "fp32" in a for a in nonfinite)
    assert any("Check the data" in a and "loss scaler" in a for a in nonfinite)
    spike = diagnose(range(N), case("spike", 0)[0])
    assert spike.verdict == "stable"
    assert spike.actions == (
        "Isolated spike: check that batch (steps 30-34) for outliers or mislabelled samples.",
    )


def test_an_explosion_that_ends_in_nan_gets_both_advices():
    values = scaled(6, lambda i: 1.5 ** max(0, i - 100), n=400)
    values = [v if v < 3e38 else math.nan for v in values]
    d = diagnose(range(400), values)
    assert d.verdict == "nonfinite"
    assert kinds(d) == ["exploding", "nonfinite"]
    assert LOWER_LR in d.events[0].actions and CHECKPOINT in d.events[1].actions
    # The explosion ran into the NaN: its actions first (the cause), then the collapse's.
    assert d.actions[0] == LOWER_LR and CHECKPOINT in d.actions


def test_one_inf_step_that_recovers_is_a_skipped_step():
    values = noise(3)
    values[K] = math.inf
    d = diagnose(range(N), values)
    assert d.verdict == "stable"
    assert [(e.kind, e.start_step, e.end_step, e.count) for e in d.events] == [("skipped", K, K, 1)]
    assert d.skipped_steps == 1


@pytest.mark.parametrize("seed", SEEDS)
def test_explosion_that_returns_is_exploding_until_it_returns(seed):
    values = scaled(seed, lambda i: 1e3 if K <= i < K + 30 else 1.0)
    d = diagnose(range(N), values)
    assert d.verdict == "exploding"
    e = only(d, "exploding")
    assert K - 2 <= e.start_step <= K
    assert e.end_step == K + 29


@pytest.mark.parametrize("seed", SEEDS)
def test_slow_growth_that_never_leaves_the_band_is_exploding(seed):
    # 4 orders of magnitude over the whole run: the band follows it; the drift rule does not.
    values = scaled(seed, lambda i: 10 ** (4.0 * i / N))
    d = diagnose(range(N), values)
    assert d.verdict == "exploding"
    assert only(d, "exploding").start_step < N // 4


@pytest.mark.parametrize("factor", [5.0, 0.2])
def test_level_shift_is_a_new_normal(factor):
    d = diagnose(range(N), scaled(4, lambda i: factor if i >= K else 1.0))
    assert d.verdict == "stable"
    assert d.events == ()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_burst_of_30x_for_tens_of_steps_is_exploding(seed):
    # The norm of a 10x learning-rate jump: 30x for 60 steps, then settling 2x above where it was.
    # Neither a spike (too long) nor a new normal (10x and more, held for `sustain` points).
    d = diagnose(range(N), scaled(seed, lambda i: 1.0 if i < K else 30.0 if i < K + 60 else 2.0))
    assert d.verdict == "exploding", d.report()
    assert K - 2 <= only(d, "exploding").start_step <= K


def test_healthy_early_decline_is_stable():
    # Norms commonly fall 10-100x over the first few hundred steps.
    d = diagnose(range(N), scaled(5, lambda i: 10 * 10 ** (-1.5 * min(i, 200) / 200), sigma=0.15))
    assert d.verdict == "stable", d.report()


def test_nonfinite_outranks_the_explosion_that_led_to_it():
    values = scaled(6, lambda i: 1.5 ** max(0, i - 100), n=400)
    values = [v if v < 3e38 else math.inf for v in values]
    d = diagnose(range(400), values)
    first_inf = values.index(math.inf)
    assert d.verdict == "nonfinite"
    assert kinds(d) == ["exploding", "nonfinite"]
    assert d.events[0].start_step < first_inf == d.events[1].start_step


def test_zero_norm_reads_as_vanishing():
    d = diagnose(range(N), scaled(7, lambda i: 0.0 if i >= K else 1.0))
    assert d.verdict == "vanishing"
    assert only(d, "vanishing").start_step == K


def test_thresholds_are_honoured():
    values = scaled(8, lambda i: 10 ** min(4.0, 4.0 * (i - K) / 100) if i >= K else 1.0)
    assert diagnose(range(N), values).verdict == "exploding"
    assert diagnose(range(N), values, explode_orders=5.0).verdict == "stable"


def test_steps_are_reported_as_given():
    steps = [10 * i + 7 for i in range(N)]
    values = [v if i < K else math.nan for i, v in enumerate(noise(9))]
    e = only(diagnose(steps, values), "nonfinite")
    assert (e.start_step, e.end_step) == (steps[K], steps[-1])


def test_fed_in_windows_equals_read_at_once():
    values = scaled(10, lambda i: 10 ** min(4.0, 4.0 * (i - K) / 100) if i >= K else 1.0)
    values[100] = math.nan
    online = Diagnoser()
    for start in range(0, N, 37):
        online.update(range(start, min(start + 37, N)), values[start : start + 37])
    assert online.result() == diagnose(range(N), values)


def test_report_and_dict():
    values = [v if i < K else math.nan for i, v in enumerate(noise(11))]
    d = diagnose(range(N), values)
    lines = d.report().splitlines()
    assert lines[0] == f"verdict: nonfinite ({N} steps read)"
    first = f"{N - K} non-finite norms from step {K} to the last step, the first nan"
    assert lines[1] == f"  nonfinite steps {K}-{N - 1}: {first}"
    assert lines[2:] == [f"    - {a}" for a in d.actions]
    assert json.loads(json.dumps(d.to_dict()))["events"][0] == {
        "kind": "nonfinite",
        "start_step": K,
        "end_step": N - 1,
        "detail": d.events[0].detail,
        "actions": list(d.actions),
        "action_ids": ["checkpoint", "check_data"],
        "action_candidates": [["checkpoint"], ["check_data"]],
        "count": 0,
    }
    assert d.to_dict()["onset"] == K == d.onset
    assert d.to_dict()["action_ids"] == list(d.action_ids) == ["checkpoint", "check_data"]
    assert (
        diagnose([], []).report()
        == "verdict: too few points (no value read; at least 5 are needed to judge a run)"
    )
    assert (
        diagnose(range(N), noise(0)).report().splitlines()[1] == "  no event: the norm stayed within its band"
    )


@pytest.mark.parametrize(
    "steps, values, kwargs, error, match",
    [
        ([0, 1], [1.0], {}, ValueError, "2 steps but 1 values"),
        ([0, 1], [1.0, 1.0], {"loss": ([0], [1.0, 2.0])}, ValueError, "1 steps but 2 loss values"),
        ([0, 1], [1.0, 1.0], {"loss": [1.0, 2.0, 3.0]}, TypeError, "loss must be a"),
        ([0, 1], [1.0, 1.0], {"window": 0}, ValueError, "window"),
        ([0, 1], [1.0, 1.0], {"window": "50"}, ValueError, "window must be a positive int, got '50'"),
        ([0, 1], [1.0, 1.0], {"explode_orders": -1}, ValueError, "explode_orders"),
        ([0, 1], [1.0, 1.0], {"warmup": 60}, ValueError, "warmup"),
        ([0, 1], [1.0, 1.0], {"max_norm": "1"}, TypeError, "max_norm must be a number"),
    ],
)
def test_bad_input_raises(steps, values, kwargs, error, match):
    with pytest.raises(error, match=match):
        diagnose(steps, values, **kwargs)


def test_negative_and_non_numeric_values_are_reported_not_raised():
    values = noise(12)
    values[100], values[200], values[201], values[400] = -1.0, "n/a", None, True
    d = diagnose(range(N), values)
    assert d.verdict == "stable"
    invalid = [(e.start_step, e.end_step, e.count) for e in d.events if e.kind == "invalid"]
    assert invalid == [(100, 100, 1), (200, 201, 2), (400, 400, 1)]
    assert INVALID_ACTION in d.actions
    assert "invalid   4 steps (100, 200-201, 400): negative or not a number" in d.report()


def test_exact_zeros_are_reported_as_zero():
    d = diagnose(range(N), scaled(7, lambda i: 0.0 if i >= K else 1.0))
    [event] = d.events
    assert "exactly 0 at each of the 300 points" in event.detail
    assert "e-30" not in d.report() and "e-45" not in d.report()


# ----------------------------------------------------------------------------
# The loss, the learning rate, the loss scale, the per-layer norms
# ----------------------------------------------------------------------------


def losses(seed, level, n=N, sigma=0.02):
    """A noisy loss around ``level(i)``."""
    rng = random.Random(1000 + seed)
    return list(range(n)), [level(i) * (1 + rng.gauss(0.0, sigma)) for i in range(n)]


def learning(i):
    return 0.5 + 2.0 * math.exp(-i / 60)  # falls from 2.5 to about 0.5


@pytest.mark.parametrize("seed", SEEDS)
def test_a_norm_spike_then_a_loss_that_stays_up_is_diverged(seed):
    # A learning-rate blow-up: the norm spikes for a few steps and comes back, the loss never does.
    values = scaled(seed, lambda i: 300.0 if K <= i < K + 5 else 1.0)
    loss = losses(seed, lambda i: learning(i) if i < K else 4.0)
    d = diagnose(range(N), values, loss=loss)
    assert d.verdict == "diverged", d.report()
    e = only(d, "diverged")
    assert K - 2 <= e.start_step <= K and e.end_step == N - 1
    assert "stayed there" in e.detail
    assert e.actions[0] == LOWER_LR
    assert any(a.startswith(f"Resume from a checkpoint saved before step {e.start_step}") for a in e.actions)
    assert "spike" not in kinds(d)  # the spike is the divergence's start, not an event of its own
    assert diagnose(range(N), values).verdict == "stable"  # without the loss: a spike, as before


@pytest.mark.parametrize("seed", SEEDS)
def test_a_divergence_dates_from_the_norms_rise_not_from_a_noisy_loss(seed):
    # The loss wanders up from its best for 60 steps, then the run blows up at K: the loss's own start is
    # blurred by its noise and smoothing; the norm, read every step, dates the blow-up.
    def level(i):
        return learning(i) if i < K - 60 else 0.5 + 0.3 * (i - K + 60) / 60 if i < K else 5.0

    values = scaled(seed, lambda i: 1.0 if i < K else 1000.0)
    d = diagnose(range(N), values, loss=losses(seed, level, sigma=0.1))
    assert K - 2 <= only(d, "diverged").start_step <= K, d.report()


def test_a_spike_whose_loss_recovers_is_a_spike():
    values = scaled(1, lambda i: 300.0 if K <= i < K + 5 else 1.0)
    loss = losses(1, lambda i: learning(i) + (3.0 if K <= i < K + 20 else 0.0))
    d = diagnose(range(N), values, loss=loss)
    assert d.verdict == "stable" and kinds(d) == ["spike"]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_loss_that_climbs_above_its_start_and_learns_again_is_diverged(seed):
    # A 10x learning-rate jump: the norm bursts 30x, the loss climbs above where the run began and
    # then has to learn it all again. The run lost what it had learned: diverged, though it recovers.
    values = scaled(seed, lambda i: 30.0 if K <= i < K + 40 else 1.0)
    loss = losses(seed, lambda i: learning(i) if i < K else 8.0 if i < K + 40 else learning(i - K - 40))
    d = diagnose(range(N), values, loss=loss)
    assert d.verdict == "diverged", d.report()
    e = only(d, "diverged")
    assert K - 2 <= e.start_step <= K and K + 35 <= e.end_step <= K + 45
    assert "rose above its initial level" in e.detail and "then came down again" in e.detail
    assert e.actions[0] == LOWER_LR
    # Without the norm's burst the climb is no stall: the loss came down again.
    assert "stalled" not in kinds(diagnose(range(N), noise(seed), loss=loss))


def test_a_loss_that_never_improves_is_stalled():
    d = diagnose(range(N), noise(2), loss=losses(2, lambda i: 1.386))
    assert d.verdict == "stalled"
    e = only(d, "stalled")
    assert (e.start_step, e.end_step) == (0, N - 1) and "never improved" in e.detail
    assert any("Raise the learning rate" in a for a in e.actions)
    assert any("log per-layer norms" in a for a in e.actions)


def test_a_loss_that_returns_to_its_start_without_a_spike_is_stalled():
    loss = losses(3, lambda i: learning(i) if i < K else 2.5)
    d = diagnose(range(N), noise(3), loss=loss)
    assert d.verdict == "stalled", d.report()
    e = only(d, "stalled")
    assert K - 3 <= e.start_step <= K + 3 and "returned to its initial level" in e.detail


@pytest.mark.parametrize("every", [1, 10])
def test_a_flat_loss_is_stalled_whatever_the_log_cadence(every):
    # A trainer logging every 10th step (Hugging Face's logging_steps=10) logs 30 points over 300 steps.
    steps = list(range(0, 300, every))
    loss = losses(6, lambda i: 1.386, n=len(steps))[1]
    d = diagnose(steps, noise(6, n=len(steps)), loss=(steps, loss))
    assert d.verdict == "stalled", d.report()
    # Over fewer than 200 steps a flat loss may just not have started (a warmup): not judged.
    short = list(range(0, 100, 5))
    assert diagnose(short, noise(6, n=20), loss=(short, loss[:20])).verdict == "stable"


def test_a_learning_run_is_stable():
    d = diagnose(range(N), noise(4), loss=losses(4, learning))
    assert d.verdict == "stable" and d.events == ()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_rising_norm_with_a_falling_loss_is_healthy_growth(seed):
    # A model leaving a small initialisation: the norm grows 1000x while the loss falls.
    values = scaled(seed, lambda i: 10 ** min(3.0, 3.0 * i / 100) * 1e-3)
    d = diagnose(range(N), values, loss=losses(seed, learning))
    assert d.verdict == "stable", d.report()
    assert kinds(d) == ["growth"] and "while the loss fell" in d.events[0].detail
    assert d.actions == ()
    alone = diagnose(range(N), values)  # without the loss: exploding, and the loss would tell
    assert alone.verdict == "exploding" and alone.events[0].actions[-1].startswith(
        "Log the loss beside the norm"
    )
    rising = diagnose(range(N), values, loss=losses(seed, lambda i: 1.0 + i / 100))
    assert not any(a.startswith("Log the loss") for a in rising.actions)
    assert rising.verdict in ("exploding", "diverged")


def test_a_falling_norm_with_a_falling_loss_is_healthy_decay():
    values = scaled(5, lambda i: 10 ** -min(4.0, 4.0 * i / 100))
    loss = losses(5, lambda i: 2.0 * 10 ** -min(4.0, 4.0 * i / 100) + 1e-6)
    d = diagnose(range(N), values, loss=loss)
    assert d.verdict == "stable" and kinds(d) == ["decay"], d.report()
    assert diagnose(range(N), values).verdict == "vanishing"


def test_loss_scaler_skips_early_and_sparse():
    values = noise(6)
    skipped = [*range(16), 250, 400]
    for i in skipped:
        values[i] = math.inf if i % 2 else math.nan
    scale = {0: 2.0**32, **{i + 1: 2.0 ** (31 - i) for i in range(16)}, 251: 2.0**15, 401: 2.0**15}
    d = diagnose(range(N), values, loss=losses(6, learning), scale=scale)
    assert d.verdict == "stable", d.report()
    assert [(e.start_step, e.end_step) for e in d.events if e.kind == "skipped"] == [
        (0, 15),
        (250, 250),
        (400, 400),
    ]
    assert d.skipped_steps == 18
    assert "the loss scale fell from 4.29e+09 to 6.55e+04" in d.events[0].detail
    assert "skipped   18 steps (0-15, 250, 400)" in d.report()


def test_nonfinite_to_the_end_or_in_the_loss_is_a_collapse():
    values = noise(7)
    values[K:] = [math.nan] * (N - K)
    loss = losses(7, learning)
    assert diagnose(range(N), values, loss=loss).verdict == "nonfinite"  # persists past max_skip_run
    short = values[: K + 5]
    d = diagnose(range(K + 5), short, loss=(loss[0][: K + 5], loss[1][: K + 5]))
    assert d.verdict == "stable" and "not back by the last step" in d.events[-1].detail  # 5 steps: a scaler?
    assert diagnose(range(K + 5), short).verdict == "nonfinite"  # without a loss: a collapse
    bad_loss = (loss[0], [v if i != 100 else math.nan for i, v in enumerate(loss[1])])
    values = noise(7)
    values[100] = math.nan
    d = diagnose(range(N), values, loss=bad_loss)
    assert d.verdict == "nonfinite"
    e = only(d, "nonfinite")
    assert (e.start_step, e.end_step) == (100, 100) and "the loss is non-finite" in e.detail


def flags(skipped, applied=(), n=N):
    """The optimizer's skip flags: 1 at ``skipped``, 0 at ``applied`` and everywhere else."""
    return list(range(n)), [1.0 if i in skipped else 0.0 for i in range(n)]


def test_nonfinite_norms_the_optimizer_skipped_are_skipped_steps_even_at_the_end():
    values = noise(14)
    bad = [40, 41, 200, N - 2, N - 1]
    for i in bad:
        values[i] = math.nan if i % 2 else math.inf
    # Without the flags and without a loss, NaN at the last step reads as a collapse.
    assert diagnose(range(N), values).verdict == "nonfinite"
    d = diagnose(range(N), values, skipped=flags(bad))
    assert d.verdict == "stable", d.report()
    assert [(e.start_step, e.end_step, e.count) for e in d.events if e.kind == "skipped"] == [
        (40, 41, 2),
        (200, 200, 1),
        (N - 2, N - 1, 2),
    ]
    assert d.skipped_steps == 5 and d.signals == ("skipped",)
    assert "steps the optimizer skipped" in d.events[0].detail
    assert "skipped   5 steps (40-41, 200, 598-599)" in d.report()
    assert "the optimizer's skip flags" in d.report()
    # With the loss too: the same.
    assert diagnose(range(N), values, skipped=flags(bad), loss=losses(14, learning)).verdict == "stable"
    # Flags given as a mapping of the skipped steps only, True/False: the same events.
    mapping = {i: i in bad for i in range(N)}
    assert diagnose(range(N), values, skipped=mapping).events == d.events


def test_an_applied_nonfinite_step_at_the_end_is_a_collapse_whatever_the_loss():
    values = noise(15)
    values[N - 3 :] = [math.nan] * 3
    loss = losses(15, learning)  # finite: computed before the step that applied the NaN
    # Without the flags a finite loss suggests a scaler that skipped: 3 steps are not enough to tell.
    assert diagnose(range(N), values, loss=loss).verdict == "stable"
    d = diagnose(range(N), values, loss=loss, skipped=flags(()))
    assert d.verdict == "nonfinite", d.report()
    e = only(d, "nonfinite")
    assert (e.start_step, e.end_step) == (N - 3, N - 1)
    assert "the optimizer applied 3 of these steps" in e.detail
    assert any("fastnorm.StepClipper" in a for a in e.actions)
    # One skipped step earlier does not change that.
    values[100] = math.nan
    d = diagnose(range(N), values, loss=loss, skipped=flags([100]))
    assert d.verdict == "nonfinite" and d.skipped_steps == 1


def test_a_nonfinite_loss_at_skipped_steps_is_a_bad_batch_not_a_collapse():
    values = noise(16)
    loss = losses(16, learning)
    for i in (150, 151):
        values[i] = math.nan
        loss[1][i] = math.nan
    assert diagnose(range(N), values, loss=loss).verdict == "nonfinite"  # without the flags
    d = diagnose(range(N), values, loss=loss, skipped=flags([150, 151]))
    assert d.verdict == "stable", d.report()
    e = only(d, "skipped")
    assert (e.start_step, e.end_step, e.count) == (150, 151, 2) and "bad batches" in e.detail


def test_skipping_every_step_to_the_end_is_a_collapse():
    values = noise(17)
    values[K:] = [math.nan] * (N - K)
    d = diagnose(range(N), values, skipped=flags(range(K, N)))
    assert d.verdict == "nonfinite", d.report()
    e = only(d, "nonfinite")
    assert e.start_step == K and "nothing has been learned since" in e.detail
    short = diagnose(range(K + 5), values[: K + 5], skipped=flags(range(K, K + 5), n=K + 5))
    assert short.verdict == "stable" and short.skipped_steps == 5  # within max_skip_run


def test_flags_before_or_after_the_norms_read_the_same():
    values = noise(18)
    bad = [30, 31, 32, 250, 251, N - 1]
    for i in bad:
        values[i] = math.nan
    skipped = flags(bad[:-1])  # the last one applied
    expected = diagnose(range(N), values, skipped=skipped)
    assert expected.verdict == "nonfinite" and expected.skipped_steps == 5
    for flags_first in (True, False):
        online = Diagnoser()
        for start in range(0, N, 50):
            window = range(start, min(start + 50, N))
            if flags_first:
                online.update_skipped(window, skipped[1][start : start + 50])
            online.update(window, values[start : start + 50])
            if not flags_first:
                online.update_skipped(window, skipped[1][start : start + 50])
        assert online.result() == expected, flags_first


def layer_norms(spread_at, steps=range(9, N, 10)):
    """Per-layer norms of a 6-layer model every 10 steps; the first layers fall away from ``spread_at``."""
    out = {}
    for s in steps:
        depth = 0.0 if s < spread_at else min(8.0, (s - spread_at) / 10)
        out[s] = {f"block{i}": 10 ** (-depth * (5 - i) / 5) for i in range(6)}
    return out


def test_layer_wise_vanishing_under_a_flat_total():
    d = diagnose(range(N), noise(8), layers=layer_norms(K))
    assert d.verdict == "vanishing", d.report()
    e = only(d, "vanishing")
    assert K <= e.start_step <= K + 80 and e.end_step == N - 1
    assert "'block0'" in e.detail and "'block5'" in e.detail and "orders of magnitude" in e.detail
    assert "below float32 resolution" in e.detail
    assert diagnose(range(N), noise(8), layers=layer_norms(10 * N)).verdict == "stable"


def test_layers_vanishing_from_the_first_reading_date_from_the_first_step():
    layers = {s: {"first": 1e-33, "last": 0.5} for s in range(9, N, 10)}
    e = only(diagnose(range(N), noise(9), layers=layers), "vanishing")
    assert e.start_step == 0 and "33 orders" in e.detail


def test_layers_that_become_exactly_zero_vanish_but_frozen_ones_do_not():
    def layers(dead_from):
        return {
            s: {"frozen": 0.0, "embed": 0.0 if s >= dead_from else 0.3, "head": 0.5} for s in range(9, N, 10)
        }

    d = diagnose(range(N), noise(10), layers=layers(K + 9))
    e = only(d, "vanishing")
    assert e.start_step == K + 9 and "exactly 0: 'embed'" in e.detail and "frozen" not in e.detail
    assert diagnose(range(N), noise(10), layers=layers(10 * N)).verdict == "stable"


def test_a_spike_at_a_learning_rate_change_or_warmup_is_normal_else_check_that_batch():
    values = scaled(11, lambda i: 100.0 if i in (K, K + 1) else 1.0)
    lr = {i: 1e-3 if i < K else 3e-3 for i in range(N)}
    d = diagnose(range(N), values, lr=lr)
    [e] = d.events
    assert e.kind == "spike" and "learning-rate change of step 300 (0.001 to 0.003)" in e.detail
    assert e.actions == () and "normal if it settles" in e.detail
    alone = diagnose(range(N), values, lr={i: 1e-3 for i in range(N)})
    assert alone.events[0].actions == (
        "Isolated spike: check that batch (steps 300-301) for outliers or mislabelled samples.",
    )
    warm = scaled(11, lambda i: 100.0 if i == 20 else 1.0)
    d = diagnose(range(N), warm, lr={i: 1e-3 * min(1.0, (i + 1) / 50) for i in range(N)})
    assert "during the learning-rate warmup" in d.events[0].detail and d.actions == ()
    dip = diagnose(range(N), scaled(11, lambda i: 0.01 if i == K else 1.0))
    assert dip.events[0].actions[0].startswith("A short drop: check that batch (step 300)")


def test_fed_in_windows_with_every_signal_equals_read_at_once():
    values = scaled(12, lambda i: 300.0 if K <= i < K + 5 else 1.0)
    loss = losses(12, lambda i: learning(i) if i < K else 4.0)
    layers = layer_norms(K)
    online = Diagnoser()
    for start in range(0, N, 50):
        window = range(start, min(start + 50, N))
        online.update(window, values[start : start + 50])
        online.update_loss(window, loss[1][start : start + 50])
        for s in window:
            if s in layers:
                online.update_layers(s, layers[s])
    assert online.result() == diagnose(range(N), values, loss=loss, layers=layers)


def test_a_long_loss_costs_constant_memory():
    d = Diagnoser()
    n = 200_000
    rng = random.Random(13)
    for start in range(0, n, 1000):
        steps = range(start, start + 1000)
        d.update(steps, [10 ** rng.gauss(0, 0.1) for _ in steps])
        d.update_loss(steps, [2.0 * math.exp(-s / 50_000) + 0.1 for s in steps])
    assert len(d._loss.all()) <= 2 * 1024
    assert d.result().verdict == "stable"


def test_a_long_reward_costs_constant_memory_and_is_still_judged():
    """A reward-driven run's reward is thinned as the loss is: one that rose is no stall, however long."""
    d = Diagnoser(objective="reinforcement")
    n = 200_000
    rng = random.Random(17)
    for start in range(0, n, 1000):
        steps = range(start, start + 1000)
        d.update(steps, [10 ** rng.gauss(0, 0.1) for _ in steps])
        d.update_reward(steps, [min(1.0, s / 100_000) + rng.gauss(0, 0.3) for s in steps])
    assert len(d._rewards.all()) <= 2 * 1024
    assert d.result().verdict == "stable"


def test_runs_without_torch():
    # torch made unimportable: the diagnosis, reached as users reach it, must not need it.
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "import fastnorm\n"
        "print(fastnorm.diagnose(range(30), [1.0] * 20 + [float('nan')] * 10).verdict)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "nonfinite"


# ----------------------------------------------------------------------------
# Honest short logs, what each report line measured, and the advice's evidence
# ----------------------------------------------------------------------------


def test_too_few_points_is_a_verdict_that_never_passes():
    d = diagnose(range(4), [1.0, 1.1, 0.9, 1.0])
    assert d.verdict == "too few points" and d.unstable and not d.judged
    assert d.report() == "verdict: too few points (4 steps read; at least 5 are needed to judge a run)"
    assert diagnose(range(5), [1.0, 1.1, 0.9, 1.0, 1.0]).verdict == "stable"


def test_a_thinned_log_judges_its_first_points():
    # Logged every 10th step: the norm explodes at step 30. A warm-up of 10 points would take it into the
    # baseline (100 steps); counted in steps as well, it ends after 3 points.
    steps = list(range(0, 1000, 10))
    values = scaled(3, lambda i: 1e3 if i >= 3 else 1.0, n=len(steps))
    e = only(diagnose(steps, values), "exploding")
    assert e.start_step == 30, e


def test_the_loss_line_names_where_it_crossed_its_initial_level():
    # The loss learns from 0.5 to 0.04, holds, then climbs back: it left its best at step 300 and crossed
    # its initial level much later. The line must say both, each where it was measured.
    def level(i):
        return 0.5 - 0.46 * min(i, 200) / 200 + (0.96 * (i - 300) / 299 if i > 300 else 0.0)

    steps, loss = losses(5, level, sigma=0.01)
    crossed = next(i for i in range(301, N) if all(level(j) > 0.5 for j in range(i, N)))
    values = scaled(5, lambda i: 10.0 if i > 300 else 1.0)
    e = only(diagnose(range(N), values, loss=(steps, loss)), "diverged")
    match = re.search(
        r"left its best from step (\d+) and rose above its initial level \([\d.]+\) from step (\d+)", e.detail
    )
    assert match, e.detail
    left, above = int(match.group(1)), int(match.group(2))
    assert abs(left - 300) <= 15 and abs(above - crossed) <= 15, (left, above, crossed)


def test_a_slow_rise_that_levels_off_ends_where_it_stopped_rising():
    # The norm drifts up 2 orders of magnitude over 500 steps, inside its band all along, then holds for
    # 2000 steps, past the drift's horizon (1000 points): an exploding event that ends long before the last
    # step, where the rise over the horizon fell back under explode_orders.
    n = 3000
    values = scaled(20, lambda i: 10 ** (2.0 * min(max(i - 500, 0), 500) / 500), n=n)
    e = only(diagnose(range(n), values), "exploding")
    # The rise passes 1 order at step 750; the horizon's window holds a point 1 order below until 1750.
    assert 500 <= e.start_step <= 760 and 1700 <= e.end_step <= 1800, e
    assert "the running baseline grew from" in e.detail


def series_with(loss_level, n=N, seed=0, norm=None, sigma=0.02):
    steps, loss = losses(seed, loss_level, n=n, sigma=sigma)
    return steps, (norm or noise(seed, n=n)), loss


def first_action(d):
    return d.action_ids[0] if d.action_ids else None


def test_a_loss_at_chance_from_the_start_with_normal_gradients_checks_the_labels():
    steps, values, loss = series_with(lambda i: math.log(10))
    d = diagnose(steps, values, loss=(steps, loss))
    assert d.verdict == "stalled" and first_action(d) == "check_labels"
    assert re.search(r"stayed at 2\.3\d* = ln 10 \(chance for 10 classes\) from step 0", d.actions[0])


def test_a_loss_at_chance_in_a_log_without_the_rate_names_a_rate_too_low_as_well():
    # A rate far too low leaves a classifier's loss where it began, at chance, as labels that do not match
    # their inputs do: without the rate logged, the labels lead and say so, the rate is their second cause.
    steps, values, loss = series_with(lambda i: math.log(10))
    d = diagnose(steps, values, loss=(steps, loss))
    assert d.action_candidates[0] == ("check_labels", "raise_lr"), d.report()
    assert "The log holds no learning rate" in d.actions[0]
    assert "GradNormMonitor(optimizer=...)" in d.actions[0]
    # The rate logged, and ordinary: the labels alone.
    told = diagnose(steps, values, loss=(steps, loss), lr={0: 1e-3})
    assert told.action_candidates[0] == ("check_labels",) and "no learning rate" not in told.actions[0]


def test_an_adam_rate_too_small_to_move_a_weight_leads_with_raising_it():
    # Adam moves each weight by about its rate a step: 2e-8 over 600 steps moves none by more than 1.2e-5,
    # whatever the loss sits at (here ln 10, which alone would point at the labels).
    steps, values, loss = series_with(lambda i: math.log(10))
    adam = {"beta1": {0: 0.9}, "beta2": {0: 0.999}}
    d = diagnose(steps, values, loss=(steps, loss), lr={0: 2e-8}, optimizer=adam)
    assert d.verdict == "stalled" and d.action_ids[:2] == ("raise_lr", "check_labels"), d.report()
    assert "no weight moved more than 1.2e-05" in d.actions[0] and d.action_ids.count("raise_lr") == 1
    # An ordinary rate, or a rate this low without Adam's settings (SGD's steps scale with the gradient):
    # the labels lead.
    ordinary = diagnose(steps, values, loss=(steps, loss), lr={0: 1e-3}, optimizer=adam)
    assert first_action(ordinary) == "check_labels"
    assert first_action(diagnose(steps, values, loss=(steps, loss), lr={0: 2e-8})) == "check_labels"
    # A warmup from 0 to 1e-3: its peak is the rate that moved the weights, not its first value.
    warm = {i: 1e-3 * min(1.0, i / 100) for i in steps}
    warmed = diagnose(steps, values, loss=(steps, loss), lr=warm, optimizer=adam)
    assert first_action(warmed) == "check_labels", warmed.report()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_loss_that_learned_then_went_back_to_chance_as_the_rate_still_rose_lowers_the_rate(seed):
    # Two classes: the loss fell from ln 2 to about 0.35 while the learning rate warmed up linearly through
    # the whole run; at K it went back to ln 2 and stayed. It had learned far below chance, so its labels
    # match its inputs: a rate still rising threw that away, and the rate leads, with what shows it. With
    # the rate constant the log cannot tell a rate too high from labels that changed: the labels lead, as
    # for a loss at chance from the start.
    rng = random.Random(seed)
    loss = [
        (0.35 + 0.34 * math.exp(-i / 60) if i < K else math.log(2)) + rng.gauss(0.0, 0.01) for i in range(N)
    ]
    rising = {i: 5e-5 * (i + 1) / N for i in range(N)}
    d = diagnose(range(N), noise(seed), loss=(range(N), loss), lr=rising)
    assert d.verdict == "stalled" and first_action(d) == "lower_lr", d.report()
    assert re.search(r"fell to 0\.3\d*, well below chance \(ln 2 = 0\.693\)", d.actions[0]), d.actions[0]
    assert f"while the learning rate was still rising (to step {N - 1})" in d.actions[0]
    assert d.action_ids.count("lower_lr") == 1
    constant = diagnose(range(N), noise(seed), loss=(range(N), loss), lr={0: 5e-5})
    assert first_action(constant) == "check_labels", constant.report()


def test_a_weight_decay_that_holds_the_weights_down_is_named():
    steps, values, loss = series_with(lambda i: 1.0)
    settings = {"weight_decay": ({0: 5.0}), "beta2": {0: 0.999}, "eps": {0: 1e-8}}
    d = diagnose(steps, values, loss=(steps, loss), lr={0: 0.01}, optimizer=settings)
    assert (
        first_action(d) == "weight_decay" and "shrinks the weights by e^30 over the 599 steps" in d.actions[0]
    )
    assert first_action(diagnose(steps, values, loss=(steps, loss), lr={0: 0.01})) == "raise_lr"


def test_gradients_below_adams_eps_are_named():
    steps, values, loss = series_with(lambda i: 1.0, norm=[v * 1e-10 for v in noise(2)])
    settings = {"eps": {0: 1e-8}, "beta1": {0: 0.9}, "beta2": {0: 0.999}}
    d = diagnose(steps, values, loss=(steps, loss), optimizer=settings)
    assert first_action(d) == "adam_eps" and "within 100x of eps=1e-08" in d.actions[0]
    sgd = {"momentum": {0: 0.9}}  # no betas: not Adam, eps says nothing
    assert first_action(diagnose(steps, values, loss=(steps, loss), optimizer=sgd)) == "raise_lr"


@pytest.mark.parametrize(
    "after, expected, words",
    [(0.3, "lower_lr", "jumped 30x at step 300"), (-0.01, "lr_schedule", "turned negative at step 300")],
)
def test_a_learning_rate_change_that_causes_a_blowup_is_named_and_dates_it(after, expected, words):
    values = scaled(4, lambda i: 1.0 if i < K + 12 else 300.0)  # the norm responds 12 steps late
    lr = {i: 0.01 if i < K else after for i in range(N)}
    loss = losses(4, lambda i: learning(i) if i < K + 12 else 8.0)
    d = diagnose(range(N), values, loss=loss, lr=lr)
    assert d.verdict == "diverged" and first_action(d) == expected, d.report()
    assert words in d.actions[0]
    assert d.onset == K  # read every step, the change dates the blow-up, not the norm's late response


def test_a_ramp_of_the_learning_rate_dates_the_blowup_from_its_foot():
    # The rate grows 5% a step from K + 20, read once per window of 25 (at K, K + 25, ...): the first
    # reading that shows it comes 5 steps into the ramp, the norm only 60 steps in. The ramp's own rate
    # puts its foot back at K + 20.
    values = scaled(5, lambda i: 1.0 if i < K + 80 else 1e3)
    lr = {i: 0.01 * 1.05 ** max(0, i - K - 20) for i in range(0, N, 25)}
    loss = losses(5, lambda i: learning(i) if i < K + 80 else 8.0)
    d = diagnose(range(N), values, loss=loss, lr=lr)
    assert first_action(d) == "lower_lr" and "kept rising from about step 320" in d.actions[0], d.report()
    assert abs(d.onset - (K + 20)) <= 3


def test_a_blowup_in_the_first_steps_then_a_loss_at_chance_is_diverged_not_stalled():
    # A learning rate far too high from the start: the loss jumps 8x within the first steps, then sits at
    # chance (ln 10). Never improving is not the story: the blow-up is.
    steps, values, loss = series_with(lambda i: 18.0 if 2 <= i < 6 else math.log(10))
    d = diagnose(steps, values, loss=(steps, loss), lr={0: 3.0})
    assert d.verdict == "diverged" and d.onset == 0, d.report()
    assert "the loss jumped to" in d.events[0].detail and "in the run's first steps" in d.events[0].detail
    assert first_action(d) == "lower_lr" and "it was 3 from the first step, with no warmup" in d.actions[0]


@pytest.mark.parametrize(
    "precision, expected",
    # Exactly 0 from one step on: an fp16 underflow, nothing training where the precision rules it out, and
    # where the log does not say, "log the precision" to tell the two apart.
    [("fp16-mixed", "grad_scaler"), ("16-mixed", "grad_scaler"), ("fp32", "no_gradient"), (None, "precision")],
)
def test_fp16_gradients_that_underflow_to_zero_get_the_grad_scaler(precision, expected):
    values = scaled(7, lambda i: 0.0 if i >= K else 1.0)
    d = diagnose(range(N), values, precision=precision)
    assert d.verdict == "vanishing" and first_action(d) == expected, d.report()
    if expected == "grad_scaler":
        lightning = precision == "16-mixed"
        assert ("Trainer(precision='16-mixed')" in d.actions[0]) == lightning
        assert ("torch.amp.GradScaler" in d.actions[0]) != lightning
    scaled_run = diagnose(range(N), values, precision=precision, scale={0: 65536.0})
    # A loss scale is logged: a scaler is in use, the zeros are no underflow it would let through.
    assert first_action(scaled_run) == ("precision" if precision is None else "no_gradient")


@pytest.mark.parametrize("precision", ["fp32", "32-true", "bf16-mixed", None])
def test_an_explosion_never_advises_fp32_to_an_fp32_run(precision):
    d = diagnose(range(N), case("exploding", 0)[0], precision=precision)
    text = " ".join(d.actions)
    if precision in ("fp32", "32-true"):
        assert "precision" not in d.action_ids and "32-true" not in text and "fp32" not in text
    else:
        assert "precision" in d.action_ids or "bf16" in d.action_ids
    collapse = diagnose(range(N), case("nonfinite", 0)[0], precision=precision)
    assert ("switch to fp32" in " ".join(collapse.actions)) != (precision in ("fp32", "32-true"))


def test_every_action_has_a_known_id():
    from fastnorm.monitoring.diagnosis.advice import IDS

    found = set()
    for name in NAMES:
        for seed in SEEDS:
            found.update(diagnose(range(N), case(name, seed)[0]).action_ids)
    assert found and found <= set(IDS), found - set(IDS)


def test_fail_on_unstable_never_passes_a_log_too_short_to_judge(tmp_path, capsys):
    from fastnorm.cli import main

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "gradient_norm": 1.0}) + "\n" for s in range(3)))
    assert main(["diagnose", str(path), "--fail-on-unstable"]) == 1
    assert (
        "verdict: too few points (3 steps read; at least 5 are needed to judge a run)"
        in capsys.readouterr().out
    )


# ----------------------------------------------------------------------------
# Thinned logs: each "held for N points" is N points or N steps, whichever ends first, over 3 points
# ----------------------------------------------------------------------------


def thinned(every, n=1000, seed=30, factor=lambda s: 1.0, sigma=0.1):
    """Steps ``0, every, 2 * every, ...`` below ``n`` and their norms: noise times ``factor(step)``."""
    steps = list(range(0, n, every))
    return steps, [v * factor(s) for s, v in zip(steps, noise(seed, n=len(steps), sigma=sigma))]


def at(steps, values, last, loss=None, lr=None):
    """The diagnosis of the series (and its loss, its learning rate) up to step ``last``, as the monitor's
    window ending there sees it."""
    kept = [i for i, s in enumerate(steps) if s <= last]
    loss = ([s for s in loss[0] if s <= last], [v for s, v in zip(*loss) if s <= last]) if loss else None
    lr = {s: v for s, v in lr.items() if s <= last} if lr else None
    return diagnose([steps[i] for i in kept], [values[i] for i in kept], loss=loss, lr=lr)


@pytest.mark.parametrize("every, held, short", [(10, 520, 510), (1, 509, 508)])
def test_a_level_is_sustained_over_10_steps_or_10_points_and_3_points_at_least(every, held, short):
    # The norm rises 1000x at step 500 and stays there. Logged every 10th step, 3 points (30 steps) sustain
    # it, not 10 (100 steps); 2 points do not. Logged every step, it takes 10 points, as it always did.
    steps, values = thinned(every, factor=lambda s: 1e3 if s >= 500 else 1.0)
    e = only(at(steps, values, held), "exploding")
    assert e.start_step == 500, e
    early = at(steps, values, short)
    assert early.verdict == "stable" and kinds(early) == ["spike"], early.report()


@pytest.mark.parametrize("every, last", [(10, 560), (1, 549)])
def test_a_departures_level_is_that_of_its_last_10_steps(every, last):
    # 4x from step 500 (out of the band, short of an explosion), then 1000x from 540: its last 10 steps
    # sustain 1000x after 3 points of a log of every 10th step, as after 10 of a log of every step. Its
    # last 10 points, half of them at 4x, would not.
    steps, values = thinned(every, factor=lambda s: 1e3 if s >= 540 else 4.0 if s >= 500 else 1.0)
    e = only(at(steps, values, last), "exploding")
    assert e.start_step == 500, e


@pytest.mark.parametrize("every", [1, 10])
def test_a_new_normal_is_a_window_of_points_or_of_steps(every):
    # A 5x shift at step 500 that holds (a new normal after 50 steps), then 50x at step 800: the explosion
    # is measured from the new normal and dated at 800, however often the run is logged. Counted in points
    # only, the shift of a log of every 10th step would last 50 points (500 steps), and the explosion
    # would be dated from the shift.
    steps, values = thinned(every, factor=lambda s: 50.0 if s >= 800 else 5.0 if s >= 500 else 1.0)
    e = only(diagnose(steps, values), "exploding")
    assert 800 - 2 * every <= e.start_step <= 800, e
    assert "from the running baseline 5" in e.detail or "from the running baseline 4" in e.detail, e.detail


@pytest.mark.parametrize("every", [1, 10])
def test_a_return_to_the_band_is_recover_points_or_steps(every):
    # Out 1000x from 500 to 550, back for 30 steps, out again from 580: with recover=6, a log of every
    # 10th step is back after 3 points (30 steps), as a log of every step is after 6: two explosions.
    out = lambda s: 1e3 if 500 <= s < 550 or s >= 580 else 1.0  # noqa: E731
    steps, values = thinned(every, factor=out)
    d = diagnose(steps, values, recover=6)
    assert [e.start_step for e in d.events if e.kind == "exploding"] == [500, 580], d.report()


@pytest.mark.parametrize("every", [1, 10])
def test_nonfinite_norms_to_the_end_are_a_collapse_after_40_steps_or_40_points(every):
    # Non-finite norms over the last 50 steps with a finite loss: more than max_skip_run (40) steps, so a
    # collapse, whether that is 50 points or 5. Over the last 20 steps, 2 points of a log of every 10th
    # step or 20 of a log of every step: steps a loss scaler skipped.
    for tail, expected in ((50, "nonfinite"), (20, "stable")):
        steps, values = thinned(every)
        values = [math.nan if s >= 1000 - tail else v for s, v in zip(steps, values)]
        d = diagnose(steps, values, loss=(steps, [learning(s) for s in steps]))
        assert d.verdict == expected, (tail, d.report())


def test_a_blowup_in_a_thinned_logs_first_window_is_seen_there():
    # A learning rate far too high, logged every 10th step: the loss jumps 400x at the second point and
    # comes down over the next three. Its only moves are the blow-up's own way down: measured outside the
    # blow-up, they leave it standing out, at the monitor's first window of 5 points.
    steps = [0, 10, 20, 30, 40]
    loss = [1.09, 438.0, 149.0, 13.9, 10.2]
    d = diagnose(steps, [0.66, 99.9, 67.4, 23.1, 14.1], loss=(steps, loss), lr={0: 3.0})
    assert d.verdict == "diverged" and d.onset == 0, d.report()
    assert "the loss jumped to 438 at step 10" in d.events[0].detail
    assert first_action(d) == "lower_lr"


def lr_jump_run(after, comes_back=False, every=10, n=1000, jump=600):
    """A log of every 10th step whose norm is so noisy (0.6 orders a point) that its band spans 3 orders:
    the learning rate jumps from 0.01 to ``after`` at ``jump``, and the loss, near 0.003 before, jumps
    100x (and falls back 100 steps later with ``comes_back``)."""
    steps, values = thinned(every, n=n, seed=31, sigma=0.6)

    def level(s):
        up = s > jump and not (comes_back and s > jump + 100)
        return 0.3 if up else 0.003 + 0.7 * math.exp(-s / 30)

    loss = [level(s) * (1 + 0.3 * math.sin(s)) for s in steps]
    lr = {s: 0.01 if s < jump else after for s in steps}
    return steps, values, {"loss": (steps, loss), "lr": lr}


def test_a_loss_that_jumps_just_after_the_learning_rate_is_diverged_from_the_jump():
    # The norm's band is too wide to see its 30x; the loss says it: 100x its level from the first points
    # after the rate jumped 30x. Diverged at the first window that holds 3 points of it (30 steps), dated
    # at the reading that shows the jump (the loss rose after it, so the jump came no later).
    steps, values, kw = lr_jump_run(0.3)
    assert at(steps, values, 610, **kw).verdict == "stable"  # one point after the jump: not yet
    d = at(steps, values, 640, **kw)
    e = only(d, "diverged")
    assert e.start_step == 600 and "the loss held at" in e.detail, d.report()
    assert first_action(d) == "lower_lr" and "jumped 30x between the readings" in d.actions[0]
    assert diagnose(steps, values, **kw).verdict == "diverged"


@pytest.mark.parametrize("after, comes_back", [(0.013, False), (0.3, True)])
def test_a_learning_rate_jump_alone_or_a_loss_that_came_back_is_no_divergence(after, comes_back):
    # The same noisy norm: the rate moved 30% (no jump) while the loss jumped (a data problem, for the
    # loss to say), or the rate jumped and the loss came back within 100 steps: neither is a divergence of
    # this rule.
    steps, values, kw = lr_jump_run(after, comes_back)
    d = diagnose(steps, values, **kw)
    assert not any("the loss held at" in e.detail for e in d.events), d.report()
    if comes_back:
        assert d.verdict == "stable", d.report()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_burst_of_the_learning_rate_that_leaves_the_loss_at_chance_is_diverged_not_stalled(seed):
    # 1000x the learning rate for 5 steps at step 150: the loss, learned from chance (ln 3) down to 0.03,
    # leaps 10^4x and takes the rest of the run to come down to chance again. Read alone, a loss whose
    # noise is the blow-up's own "never improved": a stall. The rate's jump says what happened.
    rng = random.Random(seed)
    onset = 150

    def level(i):
        if i < onset:
            return 0.03 + (math.log(3) - 0.03) * math.exp(-i / 20)
        return math.log(3) + 1e4 * math.exp(-(i - onset) / 60)

    loss = [level(i) * rng.lognormvariate(0.0, 0.5) for i in range(N)]
    values = scaled(seed, lambda i: 1e3 if onset < i < onset + 120 else 1.0)
    lr = {i: 0.01 * (1000.0 if onset <= i < onset + 5 else 1.0) for i in range(N)}
    d = diagnose(range(N), values, loss=(range(N), loss), lr=lr)
    assert d.verdict == "diverged" and d.onset == onset, d.report()
    assert "stalled" not in kinds(d) and first_action(d) == "lower_lr"
    assert "jumped 1e+03x at step 150" in d.actions[0]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_plateau_of_a_loss_that_follows_its_batches_asks_for_larger_batches(seed):
    # BatchNorm on batches of 2: the loss falls in its first 3 steps, then each step follows its batch (it
    # moves by more than half its level from one step to the next). Read over as many points at each end,
    # it ended where it began; larger batches come first, before the warmup that a plateau under a
    # constant learning rate would otherwise ask for.
    rng = random.Random(seed)
    loss = [2.4, 1.9, 1.8] + [0.8 * rng.uniform(0.05, 2.5) for _ in range(N - 3)]
    d = diagnose(range(N), noise(seed), loss=(range(N), loss), lr={0: 0.01})
    assert d.verdict == "stalled" and first_action(d) == "batch_size", d.report()


def test_larger_batches_come_before_the_warmup_for_a_plateau_that_follows_its_batches():
    # The same advice for a loss that did fall early and then stopped (a plateau) while following its
    # batches: the noise is the first suspect, a warmup the second.
    from fastnorm.monitoring.diagnosis.advice import Evidence, Stall, stall_actions

    plateau = Stall(never=False, first=2.4, start=0, noise=0.7, plateau=(30, 1.3))
    ids = [a.id for a in stall_actions(Evidence(lr_first=0.01, lr_first_step=0), plateau, 0, False, True)]
    assert ids[:2] == ["batch_size", "warmup"], ids
    steady = Stall(never=False, first=2.4, start=0, noise=0.1, plateau=(30, 1.3))
    assert stall_actions(Evidence(lr_first=0.01, lr_first_step=0), steady, 0, False, True)[0].id == "warmup"


# ----------------------------------------------------------------------------
# Bursty norms, chance levels, noisy losses, early blow-ups
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_a_learning_rate_jump_inside_a_bursty_departure_dates_the_divergence(seed):
    # A recurrent net's norm bursts 8x, three steps in four, from K - 60: out of its band by itself, a
    # departure short of an explosion. The learning rate jumps 30x at K; the loss blows up there, the norm
    # from K + 5. The departure began 60 steps before the fault: the jump inside it dates the divergence.
    def norm(i):
        if i >= K + 5:
            return 1e4
        return 8.0 if i >= K - 60 and i % 4 else 1.0

    values = scaled(seed, norm)
    loss = losses(seed, lambda i: learning(i) if i < K + 3 else 8.0)
    lr = {i: 0.01 if i < K else 0.3 for i in range(N)}
    d = diagnose(range(N), values, loss=loss, lr=lr)
    assert d.verdict == "diverged" and d.onset == K, d.report()
    assert first_action(d) == "lower_lr" and f"jumped 30x at step {K}" in d.actions[0]


def test_a_loss_at_chance_after_its_initial_offset_checks_the_labels():
    # Shuffled labels on 3 classes: the first losses sit 0.05 above ln 3 (the initial logits' spread), 4%
    # off, then the loss settles at ln 3 within its noise. Chance all the same.
    steps, values, loss = series_with(lambda i: math.log(3) + 0.05 * math.exp(-i / 10), sigma=0.005)
    d = diagnose(steps, values, loss=(steps, loss))
    assert d.verdict == "stalled" and first_action(d) == "check_labels", d.report()
    assert re.search(
        r"stayed at 1\.1 = ln 3 \(chance for 3 classes\) from step 0 \(1\.1[45]\d* at the", d.actions[0]
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_a_loss_too_noisy_to_name_its_classes_is_not_at_chance(seed):
    # A regression on batches of 2: each step's loss an exponential whose median is 0.69, within its own
    # noise of ln 2; but that noise is wider than the gap from ln 2 to ln 3, so it names no number of
    # classes. No label check: larger batches first.
    rng = random.Random(seed)
    n = 300
    loss = [math.log(2) * f for f in (1.1, 0.9, 1.0, 1.2, 0.95)] + [
        rng.expovariate(1.0) for _ in range(n - 5)
    ]
    d = diagnose(range(n), noise(seed, n=n), loss=(range(n), loss))
    assert d.verdict == "stalled" and first_action(d) == "batch_size", d.report()
    assert "check_labels" not in d.action_ids


@pytest.mark.parametrize("seed", [*SEEDS, 16])  # 16: its last batches end high, far above its least one
def test_a_loss_that_follows_its_batches_and_starts_high_never_improved(seed):
    # BatchNorm on batches of 2 in a regression: each step's loss is its batch's (an exponential around a
    # level of 0.7 that holds all run), and three of the first five happen to be 3-8x that level. Five such
    # points do not pin its start down, nor is its best more than the least of its noise: read over its
    # first and last points, it ended where it began. It never improved (not "went back up from its best":
    # that best is its noise), and larger batches come first.
    rng = random.Random(seed)
    n = 300
    loss = [2.5, 0.6, 0.46, 3.6, 5.7] + [0.7 * rng.expovariate(1.0) / math.log(2) for _ in range(n - 5)]
    d = diagnose(range(n), noise(seed, n=n), loss=(range(n), loss), lr={0: 0.01})
    assert d.verdict == "stalled" and d.onset == 0, d.report()
    assert first_action(d) == "batch_size"


def test_one_bad_batch_below_the_runs_start_is_no_early_blowup():
    # A log of every 10th step of a loss that falls fast from 0.66 to 0.015: one batch at step 80 is 25x the
    # level before it, yet below where the run began. It undid nothing: no blow-up, as the run's start is
    # still its highest loss.
    steps = list(range(0, 450, 10))
    loss = [0.005 + 0.65 * math.exp(-s / 8) * (1 + 0.2 * math.sin(s)) for s in steps]
    loss[8] = 0.38
    d = diagnose(steps, noise(3, n=len(steps), sigma=0.3), loss=(steps, loss))
    assert d.verdict == "stable", d.report()
    loss[8] = 0.9  # above the start: a blow-up in the run's first steps
    assert diagnose(steps, noise(3, n=len(steps), sigma=0.3), loss=(steps, loss)).verdict == "diverged"


# ----------------------------------------------------------------------------
# Outlier batches, losses near 0, losses that lost all, rises while the loss still learns
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_one_outlier_batch_in_a_log_of_every_step_is_no_early_blowup(seed):
    # A healthy regression, logged every step: the batch of step 50 holds one gross outlier target, its
    # loss 800x the level and above the run's start; the next step's loss, another batch through the
    # updated model, is back at the level. That batch, not the model: a spike, never an early blow-up.
    steps, values, loss = series_with(learning, n=400, seed=seed, sigma=0.2)
    loss[50], values[50] = 800 * loss[49], 30 * values[50]
    d = diagnose(steps, values, loss=(steps, loss))
    assert d.verdict == "stable" and kinds(d) == ["spike"], d.report()
    loss[51] = 600 * loss[49]  # the next step as high: the model blew up, not one batch
    assert diagnose(steps, values, loss=(steps, loss)).verdict == "diverged"


def test_a_loss_near_zero_that_falls_further_as_the_norm_shrinks_is_a_healthy_decay():
    # A log of every 10th step of a classifier that fell from 1.1 to 0.002 by step 100, then on to 4e-7 as
    # its norm shrank 4.7 orders of magnitude. Falling 0.002 is less than 5% of the run's start, yet it is
    # the loss's whole level: a loss approaching its minimum, a healthy decay, not vanishing gradients.
    steps = list(range(0, 1000, 10))

    def level(s):
        return 1.1 * math.exp(-s / 15) + 2e-3 * 10 ** (-3.7 * max(0, s - 100) / 900)

    rng = random.Random(5)
    loss = [level(s) * 10 ** rng.gauss(0.0, 0.15) for s in steps]
    values = [v * 10 ** (-4.7 * max(0, s - 100) / 900) for s, v in zip(steps, noise(5, n=len(steps)))]
    d = diagnose(steps, values, loss=(steps, loss), lr={0: 0.01})
    assert d.verdict == "stable" and kinds(d) == ["decay"], d.report()
    assert "while the loss fell" in d.events[0].detail


@pytest.mark.parametrize("seed", SEEDS)
def test_a_loss_that_climbs_above_its_start_and_chance_is_diverged_whatever_the_norm(seed):
    # A recurrent net learned from 0.69 (ln 2) to 0.13; at K its learning rate jumps 150x and its loss goes
    # to 0.83, above its start and above chance, while its norm, bursting 0.4 orders a step, stays within
    # the band its bursts widened. Worse than a model that predicts nothing: diverged, from the jump.
    values = noise(seed, sigma=0.4)
    loss = losses(seed, lambda i: 0.13 + 0.56 * math.exp(-i / 40) if i < K else 0.83, sigma=0.05)
    lr = {i: 0.003 if i < K else 0.45 for i in range(N)}
    d = diagnose(range(N), values, loss=loss, lr=lr)
    assert d.verdict == "diverged" and d.onset == K, d.report()
    assert "without a rise of the norm to go with it" in only(d, "diverged").detail
    assert first_action(d) == "lower_lr" and f"jumped 150x at step {K}" in d.actions[0]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_loss_that_settles_at_chance_above_its_start_is_a_stall(seed):
    # Four classes: the loss fell from 1.58 within its first 5 points (their median 1.0), learned to 0.13,
    # then went back to ln 4 as a weight decay held the weights at 0: its outputs uniform. Above its start
    # by far more than its tolerance, but at chance: it predicts nothing, no worse. A stall, not a
    # divergence. (The noise is the same at every level, so that the end's median is read against the noise
    # it has there.)
    rng = random.Random(seed)
    loss = [
        (1.45 * math.exp(-i / 4) + 0.13 if i < K else math.log(4)) + rng.gauss(0.0, 0.003) for i in range(N)
    ]
    d = diagnose(range(N), noise(seed), loss=(range(N), loss))
    assert d.verdict == "stalled" and d.onset == K, d.report()
    assert "rose above its initial level (1.01)" in only(d, "stalled").detail


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n", [N, K + 600], ids=["blowup-half", "blowup-two-thirds"])
def test_a_rise_while_the_loss_still_learns_does_not_date_its_divergence(seed, n):
    # A recurrent net's norm grows tenfold as it learns, bursting out of its band from K - 70 while its loss
    # falls on from 0.23 to its best (0.18, at K); at K its learning rate jumps (not logged): its loss blows
    # up to about 3, moving by its whole level from step to step, and its norm to 1e4. The departure began
    # while the run still learned: the loss's turn dates the divergence, not the departure's start (a burst
    # that left the band within a smoothed loss point of the turn, 25 points, may: the norm is read every
    # step). With the blow-up twice as long as all before it, the whole run's noise buries the fall from
    # 0.23 to 0.18: whether the loss still learned is read on the steps from the departure to the turn.
    def norm(i):
        if i >= K + 3:
            return 1e4
        return 10.0 if i >= K - 70 and i % 4 else 1.0

    rng = random.Random(seed)
    loss = [
        0.1 + 0.6 * math.exp(-i / 150) + 0.01 * rng.random() if i < K else 3 * rng.random() for i in range(n)
    ]
    d = diagnose(range(n), scaled(seed, norm, n=n), loss=(range(n), loss))
    assert d.verdict == "diverged" and K - 25 <= d.onset <= K + 5, d.report()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_loss_that_follows_its_batches_ends_above_its_start_only_above_its_first_points(seed):
    # BatchNorm on batches of 2: each step's loss is its batch's (an exponential around a level of 0.7), and
    # the first five happen to be low, their median 0.3. The end, at 0.7, lies above that start, but not
    # above the loss's first 25 points: the start was its noise. It lost nothing it had learned: no
    # divergence.
    rng = random.Random(seed)
    n = 300
    loss = [0.3, 0.35, 0.25, 0.4, 0.3] + [0.7 * rng.expovariate(1.0) / math.log(2) for _ in range(n - 5)]
    d = diagnose(range(n), noise(seed, n=n), loss=(range(n), loss), lr={0: 0.01})
    assert d.verdict == "stalled", d.report()


def _plateau_after(level_lr):
    """300 steps: the loss falls from 4.5 to 3 in its first 25, then stays there; the rate as given."""
    steps = list(range(300))
    loss = losses(8, lambda i: 3.0 + 1.5 * max(0.0, 1 - i / 25), n=300, sigma=0.05)[1]
    return diagnose(steps, noise(8, n=300), loss=(steps, loss), lr={i: level_lr(i) for i in steps})


def test_a_plateau_after_a_logged_warmup_is_a_stall_whose_schedule_is_named():
    # A 20-step warmup, then the rate cut 10^4x at step 30: the loss flat for the last 90% of the run.
    d = _plateau_after(lambda i: 3e-3 * (i + 1) / 20 if i < 20 else 3e-3 if i < 30 else 3e-7)
    assert d.verdict == "stalled", d.report()
    assert first_action(d) == "lr_schedule" and "fell 1e+04x" in d.actions[0], d.report()
    # A rate that still rises through the first half of the plateau: the loss may not have started.
    warming = _plateau_after(lambda i: 3e-3 * (i + 1) / 200 if i < 200 else 3e-3)
    assert warming.verdict == "stable", warming.report()
    # Cut 10x only later in the run, where the loss had long stopped: a stall, not the schedule's doing.
    late = _plateau_after(lambda i: 3e-3 * (i + 1) / 20 if i < 20 else 3e-3 if i < 250 else 3e-4)
    assert late.verdict == "stalled" and first_action(late) != "lr_schedule", late.report()


def test_a_plateau_without_the_learning_rate_logged_names_both_causes_and_claims_no_rate():
    # The loss falls from 4.5 to 3 in 25 steps and stays there; the log holds no learning rate. A rate cut
    # to near zero and a rate too high for the stage both do this: the first action says the log cannot
    # tell them apart and what to log, the second names the other; the norm in its band puts the cut first.
    steps = list(range(300))
    loss = losses(8, lambda i: 3.0 + 1.5 * max(0.0, 1 - i / 25), n=300, sigma=0.05)[1]
    d = diagnose(steps, noise(8, n=300), loss=(steps, loss))
    assert d.verdict == "stalled", d.report()
    assert d.action_ids[:2] == ("lr_schedule", "warmup"), d.report()
    assert "holds no learning rate" in d.actions[0] and "GradNormMonitor(optimizer=...)" in d.actions[0]
    assert "constant" not in d.actions[0], d.report()  # nothing the log does not hold is claimed
    # With the rate logged, constant from the first step: the warmup leads, as before.
    logged = _plateau_after(lambda i: 3e-3)
    assert first_action(logged) == "warmup" and "0.003 from the first step" in logged.actions[0], logged.report()
    # A norm that left its band (a rate too high shows there): the warmup leads, the cut second.
    from fastnorm.monitoring.diagnosis.advice import Evidence, Stall, stall_actions

    plateau = Stall(never=False, first=4.5, start=0, noise=0.05, plateau=(25, 3.0))
    ids = [a.id for a in stall_actions(Evidence(), plateau, 0, False, False)]
    assert ids[:2] == ["warmup", "lr_schedule"], ids


def test_a_loss_that_fell_by_half_then_stopped_at_a_logged_rate_cut_is_a_stall():
    # Falls from 4 to 1.8 by step 40, where the rate is cut 10^4x; flat for the rest of the run.
    steps = list(range(300))
    loss = losses(9, lambda i: 1.8 + 2.2 * max(0.0, 1 - i / 40), n=300, sigma=0.05)[1]
    values = noise(9, n=300)
    cut = diagnose(steps, values, loss=(steps, loss), lr={i: 2e-3 if i < 40 else 2e-7 for i in steps})
    assert cut.verdict == "stalled" and first_action(cut) == "lr_schedule", cut.report()
    # The same loss without the rate, or with a rate that stayed: a loss at its floor early, as far as the
    # log can tell.
    assert diagnose(steps, values, loss=(steps, loss)).verdict == "stable"
    assert diagnose(steps, values, loss=(steps, loss), lr={i: 2e-3 for i in steps}).verdict == "stable"


def test_a_collapse_to_nan_at_the_end_of_a_divergence_leads_with_the_divergences_actions():
    # The norm and the loss rise 5% a step from step 100 (a rate that kept growing) until both are
    # non-finite from step 190: the NaN is where the divergence ended, not another fault to re-run.
    steps = list(range(300))
    rise = [1.0 if i < 100 else 1.05 ** (i - 100) for i in steps]
    values = [v * r if i < 190 else float("nan") for i, (v, r) in enumerate(zip(noise(5, n=300), rise))]
    loss = [1.0 / (1 + i / 30) * r if i < 190 else float("inf") for i, r in enumerate(rise)]
    d = diagnose(steps, values, loss=(steps, loss))
    assert d.verdict == "nonfinite", d.report()
    assert [e.kind for e in d.events][:2] == ["diverged", "nonfinite"], d.report()
    assert first_action(d) == "lower_lr", d.report()
    assert "checkpoint" in d.action_ids  # still said, after the cause


def test_a_loss_that_rose_into_nan_in_its_first_steps_names_the_rate_and_the_initialisation():
    # The first update made the loss worse, and it was non-finite from step 4: too few finite points for a
    # divergence, and the log cannot tell a rate far too high from an initialisation that explodes.
    steps = list(range(300))
    first = [1.2, 4.5, 60.0, 3e4]
    values = [v if i < 4 else float("nan") for i, v in enumerate([1.0, 15.0, 900.0, 2e6] + [0.0] * 296)]
    loss = [first[i] if i < 4 else float("inf") for i in steps]
    d = diagnose(steps, values, loss=(steps, loss))
    assert d.verdict == "nonfinite", d.report()
    assert list(d.action_ids[:2]) == ["lower_lr", "normalisation"], d.report()
    assert "cannot tell them apart" in d.actions[0] and "GradNormMonitor(optimizer=...)" in d.actions[0]
    diverged = next(e for e in d.events if e.kind == "diverged")
    assert diverged.start_step == 0 and "rose from 1.2 at step 0" in diverged.detail, d.report()
    # A loss that fell before going non-finite (one bad batch late in a short run) is no blow-up from the start.
    fell = [1.2, 0.9, 0.8, 0.7]
    d = diagnose(steps, values, loss=(steps, [fell[i] if i < 4 else float("inf") for i in steps]))
    assert "diverged" not in [e.kind for e in d.events], d.report()
    # With the rate in the log, its first value is named.
    d = diagnose(steps, values, loss=(steps, loss), lr={i: 3.0 for i in steps})
    assert "it started at 3" in d.actions[0], d.report()


def test_a_loss_that_rose_for_many_steps_straight_into_inf_diverged_from_the_start():
    # A rate far too high from the first step: the loss rises 3x a step from its first value for 17
    # steps, more than a divergence's too-few points, and is inf from step 17; the norm with it, then 0.
    steps = list(range(300))
    loss = [0.9 * 3.0**i if i < 17 else float("inf") for i in steps]
    values = [0.8 * 2.5**i if i < 19 else 0.0 for i in steps]
    d = diagnose(steps, values, loss=(steps, loss))
    assert d.verdict == "nonfinite", d.report()
    assert list(d.action_ids[:2]) == ["lower_lr", "normalisation"], d.report()
    diverged = next(e for e in d.events if e.kind == "diverged")
    assert diverged.start_step == 0, d.report()
    # A loss that fell first and rose only later into the inf is no blow-up from the start.
    late = [1.0 / (1 + i) if i < 8 else 0.1 * 3.0 ** (i - 8) for i in range(17)]
    d = diagnose(steps, values, loss=(steps, [late[i] if i < 17 else float("inf") for i in steps]))
    assert "diverged" not in [e.kind for e in d.events], d.report()


def test_zeros_after_the_loss_went_non_finite_are_its_aftermath_not_the_finding_that_leads():
    # A divergence from step 100 (the rate grew 6% a step) runs into an inf loss at step 190; from
    # step 200 the norm is exactly 0 (the NaN loss's gradients skipped): the divergence leads.
    steps = list(range(300))
    rise = [1.0 if i < 100 else 1.06 ** (i - 100) for i in steps]
    after = [float("nan") if i < 200 else 0.0 for i in steps]
    values = [v * r if i < 190 else after[i] for i, (v, r) in enumerate(zip(noise(7, n=300), rise))]
    loss = [1.0 / (1 + i / 30) * r if i < 190 else float("inf") for i, r in enumerate(rise)]
    d = diagnose(steps, values, loss=(steps, loss))
    assert d.verdict == "nonfinite", d.report()
    assert first_action(d) == "lower_lr", d.report()
    zero = next(e for e in d.events if "exactly 0" in e.detail)
    assert "after the non-finite values from step 190" in zero.detail, d.report()
    # Zeros that begin before any non-finite value still lead: nothing trains.
    values = [v if i < 150 else 0.0 for i, v in enumerate(noise(7, n=300))]
    loss = [1.0 / (1 + i / 30) for i in steps]
    assert diagnose(steps, values, loss=(steps, loss)).action_ids[0] in ("precision", "no_gradient")


def test_a_norm_never_finite_under_a_finite_loss_leads_with_the_precision_not_a_rerun():
    # Every logged norm inf from the first step, the loss flat and finite: every update was skipped (a
    # loss scaler that never finds a finite step), the backward pass overflows from the start.
    rng = random.Random(3)
    steps = list(range(0, 684, 4))
    loss = [2.44 + rng.gauss(0, 0.04) for _ in steps]
    d = diagnose(steps, [float("inf")] * len(steps), loss=(steps, loss))
    assert d.verdict == "nonfinite", d.report()
    assert d.action_ids[0] == "precision" and "never finite" in d.actions[0], d.report()
    assert "checkpoint" in d.action_ids[1:]
    # Finite norms first, then inf to the end under a finite loss: still the skipped steps' re-run.
    values = [1.0] * 50 + [float("inf")] * (len(steps) - 50)
    assert diagnose(steps, values, loss=(steps, loss)).action_ids[0] == "checkpoint"


@pytest.mark.parametrize("seed", SEEDS)
def test_a_loss_still_falling_slowly_after_an_early_fall_is_learning_not_a_plateau(seed):
    # A masked LM: the loss falls from 4.5 to 3.1 in 20 steps, then on by 8% over the next 280 steps, its
    # batches +-7%: the halves of the stretch lie within 4% of each other, its least-squares line falls
    # 8% at many standard errors. Learning, slowly; the same stretch flat, with the same noise, is a stall.
    steps = list(range(300))

    def level(slope):
        return lambda i: 3.1 - slope * max(0, i - 20) + 1.4 * max(0.0, 1 - i / 20)

    slow = losses(seed, level(0.25 / 280), n=300, sigma=0.07)[1]
    d = diagnose(steps, noise(seed, n=300), loss=(steps, slow))
    assert d.verdict == "stable", d.report()
    flat = losses(seed, level(0.0), n=300, sigma=0.07)[1]
    assert diagnose(steps, noise(seed, n=300), loss=(steps, flat)).verdict == "stalled"


def test_a_trend_is_its_change_over_the_span_in_standard_errors():
    from fastnorm.monitoring.diagnosis.robust import trend

    rng = random.Random(0)
    steps = list(range(200))
    change, errors = trend(steps, [1.0 - 0.001 * s + rng.gauss(0, 0.01) for s in steps])
    assert change == pytest.approx(-0.199, abs=0.01) and errors < -20
    change, errors = trend(steps, [1.0 + rng.gauss(0, 0.01) for s in steps])
    assert abs(errors) < 4 and abs(change) < 0.01
    # noise whose neighbours are correlated (a logger's smoothing) is worth fewer points than it has: a flat
    # level read through it is no trend in any of 50 runs
    for seed in range(50):
        rng, e, ys = random.Random(seed), 0.0, []
        for _ in steps:
            e = 0.8 * e + rng.gauss(0, 0.01)
            ys.append(1.0 + e)
        assert abs(trend(steps, ys)[1]) < 4, seed
    assert trend([0, 1], [1.0, 0.0]) == (0.0, 0.0) and trend([3, 3, 3], [1.0, 2.0, 3.0]) == (0.0, 0.0)


def test_a_plateau_at_a_logged_cut_of_the_rate_is_dated_from_the_cut():
    # Falls from 4.5 to 3 by step 24, the rate cut 10^4x at step 30, flat for the rest: the stall's onset
    # is the cut, its cause, not the run's first step.
    steps = list(range(300))
    loss = losses(4, lambda i: 3.0 + 1.5 * max(0.0, 1 - i / 24), n=300, sigma=0.05)[1]
    values = noise(4, n=300)
    lr = {i: 3e-3 if i < 30 else 3e-7 for i in steps}
    d = diagnose(steps, values, loss=(steps, loss), lr=lr)
    stall = only(d, "stalled")
    assert d.verdict == "stalled" and first_action(d) == "lr_schedule", d.report()
    assert stall.start_step == 30 and d.onset == 30, d.report()


@pytest.mark.parametrize("value", [1.5e308, -1.7e308, 1.7976931348623157e308])
def test_a_long_log_of_losses_near_the_largest_float_is_read(value):
    # Past 2048 points the kept series averages neighbours: a plain sum of two values near 1.8e308
    # overflows (math.fsum raises, a + b is inf). The diagnosis reads them as the finite losses they are.
    steps = list(range(5000))
    norms = [1.0 + 0.01 * (s % 7) for s in steps]
    losses = [2.0 if s < 10 else value * (1 - 1e-3 * (s % 5)) for s in steps]
    d = diagnose(steps, norms, loss=(steps, losses))
    if value > 0:
        assert d.verdict == "diverged"  # it left 2 for a loss near 1.8e308
    else:
        assert d.verdict in ("stable", "diverged", "exploding", "vanishing")  # an objective's call
    from fastnorm.monitoring.diagnosis.robust import Thinned, mean, median, midpoint

    thinned = Thinned(1024)
    for s, v in zip(steps, losses):
        thinned.add(s, v)
    kept = [v for _, v in thinned.all()]
    assert all(math.isfinite(v) for v in kept)
    assert min(kept) >= min(losses) and max(kept) <= max(losses)
    assert midpoint(value, value) == value and mean([value] * 3) == value
    assert median(sorted([value, value])) == value
