"""``fastnorm diagnose``: the known synthetic cases through files the loggers wrote, the plot, exit codes."""

import json
import math

import pytest

from fastnorm import GradNormMonitor, JsonlLogger, TensorBoardLogger, diagnose
from fastnorm.cli import main
from harness import run_python
from synthetic import NAMES, N, case


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
    assert out[3] == "next actions:"
    assert "learning rate" in out[4]


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


def test_plot_draws_the_events_and_the_threshold(tmp_path):
    pytest.importorskip("matplotlib")
    from fastnorm.monitoring.plot import plot

    values = case("exploding", seed=4)[0]
    values[100] = math.inf
    d = diagnose(range(N), values)
    fig = plot(range(N), values, d, tmp_path / "p.png", max_norm=2.0, title="run 7")
    [ax] = fig.axes
    assert ax.get_yscale() == "log"
    assert ax.get_title() == "run 7 (verdict: nonfinite)"
    spans = [(p.get_x(), p.get_x() + p.get_width()) for p in ax.patches]
    assert spans == [(e.start_step - 0.5, e.end_step + 0.5) for e in d.events]
    assert [e.kind for e in d.events] == ["nonfinite", "exploding"]
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["gradient norm", "nonfinite", "exploding", "max_norm=2"]
    [threshold] = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert list(threshold.get_ydata()) == [2.0, 2.0]
    [marks] = [line for line in ax.get_lines() if line.get_marker() == "|"]
    assert list(marks.get_xdata()) == [100]


def test_unreadable_path_exits_2(tmp_path, capsys):
    assert main(["diagnose", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_python_dash_m(tmp_path):
    path = write("jsonl", tmp_path, case("vanishing", seed=5)[0])
    out = run_python(["-m", "fastnorm", "diagnose", str(path), "--fail-on-unstable"])
    assert out.returncode == 1
    assert "verdict: vanishing" in out.stdout
