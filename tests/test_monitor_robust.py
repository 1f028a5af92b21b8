"""The monitor under what should not happen: a diagnosis that raises, a Ctrl-C in a logger or in the
diagnosis, a copied monitor, numpy flags, tensors without data, a window too large to allocate, a
diagnosis asked for before the first window."""

import copy
import json
import math
import pickle
import warnings

import numpy as np
import pytest
import torch

import fastnorm
from fastnorm import GradNormMonitor, JsonlLogger
from test_monitor import Recorder


def caught_warnings():
    box = warnings.catch_warnings(record=True)
    return box


class Interrupting(Recorder):
    """Raises KeyboardInterrupt at its first window (a Ctrl-C while it writes)."""

    def log_window(self, window):
        if not self.windows:
            self.windows.append(None)
            raise KeyboardInterrupt
        super().log_window(window)


def lines(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def test_a_ctrl_c_in_a_logger_costs_the_other_loggers_nothing(tmp_path):
    """Every logger after the interrupted one, the JSONL included, has the window; then Ctrl-C goes on."""
    before, after = Recorder(), Recorder()
    jsonl = JsonlLogger(tmp_path / "m.jsonl")
    with pytest.raises(KeyboardInterrupt):
        with GradNormMonitor(10, [before, Interrupting(), jsonl, after], diagnose=False) as monitor:
            for i in range(4):
                monitor.update(float(i))
    assert before.steps == after.steps == [0, 1, 2, 3]
    assert [r["step"] for r in lines(tmp_path / "m.jsonl")] == [0, 1, 2, 3]
    assert before.closed and after.closed and monitor.closed


def test_a_ctrl_c_in_the_diagnosis_costs_no_logger_its_window(tmp_path):
    class Interrupted(fastnorm.Diagnoser):
        def result(self):
            raise KeyboardInterrupt

    rec = Recorder()
    jsonl = JsonlLogger(tmp_path / "m.jsonl")
    monitor = GradNormMonitor(3, [jsonl, rec], diagnose=Interrupted())
    monitor.update(1.0)
    monitor.update(1.0)
    with pytest.raises(KeyboardInterrupt):
        monitor.update(1.0)  # the window: diagnosed, interrupted
    assert rec.steps == [0, 1, 2] and len(lines(tmp_path / "m.jsonl")) == 3
    assert monitor.diagnosis.verdict == "diagnosis failed"
    assert "interrupted at step 2 (KeyboardInterrupt)" in monitor.diagnosis.report()
    monitor.close()


class FailsOnce(fastnorm.Diagnoser):
    """A diagnoser whose result raises at its ``at``-th window only."""

    def __init__(self, at):
        super().__init__()
        self.at, self.calls = at, 0

    def result(self):
        self.calls += 1
        if self.calls == self.at:
            raise ValueError("a bug of the diagnosis")
        return super().result()


def test_a_failed_diagnosis_never_leaves_a_stale_verdict_and_is_tried_again():
    rec = Recorder()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor = GradNormMonitor(10, [rec], diagnose=FailsOnce(at=2))
        for i in range(10):
            monitor.update(1.0 + 0.01 * (i % 3))
        assert monitor.diagnosis.verdict == "stable"
        for i in range(10):
            monitor.update(1.0)
        failed = monitor.diagnosis  # not the "stable" of the window before
        assert failed.verdict == "diagnosis failed" and failed.unstable and not failed.judged
        assert rec.windows[-1].diagnosis is failed
        assert "at step 19, ValueError: a bug of the diagnosis" in failed.report()
        assert failed.to_dict()["error"].startswith("at step 19")
        for i in range(10):
            monitor.update(1.0)
        assert monitor.diagnosis.verdict == "stable"  # diagnosed again
        monitor.close()
    messages = [str(w.message) for w in caught if issubclass(w.category, fastnorm.MonitorWarning)]
    assert len(messages) == 1 and "the diagnosis failed at step 19 (ValueError" in messages[0]


def test_a_frozen_learning_rate_then_a_jump_and_a_blow_up_is_warned_of():
    """A rate at exactly 0 (a frozen phase), then a jump, then the blow-up: the monitor warns of the
    divergence instead of losing its diagnosis at the blow-up and keeping a stale "stable"."""
    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([weight], lr=0.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with GradNormMonitor(10, optimizer=optimizer) as monitor:
            for step in range(200):
                optimizer.param_groups[0]["lr"] = 0.0 if step < 100 else 1e-3
                blown = step >= 110
                monitor.update(
                    1e4 * (1.5 + math.sin(step)) if blown else 1.0 + 0.1 * math.sin(step),
                    loss=50.0 + math.sin(step) if blown else 2.0 - 1e-3 * step,
                )
    assert not [w for w in caught if issubclass(w.category, fastnorm.MonitorWarning)]
    assert monitor.diagnosis.verdict == "diverged"
    assert any(issubclass(w.category, fastnorm.UnstableGradientWarning) for w in caught)


def test_a_monitor_is_neither_copied_nor_pickled():
    monitor = GradNormMonitor(5, [Recorder()])
    monitor.update(1.0)
    for attempt in (copy.deepcopy, copy.copy, pickle.dumps):
        with pytest.raises(TypeError, match="GradNormMonitor cannot be copied or pickled"):
            attempt(monitor)
    monitor.close()
    assert monitor.loggers[0].steps == [0]


@pytest.mark.parametrize("flag, skipped", [(np.True_, True), (np.False_, False), (np.int64(1), True),
                                           (np.array(True), True), (np.uint8(0), False)])
def test_numpy_skip_flags_are_read_as_pythons(flag, skipped):
    rec = Recorder()
    with GradNormMonitor(1, [rec], diagnose=False) as monitor:
        monitor.update(1.0, skipped=flag)
    assert rec.windows[0].skipped == (skipped,)


def test_a_numpy_flag_out_of_range_is_refused():
    with pytest.raises(ValueError, match="skipped must be True/False, or 0, 1 or 2"):
        GradNormMonitor(1, diagnose=False).update(1.0, skipped=np.int64(3))


@pytest.mark.parametrize("name", ["norm", "loss", "skipped"])
@pytest.mark.parametrize(
    "make, kind",
    [(lambda: torch.ones((), device="meta"), "meta"), (lambda: torch.ones(1).to_sparse(), "sparse_coo")],
)
def test_a_tensor_without_dense_data_is_refused_at_update(name, make, kind):
    rec = Recorder()
    monitor = GradNormMonitor(2, [rec], diagnose=False)
    value = make()
    args = {"norm": 1.0, name: value}
    with pytest.raises(ValueError, match=f"{name} must be a dense tensor with data, got a {kind} tensor"):
        monitor.update(args.pop("norm"), **args)
    monitor.update(2.0)  # nothing half-recorded
    monitor.close()
    assert rec.steps == [0] and rec.values == [2.0]


def test_a_window_too_large_to_allocate_is_refused_at_once():
    with pytest.raises(ValueError, match="log_every_n_steps must be at most 1000000"):
        GradNormMonitor(10**9)
    GradNormMonitor(fastnorm.monitoring.monitor.MAX_WINDOW, diagnose=False).close()


def test_the_diagnosis_before_the_first_window_says_there_is_nothing_yet():
    monitor = GradNormMonitor(50)
    monitor.update(1.0)
    d = monitor.diagnosis
    assert d.verdict == "too few points" and not d.judged and d.unstable
    assert "no value read" in d.report()
    assert GradNormMonitor(5, diagnose=False).diagnosis is None  # off: no diagnosis at all
    monitor.close()


def test_close_loggers_false_flushes_and_leaves_them_open(tmp_path):
    jsonl = JsonlLogger(tmp_path / "m.jsonl")
    for run in range(2):  # two monitors, one logger that outlives them
        with GradNormMonitor(10, [jsonl], diagnose=False, close_loggers=False) as monitor:
            for i in range(3):
                monitor.update(float(i), step=i + 1)
        assert len(lines(tmp_path / "m.jsonl")) == 3 * (run + 1)  # flushed at close
    jsonl.close()
