"""fastnorm bench's verdict: a few lines that say what a run found, and only what its figures can carry."""

import json

import pytest
import torch

from fastnorm.bench import harness, step, verdict
from fastnorm.cli import main

CPU = torch.device("cpu")
ENV = {
    "device_name": "Some CPU (family 26, model 2)",
    "threads": 2,
    "backend": "cpp",
    "cpp_isa": "avx512",
    "torch": "2.13.0+cpu",
}


def result(name, *, speedup=None, roofline_pct=None, paired_ratio=None, disturbed=None, group="fastnorm"):
    r = {"contender": name, "group": group, "speedup": speedup, "roofline_pct": roofline_pct}
    r["paired_ratio"] = paired_ratio
    return r | ({"disturbed": disturbed} if disturbed else {})


def record(workload, dtype, results, timed=7, quiet=7, disturbed=None):
    rounds = {"timed": timed, "kept": quiet, "quiet": quiet}
    rec = {"workload": workload, "dtype": dtype, "results": results, "rounds": rounds}
    return rec | ({"disturbed": disturbed} if disturbed else {})


def run_of(*records, load=0.05, quick=False, goals=()):
    return {
        "environment": ENV,
        "workloads": list(records),
        "load_before": {"other_cores_busy": load},
        "settings": {"quick": quick},
        "goals": list(goals),
        "peak_memory_bytes": 2.7e9,
    }


def quiet_run(**kwargs):
    return run_of(
        record("gpt2-small", "fp32", [result("fastnorm.total_norm", speedup=1.27, roofline_pct=96)]),
        record("gpt2-small", "bf16", [result("fastnorm.total_norm", speedup=1.72, roofline_pct=98)]),
        record(
            "tiny",
            "fp32",
            [result("fastnorm.total_norm", speedup=6.0), result("fastnorm.clip_/clips", speedup=7.3)],
        ),
        record(
            "step-gpt2-small",
            "fp32",
            [
                result(step.BARE, paired_ratio=1.0),
                result(step.FOLDED, paired_ratio=1.38),
                result(step.CLIP_THEN_STEP, paired_ratio=1.55),
            ],
        ),
        **kwargs,
    )


def test_a_quiet_run_says_what_it_compared_where_how_fast_and_at_what_share_of_memory():
    text = verdict.verdict(quiet_run(goals=[{"pass": True}, {"pass": False}, {"pass": None}]))
    flat = " ".join(text.split())
    lines = text.splitlines()
    assert lines[0] == "Verdict:" and len(lines) <= 16 and max(map(len, lines)) <= verdict.WIDTH + 4
    assert "against torch.nn.utils.get_total_norm and clip_grad_norm_" in flat
    assert "on 3 workloads" in flat and "Some CPU (family 26, model 2), 2 threads" in flat
    assert "C++ kernels avx512" in flat and "torch 2.13.0+cpu" in flat
    assert "total_norm ran 1.27x to 6.00x as fast as torch's get_total_norm (3 measurements;" in flat
    assert "gpt2-small fp32 1.27x, bf16 1.72x" in flat
    assert "clip_ that clips, 7.30x as fast as clip_grad_norm_" in flat
    assert "takes 1.38x the bare step's time, clip_ then the step 1.55x" in flat
    assert "on gpt2-small (fp32, bf16), total_norm read the gradients at 96% to 98% of the memory" in flat
    assert "Trust: good: other processes kept at most 0.25 cores busy in every one of the 28 timed" in flat
    assert "Targets: 1 met, 1 missed, 1 not judged" in flat
    assert "held at most 2.7 GB" in flat


def test_replaced_rounds_are_said_and_a_disturbed_figure_is_counted_never_quoted():
    replaced = quiet_run()
    replaced["workloads"][0]["rounds"] = {"timed": 14, "kept": 7, "quiet": 7}
    flat = " ".join(verdict.verdict(replaced).split())
    assert "Trust: good: other processes kept more than 0.25 cores busy in 7 of 35 rounds" in flat
    assert "timed again" in flat

    one = quiet_run()
    one["workloads"][1]["results"][0]["disturbed"] = "timed faster than memory allows (182% of ...)"
    flat = " ".join(verdict.verdict(one).split())
    assert "Trust: partial:" in flat and "1 other figure came out faster than memory allows" in flat
    assert "1.72x" not in flat and "98%" not in flat and "2 measurements" in flat

    whole = quiet_run()
    for rec in whole["workloads"][:3]:
        rec["disturbed"] = "other processes kept up to 2.00 cores busy in 7 of 7 rounds"
        rec["rounds"] = {"timed": 7, "kept": 7, "quiet": 0}  # too few quiet: every round kept
    flat = " ".join(verdict.verdict(whole).split())
    assert "busy in 21 of 28 rounds" in flat
    assert "Trust: poor:" in flat and "3 of the 4 workloads got too few quiet rounds" in flat
    assert "no figure of total_norm against torch's get_total_norm is a result" in flat
    assert "Rerun on an idle machine" in flat and "good" not in flat


def test_a_quick_run_is_called_a_smoke_test():
    assert "--quick shapes, a smoke test" in verdict.verdict(quiet_run(quick=True))


def test_the_look_before_the_run_promises_nothing_about_the_rounds():
    load = harness.MachineLoad(seconds=0.5, cores=2, other_cores_busy=0.1, processes=[], load_average=0.3)
    assert "quiet" not in load.message() and "timed again" in load.message()


def test_the_peak_memory_outlives_the_resets_of_the_per_call_measure():
    base = harness.peak_memory_bytes()
    big = torch.ones(32 * 2**20)  # 128 MiB, every page touched
    del big
    harness.peak_extra_bytes(lambda: None, CPU)  # resets VmHWM (and ru_maxrss) to the current set
    assert harness.peak_memory_bytes() >= base + 120 * 2**20


class QuietMeter:
    def stop(self):
        return {"other_cores_busy": 0.0, "steal_cores": 0.0}


@pytest.mark.slow
def test_the_default_output_is_the_verdict_and_where_the_tables_are(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(harness, "LoadMeter", QuietMeter)
    argv = ["bench", "--quick", "--workloads", "tiny,gpt2-small", "--dtypes", "fp32", "--no-plot"]
    assert main(argv + ["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert len(lines) <= 20, out
    assert not any(line.lstrip().startswith("contender") for line in lines)  # no table
    assert "It holds up to about" in out  # the memory, said before the run
    assert out.index("Verdict:") < out.index(f"Every workload's table and every target: {tmp_path}/cpu.md")
    run = json.loads((tmp_path / "cpu.json").read_text())
    assert run["peak_memory_bytes"] >= 100e6  # torch alone holds more
    assert f"held at most {verdict.fmt_bytes(run['peak_memory_bytes'])}" in " ".join(out.split())
    assert "| tiny | fp32 |" in (tmp_path / "cpu.md").read_text()
