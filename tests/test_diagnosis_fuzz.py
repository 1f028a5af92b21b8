"""The diagnosis never raises and always answers: property-based fuzzing of the logged series and settings.

Series of norms, losses, learning rates, loss scales, skip flags, per-layer norms and the optimizer's
settings, drawn with their edges (0, negative, NaN, inf, subnormal, huge, jumps from and to 0, irregular
steps), read offline by :func:`fastnorm.diagnose` and online by a :class:`fastnorm.GradNormMonitor` whose
optimizer's settings change as it runs. Each reading must give a well-formed :class:`Diagnosis`.
"""

import json
import math
import warnings

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastnorm
from fastnorm.checks import PRECISIONS
from fastnorm.monitoring.diagnosis import KINDS, STABLE, UNSTABLE, Diagnosis
from fastnorm.monitoring.diagnosis.events import TOO_FEW

EDGES = [0.0, -0.0, -1.0, math.nan, math.inf, -math.inf, 5e-324, 2.2e-308, 1e-300, 1e300, 1.7e308, 1.0]
# Levels a healthy series sits at, and factors a fault moves it by: a blow-up, a fall, a jump to 0.
LEVELS = [1e-30, 1e-6, 1e-3, 0.5, 1.0, 3.0, 1e3, 1e30]
FACTORS = [0.0, 1e-12, 1e-3, 0.5, 1.0, 2.0, 1e3, 1e12, 1e300]

settings_fast = settings(
    max_examples=80, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@st.composite
def series(draw, n: int, edges: list) -> list:
    """``n`` values: a noisy level, a change of level at some point (a blow-up, a fall, a jump to 0),
    and some points replaced by edge values."""
    base = draw(st.sampled_from(LEVELS))
    factor = draw(st.sampled_from(FACTORS))
    at = draw(st.integers(0, n))
    noise = draw(st.floats(0.0, 0.5))
    values = [base * (1.0 + noise * math.sin(7.3 * i)) * (factor if i >= at else 1.0) for i in range(n)]
    for i in draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=n // 4 + 1)):
        if i < n:
            values[i] = draw(st.sampled_from(edges))
    return values


@st.composite
def steps_of(draw, n: int) -> list[int]:
    """``n`` steps in order, with irregular gaps (repeats, single steps, long gaps)."""
    step = draw(st.integers(-5, 10**9))
    out = []
    for _ in range(n):
        out.append(step)
        step += draw(st.sampled_from([0, 1, 1, 1, 2, 10, 997, 10**6]))
    return out


@st.composite
def lr_schedule(draw, steps: list[int]) -> dict[int, float]:
    """A learning rate at some steps: a frozen phase at exactly 0 and a jump, to and from 0, a sign flip,
    a warmup, the edges."""
    pieces = draw(st.lists(st.sampled_from([0.0, 1e-3, 1e-1, 10.0, -1e-3, 1e-300, 1e300, math.nan, math.inf]),
                           min_size=1, max_size=4))
    cut = sorted(draw(st.lists(st.integers(0, max(len(steps) - 1, 0)), min_size=len(pieces) - 1,
                               max_size=len(pieces) - 1)))
    warm = draw(st.integers(0, 20))
    out = {}
    for i, s in enumerate(steps):
        piece = pieces[sum(i >= c for c in cut)]
        out[s] = piece * min(1.0, (i + 1) / warm) if warm and i < warm else piece
    return out


SETTING_VALUES = st.sampled_from([*EDGES, 0.9, 0.999, 1e-8, 0.1, 10.0])


@st.composite
def logged_run(draw) -> dict:
    n = draw(st.integers(0, 160))
    steps = draw(steps_of(n))
    run = {"steps": steps, "values": draw(series(n, [*EDGES, "x", None]))}
    if draw(st.booleans()):
        run["loss"] = (steps, draw(series(n, EDGES)))
    if draw(st.booleans()):
        run["lr"] = draw(lr_schedule(steps))
    if draw(st.booleans()):
        run["scale"] = (steps, draw(series(n, EDGES)))
    if draw(st.booleans()):
        run["skipped"] = (steps, [draw(st.sampled_from([0, 1, True, False, 0.5, math.nan])) for _ in steps])
    if steps and draw(st.booleans()):
        names = ["a", "b", "c"]
        run["layers"] = {
            s: {name: draw(st.sampled_from([*EDGES, 1e-9, 1.0])) for name in names}
            for s in draw(st.lists(st.sampled_from(steps), max_size=4))
        }
    if steps and draw(st.booleans()):
        run["optimizer"] = {
            name: {draw(st.sampled_from(steps)): draw(SETTING_VALUES) for _ in range(draw(st.integers(1, 3)))}
            for name in draw(st.sets(st.sampled_from(["weight_decay", "eps", "beta1", "beta2", "momentum"])))
        }
    run["precision"] = draw(st.sampled_from([None, *PRECISIONS]))
    run["max_norm"] = draw(st.sampled_from([None, 0.0, 5e-324, 1e-6, 1.0, 1e308, math.inf]))
    return run


def well_formed(d: Diagnosis) -> None:
    assert isinstance(d, Diagnosis)
    assert d.verdict in (*UNSTABLE, STABLE, TOO_FEW)
    for e in d.events:
        assert e.kind in KINDS
        assert isinstance(e.start_step, int) and isinstance(e.end_step, int)
        assert isinstance(e.detail, str) and all(isinstance(a, str) for a in e.actions)
    assert d.verdict == TOO_FEW or d.verdict == STABLE or any(e.kind == d.verdict for e in d.events)
    assert isinstance(d.report(), str) and d.headline()
    json.dumps(d.to_dict(), allow_nan=True)


@settings_fast
@given(logged_run())
def test_diagnose_never_raises_on_logged_series(run):
    well_formed(fastnorm.diagnose(**run))


def test_a_blow_up_after_a_learning_rate_frozen_at_zero_is_diagnosed():
    """A rate at exactly 0 for a while (a frozen phase), then a jump, then a blow-up within 30 steps:
    diagnosed as the divergence it is, the jump from 0 named, not a division by the old rate."""
    steps = list(range(200))
    lr = {s: 0.0 if s < 100 else 1e-3 for s in steps}
    norms = [1.0 + 0.1 * math.sin(s) for s in steps[:110]] + [1e4 * (1.5 + math.sin(s)) for s in steps[110:]]
    loss = [2.0 - 1e-3 * s for s in steps[:110]] + [50.0 + math.sin(s) for s in steps[110:]]
    d = fastnorm.diagnose(steps, norms, loss=(steps, loss), lr=lr)
    well_formed(d)
    assert d.verdict == "diverged"
    assert "(0 to 0.001)" in d.actions[0] and "step 100" in d.actions[0], d.report()


class _Optimizer:
    """What the monitor reads of an optimizer: its param_groups, changed by the test as the run goes."""

    def __init__(self) -> None:
        self.param_groups = [{"params": [], "lr": 0.0}]


@st.composite
def online_run(draw) -> dict:
    n = draw(st.integers(0, 100))
    return {
        "every": draw(st.sampled_from([3, 10, 40])),
        "steps": draw(steps_of(n)),
        "norms": draw(series(n, EDGES)),
        "loss": draw(st.one_of(st.none(), series(n, EDGES))),
        "skipped": draw(st.one_of(st.none(), st.lists(st.booleans(), min_size=n, max_size=n))),
        "lr": draw(series(n, [0.0, -1e-3, math.nan, math.inf, 1e300])),
        "settings": {
            name: draw(SETTING_VALUES)
            for name in draw(st.sets(st.sampled_from(["weight_decay", "eps", "momentum"])))
        },
        "betas": draw(st.one_of(st.none(), st.tuples(SETTING_VALUES, SETTING_VALUES))),
        "precision": draw(st.sampled_from([None, *PRECISIONS])),
        "max_norm": draw(st.sampled_from([None, 0.0, 1.0, math.inf])),
    }


@settings(max_examples=30, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(online_run())
def test_monitor_diagnosis_never_fails_online(run):
    monitor_online(run)


def monitor_online(run: dict) -> None:
    """The run fed to a monitor step by step, its optimizer's learning rate set at each: no failure."""
    optimizer = _Optimizer()
    group = optimizer.param_groups[0]
    group.update(run["settings"])
    if run["betas"] is not None:
        group["betas"] = run["betas"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor = fastnorm.GradNormMonitor(
            run["every"], max_norm=run["max_norm"], precision=run["precision"], optimizer=optimizer
        )
        with monitor:
            for i, (step, norm) in enumerate(zip(run["steps"], run["norms"])):
                group["lr"] = run["lr"][i]
                monitor.update(
                    norm,
                    step,
                    loss=None if run["loss"] is None else run["loss"][i],
                    skipped=None if run["skipped"] is None else run["skipped"][i],
                )
    failed = [w for w in caught if "the diagnosis failed" in str(w.message)]
    assert not failed, failed[0].message
    if run["steps"]:
        well_formed(monitor.diagnosis)
