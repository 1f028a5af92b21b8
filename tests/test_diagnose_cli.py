"""``fastnorm diagnose``: the known synthetic cases through files the loggers wrote, the plot, exit codes."""

import json
import math
import os

import pytest

from fastnorm import GradNormMonitor, JsonlLogger, TensorBoardLogger, diagnose
from fastnorm.cli import main
from fastnorm.monitoring.series import MAX_NORM_KEY
from helpers import run_python
from synthetic import NAMES, K, N, case


def write(kind, folder, values, max_norm=None):
    """Logs ``values`` through a monitor into a JSON-lines file or TensorBoard events; returns the path."""
    if kind == "jsonl":
        path = folder / "metrics.jsonl"
        logger = JsonlLogger(path)
    else:
        pytest.importorskip("tensorboard")
        path = folder / "tb"
        logger = TensorBoardLogger(str(path))
    with GradNormMonitor(50, [logger], max_norm=max_norm, diagnose=False) as monitor:
        for v in values:
            monitor.update(v)
    return path


def run_json(capsys, *args):
    code = main(["diagnose", *map(str, args), "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("writer", ["jsonl", "tensorboard"])
@pytest.mark.parametrize("name", NAMES)
def test_known_cases_through_the_files(tmp_path, capsys, writer, name):
    values, verdict, expected = case(name, seed=0)
    path = write(writer, tmp_path, values)
    code, out = run_json(capsys, path, "--fail-on-unstable")
    assert out["verdict"] == verdict
    assert out["steps"] == N
    assert code == (0 if verdict == "stable" else 1)
    if expected is None:
        assert out["events"] == []
    else:
        kind, first, last, end = expected
        [event] = out["events"]
        assert event["kind"] == kind
        assert first <= event["start_step"] <= last and event["end_step"] == end


def test_without_fail_on_unstable_the_exit_code_is_zero(tmp_path, capsys):
    path = write("jsonl", tmp_path, case("nonfinite", seed=1)[0])
    code, out = run_json(capsys, path)
    assert (code, out["verdict"]) == (0, "nonfinite")


def test_text_report(tmp_path, capsys):
    path = write("jsonl", tmp_path, case("exploding", seed=2)[0])
    assert main(["diagnose", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{path}: {N} values of 'gradient_norm'"
    assert out[1] == f"verdict: exploding ({N} steps read)"
    assert out[2].startswith("  exploding steps 3") and out[2].split(":")[0].endswith(f"-{N - 1}")
    assert out[3] == "    - Lower the learning rate (by 3-10x), or lengthen its warmup."
    assert out[4].startswith("    - Enable gradient clipping: no max_norm was set")


def test_text_report_with_the_loss_and_max_norm(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    values = case("exploding", seed=2)[0]
    with GradNormMonitor(50, [JsonlLogger(path)], max_norm=5.0, diagnose=False) as monitor:
        for i, v in enumerate(values):
            monitor.update(v, loss=2.0 * 0.99**i if i < K else 3.0 + i / 100)
    assert main(["diagnose", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{path}: {N} values of 'gradient_norm', with 'gradient_norm_loss'"
    assert out[1] == f"verdict: diverged ({N} steps read with the loss)"
    start = int(out[2].split()[2].split("-")[0])
    assert K <= start <= K + 15  # as the norm alone dates it (synthetic.case)
    assert out[2].startswith(f"  diverged  steps {start}-{N - 1}: the norm rose from step {start}")
    assert out[4].startswith("    - Tighten the gradient clipping: max_norm=5 is set")


def test_the_skip_flags_in_the_file_make_nonfinite_steps_skipped_steps(tmp_path, capsys):
    values = case("stable", seed=3)[0]
    bad = {K, K + 1, N - 1}
    for i in bad:
        values[i] = math.nan
    for skip_last, verdict in ((True, "stable"), (False, "nonfinite")):
        path = tmp_path / f"{skip_last}.jsonl"
        with GradNormMonitor(50, [JsonlLogger(path)], diagnose=False) as monitor:
            for i, v in enumerate(values):
                monitor.update(v, skipped=i in bad and (skip_last or i != N - 1))
        code, out = run_json(capsys, path, "--fail-on-unstable")
        assert out["verdict"] == verdict and code == (verdict != "stable")
        assert out["skipped_steps"] == (3 if skip_last else 2) and "skipped" in out["signals"]
    assert main(["diagnose", str(tmp_path / "True.jsonl")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{tmp_path / 'True.jsonl'}: {N} values of 'gradient_norm', with 'gradient_norm_skipped'"
    assert out[2].startswith(f"  skipped   3 steps ({K}-{K + 1}, {N - 1}): steps the optimizer skipped")


def test_a_folder_is_searched_for_a_file_that_holds_a_norm(tmp_path, capsys):
    run = tmp_path / "run"
    path = write("jsonl", run.mkdir() or run, case("vanishing", seed=1)[0])
    newer = run / "eval.csv"
    newer.write_text("step,eval_loss\n0,1.0\n")
    os.utime(path, (1e9, 1e9))  # the metrics file is the older one
    code, out = run_json(capsys, tmp_path)
    assert code == 0 and out["source"] == str(path) and out["verdict"] == "vanishing"


def test_a_rerun_into_the_same_file_is_read_alone(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    for values, mode in ((case("nonfinite", seed=1)[0], "w"), (case("stable", seed=1)[0][:400], "a")):
        with GradNormMonitor(50, [JsonlLogger(path, mode=mode)], diagnose=False) as monitor:
            for v in values:
                monitor.update(v)
    code, out = run_json(capsys, path)
    assert out["verdict"] == "stable" and out["steps"] == 400 and out["runs"] == 2
    main(["diagnose", str(path)])
    assert "(the last of 2 runs in the file: its steps started over)" in capsys.readouterr().out


def test_plot_png(tmp_path, capsys):
    values = case("exploding", seed=3)[0]
    values[100] = math.nan
    path = write("jsonl", tmp_path, values, max_norm=2.0)
    png = tmp_path / "norm.png"
    assert main(["diagnose", str(path), "--plot", str(png)]) == 0
    assert f"plot: {png}" in capsys.readouterr().out
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) < 200_000


def test_plot_draws_the_events_the_threshold_zeros_and_the_loss(tmp_path):
    pytest.importorskip("matplotlib")
    from fastnorm.monitoring.plot import MIN_WIDTH, plot

    values = case("exploding", seed=4)[0]
    values[100] = math.inf  # a skipped step: a one-step event
    values[150] = values[151] = 0.0  # exact zeros: on the axis floor
    loss = (range(N), [2.0 - i / N for i in range(N)])
    d = diagnose(range(N), values, loss=loss)
    fig = plot(range(N), values, d, tmp_path / "p.png", max_norm=2.0, title="run 7", loss=loss)
    ax, twin = fig.axes
    assert ax.get_yscale() == "log"
    assert ax.get_title() == f"run 7 (verdict: {d.verdict})"
    spans = [(p.get_x(), p.get_x() + p.get_width()) for p in ax.patches]
    assert len(spans) == len(d.events) and "skipped" in [e.kind for e in d.events]
    for (left, right), e in zip(spans, d.events):
        assert right - left >= max(e.end_step - e.start_step + 1, MIN_WIDTH * N) - 1e-9
        assert left <= e.start_step and right >= e.end_step
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[:2] == ["gradient norm", "zero norm"] and labels[-2:] == ["max_norm=2", "loss"]
    assert labels[2:-2] == list(dict.fromkeys(e.kind for e in d.events))  # each kind once
    [threshold] = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert list(threshold.get_ydata()) == [2.0, 2.0]
    [marks] = [line for line in ax.get_lines() if line.get_marker() == "|"]
    assert list(marks.get_xdata()) == [100]
    [zeros] = [line for line in ax.get_lines() if line.get_marker() == "v"]
    assert list(zeros.get_xdata()) == [150, 151] and list(zeros.get_ydata()) == [0.0, 0.0]
    assert twin.get_ylabel() == "loss" and len(twin.get_lines()[0].get_xdata()) == N


def test_unreadable_path_exits_2(tmp_path, capsys):
    assert main(["diagnose", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_python_dash_m(tmp_path):
    path = write("jsonl", tmp_path, case("vanishing", seed=5)[0])
    out = run_python(["-m", "fastnorm", "diagnose", str(path), "--fail-on-unstable"])
    assert out.returncode == 1
    assert "verdict: vanishing" in out.stdout


# ----------------------------------------------------------------------------
# Anything that is not a diagnosis: exit 2, one line that names the file
# ----------------------------------------------------------------------------


def _norms(path, values):
    path.write_text("".join(json.dumps({"step": i, "gradient_norm": v}) + "\n" for i, v in enumerate(values)))
    return path


def _bad_logs(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.csv").write_text("\n \n")
    (tmp_path / "bytes.jsonl").write_bytes(bytes(range(256)) * 8)
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "metrics.jsonl").write_bytes(b"\x80\xff" * 100)  # no UTF-16 byte-order mark
    (tmp_path / "trainer_state.json").write_text('{"log_history": [')
    _norms(tmp_path / "strings.jsonl", ["abc"] * 30 + [1.0] * 20)
    _norms(tmp_path / "nulls.jsonl", [None] * 50)
    lines = "".join(f'{{"step": {i}, "gradient_norm": 1.0}}\n' for i in range(20))
    (tmp_path / "max_norm.jsonl").write_text(lines + '{"step": 20, "gradient_norm_max_norm": -1}\n')
    (tmp_path / "precision.jsonl").write_text(lines + '{"step": 20, "gradient_norm_precision/fp7": 1}\n')
    (tmp_path / "step.jsonl").write_text(lines + '{"step": 1e400, "gradient_norm": 1.0}\n')
    (tmp_path / "cells.csv").write_text("step,grad_norm\n0,1.0\n1,1.1,5\n")
    (tmp_path / "unknown.csv").write_text("step,loss,norm_of_grads\n0,2.0,1.0\n")
    return {
        "empty.jsonl": "the file is empty",
        "blank.csv": "the file is empty",
        "bytes.jsonl": "the file is not text (byte 0x80 at offset 128 is not UTF-8)",
        "folder": "a metrics file in this folder is not text",
        "trainer_state.json": "not JSON (Expecting value, line 1 column 18)",
        "strings.jsonl": "30 of 50 values of 'gradient_norm' are not numbers (the first, at step 0: 'abc')",
        "nulls.jsonl": "no value of 'gradient_norm'",
        "missing.csv": "no such file or folder",
        "max_norm.jsonl": "at step 20: gradient_norm_max_norm: max_norm must be >= 0, got -1.0",
        "precision.jsonl": "gradient_norm_precision/fp7: precision must be one of fp64, fp32,",
        "step.jsonl": "the step inf (under 'step') is not a whole number",
        "cells.csv": "line 3 has 3 cells, its header 2",
        "unknown.csv": "it holds: loss, norm_of_grads, step; to read one of them as the gradient norm: "
        "--key 'norm_of_grads'",
    }


def test_a_file_that_holds_no_diagnosis_exits_2_with_one_line_naming_it(tmp_path, capsys):
    for name, message in _bad_logs(tmp_path).items():
        path = tmp_path / name
        assert main(["diagnose", str(path), "--fail-on-unstable"]) == 2, name
        out, err = capsys.readouterr()
        assert out == ""  # no report of a log that is not one
        assert err.count("\n") == 1 and err.startswith("fastnorm diagnose: error: "), err
        assert str(path) in err and message in err, err


@pytest.mark.parametrize(
    "plot, message",
    [
        ("missing/norm.png", "there is no folder"),
        ("metrics.jsonl/norm.png", "is a file, not a folder"),
        (".", "is a folder, not a file"),
        ("norm.xyz", "not a picture file name"),
    ],
)
def test_a_plot_that_cannot_be_written_exits_2_before_anything_is_read(tmp_path, capsys, plot, message):
    path = _norms(tmp_path / "metrics.jsonl", case("nonfinite", seed=1)[0])
    target = str(tmp_path / plot)
    assert main(["diagnose", str(path), "--plot", target, "--fail-on-unstable"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"fastnorm diagnose: error: --plot {target}: ")
    assert message in err and err.count("\n") == 1


def test_a_plot_that_fails_while_written_exits_2(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    from fastnorm.monitoring import plot

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(plot, "plot", full)
    path = _norms(tmp_path / "metrics.jsonl", case("stable", seed=1)[0])
    assert main(["diagnose", str(path), "--plot", str(tmp_path / "norm.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fastnorm diagnose: error: --plot {tmp_path / 'norm.png'}: ")
    assert "No space left on device" in err


def test_a_few_norms_that_are_not_numbers_are_a_warning(tmp_path, capsys):
    values = case("stable", seed=2)[0]
    values[10] = "n/a"
    path = _norms(tmp_path / "metrics.jsonl", values)
    assert main(["diagnose", str(path), "--fail-on-unstable"]) == 0
    out, err = capsys.readouterr()
    assert err == (
        f"fastnorm diagnose: warning: {path}: 1 of {N} values of 'gradient_norm' is not a number "
        "(the first, at step 10: 'n/a'); the diagnosis leaves them out\n"
    )
    assert "invalid" in out and "verdict: stable" in out


def test_a_norm_under_another_spelling_is_read_and_said(tmp_path, capsys):
    path = tmp_path / "metrics.csv"
    path.write_text("step,train/grad_norm_before_clip,train/grad_norm_after_clip\n0,3.0,1.0\n1,3.5,1.0\n")
    assert main(["diagnose", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"{path}: 2 values of 'train/grad_norm_before_clip'"


def test_a_plot_of_norms_near_the_largest_float(tmp_path, capsys):
    # matplotlib's axes overflow there: the norms beyond its reach are marked on the top edge.
    pytest.importorskip("matplotlib")
    values = [1.7e308 * (0.5 + 0.5 * (i % 2)) for i in range(100)]
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        "".join(
            json.dumps({"step": i, "gradient_norm": v, "gradient_norm_loss": v, MAX_NORM_KEY: 1e308}) + "\n"
            for i, v in enumerate(values)
        )
    )
    png = tmp_path / "norm.png"
    assert main(["diagnose", str(path), "--plot", str(png)]) == 0
    assert f"plot: {png}" in capsys.readouterr().out and png.read_bytes()[:4] == b"\x89PNG"

    from fastnorm.monitoring.plot import plot

    values[10] = 1.0
    fig = plot(range(100), values, diagnose(range(100), values), tmp_path / "p.png", max_norm=1e308)
    [marks] = [line for line in fig.axes[0].get_lines() if line.get_marker() == "|"]
    assert list(marks.get_xdata()) == [i for i in range(100) if i != 10]
