"""Reading gradient-norm series from the files trainers write."""

import json
import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastnorm import GradNormMonitor, JsonlLogger, read_series
from fastnorm import checks
from fastnorm.checks import PRECISIONS, InputError
from fastnorm.monitoring.series import MAX_NORM_KEY, PRECISION_PREFIX, NoGradientNorm, Track


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
        assert series.source == str(run if where == tmp_path else event_file)
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


# ----------------------------------------------------------------------------
# What the run's settings cannot hold: an InputError naming the file, once, here
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line, message",
    [
        ('"gradient_norm_max_norm": -1', "step 2: gradient_norm_max_norm: max_norm must be >= 0, got -1.0"),
        ('"gradient_norm_max_norm": NaN', "step 2: gradient_norm_max_norm: max_norm must be >= 0, got nan"),
        ('"gradient_norm_max_norm": [1, 2]', "max_norm must be a number >= 0, got [1, 2] (list)"),
        ('"gradient_norm_max_norm": "one"', "max_norm must be a number >= 0, got 'one' (str)"),
        ('"gradient_norm_precision/fp7": 1', "precision must be one of fp64, fp32,"),
        ('"step": Infinity', "the step inf (under 'step') is not a whole number below 2**63"),
        ('"step": 1e400', "the step inf (under 'step') is not a whole number below 2**63"),
        ('"step": 1e19', "the step 1e+19 (under 'step') is not a whole number"),
        ('"step": 2.5', "the step 2.5 (under 'step') is not a whole number"),
        ('"step": "two"', "the step 'two' (under 'step') is not a whole number"),
        ('"step": true', "the step True (under 'step') is not a whole number"),
    ],
)
def test_a_logged_value_out_of_range_is_an_input_error_naming_the_file(tmp_path, line, message):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"step": 0, "gradient_norm": 1.0}\n{"step": 1, "gradient_norm": 1.1}\n'
        + '{"step": 2, "gradient_norm": 1.2, ' + line + "}\n"
    )
    with pytest.raises(InputError) as raised:
        read_series(path)
    assert str(raised.value).startswith(f"{path}: ") and message in str(raised.value)


def test_settings_in_range_are_read(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"step": 0.0, "gradient_norm": 1.0, "gradient_norm_max_norm": Infinity}\n'
        '{"step": 7, "gradient_norm": 2.0, "gradient_norm_max_norm": 0, "gradient_norm_precision/16": 1}\n'
    )
    series = read_series(path)
    assert series.steps == (0, 7) and series.max_norm == 0.0 and series.precision == "16"


def test_a_csv_row_with_more_cells_than_its_header_names_its_line(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("step,grad_norm\n0,1.0\n1,1.1\n2,1.2,7\n3,1.3\n")
    with pytest.raises(InputError, match=r"metrics.csv: line 4 has 3 cells, its header 2$"):
        read_series(path)
    path.write_text("step,grad_norm,loss\n0,1.0,2.0\n1,1.1\n")  # fewer: the missing cells are empty
    assert read_series(path).steps == (0, 1)


def test_semicolon_csv_with_decimal_commas_as_a_spreadsheet_writes_it(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("step;grad_norm;loss\n0;1,5;2,25\n1;0,75;2\n2;1.25e-3;-1,5E2\n3;nan;\n")
    series = read_series(path)
    assert series.steps == (0, 1, 2, 3) and series.values[:3] == (1.5, 0.75, 1.25e-3)
    assert math.isnan(series.values[3])
    assert series.loss.pair() == ((0, 1, 2), (2.25, 2.0, -150.0))
    path.write_text("step\tgrad_norm\n4\t0.5\n5\t0.25\n")  # a tab-separated one
    assert read_series(path).values == (0.5, 0.25)


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-16-le-bom", "utf-16-be-bom"])
@pytest.mark.parametrize("kind", ["csv", "jsonl", "trainer_state"])
def test_a_byte_order_mark_keeps_the_first_column(tmp_path, encoding, kind):
    # Excel's "CSV UTF-8" and PowerShell write one; read as part of the first name, it hid `step`.
    text = {
        "csv": "step,grad_norm\n600,1.0\n610,2.0\n",
        "jsonl": '{"step": 600, "grad_norm": 1.0}\n{"step": 610, "grad_norm": 2.0}\n',
        "trainer_state": '{"log_history": [{"step": 600, "grad_norm": 1.0}, '
        '{"step": 610, "grad_norm": 2.0}]}',
    }[kind]
    name = {"csv": "metrics.csv", "jsonl": "metrics.jsonl", "trainer_state": "trainer_state.json"}[kind]
    codec = encoding.removesuffix("-bom")
    mark = {"utf-16-le": "\ufeff", "utf-16-be": "\ufeff"}.get(codec, "")
    path = tmp_path / name
    path.write_bytes((mark + text).encode(codec))
    series = read_series(path)
    assert series.steps == (600, 610) and series.values == (1.0, 2.0)


def test_an_event_file_is_read_alone_and_its_folder_for_all_its_files(tmp_path):
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    files = []
    for run, level in enumerate((1.0, 100.0)):  # two runs written into one folder
        writer = SummaryWriter(str(tmp_path), filename_suffix=f".run{run}")
        for step in range(4):
            writer.add_scalar("train/grad_norm", level + step, step)
        writer.close()
        files.append(next(tmp_path.glob(f"events.out.tfevents.*.run{run}")))
    for path, level in zip(files, (1.0, 100.0)):
        series = read_series(path)
        assert series.values == tuple(level + s for s in range(4)) and series.source == str(path)
    assert read_series(tmp_path).source == str(tmp_path)


@pytest.mark.parametrize(
    "name",
    [
        "train/grad_norm_before_clip",
        "grad_norm_before_clip",
        "gradient-norm",
        "grad-norm",
        "train/gradient_norm_pre_clip",
        "optimizer/grad_norm",
        "training/total_grad_norm",
        "GradNorm",
        "grad_norm_unclipped",
    ],
)
def test_other_spellings_of_the_norm_are_read(tmp_path, name):
    path = tmp_path / "metrics.csv"
    path.write_text(f"step,{name},eval/grad_norm,grad_norm_after_clip\n0,1.5,9.0,1.0\n1,2.5,9.0,1.0\n")
    series = read_series(path)
    assert series.key == name and series.values == (1.5, 2.5)


@pytest.mark.parametrize(
    "columns, likeliest",
    [
        ("grad_norm_after_clip,loss", "grad_norm_after_clip"),  # capped at max_norm: never read unasked
        ("eval/grad_norm,loss", "eval/grad_norm"),
        ("grad_norm/layer.0,loss", "grad_norm/layer.0"),
        ("norm_of_grads,val_norm,loss", "norm_of_grads"),
        ("loss,accuracy", None),
    ],
)
def test_a_norm_under_a_name_not_known_is_suggested_not_read(tmp_path, columns, likeliest):
    path = tmp_path / "metrics.csv"
    path.write_text(f"step,{columns}\n0,1.0,2.0\n")
    with pytest.raises(NoGradientNorm, match="it holds: ") as raised:
        read_series(path)
    assert raised.value.likeliest == likeliest


def _broken_file(draw):
    """A metrics file that a trainer, a spreadsheet or a crash could have left: a valid one, then edits."""
    kind = draw(st.sampled_from(["csv", "jsonl", "trainer_state"]))
    cell = st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(-(2**70), 2**70),
        st.sampled_from(["", "nan", "Infinity", "1e400", "-1", "1,5", "abc", "[1]", "true", '"', ";"]),
    )
    keys = ["step", "grad_norm", "loss", MAX_NORM_KEY, f"{PRECISION_PREFIX}fp7", f"{PRECISION_PREFIX}bf16"]
    columns = draw(st.lists(st.sampled_from(keys), min_size=1, max_size=5, unique=True))
    rows = draw(st.lists(st.lists(cell, min_size=0, max_size=len(columns) + 2), max_size=12))
    if kind == "csv":
        sep = draw(st.sampled_from([",", ";", "\t"]))
        text = sep.join(columns) + "\n" + "".join(sep.join(map(str, r)) + "\n" for r in rows)
    else:
        records = [dict(zip(columns, r)) for r in rows]
        lines = [json.dumps(r) for r in records]
        text = "\n".join(lines) if kind == "jsonl" else json.dumps({"log_history": records})
    data = text.encode(draw(st.sampled_from(["utf-8", "utf-8-sig", "utf-16"])))
    if draw(st.booleans()):
        cut = draw(st.integers(0, len(data)))
        data = data[:cut] + draw(st.binary(max_size=8)) + data[cut:]
    return kind, data


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_broken_files_are_read_or_refused_clearly(tmp_path, data):
    # Fuzz: whatever the bytes, the reader returns a series whose settings hold, or raises the errors
    # the fastnorm command turns into one line (never a TypeError, AttributeError, OverflowError...).
    kind, raw = data.draw(st.composite(_broken_file)())
    path = tmp_path / {"csv": "m.csv", "jsonl": "m.jsonl", "trainer_state": "trainer_state.json"}[kind]
    path.write_bytes(raw)
    try:
        series = read_series(path)
    except (InputError, UnicodeDecodeError, json.JSONDecodeError):
        return
    assert all(isinstance(s, int) for s in series.steps) and list(series.steps) == sorted(set(series.steps))
    assert series.max_norm is None or series.max_norm >= 0
    assert series.precision is None or checks.precision(series.precision, "") in PRECISIONS
