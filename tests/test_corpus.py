"""The diagnosis of real training runs with known causes: the corpus under tests/corpus.

Each run was made by tests/corpus/make_corpus.py (which regenerates them): a
small model trained on the CPU, logged through fastnorm's monitor (or the
Lightning callback), with the ground truth written by the script from what it
did. Here nothing is retrained: ``fastnorm diagnose`` reads each run's folder,
as a user would, and must give the verdict, place the onset within 10 steps of
the truth, and name the right action.
"""

import json
import re
from pathlib import Path

import pytest

from fastnorm.cli import main
from fastnorm.monitoring.diagnosis import UNSTABLE

CORPUS = Path(__file__).resolve().parent / "corpus"
RUNS = sorted(p.name for p in CORPUS.iterdir() if (p / "truth.json").is_file())


def truth(name):
    return json.loads((CORPUS / name / "truth.json").read_text())


def diagnosed(name, capsys, *flags):
    code = main(["diagnose", str(CORPUS / name), "--json", *flags])
    return code, json.loads(capsys.readouterr().out)


def test_the_corpus_covers_every_case():
    assert len(RUNS) >= 12
    verdicts = {truth(name)["verdict"] for name in RUNS}
    assert verdicts == {"stable", "diverged", "nonfinite", "vanishing", "stalled"}
    assert sum(truth(name)["verdict"] == "stable" for name in RUNS) >= 4  # healthy controls
    for name in RUNS:
        assert (CORPUS / name / "metrics.csv").stat().st_size < 25_000  # small fixtures
    source = (CORPUS / "make_corpus.py").read_text()
    assert all(f"def {name}():" in source for name in RUNS)  # each run can be regenerated


@pytest.mark.parametrize("name", RUNS)
def test_verdict_onset_and_action(name, capsys):
    expected = truth(name)
    code, out = diagnosed(name, capsys, "--fail-on-unstable")
    events = out["events"]
    assert out["verdict"] == expected["verdict"], json.dumps(events, indent=1)
    assert code == (0 if expected["verdict"] == "stable" else 1)
    if expected["onset"] is None:
        assert not [e for e in events if e["kind"] in UNSTABLE]
    else:
        kind = expected.get("onset_kind", expected["verdict"])
        first = next(e for e in events if e["kind"] == kind)
        assert abs(first["start_step"] - expected["onset"]) <= 10, first
        assert any(expected["action"] in a for a in first["actions"]), first["actions"]
    for action in expected.get("also", []):
        assert any(action in a for a in out["actions"]), out["actions"]


def test_isolated_spikes_are_found_and_point_at_their_batch(capsys):
    expected = truth("mlp_spikes")
    _, out = diagnosed("mlp_spikes", capsys)
    spikes = [e for e in out["events"] if e["kind"] == "spike"]
    for step in expected["spikes"]:
        [spike] = [e for e in spikes if abs(e["start_step"] - step) <= 10]
        assert any(expected["spike_action"] in a for a in spike["actions"])


def test_loss_scaler_skips_are_counted_with_their_steps(capsys):
    expected = truth("fp16_scaler")["skipped"]
    _, out = diagnosed("fp16_scaler", capsys)
    skipped = [e for e in out["events"] if e["kind"] == "skipped"]
    steps = [s for e in skipped for s in range(e["start_step"], e["end_step"] + 1)]
    assert steps == expected and out["skipped_steps"] == len(expected)
    assert "loss scale fell from 4.3e+09" in skipped[0]["detail"]  # read from the log's loss_scale


def test_layer_names_in_the_vanishing_report(capsys):
    main(["diagnose", str(CORPUS / "vanishing_depth")])
    report = capsys.readouterr().out
    orders = re.search(r"per-layer norms span (\d+) orders of magnitude, from '0' \(", report)
    assert orders and int(orders.group(1)) >= 30  # the first of 40 sigmoid layers against the last
    assert "below float32 resolution against the largest: '0', '2', '4'" in report
