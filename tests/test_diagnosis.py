"""The diagnosis on synthetic series with known answers (see synthetic.py)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from fastnorm.monitoring.diagnosis import Diagnoser, diagnose
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
    vanishing = diagnose(range(N), case("vanishing", 0)[0]).actions
    assert any("Raise the learning rate" in a and "10M" in a for a in vanishing)
    assert any("normalisation" in a for a in vanishing)
    nonfinite = diagnose(range(N), case("nonfinite", 0)[0]).actions
    assert any("latest checkpoint" in a for a in nonfinite)
    assert any("fp32" in a for a in nonfinite)
    assert diagnose(range(N), case("spike", 0)[0]).actions == ()


def test_one_inf_step_that_recovers_is_nonfinite_for_that_step():
    values = noise(3)
    values[K] = math.inf
    d = diagnose(range(N), values)
    assert d.verdict == "nonfinite"
    assert [(e.kind, e.start_step, e.end_step) for e in d.events] == [("nonfinite", K, K)]


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
    # Loaded as a file, with torch (and the package, which imports it) made unimportable:
    # the diagnosis must not need it.
    path = Path(__file__).resolve().parents[1] / "fastnorm" / "monitoring" / "diagnosis.py"
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
