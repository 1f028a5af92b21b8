"""Reading gradient-norm series from the files trainers write."""

import json
import math
import os

import pytest

from fastnorm import GradNormMonitor, JsonlLogger, read_series


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
        writer.add_scalar("train/loss", 1.0, step)
    writer.close()
    event_file = next(run.glob("events.out.tfevents.*"))
    for where in (tmp_path, event_file):
        series = read_series(where)
        assert series.steps == (0, 1, 2, 3, 4)
        assert series.values == (0.5, 1.0, 1.5, 2.0, 2.5)
        assert series.key == "train/grad_norm"
        assert series.source == str(run)


def test_folder_means_its_newest_metrics_file(tmp_path):
    old, new = tmp_path / "a" / "metrics.jsonl", tmp_path / "b" / "metrics.jsonl"
    for path, value in ((old, 1.0), (new, 2.0)):
        path.parent.mkdir()
        write_jsonl(path, [{"step": 0, "gradient_norm": value}])
    os.utime(old, (1e9, 1e9))
    (tmp_path / "notes.txt").write_text("not a metrics file")
    assert read_series(tmp_path).values == (2.0,)


def test_nothing_to_read(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics file"):
        read_series(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_series(tmp_path / "missing.jsonl")
