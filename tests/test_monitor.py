"""GradNormMonitor: every step kept on the device, one transfer per window, nothing lost, nothing broken."""

import gc
import json
import math
import os
import warnings

import pytest
import torch

import fastnorm
from fastnorm import GradNormMonitor, JsonlLogger, Logger, UnstableGradientWarning
from helpers import run_python


class Recorder(Logger):
    """Keeps every window it receives, and whether it was closed."""

    def __init__(self):
        self.windows = []
        self.closed = False

    def log_window(self, window):
        self.windows.append(window)

    def log_metrics(self, metrics, step):
        raise AssertionError("the monitor hands over whole windows")

    def close(self):
        self.closed = True

    @property
    def steps(self):
        return [s for w in self.windows for s in w.steps]

    @property
    def values(self):
        return [v for w in self.windows for v in w.values]


def norms(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, generator=g, dtype=torch.float64) * 3).tolist()


def count_reads(monkeypatch, names):
    """Counts each call of these Tensor methods (the ways a value reaches the host)."""
    reads = dict.fromkeys(names, 0)
    for name in names:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original):
            reads[_name] += 1
            return _original(self, *args)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return reads


def test_every_step_reaches_the_loggers_in_one_transfer_per_window(monkeypatch):
    expected = norms(5 * 8 + 3)
    given = [torch.tensor(v, dtype=torch.float32) for v in expected]
    reads = count_reads(monkeypatch, ["tolist", "item", "__float__", "__bool__"])
    rec = Recorder()
    monitor = GradNormMonitor(8, [rec], diagnose=False)
    for i, norm in enumerate(given):
        monitor.update(norm)
        assert monitor.transfers == (i + 1) // 8
    assert reads == {"tolist": 5, "item": 0, "__float__": 0, "__bool__": 0}
    monitor.close()
    assert monitor.transfers == 6 and reads["tolist"] == 6
    assert rec.steps == list(range(len(expected)))
    assert rec.values == pytest.approx(expected, rel=1e-7)  # float32 slots
    assert [len(w.values) for w in rec.windows] == [8, 8, 8, 8, 8, 3]


def test_buffer_is_preallocated_and_never_grows():
    monitor = GradNormMonitor(16, diagnose=False)
    monitor.update(torch.tensor(1.0))
    buffer = monitor._rec.buffer
    address = buffer.data_ptr()
    for i in range(5000):
        monitor.update(
            torch.tensor(float(i)), loss=torch.tensor(1.0), skipped=torch.tensor(i % 7 == 0), reward=0.5
        )
    assert monitor._rec.buffer is buffer and buffer.data_ptr() == address
    assert buffer.numel() == 4 * 16  # the norm, the loss, the skip flag and the reward of each step
    monitor.close()


def test_float64_norms_keep_their_precision():
    rec = Recorder()
    value = 1.0 + 2.0**-40  # not a float32
    with GradNormMonitor(4, [rec], diagnose=False) as monitor:
        monitor.update(torch.tensor(value, dtype=torch.float64))
    assert rec.values == [value]


def test_steps_as_given_and_counted_on():
    rec = Recorder()
    with GradNormMonitor(3, [rec], diagnose=False) as monitor:
        monitor.update(1.0)
        monitor.update(1.0, step=100)
        monitor.update(1.0)
        monitor.update(1.0, step=250)
        monitor.update(torch.tensor([2.0]))
    assert rec.steps == [0, 100, 101, 250, 251]


def test_exception_in_the_loop_loses_nothing(tmp_path):
    rec = Recorder()
    path = tmp_path / "metrics.jsonl"
    expected = norms(13, seed=1)
    with pytest.raises(KeyboardInterrupt):
        with GradNormMonitor(5, [rec, JsonlLogger(path)], diagnose=False) as monitor:
            for v in expected:
                monitor.update(torch.tensor(v))
            raise KeyboardInterrupt
    assert rec.closed
    assert rec.values == pytest.approx(expected, rel=1e-7)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(13))
    with pytest.raises(RuntimeError, match="after close"):
        monitor.update(1.0)
    monitor.close()  # twice is harmless


@pytest.mark.slow
def test_unclosed_monitor_is_flushed_at_exit(tmp_path):
    path = tmp_path / "metrics.jsonl"
    code = (
        "import torch, fastnorm\n"
        f"m = fastnorm.GradNormMonitor(5, [fastnorm.JsonlLogger({str(path)!r})], diagnose=False)\n"
        "for i in range(7):\n"
        "    m.update(torch.tensor(float(i)))\n"
    )
    assert run_python(["-c", code]).returncode == 0
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["gradient_norm"] for line in lines] == [float(i) for i in range(7)]


@pytest.mark.parametrize("max_norm", [None, 1.0])
def test_window_statistics(max_norm):
    values = [0.5, math.nan, 2.0, 0.25, math.inf, 1.0 - 1e-9, 3.0]
    rec = Recorder()
    with GradNormMonitor(len(values), [rec], max_norm=max_norm, diagnose=False) as monitor:
        for v in values:
            monitor.update(torch.tensor(v, dtype=torch.float64))
    stats = rec.windows[0].stats
    finite = [0.5, 2.0, 0.25, 1.0 - 1e-9, 3.0]
    assert stats["min"] == 0.25 and stats["max"] == 3.0
    assert stats["mean"] == pytest.approx(sum(finite) / 5)
    assert stats["nonfinite_steps"] == 2
    if max_norm is None:
        assert "clipped_fraction" not in stats
    else:
        # clip_ scales when max_norm / (norm + 1e-6) < 1: 2.0, inf, 1 - 1e-9 and 3.0.
        assert stats["clipped_fraction"] == pytest.approx(4 / 7)
        assert stats["max_norm"] == max_norm


def test_skip_flags_cross_in_the_same_transfer_and_are_counted(monkeypatch, tmp_path):
    expected = norms(2 * 6 + 4, seed=4)
    flags = [i % 3 == 1 for i in range(len(expected))]
    flags[5] = None  # a step without a flag
    # As a StepClipper gives it (a float32 0-dim tensor), as a bool tensor, and as a bool.
    kinds = [lambda f: torch.tensor(float(f)), torch.tensor, bool, lambda f: torch.tensor(float(f))]
    given = [None if f is None else kinds[i % 4](f) for i, f in enumerate(flags)]
    reads = count_reads(monkeypatch, ["tolist", "item", "__float__", "__bool__", "__int__", "__index__"])
    rec = Recorder()
    path = tmp_path / "metrics.jsonl"
    with GradNormMonitor(6, [rec, JsonlLogger(path)], max_norm=1.5) as monitor:
        for norm, flag in zip(expected, given):
            monitor.update(torch.tensor(norm, dtype=torch.float64), skipped=flag)
        assert reads == {"tolist": 2, "item": 0, "__float__": 0, "__bool__": 0, "__int__": 0, "__index__": 0}
    monkeypatch.undo()
    assert [f for w in rec.windows for f in w.skipped] == flags
    assert rec.values == expected  # the norms as given
    for w, start in zip(rec.windows, range(0, len(expected), 6)):
        window_flags = flags[start : start + 6]
        assert w.stats["skipped_steps"] == sum(f is True for f in window_flags)
        applied = [v for v, f in zip(expected[start : start + 6], window_flags) if not f]
        assert w.stats["clipped_fraction"] == sum(v > 1.5 - 1e-6 for v in applied) / len(applied)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line.get("gradient_norm_skipped") for line in lines] == [
        None if f is None else float(f) for f in flags
    ]
    counts = [line["gradient_norm_skipped_steps"] for line in lines if "gradient_norm_skipped_steps" in line]
    assert counts == [sum(f is True for f in flags[i : i + 6]) for i in (0, 6, 12)] == [2, 2, 1]
    assert "skipped" in monitor.diagnosis.signals


def test_without_skip_flags_nothing_about_skips_is_logged(tmp_path):
    rec = Recorder()
    with GradNormMonitor(4, [rec], max_norm=1.0, diagnose=False) as monitor:
        for v in norms(6, seed=5):
            monitor.update(v)
    assert all(w.skipped == () and "skipped_steps" not in w.stats for w in rec.windows)
    assert all(name != "gradient_norm_skipped" for w in rec.windows for _, m in w.metrics() for name in m)


def test_a_skipped_step_is_not_clipped():
    # An inf norm that is skipped clips nothing; one that is applied is clipped (by 0, as torch does).
    values = [0.5, math.inf, 3.0, math.inf, 2.0, 0.25]
    skipped = [False, True, True, False, False, False]
    rec = Recorder()
    with GradNormMonitor(len(values), [rec], max_norm=1.0, diagnose=False) as monitor:
        for v, f in zip(values, skipped):
            monitor.update(v, skipped=f)
    stats = rec.windows[0].stats
    assert stats["skipped_steps"] == 2 and stats["nonfinite_steps"] == 2
    assert stats["clipped_fraction"] == 2 / 4  # inf and 2.0, of the 4 applied steps
    with GradNormMonitor(2, [rec], max_norm=1.0, diagnose=False) as monitor:
        monitor.update(math.nan, skipped=True)
        monitor.update(math.inf, skipped=torch.tensor(1.0))
    assert rec.windows[1].stats["clipped_fraction"] == 0.0 and rec.windows[1].stats["skipped_steps"] == 2


def test_clipped_fraction_matches_what_clip_did():
    torch.manual_seed(0)
    model = torch.nn.Linear(7, 3)
    rec = Recorder()
    clipped = 0
    with GradNormMonitor(20, [rec], max_norm=1.0, diagnose=False) as monitor:
        for i in range(20):
            model.zero_grad()
            (model(torch.randn(5, 7)) * (0.05 + 0.1 * i)).sum().backward()
            before = model.weight.grad.clone()
            monitor.update(fastnorm.clip_(model.parameters(), 1.0))
            clipped += not torch.equal(before, model.weight.grad)
    assert 0 < clipped < 20
    assert rec.windows[0].stats["clipped_fraction"] == clipped / 20


def test_clipped_fraction_counts_what_clip_scales_near_max_norm():
    # clip_ scales where max_norm / (norm + 1e-6) < 1: also a norm just below max_norm.
    norms = [1.0 - 2e-6, 1.0 - 5e-7, 1.0, 0.5, 2.0]
    scaled = 0
    for norm in norms:
        grad = torch.tensor([norm], dtype=torch.float64)
        fastnorm.clip_([grad], 1.0, gradients=True)
        scaled += grad.item() != norm
    assert scaled == 3
    rec = Recorder()
    with GradNormMonitor(len(norms), [rec], max_norm=1.0, diagnose=False) as monitor:
        for norm in norms:
            monitor.update(torch.tensor(norm, dtype=torch.float64))
    assert rec.windows[0].stats["clipped_fraction"] == scaled / len(norms)


def test_warns_once_when_the_verdict_turns_unstable():
    values = [1.0 + 0.01 * (i % 5) for i in range(60)] + [math.nan] * 40
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with GradNormMonitor(10) as monitor:
            for v in values:
                monitor.update(torch.tensor(v))
    unstable = [w for w in caught if issubclass(w.category, UnstableGradientWarning)]
    assert len(unstable) == 1
    assert "nonfinite" in str(unstable[0].message) and "steps 60-69" in str(unstable[0].message)
    assert unstable[0].filename == __file__  # points at the caller's update()
    assert monitor.diagnosis.verdict == "nonfinite"


def test_diagnosis_can_be_configured_or_off():
    values = [1.0] * 30 + [1e3] * 30
    strict = GradNormMonitor(10, diagnose=fastnorm.Diagnoser(explode_orders=4.0), warn=False)
    off = GradNormMonitor(10, diagnose=False)
    default = GradNormMonitor(10, warn=False)
    for m in (strict, off, default):
        for v in values:
            m.update(v)
        m.close()
    assert strict.diagnosis.verdict == "stable"
    assert default.diagnosis.verdict == "exploding"
    assert off.diagnosis is None


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        ((0,), {}, ValueError, "log_every_n_steps must be a positive int, got 0"),
        ((True,), {}, TypeError, r"log_every_n_steps must be a positive int, got True \(bool\)"),
        ((2.5,), {}, TypeError, "log_every_n_steps must be a positive int, got 2.5"),
        ((), {"max_norm": "1"}, TypeError, r"max_norm must be a number >= 0 or None, got '1' \(str\)"),
        ((), {"max_norm": True}, TypeError, "max_norm must be a number"),
        ((), {"max_norm": -1.0}, ValueError, "max_norm must be >= 0, got -1.0"),
        ((), {"max_norm": math.nan}, ValueError, "max_norm must be >= 0, got nan"),
        ((10, Recorder()), {}, TypeError, r"loggers must be a sequence of Logger"),
        ((10, "run.jsonl"), {}, TypeError, r"loggers must be a sequence of Logger"),
        ((10, [print]), {}, TypeError, r"every logger needs log_window\(\) and close\(\)"),
        ((), {"layer_names": "encoder"}, TypeError, "layer_names must be a sequence of str"),
        ((), {"layer_names": ["a", 1]}, TypeError, "layer_names must be strings, got 1"),
        ((), {"layer_names": ["a", "b", "a"]}, ValueError, "layer_names must be distinct, repeated: a"),
        ((), {"diagnose": "yes"}, TypeError, "diagnose must be a bool or a Diagnoser"),
        ((), {"warn": 1}, TypeError, "warn must be True or False"),
        ((), {"precision": "fp8"}, ValueError, "precision must be one of fp64, fp32, bf16"),
        ((), {"precision": True}, ValueError, "precision must be one of"),
        (
            (),
            {"optimizer": [1.0]},
            TypeError,
            r"optimizer must be a torch.optim.Optimizer \(with param_groups\)",
        ),
    ],
)
def test_bad_arguments(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        GradNormMonitor(*args, **kwargs)


def test_bad_updates_raise_before_recording_anything():
    rec = Recorder()
    with GradNormMonitor(4, [rec], layer_names=["a", "b"], diagnose=False) as monitor:
        monitor.update(1.0)
        for kwargs, error, match in [
            ({"norm": torch.ones(2)}, ValueError, "norm must hold one value"),
            ({"norm": "1.0"}, TypeError, r"norm must be a Tensor or a number, got '1.0' \(str\)"),
            ({"norm": None}, TypeError, "norm must be a Tensor or a number"),
            ({"norm": True}, TypeError, "norm must be a Tensor or a number"),
            ({"norm": torch.tensor(True)}, TypeError, "norm must be real"),
            ({"norm": 1.0, "loss": "low"}, TypeError, "loss must be a Tensor or a number"),
            ({"norm": 1.0, "skipped": "yes"}, TypeError, "skipped must be a one-value Tensor"),
            ({"norm": 1.0, "skipped": 0.5}, ValueError, "skipped must be True/False"),
            ({"norm": 1.0, "skipped": math.nan}, ValueError, "skipped must be True/False"),
            ({"norm": 1.0, "skipped": torch.zeros(2)}, ValueError, "skipped must hold one value"),
            ({"norm": 1.0, "skipped": torch.zeros((), dtype=torch.complex64)}, TypeError, "must be real"),
            ({"norm": 1.0, "step": 2.0}, TypeError, "step must be an int"),
            ({"norm": 1.0, "layers": torch.ones(3)}, ValueError, "layer_names"),
            ({"norm": 1.0, "layers": [1.0, 2.0]}, ValueError, "layers must be a tensor of shape"),
        ]:
            with pytest.raises(error, match=match):
                monitor.update(**kwargs)
        monitor.update(2.0)
    assert rec.steps == [0, 1] and rec.values == [1.0, 2.0]


# ----------------------------------------------------------------------------
# Failure isolation: the monitor never breaks the loop
# ----------------------------------------------------------------------------


class Failing(Recorder):
    """Raises at some windows (or all) and at close; records what it did receive."""

    def __init__(self, fail_windows=None, fail_close=False):
        super().__init__()
        self.fail_windows = fail_windows  # window indices to fail at; None: every one
        self.fail_close = fail_close
        self.calls = 0

    def log_window(self, window):
        self.calls += 1
        if self.fail_windows is None or self.calls - 1 in self.fail_windows:
            raise OSError(28, "No space left on device")
        super().log_window(window)

    def close(self):
        super().close()
        if self.fail_close:
            raise ConnectionError("tracking server down")

    def __repr__(self):
        return "Failing('tracking')"


def monitor_warnings(caught):
    return [str(w.message) for w in caught if issubclass(w.category, fastnorm.MonitorWarning)]


def test_a_failing_logger_is_reported_once_and_the_others_get_every_window():
    before, after = Recorder(), Recorder()
    failing = Failing()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor = GradNormMonitor(5, [before, failing, after], diagnose=False)
        for i in range(23):
            monitor.update(float(i))  # never raises
        monitor.close()
    messages = monitor_warnings(caught)
    assert len(messages) == 1
    assert "Failing('tracking') failed to log steps 0-4" in messages[0]
    assert "OSError: [Errno 28] No space left on device" in messages[0]
    assert [w for w in caught if issubclass(w.category, fastnorm.MonitorWarning)][0].filename == __file__
    for rec in (before, after):
        assert rec.steps == list(range(23)) and rec.closed
    assert failing.calls == 5 and failing.closed  # tried again at every window, and closed
    assert monitor.logger_failures == {"Failing('tracking')": 5}


def test_a_logger_that_recovers_gets_the_later_windows():
    flaky = Failing(fail_windows={0, 1})
    with pytest.warns(fastnorm.MonitorWarning, match="failed to log steps 0-4"):
        with GradNormMonitor(5, [flaky], diagnose=False) as monitor:
            for i in range(20):
                monitor.update(float(i))
    assert flaky.steps == list(range(10, 20))
    assert monitor.logger_failures == {"Failing('tracking')": 2}


def test_jsonl_logger_on_a_full_disk(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    rec = Recorder()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with GradNormMonitor(4, [JsonlLogger("/dev/full"), rec], diagnose=False) as monitor:
            for i in range(10):
                monitor.update(float(i))
    messages = monitor_warnings(caught)
    assert len(messages) == 1 and "JsonlLogger('/dev/full') failed to log steps 0-3" in messages[0]
    assert "No space left on device" in messages[0]
    assert rec.steps == list(range(10)) and rec.closed
    assert monitor.closed


def test_the_loops_own_exception_propagates_unchanged():
    failing = Failing(fail_close=True)
    rec = Recorder()
    error = KeyError("the loop's own")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(KeyError) as raised:
            with GradNormMonitor(5, [failing, rec], diagnose=False) as monitor:
                for i in range(7):
                    monitor.update(float(i))
                raise error
    assert raised.value is error
    assert rec.steps == list(range(7)) and rec.closed
    assert len(monitor_warnings(caught)) == 1  # the logger, once, for its windows and its close


def test_close_is_idempotent_and_closes_every_logger_even_if_one_fails():
    loggers = [Failing(fail_windows=set(), fail_close=True), Recorder(), Failing(fail_close=True), Recorder()]
    monitor = GradNormMonitor(5, loggers, diagnose=False)
    monitor.update(1.0)
    with pytest.warns(fastnorm.MonitorWarning):
        monitor.close()
    assert all(logger.closed for logger in loggers)
    assert loggers[1].steps == [0]
    for logger in loggers:
        logger.closed = False
    monitor.close()  # twice: nothing happens
    assert not any(logger.closed for logger in loggers)
    with pytest.raises(RuntimeError, match="after close"):
        monitor.update(1.0)


def test_a_broken_diagnoser_costs_no_window():
    class Broken(fastnorm.Diagnoser):
        def update(self, steps, values):
            raise ZeroDivisionError("bug")

    rec = Recorder()
    with pytest.warns(fastnorm.MonitorWarning, match=r"diagnosis failed at step 2 \(ZeroDivisionError") as caught:
        with GradNormMonitor(3, [rec], diagnose=Broken()) as monitor:
            for i in range(7):
                monitor.update(float(i))
    assert len(caught) == 1  # once, though every window failed
    assert rec.steps == list(range(7))
    assert monitor.diagnosis.verdict == "diagnosis failed" and monitor.diagnosis.unstable
    assert "ZeroDivisionError: bug" in monitor.diagnosis.report()


def test_negative_values_are_logged_and_reported_never_dropped():
    rec = Recorder()
    values = [1.0, 1.1, -1.0, 0.9] * 5
    with pytest.warns(fastnorm.MonitorWarning, match=r"negative norm \(-1.0 at step 2\)"):
        with GradNormMonitor(5, [rec]) as monitor:
            for v in values:
                monitor.update(v)
    assert rec.values == values  # every window reached the logger, the bad values as given
    invalid = [e for e in monitor.diagnosis.events if e.kind == "invalid"]
    assert [(e.start_step, e.count) for e in invalid] == [(2 + 4 * i, 1) for i in range(5)]
    assert "invalid   5 steps (2, 6, 10, 14, 18): negative or not a number" in monitor.diagnosis.report()
    assert monitor.diagnosis.verdict == "stable"


def test_an_unclosed_monitor_delivers_when_collected(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rec = Recorder()
    monitor = GradNormMonitor(5, [JsonlLogger(path), rec], diagnose=False)
    for i in range(7):
        monitor.update(torch.tensor(float(i)))
    del monitor
    gc.collect()
    assert rec.closed and rec.steps == list(range(7))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["gradient_norm"] for line in lines] == [float(i) for i in range(7)]


@pytest.mark.slow
def test_one_exit_hook_for_every_monitor():
    import atexit
    import tracemalloc

    GradNormMonitor(diagnose=False)  # weakref's one exit hook exists from the first monitor on
    hooks = atexit._ncallbacks()
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    for _ in range(5_000):
        GradNormMonitor(5, diagnose=False).update(1.0)
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - start
    tracemalloc.stop()
    assert atexit._ncallbacks() == hooks
    assert grown < 125_000  # 5,000 collected monitors leave nothing behind (25 bytes each would fail)


def test_the_loss_travels_with_the_norm(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rec = Recorder()
    with GradNormMonitor(4, [rec, JsonlLogger(path)]) as monitor:
        for i in range(6):
            monitor.update(torch.tensor(1.0 + 0.01 * i), loss=torch.tensor(2.0 - 0.1 * i) if i != 3 else None)
    assert [loss for w in rec.windows for loss in w.losses] == pytest.approx([2.0, 1.9, 1.8, None, 1.6, 1.5])
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line.get("gradient_norm_loss") for line in lines] == pytest.approx(
        [2.0, 1.9, 1.8, None, 1.6, 1.5]
    )
    assert monitor.diagnosis.signals == ("loss",)


# ----------------------------------------------------------------------------
# Per-layer norms
# ----------------------------------------------------------------------------


def reference_layer_norm(params, p):
    grads = [q.grad.double().flatten() for q in params if q.grad is not None]
    return torch.linalg.vector_norm(torch.cat(grads), p).item() if grads else 0.0


def model_with_odd_shapes():
    # The first weight (73923 float32 values) is larger than one task of the C++ kernels.
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(123, 601),
        torch.nn.ReLU(),
        torch.nn.Sequential(torch.nn.Linear(601, 241), torch.nn.Linear(241, 5, bias=False)),
    )
    model(torch.randn(3, 123)).square().sum().backward()
    return model


@pytest.mark.parametrize("p", [1.0, 2.0, 3.0, math.inf])
def test_layer_norms_against_float64(p):
    model = model_with_odd_shapes()
    layers = fastnorm.LayerGradNorms(model, norm_type=p)
    assert layers.names == ["0", "2.0", "2.1"]
    total, per_layer = layers()
    modules = [model[0], model[2][0], model[2][1]]
    expected = [reference_layer_norm(list(m.parameters()), p) for m in modules]
    assert per_layer.dtype == torch.float32 and per_layer.shape == (3,)
    assert per_layer.tolist() == pytest.approx(expected, rel=1e-6)
    assert total.item() == pytest.approx(reference_layer_norm(list(model.parameters()), p), rel=1e-6)


def test_layer_norms_by_depth_and_missing_grads():
    model = model_with_odd_shapes()
    model[2][1].weight.grad = None
    layers = fastnorm.LayerGradNorms(model.named_parameters(), depth=1)
    assert layers.names == ["0", "2"]
    _, per_layer = layers()
    expected = [reference_layer_norm(list(model[i].parameters()), 2.0) for i in (0, 2)]
    assert per_layer.tolist() == pytest.approx(expected, rel=1e-6)


def test_combine_does_not_overflow_and_keeps_nan():
    from fastnorm.layers import combine

    norms = torch.tensor([1e30, 1e30, math.nan, 1.0, 3.0], dtype=torch.float32)
    index = torch.tensor([0, 0, 1, 1, 2])
    out = combine(norms, index, 3, 2.0)
    assert out.dtype == torch.float32
    assert out[0].item() == pytest.approx(math.sqrt(2) * 1e30, rel=1e-6)
    assert math.isnan(out[1].item())
    assert out[2].item() == 3.0


def test_layers_reach_the_loggers_in_the_same_transfer(tmp_path):
    model = model_with_odd_shapes()
    layers = fastnorm.LayerGradNorms(model)
    rec = Recorder()
    path = tmp_path / "metrics.jsonl"
    with GradNormMonitor(4, [rec, JsonlLogger(path)], layer_names=layers.names, diagnose=False) as monitor:
        for _ in range(8):
            total, per_layer = layers()
            if monitor.due:
                monitor.update(total, layers=per_layer)
            else:
                monitor.update(total)
        assert monitor.transfers == 2
    expected = dict(zip(layers.names, per_layer.tolist()))
    assert [w.layers_step for w in rec.windows] == [3, 7]
    assert rec.windows[1].layers == pytest.approx(expected)
    last = json.loads(path.read_text().splitlines()[-1])
    assert last["step"] == 7
    assert last["gradient_norm_layer/2.0"] == pytest.approx(expected["2.0"])


def test_per_tensor_norms_straight_from_tensor_norms():
    model = model_with_odd_shapes()
    names = [name for name, _ in model.named_parameters()]
    rec = Recorder()
    with GradNormMonitor(2, [rec], layer_names=names, diagnose=False) as monitor:
        total, per_tensor = fastnorm.tensor_norms(model.parameters())
        monitor.update(total, layers=per_tensor)
    expected = {name: reference_layer_norm([p], 2.0) for name, p in model.named_parameters()}
    assert rec.windows[0].layers == pytest.approx(expected, rel=1e-6)


# ----------------------------------------------------------------------------
# A real run
# ----------------------------------------------------------------------------


def train(lr, steps=300):
    """A tiny MLP regression with SGD; returns the monitor's diagnosis and the norms it logged."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    x = torch.randn(256, 8)
    y = x.sum(1, keepdim=True).sin()
    rec = Recorder()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnstableGradientWarning)
        with GradNormMonitor(50, [rec]) as monitor:
            for _ in range(steps):
                batch = torch.randint(0, 256, (32,))
                loss = torch.nn.functional.mse_loss(model(x[batch]), y[batch])
                optimizer.zero_grad()
                loss.backward()
                monitor.update(fastnorm.total_norm(model.parameters()))
                optimizer.step()
    return monitor.diagnosis, rec.values


def test_real_run_with_far_too_high_learning_rate_explodes(one_thread):
    diagnosis, values = train(lr=1.2)
    first_nonfinite = next(i for i, v in enumerate(values) if not math.isfinite(v))
    assert max(values[:first_nonfinite]) > 1e6 * values[0]  # it did blow up
    assert diagnosis.verdict in ("exploding", "nonfinite")
    exploding = [e for e in diagnosis.events if e.kind == "exploding"]
    assert len(exploding) == 1 and exploding[0].start_step < first_nonfinite


def test_real_run_with_sane_learning_rate_is_stable(one_thread):
    diagnosis, values = train(lr=0.05)
    assert all(math.isfinite(v) for v in values)
    assert diagnosis.verdict == "stable" and diagnosis.events == ()


# ----------------------------------------------------------------------------
# CUDA: the asynchronous transfer
# ----------------------------------------------------------------------------


@pytest.mark.cuda
def test_cuda_updates_never_synchronize():
    expected = norms(2 * 16 + 5, seed=2)
    losses = norms(2 * 16 + 5, seed=3)
    given = [torch.tensor(v, device="cuda") for v in expected]
    given_losses = [torch.tensor(v, device="cuda") for v in losses]
    flags = [i % 4 == 2 for i in range(len(expected))]
    given_flags = [torch.tensor(float(f), device="cuda") for f in flags]
    rec = Recorder()
    monitor = GradNormMonitor(16, [rec], diagnose=False)
    monitor.update(given[0], loss=given_losses[0], skipped=given_flags[0])  # allocates the buffers
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for norm, loss, flag in zip(given[1:], given_losses[1:], given_flags[1:]):
            monitor.update(norm, loss=loss, skipped=flag)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert monitor.transfers == 2
    monitor.close()
    assert monitor.transfers == 3
    assert rec.values == pytest.approx(expected, rel=1e-6)
    assert [v for w in rec.windows for v in w.losses] == pytest.approx(losses, rel=1e-6)
    assert [f for w in rec.windows for f in w.skipped] == flags
    assert rec.steps == list(range(len(expected)))


@pytest.mark.cuda
def test_cuda_layer_norms_against_float64():
    model = model_with_odd_shapes().cuda()
    for p in model.parameters():
        p.grad = p.grad.cuda()
    total, per_layer = fastnorm.LayerGradNorms(model)()
    assert per_layer.device.type == "cuda"
    modules = [model[0], model[2][0], model[2][1]]
    expected = [reference_layer_norm(list(m.parameters()), 2.0) for m in modules]
    assert per_layer.tolist() == pytest.approx(expected, rel=1e-6)
    assert total.item() == pytest.approx(reference_layer_norm(list(model.parameters()), 2.0), rel=1e-6)


def test_the_optimizer_settings_and_precision_are_logged_once_per_window_without_a_sync(
    monkeypatch, tmp_path
):
    model = torch.nn.Linear(4, 2)
    decay = [model.weight]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": [model.bias], "weight_decay": 0.0}],
        lr=torch.tensor(3e-3),  # a CPU tensor, as fused and capturable optimizers hold it: read, no sync
        betas=(0.8, 0.95),
        eps=1e-6,
    )
    reads = count_reads(monkeypatch, ["item", "__bool__"])
    rec = Recorder()
    logger = JsonlLogger(tmp_path / "m.jsonl")
    with GradNormMonitor(5, [rec, logger], optimizer=optimizer, precision="bf16-mixed") as monitor:
        for i in range(12):
            if i == 7:
                optimizer.param_groups[0]["lr"] = 3e-2  # a jump: the learning rate is read at every update
            monitor.update(torch.tensor(1.0), loss=torch.tensor(2.0))
    assert reads == {"item": 0, "__bool__": 0}
    first, second, last = (w.settings for w in rec.windows)
    assert first == pytest.approx(
        {"lr": 3e-3, "weight_decay": 0.1, "eps": 1e-6, "beta1": 0.8, "beta2": 0.95, "precision/bf16-mixed": 1}
    )
    assert second["lr"] == pytest.approx(3e-2) and last["lr"] == pytest.approx(3e-2)
    series = fastnorm.read_series(tmp_path / "m.jsonl")  # read back as fastnorm diagnose reads it
    assert series.lr.key == "gradient_norm_lr" and series.lr.steps == (0, 4, 7, 9, 11)  # changes, window ends
    assert series.lr.values == pytest.approx((3e-3, 3e-3, 3e-2, 3e-2, 3e-2))
    assert series.optimizer["weight_decay"].values == pytest.approx((0.1, 0.1, 0.1))
    assert sorted(series.optimizer) == ["beta1", "beta2", "eps", "weight_decay"]
    assert series.precision == "bf16-mixed"
    assert monitor.diagnosis.signals == ("loss", "lr")


@pytest.mark.parametrize(
    "dtype, inferred", [(torch.bfloat16, "bf16"), (torch.float16, "fp16"), (torch.float32, None)]
)
def test_the_precision_is_inferred_from_the_parameters(dtype, inferred):
    model = torch.nn.Linear(4, 2).to(dtype)
    rec = Recorder()
    with GradNormMonitor(2, [rec], optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)) as m:
        m.update(torch.tensor(1.0))
        m.update(torch.tensor(1.0))
    assert m.precision == inferred
    assert {k for k in rec.windows[0].settings if k.startswith("precision/")} == (
        {f"precision/{inferred}"} if inferred else set()
    )
    assert rec.windows[0].settings["momentum"] == 0.9
    assert GradNormMonitor(precision="16-mixed", diagnose=False).precision == "16-mixed"  # Lightning's names


def test_the_offline_diagnosis_sees_what_the_online_one_saw(tmp_path):
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.5, eps=1e-3)
    with GradNormMonitor(10, [JsonlLogger(tmp_path / "m.jsonl")], optimizer=optimizer, precision="fp32") as m:
        for i in range(300):
            optimizer.param_groups[0]["lr"] = 1e-3 * min(1.0, (i + 1) / 100)  # a warmup, then steady
            norm = 1.0 + 0.1 * math.sin(i) if i < 90 else 100.0  # a blow-up late in the warmup
            m.update(torch.tensor(norm), loss=torch.tensor(2.0 - i / 300 if i < 90 else 5.0))
    from fastnorm.monitoring.command import diagnose_series

    offline = diagnose_series(fastnorm.read_series(tmp_path / "m.jsonl"))
    assert offline == m.diagnosis and offline.verdict == "diverged" and offline.onset == 90


def test_a_warning_is_withdrawn_once_when_the_run_recovers():
    # The loss stays flat for 300 steps (stalled), then learns: the warning is taken back, once, and the
    # current diagnosis is stable again.
    loss = [2.0 + 0.01 * math.sin(i) for i in range(300)] + [2.0 * 0.99 ** (i - 300) for i in range(300, 800)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with GradNormMonitor(25) as monitor:
            for i, v in enumerate(loss):
                monitor.update(torch.tensor(1.0 + 0.1 * math.sin(i)), loss=torch.tensor(v))
    kinds = [w.category for w in caught if w.category in (UnstableGradientWarning, fastnorm.RecoveredWarning)]
    assert kinds == [UnstableGradientWarning, fastnorm.RecoveredWarning], [str(w.message) for w in caught]
    assert "stalled" in str(caught[0].message)
    recovered = next(w for w in caught if w.category is fastnorm.RecoveredWarning)
    assert "the run recovered" in str(recovered.message) and "'stalled' warning is withdrawn" in str(
        recovered.message
    )
    assert monitor.diagnosis.verdict == "stable"


def test_no_warning_while_too_few_points_were_read():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with GradNormMonitor(2) as monitor:
            for v in (1.0, math.nan, math.nan):
                monitor.update(torch.tensor(v))
    assert monitor.diagnosis.verdict == "too few points"
    assert not [w for w in caught if w.category is UnstableGradientWarning]


def unstable_warnings(values, window=25, diagnose=True):
    """The monitor's UnstableGradientWarning and RecoveredWarning messages over ``values``, in order."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with GradNormMonitor(window, diagnose=diagnose) as monitor:
            for v in values:
                monitor.update(v)
    kinds = (UnstableGradientWarning, fastnorm.RecoveredWarning)
    return [(w.category.__name__, str(w.message)) for w in caught if w.category in kinds], monitor


def test_a_new_fault_under_the_same_verdict_is_warned_of_again():
    # The norm explodes 1000x at step 100 for 30 steps and comes back: exploding, warned of at the window
    # that holds it, and the verdict stays so. A second explosion from step 400 is a fault of its own: it
    # is warned of too, though the verdict does not change; the windows between, which only see the first
    # one again, give no warning.
    values = [(1e3 if 100 <= i < 130 or i >= 400 else 1.0) * (1 + 0.05 * math.sin(i)) for i in range(500)]
    seen, monitor = unstable_warnings(values)
    assert [k for k, _ in seen] == ["UnstableGradientWarning", "UnstableGradientWarning"], seen
    assert "gradient norm is exploding (since step 100)" in seen[0][1]
    assert "new since the warning of step 124: exploding from step 400" in seen[1][1], seen[1][1]
    assert monitor.diagnosis.verdict == "exploding"


class Scripted(fastnorm.Diagnoser):
    """A diagnoser that answers each window with the next diagnosis of a script."""

    def __init__(self, script):
        super().__init__()
        self.script = list(script)

    def result(self):
        return self.script.pop(0)


def stall(start, cause):
    from fastnorm.monitoring.diagnosis.advice import Action

    event = fastnorm.Event("stalled", start, 99, "the loss never improved", (Action(cause, cause),))
    return fastnorm.Diagnosis("stalled", (event,), event.actions, 100)


def test_warnings_follow_new_onsets_and_causes_and_are_withdrawn_together():
    from fastnorm.monitoring.diagnosis import Diagnosis

    stable = Diagnosis("stable", steps=100)
    later = stall(60, "raise_lr")
    diverged = fastnorm.Event("diverged", 30, 99, "the loss jumped", ())
    script = [
        stall(0, "raise_lr"),  # warned
        stall(5, "raise_lr"),  # the same stall, its date refined: no news
        stall(0, "weight_decay"),  # a new cause
        Diagnosis("stalled", (stall(0, "weight_decay").events[0], later.events[0]), (), 100),  # a new onset
        Diagnosis("diverged", (diverged,), (), 100),  # another verdict
        stable,  # every warning withdrawn, once
        stable,
        stall(0, "raise_lr"),  # warned of again after the recovery
    ]
    seen, _ = unstable_warnings([1.0] * 10 * len(script), window=10, diagnose=Scripted(script))
    assert [k for k, _ in seen] == [
        *["UnstableGradientWarning"] * 4,
        "RecoveredWarning",
        "UnstableGradientWarning",
    ]
    assert "new since the warning of step 9: stalled from step 0" in seen[1][1]
    assert "new since the warning of step 29: stalled from step 60" in seen[2][1]
    assert "the 'stalled' and 'diverged' warnings are withdrawn" in seen[4][1]
