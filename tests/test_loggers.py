"""The loggers: each writes what the window holds, read back by the destination's own reader."""

import io
import json
import math
import os
import sys

import pytest

from fastnorm.monitoring.diagnosis import diagnose
from fastnorm.monitoring.loggers import (
    ConsoleLogger,
    JsonlLogger,
    MLflowLogger,
    TensorBoardLogger,
    WandbLogger,
    Window,
    window_stats,
)


def window(
    steps=(10, 11, 12, 13), values=(0.5, math.nan, 2.5, 1.25), max_norm=1.0, layers=None, layers_step=None
):
    return Window(
        tuple(steps), tuple(values), window_stats(list(values), max_norm), layers or {}, layers_step
    )


def test_metrics_put_each_value_at_its_step_and_the_statistics_last():
    w = window(layers={"encoder": 3.0, "head": 4.0}, layers_step=11)
    rows = list(w.metrics())
    assert [step for step, _ in rows] == [10, 11, 12, 13]
    assert rows[0][1] == {"gradient_norm": 0.5}
    assert math.isnan(rows[1][1]["gradient_norm"])
    assert rows[1][1]["gradient_norm_layer/encoder"] == 3.0 and rows[1][1]["gradient_norm_layer/head"] == 4.0
    assert rows[3][1] == {
        "gradient_norm": 1.25,
        "gradient_norm_min": 0.5,
        "gradient_norm_max": 2.5,
        "gradient_norm_mean": pytest.approx(4.25 / 3),
        "gradient_norm_nonfinite_steps": 1.0,
        "gradient_norm_clipped_fraction": 0.5,
        "gradient_norm_max_norm": 1.0,
    }


def test_statistics_of_an_all_nan_window():
    stats = window_stats([math.nan, math.nan], None)
    assert all(math.isnan(stats[k]) for k in ("min", "max", "mean"))
    assert stats["nonfinite_steps"] == 2.0


@pytest.mark.parametrize("n", range(1, 9))
@pytest.mark.parametrize("value", [sys.float_info.max, math.nextafter(sys.float_info.max, 0), 1.7e308])
def test_a_window_of_norms_near_the_largest_float_is_logged_with_its_mean(tmp_path, n, value):
    # A float64 run's norm can be finite and near 1.8e308: the shares v / n of the window's mean round up,
    # and their sum passed the largest float (OverflowError from the monitor's update, at the cadence).
    import torch

    from fastnorm import GradNormMonitor

    path = tmp_path / "m.jsonl"
    monitor = GradNormMonitor(n, [JsonlLogger(path)], diagnose=False, warn=False)
    for step in range(n):
        monitor.update(torch.tensor(value, dtype=torch.float64), step)
    monitor.close()
    last = json.loads(path.read_text().splitlines()[-1])
    assert last["gradient_norm_mean"] == pytest.approx(value, rel=1e-15)
    assert last["gradient_norm_min"] <= last["gradient_norm_mean"] <= last["gradient_norm_max"]


def test_a_windows_mean_keeps_its_bits_wherever_the_sum_of_shares_is_finite():
    import random

    rng = random.Random(7)
    for n in range(1, 60):
        values = [rng.lognormvariate(0, 3) for _ in range(n)]
        assert window_stats(values, None)["mean"] == math.fsum(v / n for v in values)


def test_jsonl_one_object_per_step_flushed_at_each_window(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    logger = JsonlLogger(path)
    logger.log_window(window())
    lines = path.read_text().splitlines()  # readable before close: flushed
    assert len(lines) == 4
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == [10, 11, 12, 13]
    assert math.isnan(records[1]["gradient_norm"])
    assert records[3]["gradient_norm_clipped_fraction"] == 0.5
    logger.close()
    with pytest.raises(RuntimeError, match="closed"):
        logger.log_metrics({"gradient_norm": 1.0}, 14)


def test_jsonl_starts_afresh_by_default_and_appends_on_request(tmp_path):
    path = tmp_path / "metrics.jsonl"
    for kwargs, expected in (({}, 1), ({"mode": "a"}, 2), ({"mode": "a"}, 3), ({}, 1), ({"mode": "w"}, 1)):
        logger = JsonlLogger(path, **kwargs)
        logger.log_metrics({"gradient_norm": 1.0}, 0)
        logger.close()
        assert len(path.read_text().splitlines()) == expected
    with pytest.raises(ValueError, match="mode must be 'w' or 'a', got 'r'"):
        JsonlLogger(path, mode="r")
    with pytest.raises(TypeError, match="path must be a str or PathLike, got 3"):
        JsonlLogger(3)


def test_jsonl_close_after_a_failed_flush_closes(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    logger = JsonlLogger("/dev/full")
    assert repr(logger) == "JsonlLogger('/dev/full')"
    with pytest.raises(OSError):
        logger.log_window(window())
    with pytest.raises(OSError):
        logger.close()
    logger.close()  # closed already: nothing left to fail


def test_the_loss_is_logged_at_its_step():
    w = Window((1, 2, 3), (0.5, 0.6, 0.7), window_stats([0.5, 0.6, 0.7], None), losses=(2.0, None, 1.5))
    rows = dict(w.metrics())
    assert rows[1] == {"gradient_norm": 0.5, "gradient_norm_loss": 2.0}
    assert rows[2] == {"gradient_norm": 0.6}
    assert rows[3]["gradient_norm_loss"] == 1.5


def skipped_window():
    values, skipped = (0.5, math.nan, 2.5, 1.25), (False, True, None, False)
    return Window((10, 11, 12, 13), values, window_stats(list(values), 1.0, skipped), skipped=skipped)


def test_the_skip_flags_are_logged_at_their_step_and_counted_last():
    rows = dict(skipped_window().metrics())
    assert rows[10] == {"gradient_norm": 0.5, "gradient_norm_skipped": 0.0}
    assert rows[11]["gradient_norm_skipped"] == 1.0 and "gradient_norm_skipped" not in rows[12]
    assert rows[13]["gradient_norm_skipped"] == 0.0
    assert rows[13]["gradient_norm_skipped_steps"] == 1.0
    assert rows[13]["gradient_norm_nonfinite_steps"] == 1.0
    assert rows[13]["gradient_norm_clipped_fraction"] == pytest.approx(2 / 3)  # of 0.5, 2.5, 1.25


def test_tensorboard_writes_scalars_that_tensorboard_reads(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(str(tmp_path))
    logger.log_window(window())
    logger.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    norms = [(e.step, e.value) for e in acc.Scalars("gradient_norm")]
    assert [s for s, _ in norms] == [10, 11, 12, 13]
    assert norms[0][1] == 0.5 and math.isnan(norms[1][1]) and norms[2][1] == 2.5
    assert [(e.step, e.value) for e in acc.Scalars("gradient_norm_max")] == [(13, 2.5)]
    logger = TensorBoardLogger(str(tmp_path / "skipped"))
    logger.log_window(skipped_window())
    logger.close()
    acc = EventAccumulator(str(tmp_path / "skipped"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("gradient_norm_skipped")] == [
        (10, 0.0),
        (11, 1.0),
        (13, 0.0),
    ]
    assert [(e.step, e.value) for e in acc.Scalars("gradient_norm_skipped_steps")] == [(13, 1.0)]


def test_tensorboard_leaves_a_given_writer_open(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path))
    file_writer = writer._get_file_writer()
    logger = TensorBoardLogger(writer=writer)
    logger.log_window(window())
    logger.close()
    # The writer's own state: still open, on the same event file. (add_scalar
    # cannot tell: a closed SummaryWriter silently opens a new file.)
    assert writer.file_writer is file_writer and writer.all_writers is not None
    event_files = sorted(tmp_path.iterdir())
    assert len(event_files) == 1
    # The logged values are on disk already (flushed), and the owner goes on.
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [e.step for e in acc.Scalars("gradient_norm")] == [10, 11, 12, 13]
    writer.add_scalar("still/open", 1.0, 0)
    writer.close()
    assert sorted(tmp_path.iterdir()) == event_files  # written where the rest went
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("still/open")] == [(0, 1.0)]


def test_mlflow_logs_every_step(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.chdir(tmp_path)
    # A local file store (the one mlflow-skinny has) is opt-in in MLflow 3.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    mlflow.set_tracking_uri((tmp_path / "mlruns").as_uri())
    logger = MLflowLogger()
    run_id = logger.run_id
    assert mlflow.active_run().info.run_id == run_id
    logger.log_window(window())
    logger.close()
    assert mlflow.active_run() is None  # the run started here ends here
    history = mlflow.MlflowClient().get_metric_history(run_id, "gradient_norm")
    by_step = {m.step: m.value for m in history}
    assert sorted(by_step) == [10, 11, 12, 13]
    assert by_step[12] == 2.5 and math.isnan(by_step[11])


@pytest.mark.parametrize(
    "make, module, extra",
    [
        (lambda: TensorBoardLogger("unused"), "tensorboard", "tensorboard"),
        (MLflowLogger, "mlflow", "mlflow"),
        (WandbLogger, "wandb", "wandb"),
    ],
)
def test_missing_package_names_the_extra(monkeypatch, make, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    with pytest.raises(ImportError, match=rf"pip install 'torch-fastnorm\[{extra}\]'"):
        make()


def test_console_line():
    out = io.StringIO()
    ConsoleLogger(out).log_window(window())
    assert out.getvalue() == (
        "step 13: grad_norm=1.25 (4 steps: min 0.5, mean 1.417, max 2.5; 1 non-finite; 50% clipped at 1)\n"
    )


def test_console_line_counts_the_skipped_steps_when_there_are_any():
    assert ConsoleLogger.line(skipped_window()) == (
        "step 13: grad_norm=1.25 (4 steps: min 0.5, mean 1.417, max 2.5; 1 non-finite; 1 skipped; "
        "67% clipped at 1)"
    )
    values = (0.5, 2.5)
    none = Window((1, 2), values, window_stats(list(values), 1.0, (False, False)), skipped=(False, False))
    assert "skipped" not in ConsoleLogger.line(none)


def test_console_line_names_an_unstable_verdict():
    d = diagnose(range(40), [1.0] * 30 + [math.nan] * 10)
    w = Window((39,), (math.nan,), window_stats([math.nan], None), diagnosis=d)
    assert ConsoleLogger.line(w).endswith("[nonfinite since step 30]")
