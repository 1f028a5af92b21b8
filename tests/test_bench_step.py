"""fastnorm bench's training-step workloads: torch's fused AdamW step, clipping through it or not.

Everything runs at --quick size on the CPU, in a few seconds.
"""

import csv
import dataclasses
import json
import statistics
import time

import pytest
import torch

from fastnorm.bench import cli, goals, harness, report, step
from fastnorm.bench import contenders as C
from fastnorm.bench.workloads import WORKLOADS, prepare
from fastnorm.cli import main

CPU = torch.device("cpu")
NAMES = ["adamw.step", "adamw.clip_+step", "adamw.folded", "adamw.guarded", "adamw.scale+step", "adamw.folded-step"]


def test_the_step_workloads():
    assert [c.name for c in step.CONTENDERS] == NAMES
    cpu = [n for n, w in WORKLOADS.items() if n.startswith("step-") and not w.not_supported_reasons(CPU)]
    assert cpu == ["step-gpt2-small", "step-llama-300m"]
    assert WORKLOADS["step-llama-7b"].devices == ("cuda",)
    assert WORKLOADS["step-llama-7b"].dtypes == ("bf16",)  # fp32 needs 135 GB
    for name in ("step-gpt2-small", "step-llama-300m", "step-llama-7b"):
        w, base = WORKLOADS[name], WORKLOADS[name.removeprefix("step-")]
        assert w.shapes() == base.shapes() and w.shapes(quick=True) == base.shapes(quick=True)
        assert w.contenders == tuple(NAMES)
        # parameters, gradients, their copy and two moments
        assert harness.memory_needed(w, torch.float32) == 5 * 4 * base.numel()
    assert "step-gpt2-small" in cli._default_workloads(CPU)  # one step row in the default run
    assert {"step-gpt2-small", "step-llama-300m"} <= set(cli._full_workloads(CPU))
    assert all(c.only_listed for c in step.CONTENDERS)  # never on the norm workloads
    assert not set(NAMES) & {c.name for c in C.select(CPU)[0]}


def test_a_prepared_step_has_real_parameters_and_the_optimizers_state():
    w = prepare(WORKLOADS["step-llama-300m"], torch.float32, CPU, quick=True)
    assert all(p.stride() != (0,) * p.dim() and p.abs().sum() > 0 for p in w.params)
    assert all(set(w.optimizer.state[p]) >= {"exp_avg", "exp_avg_sq"} for p in w.params)
    assert w.compare(1.0, 0.0) is None  # the creating step wrote no gradient
    clipper = w.clipper(0.5)
    assert w.clipper(0.5) is clipper  # one clipper per optimizer, shared
    with pytest.raises(ValueError, match="clips to 0.5, not 0.25"):
        w.clipper(0.25)


@pytest.mark.slow
def test_staged_work_is_not_timed():
    clock = harness.Clock(CPU)
    calls = []
    staged = C.Staged(lambda: (calls.append("before"), time.sleep(0.5)), lambda: calls.append("call"))
    elapsed, host = clock.time(staged, undo=lambda: calls.append("undo"))
    assert calls == ["before", "call", "undo"] and elapsed < 0.25
    staged()  # called whole (the correctness check): both parts
    assert calls[3:] == ["before", "call"]


class QuietMeter:
    """A load meter that sees no other process: the rows below are read as
    figures, not as ``disturbed``, however busy the machine running the tests."""

    def stop(self):
        return {"other_cores_busy": 0.0, "steal_cores": 0.0}


@pytest.mark.slow
def test_step_rows_in_a_quick_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(harness, "LoadMeter", QuietMeter)
    argv = ["bench", "--full", "--quick", "--workloads", "step-gpt2-small", "--repeats", "3", "--no-plot"]
    assert main(argv + ["--details", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.lstrip().startswith("contender"))
    assert header.split()[:6] == ["contender", "time", "spread", "x", "step", "GB/s"]
    assert "% roof" not in header and "vs base" not in header
    assert "torch's fused AdamW, every call clipping to half the norm" in out

    run = json.loads((tmp_path / "cpu.json").read_text())
    assert run["command"].startswith("fastnorm bench --device cpu --full --workloads step-gpt2-small --quick")
    (record,) = run["workloads"]
    assert (record["workload"], record["dtype"], record["quick"]) == ("step-gpt2-small", "fp32", True)
    assert record["roofline"] == {"read": None, "read_write": None}
    by_name = {r["contender"]: r for r in record["results"]}
    assert list(by_name) == NAMES
    bare = by_name["adamw.step"]
    assert bare["kind"] == "step" and bare["baseline"] is None and bare["paired_ratio"] is None
    assert bare["norm_error"] is None and bare["applied_coef"] is None
    nbytes = record["bytes"]
    for name in NAMES[1:]:
        r = by_name[name]
        # the guarded step is paired with the folded one, every other with the bare step
        base = "adamw.folded" if name == "adamw.guarded" else "adamw.step"
        assert r["baseline"] == base and r["norm_error"] < 1e-4
        # the ratio of each round, paired with its baseline in the same round
        ratios = [t / b for t, b in zip(r["samples_ms"], by_name[base]["samples_ms"])]
        assert r["paired_ratio"] == pytest.approx(statistics.median(ratios), rel=1e-4)
        # every one of them clipped to half the norm, the folded steps in torch's kernel
        assert r["applied_coef"] == pytest.approx(r["expected_coef"], rel=1e-5)
        assert r["expected_coef"] == pytest.approx(0.5, rel=1e-5)
        traffic = 8 if r["kind"] == "clip-step" else 7
        assert r["gbps"] == pytest.approx(traffic * nbytes / r["ms"] / 1e6, rel=1e-9)
    kinds = ["step", "clip-step", "clip-step", "clip-step", "scale-step", "scale-step"]
    assert [by_name[n]["kind"] for n in NAMES] == kinds

    assert run["goals"] == []  # --quick figures are not results
    evaluated = goals.evaluate({**run, "workloads": [{**record, "quick": False}]})
    by_goal = {g["goal"]: g for g in evaluated}
    folded = by_goal["folded step (with its norm) / bare fused AdamW step"]
    assert folded["value"] == by_name["adamw.folded"]["paired_ratio"] and folded["threshold"] == 1.05
    alone = by_goal["folded step (alone, the norm computed before) / bare fused AdamW step"]
    assert alone["value"] == by_name["adamw.folded-step"]["paired_ratio"]
    assert by_goal["folded step (with its norm) / (clip_ + step)"]["threshold"] == 1.0
    guarded = by_goal["folded step with the spike guard / folded step (with its norm)"]
    assert guarded["value"] == by_name["adamw.guarded"]["paired_ratio"] and guarded["threshold"] == 1.02
    for name in ("adamw.folded", "adamw.folded-step"):
        clipped = by_goal[f"{name} clipped: |coefficient applied / max_norm/(norm+1e-6) - 1|"]
        assert clipped["pass"] and clipped["value"] < 1e-5

    markdown = (tmp_path / "cpu.md").read_text()
    assert "| dtype | bare fused AdamW step | `clip_` + step | folded (with its norm) |" in markdown
    row = next(line for line in markdown.splitlines() if line.startswith("| step-gpt2-small | fp32 |"))
    assert row.count("x (") == 5
    with (tmp_path / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [row["contender"] for row in rows] == NAMES
    assert rows[0]["paired_ratio"] == "" and float(rows[2]["paired_ratio"]) > 0


def test_step_goals_on_made_up_numbers():
    def result(name, kind, ratio, samples, coef=None):
        return {
            "contender": name,
            "kind": kind,
            "group": "torch" if name == "adamw.step" else "fastnorm",
            "extra_bytes": None,
            "paired_ratio": ratio,
            "samples_ms": samples,
            "applied_coef": coef,
            "expected_coef": 0.5 if coef else None,
        }

    record = {
        "workload": "step-llama-7b",
        "dtype": "bf16",
        "quick": False,
        "bytes": 1e9,
        "roofline": {"read": None, "read_write": None},
        "results": [
            result("adamw.step", "step", None, [10.0, 20.0, 10.0]),
            result("adamw.clip_+step", "clip-step", 1.4, [14.0, 30.0, 13.0]),
            result("adamw.folded", "clip-step", 1.3, [13.0, 26.0, 13.5], 0.5 * (1 + 1e-3)),
            result("adamw.folded-step", "scale-step", 1.04, [10.4, 21.0, 10.3], 0.5 * (1 + 2e-2)),
        ],
    }
    run = {"environment": {"device": "cuda"}, "workloads": [record]}  # on every device
    by_goal = {g["goal"]: g for g in goals.evaluate(run)}
    assert not by_goal["folded step (with its norm) / bare fused AdamW step"]["pass"]
    assert by_goal["folded step (alone, the norm computed before) / bare fused AdamW step"]["pass"]
    versus = by_goal["folded step (with its norm) / (clip_ + step)"]
    # the median of the rounds' ratios (13/14, 26/30, 13.5/13), not the ratio of the medians
    assert versus["pass"] and versus["value"] == pytest.approx(13.0 / 14.0)
    clipped = "clipped: |coefficient applied / max_norm/(norm+1e-6) - 1|"
    assert by_goal[f"adamw.folded {clipped}"]["pass"]  # 1e-3 within bf16's 1e-2
    assert not by_goal[f"adamw.folded-step {clipped}"]["pass"]
    record["disturbed"] = "other processes kept up to 1.00 cores busy in 5 of 5 rounds"
    by_goal = {g["goal"]: g for g in goals.evaluate(run)}
    assert all(g["pass"] is None for text, g in by_goal.items() if clipped not in text)
    # what a step computed is not a time: other processes do not change it
    assert by_goal[f"adamw.folded {clipped}"]["pass"] and not by_goal[f"adamw.folded-step {clipped}"]["pass"]


def _unclipped_step(w, max_norm):
    params, opt = w.params, w.optimizer

    def call():
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        opt.step()  # forgets to clip
        return norm

    return call


def _skipped_step(w, max_norm):
    clipper, opt = w.clipper(max_norm), w.optimizer

    def call():
        norm = clipper.arm()
        opt.found_inf = torch.ones(())  # as a GradScaler that found an inf: the step skips
        try:
            opt.step()
        finally:
            del opt.found_inf
        return norm

    return call


def _scaling_bare_step(w, max_norm):
    opt = w.optimizer

    def call():
        opt.grad_scale = torch.tensor(2.0)  # the kernel divides and stores the gradients
        try:
            opt.step()
        finally:
            del opt.grad_scale

    return call


@pytest.mark.parametrize(
    "kind, make, message",
    [
        ("clip-step", _unclipped_step, r"gradient 0 .* was expected"),
        ("clip-step", _skipped_step, r"gradient 0 .* was expected"),
        ("step", _scaling_bare_step, "gradient 0 .* changed although nothing was to be clipped"),
    ],
)
def test_a_step_that_did_not_do_its_work_aborts_before_timing(kind, make, message):
    broken = C.Contender("broken-step", kind, make)
    workload = dataclasses.replace(WORKLOADS["step-gpt2-small"], contenders=("adamw.step", "broken-step"))
    chosen = [C.CONTENDERS["adamw.step"], broken]
    with pytest.raises(harness.CorrectnessError, match=message):
        harness.run_workload(
            workload, torch.float32, CPU, chosen, repeats=1, warmup=0, quick=True, min_time_s=0
        )


def test_the_table_of_a_disturbed_step_record_names_no_figure():
    record = {
        "workload": "step-gpt2-small",
        "dtype": "fp32",
        "tensors": 148,
        "numel": 124e6,
        "bytes": 498e6,
        "roofline": {"read": None, "read_write": None},
        "disturbed": "other processes kept up to 2.00 cores busy in 7 of 7 rounds",
        "results": [{"contender": n, "kind": "step"} for n in NAMES],
    }
    text = report.table(record)
    assert "DISTURBED" in text and " ms" not in text and "adamw.folded" in text
    assert "| step-gpt2-small | fp32 | disturbed |" in report.markdown(
        {
            "environment": {
                "device_name": "cpu",
                "device": "cpu",
                "cores": 2,
                "threads": 2,
                "torch": torch.__version__,
                "fastnorm": "0",
                "backend": "cpp",
            },
            "timestamp": "2026-01-01T00:00:00",
            "command": "fastnorm bench",
            "workloads": [record],
        }
    )


def test_the_watched_training_step_rows_and_their_table(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(harness, "LoadMeter", QuietMeter)
    argv = ["bench", "--quick", "--workloads", "train-resnet", "--repeats", "3", "--no-plot", "--out", str(tmp_path)]
    assert main(argv) == 0
    capsys.readouterr()
    run = json.loads((tmp_path / "cpu.json").read_text())
    (record,) = run["workloads"]
    by_name = {r["contender"]: r for r in record["results"]}
    assert {"train.plain", "train.locator", "train.detect-anomaly"} <= set(by_name)
    assert by_name["train.locator"]["baseline"] == "train.plain" and by_name["train.locator"]["paired_ratio"] > 0
    markdown = (tmp_path / "cpu.md").read_text()
    # Its own table, not the optimizer step's; no memory target (the activations are the step's).
    assert "| workload | dtype | forward and backward | with `fastnorm.Locator` |" in markdown
    assert "bare fused AdamW step" not in markdown
    evaluated = goals.evaluate({**run, "workloads": [{**record, "quick": False}]})
    assert [g["target"] for g in evaluated] == ["locator"]
    assert evaluated[0]["value"] == by_name["train.locator"]["paired_ratio"]
