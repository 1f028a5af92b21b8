"""Reading gradient-norm series from the files trainers write."""

import json
import math
import os

import pytest

from fastnorm import GradNormMonitor, JsonlLogger, read_series
from fastnorm.monitoring.series import Track


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_reads_what_the_jsonl_logger_wrote(tmp_path):
    path = tmp_path / "metrics.jsonl"
    values = [0.5, 1.5, math.nan, 3.0, 0.25]
    with GradNormMonitor(2, [JsonlLogger(path)], max_norm=2.0, diagnose=False) as monitor:
        for step, v in enumerate(values):
            monitor.update(v, step=10 * step)
    series = read_series(path)
    assert series.steps == (0, 10, 20, 30, 40)
    assert (
        series.values[:2] == (0.5, 1.5) and math.isnan(series.values[2]) and series.values[3:] == (3.0, 0.25)
    )
    assert series.key == "gradient_norm"
    assert series.max_norm == 2.0
    assert series.source == str(path)


@pytest.mark.parametrize(
    "record",
    [
        lambda s, v: {"grad_norm": v, "global_step": s},
        lambda s, v: {"train/grad_norm": v, "_step": s, "_runtime": 1.0},
        lambda s, v: {"trainer/global_step": s, "grad_2.0_norm_total": v},
    ],
)
def test_other_trainers_jsonl(tmp_path, record):
    path = tmp_path / "log.jsonl"
    write_jsonl(path, [record(s, float(s + 1)) for s in (5, 6, 7)] + [{"loss": 0.1, "step": 8}])
    series = read_series(path)
    assert series.steps == (5, 6, 7)
    assert series.values == (6.0, 7.0, 8.0)
    assert series.max_norm is None


def test_steps_sorted_repeats_keep_the_last_nan_strings_nulls_skipped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_jsonl(
        path,
        [
            {"step": 2, "grad_norm": 2.0},
            {"step": 1, "grad_norm": 1.0},
            {"step": 2, "grad_norm": 20.0},  # a resumed run logged step 2 again
            {"step": 3, "grad_norm": "nan"},
            {"step": 4, "grad_norm": None},
        ],
    )
    series = read_series(path)
    assert series.steps == (1, 2, 3)
    assert series.values[:2] == (1.0, 20.0) and math.isnan(series.values[2])


def test_no_step_key_means_line_order(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_jsonl(path, [{"grad_norm": 1.0}, {"grad_norm": 2.0}])
    assert read_series(path).steps == (0, 1)


def test_key_chosen_or_missing(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_jsonl(path, [{"step": 0, "grad_norm": 1.0, "gradient_norm": 2.0, "loss": 3.0}])
    assert read_series(path).values == (2.0,)  # fastnorm's own key first
    assert read_series(path, key="grad_norm").values == (1.0,)
    with pytest.raises(ValueError, match=r"no 'other'; it holds: grad_norm, gradient_norm, loss, step"):
        read_series(path, key="other")
    write_jsonl(path, [{"step": 0, "loss": 3.0}])
    with pytest.raises(ValueError, match="none of gradient_norm, grad_norm"):
        read_series(path)


def test_bad_json_line_names_the_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "grad_norm": 1.0}\n\n{oops\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:3: not JSON"):
        read_series(path)


def test_csv_as_lightning_writes_it(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("epoch,grad_norm,step,train_loss\n0,0.5,0,\n0,,1,2.0\n0,nan,2,\n1,1.5,3,\n")
    series = read_series(path)
    assert series.steps == (0, 2, 3)
    assert series.values[0] == 0.5 and math.isnan(series.values[1]) and series.values[2] == 1.5


def test_hugging_face_trainer_state(tmp_path):
    path = tmp_path / "checkpoint-30" / "trainer_state.json"
    path.parent.mkdir()
    state = {
        "best_metric": None,
        "epoch": 3.0,
        "global_step": 30,
        "log_history": [
            {"epoch": 1.0, "grad_norm": 4.5, "learning_rate": 5e-05, "loss": 2.1, "step": 10},
            {"epoch": 1.0, "eval_loss": 2.0, "eval_runtime": 0.5, "step": 10},
            {"epoch": 2.0, "grad_norm": 3.25, "learning_rate": 3e-05, "loss": 1.7, "step": 20},
            {"epoch": 3.0, "grad_norm": 2.0, "learning_rate": 1e-05, "loss": 1.5, "step": 30},
            {"epoch": 3.0, "step": 30, "total_flos": 1.0, "train_loss": 1.8, "train_runtime": 9.0},
        ],
        "logging_steps": 10,
    }
    path.write_text(json.dumps(state, indent=2))
    for where in (path, tmp_path):  # the file, or the run folder holding it
        series = read_series(where)
        assert series.steps == (10, 20, 30)
        assert series.values == (4.5, 3.25, 2.0)
        assert series.key == "grad_norm"


def test_json_that_is_not_a_trainer_state(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{}")
    with pytest.raises(ValueError, match="no 'log_history'"):
        read_series(path)


def test_tensorboard_event_files(tmp_path):
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    run = tmp_path / "lightning_logs" / "version_0"
    writer = SummaryWriter(str(run))
    for step in range(5):
        writer.add_scalar("train/grad_norm", 0.5 * (step + 1), step)
        writer.add_scalar("train/loss", 1.0 - 0.1 * step, step)
        writer.add_scalar("gradient_norm_layer/head", 0.25, step)
    writer.close()
    event_file = next(run.glob("events.out.tfevents.*"))
    for where in (tmp_path, event_file):
        series = read_series(where)
        assert series.steps == (0, 1, 2, 3, 4)
        assert series.values == (0.5, 1.0, 1.5, 2.0, 2.5)
        assert series.key == "train/grad_norm"
        assert series.source == str(run)
        assert series.loss.key == "train/loss" and series.loss.values == pytest.approx(
            [1.0, 0.9, 0.8, 0.7, 0.6]
        )
        assert series.layers == {s: {"head": 0.25} for s in range(5)}


def test_the_skip_flags_the_monitor_logged(tmp_path):
    path = tmp_path / "metrics.jsonl"
    values = [0.5, math.nan, 3.0, math.inf, 0.25]
    flags = [False, True, False, None, True]
    with GradNormMonitor(2, [JsonlLogger(path)], diagnose=False) as monitor:
        for v, f in zip(values, flags):
            monitor.update(v, skipped=f)
    series = read_series(path)
    assert series.skipped == Track("gradient_norm_skipped", (0, 1, 2, 4), (0.0, 1.0, 0.0, 1.0))
    csv = tmp_path / "metrics.csv"
    csv.write_text("step,gradient_norm,gradient_norm_skipped\n0,0.5,0\n1,nan,1\n2,3.0,\n")
    assert read_series(csv).skipped.pair() == ((0, 1), (0.0, 1.0))
    assert read_series(tmp_path / "metrics.jsonl").loss is None


def test_tensorboard_skip_flags(tmp_path):
    pytest.importorskip("tensorboard")
    from fastnorm import TensorBoardLogger

    with GradNormMonitor(3, [TensorBoardLogger(str(tmp_path))], diagnose=False) as monitor:
        for i in range(5):
            monitor.update(math.nan if i == 3 else 1.0, skipped=i == 3)
    assert read_series(tmp_path).skipped.pair() == ((0, 1, 2, 3, 4), (0.0, 0.0, 0.0, 1.0, 0.0))


def test_folder_means_its_newest_metrics_file(tmp_path):
    old, new = tmp_path / "a" / "metrics.jsonl", tmp_path / "b" / "metrics.jsonl"
    for path, value in ((old, 1.0), (new, 2.0)):
        path.parent.mkdir()
        write_jsonl(path, [{"step": 0, "gradient_norm": value}])
    os.utime(old, (1e9, 1e9))
    (tmp_path / "notes.txt").write_text("not a metrics file")
    assert read_series(tmp_path).values == (2.0,)


def test_folder_passes_over_newer_files_without_a_norm(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    write_jsonl(metrics, [{"step": 0, "gradient_norm": 1.0}])
    os.utime(metrics, (1e9, 1e9))
    write_jsonl(tmp_path / "eval.jsonl", [{"step": 0, "eval_loss": 2.0}])
    (tmp_path / "hparams.csv").write_text("lr,batch\n0.1,32\n")
    series = read_series(tmp_path)
    assert series.source == str(metrics) and series.values == (1.0,)
    metrics.unlink()
    with pytest.raises(ValueError, match="no file in .* holds a gradient norm") as raised:
        read_series(tmp_path)
    assert "eval.jsonl: none of gradient_norm" in str(raised.value)
    assert "hparams.csv: none of gradient_norm" in str(raised.value)


def test_the_loss_learning_rate_scale_and_layers(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_jsonl(
        path,
        [
            {"step": 0, "gradient_norm": 1.0, "train_loss": 2.5, "lr-AdamW": 1e-3, "loss_scale": 65536.0},
            {"step": 1, "gradient_norm": 1.5, "train_loss": 2.4, "gradient_norm_layer/enc": 0.5},
            {"step": 1, "gradient_norm_layer/dec": 1.4},
            {"step": 2, "gradient_norm": 2.0, "lr-AdamW": 2e-3},
        ],
    )
    series = read_series(path)
    assert series.loss == Track("train_loss", (0, 1), (2.5, 2.4))
    assert series.lr == Track("lr-AdamW", (0, 2), (1e-3, 2e-3))
    assert series.scale == Track("loss_scale", (0,), (65536.0,))
    assert series.layers == {1: {"enc": 0.5, "dec": 1.4}}
    assert series.loss.pair() == ((0, 1), (2.5, 2.4))


@pytest.mark.parametrize(
    "loss_key",
    ["gradient_norm_loss", "loss", "train_loss", "train/loss", "train_loss_step", "training_loss"],
)
def test_loss_keys_of_plain_loops_lightning_and_hugging_face(tmp_path, loss_key):
    path = tmp_path / "metrics.csv"
    path.write_text(f"step,grad_norm,{loss_key},epoch\n0,1.0,3.0,0\n1,1.1,2.9,0\n")
    assert read_series(path).loss == Track(loss_key, (0, 1), (3.0, 2.9))


def test_lightning_grad_norm_layers(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text(
        "step,grad_2.0_norm_total,grad_2.0_norm/net.0.weight,grad_2.0_norm/net.2.bias\n0,1.0,0.8,0.6\n"
    )
    series = read_series(path)
    assert series.key == "grad_2.0_norm_total"
    assert series.layers == {0: {"net.0.weight": 0.8, "net.2.bias": 0.6}}


def test_a_run_that_starts_over_is_read_alone(tmp_path):
    path = tmp_path / "metrics.jsonl"
    first = [{"step": s, "gradient_norm": math.nan, "gradient_norm_loss": 9.0} for s in range(5)]
    second = [{"step": s, "gradient_norm": 1.0, "gradient_norm_loss": 2.0} for s in range(3)]
    write_jsonl(path, first + second)
    series = read_series(path)
    assert series.runs == 2
    assert series.steps == (0, 1, 2) and series.values == (1.0, 1.0, 1.0)
    assert series.loss.values == (2.0, 2.0, 2.0)
    resumed = first + [{"step": s, "gradient_norm": 1.0} for s in range(3, 7)]  # resumed from step 3
    write_jsonl(path, resumed)
    series = read_series(path)
    assert series.runs == 1 and series.steps == tuple(range(7)) and series.values[3:] == (1.0,) * 4


def test_values_that_are_not_numbers_are_kept_for_the_diagnosis(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("step,gradient_norm\n0,1.0\n1,n/a\n2,-1\n3,inf\n")
    assert read_series(path).values == (1.0, "n/a", -1.0, math.inf)
    write_jsonl(path.with_suffix(".jsonl"), [{"step": 0, "grad_norm": True}, {"step": 1, "grad_norm": [1]}])
    assert read_series(path.with_suffix(".jsonl")).values == (True, [1])


def test_hugging_face_summary_record_is_not_a_step(tmp_path):
    path = tmp_path / "trainer_state.json"
    history = [
        {"grad_norm": 1.0, "learning_rate": 5e-05, "loss": 2.1, "step": 10},
        {"grad_norm": 0.9, "learning_rate": 3e-05, "loss": 1.7, "step": 20},
        {"step": 20, "train_loss": 9.9, "train_runtime": 9.0},
    ]
    path.write_text(json.dumps({"log_history": history}))
    series = read_series(path)
    assert series.loss == Track("loss", (10, 20), (2.1, 1.7))
    assert series.lr == Track("learning_rate", (10, 20), (5e-05, 3e-05))


def test_nothing_to_read(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics file"):
        read_series(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_series(tmp_path / "missing.jsonl")
