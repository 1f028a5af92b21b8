"""The diagnosis on synthetic series with known answers.

Every series is fresh seeded noise (log-normal around 1) with one known change
at a known step, so each test can say which verdict and which steps are right.
"""

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from fastnorm.diagnosis import Diagnoser, diagnose

N = 600
K = 300
SEEDS = [0, 1, 2]


def noise(seed, n=N, sigma=0.1):
    rng = random.Random(seed)
    return [10 ** rng.gauss(0.0, sigma) for _ in range(n)]


def scaled(seed, factor, n=N, sigma=0.1):
    """Noise times ``factor(i)``, the known change."""
    return [v * factor(i) for i, v in enumerate(noise(seed, n, sigma))]


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
def test_growth_by_four_orders_is_exploding(seed):
    values = scaled(seed, lambda i: 10 ** min(4.0, 4.0 * (i - K) / 100) if i >= K else 1.0)
    d = diagnose(range(N), values)
    assert d.verdict == "exploding"
    e = only(d, "exploding")
    assert K <= e.start_step <= K + 15
    assert e.end_step == N - 1  # it stays up
    assert any("learning rate" in a for a in d.actions)
    assert any("bf16-mixed" in a and "32-true" in a for a in d.actions)


@pytest.mark.parametrize("seed", SEEDS)
def test_decay_to_1e_minus_9_is_vanishing(seed):
    values = scaled(seed, lambda i: 10 ** max(-9.0, -9.0 * (i - K) / 50) if i >= K else 1.0)
    d = diagnose(range(N), values)
    assert d.verdict == "vanishing"
    e = only(d, "vanishing")
    assert K <= e.start_step <= K + 10
    assert e.end_step == N - 1
    assert any("Raise the learning rate" in a and "10M" in a for a in d.actions)
    assert any("normalisation" in a for a in d.actions)


@pytest.mark.parametrize("seed", SEEDS)
def test_nan_from_step_k_is_nonfinite_at_k(seed):
    values = [v if i < K else math.nan for i, v in enumerate(noise(seed))]
    d = diagnose(range(N), values)
    assert d.verdict == "nonfinite"
    assert kinds(d) == ["nonfinite"]
    assert (d.events[0].start_step, d.events[0].end_step) == (K, N - 1)
    assert any("checkpoint" in a for a in d.actions)
    assert any("fp32" in a for a in d.actions)


def test_one_inf_step_that_recovers_is_nonfinite_for_that_step():
    values = noise(3)
    values[K] = math.inf
    d = diagnose(range(N), values)
    assert d.verdict == "nonfinite"
    assert [(e.kind, e.start_step, e.end_step) for e in d.events] == [("nonfinite", K, K)]


@pytest.mark.parametrize("seed", SEEDS)
def test_warmup_spike_that_recovers_is_a_spike_and_stable(seed):
    values = scaled(seed, lambda i: 100.0 if 30 <= i < 35 else 1.0)
    d = diagnose(range(N), values)
    assert d.verdict == "stable"
    e = only(d, "spike")
    assert 28 <= e.start_step <= 30
    assert e.end_step == 34
    assert kinds(d) == ["spike"]


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
    text = d.report()
    assert text.splitlines()[0] == f"verdict: nonfinite ({N} steps read)"
    assert f"steps {K}-{N - 1}" in text
    assert json.loads(json.dumps(d.to_dict()))["events"][0] == {
        "kind": "nonfinite",
        "start_step": K,
        "end_step": N - 1,
        "detail": d.events[0].detail,
    }
    assert diagnose([], []).report() == "verdict: stable (no values read)"


@pytest.mark.parametrize(
    "steps, values, kwargs, match",
    [
        ([0, 1], [1.0], {}, "2 steps but 1 values"),
        ([0, 1], [1.0, -1.0], {}, "negative"),
        ([0, 1], [1.0, 1.0], {"window": 0}, "window"),
        ([0, 1], [1.0, 1.0], {"explode_orders": -1}, "explode_orders"),
        ([0, 1], [1.0, 1.0], {"warmup": 60}, "warmup"),
    ],
)
def test_bad_input_raises(steps, values, kwargs, match):
    with pytest.raises(ValueError, match=match):
        diagnose(steps, values, **kwargs)


def test_runs_without_torch():
    # Loaded as a file with torch (and the package, which imports it) made unimportable: the diagnosis must not need it.
    path = Path(__file__).resolve().parents[1] / "fastnorm" / "diagnosis.py"
    code = (
        "import sys, importlib.util\n"
        "sys.modules['torch'] = sys.modules['fastnorm'] = None\n"
        f"spec = importlib.util.spec_from_file_location('diagnosis', {str(path)!r})\n"
        "m = sys.modules['diagnosis'] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(m)\n"
        "print(m.diagnose(range(30), [1.0] * 20 + [float('nan')] * 10).verdict)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "nonfinite"
