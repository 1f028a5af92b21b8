"""The diagnosis on the families corpus: real runs of six model families, scored against issue 21's goals.

tests/families/make_runs.py made every run (a tuning set, and a held-out rerun on
other seeds, onsets and magnitudes) and wrote its truth from what it injected;
tests/families/score.py diagnoses each run as ``fastnorm diagnose`` does and replays
its log through the monitor's online path. Nothing is retrained here, and
scikit-learn (needed only to regenerate) is never imported.
"""

import json
import sys
from pathlib import Path

import pytest

FAMILIES = Path(__file__).resolve().parent / "families"
sys.path.insert(0, str(FAMILIES))
import score  # noqa: E402

SETS = ("tuning", "heldout")
# Every pattern issue 21 names, by the generator's cause function.
CAUSES = {
    "lr_too_high",
    "shuffled_labels",
    "batchnorm_batch2",
    "adam_eps",
    "weight_decay",
    "no_warmup",
    "fp16_underflow",
    "lr_jump",
    "lr_negative",
    "explode_then_chance",
    "slow_rise",
}
FIELDS = {
    "cause",
    "healthy",
    "verdicts",
    "onset",
    "actions",
    "blowup_step",
    "abrupt",
    "family",
    "precision",
    "optimizer",
    "every",
    "window",
    "injected",
}


def truths(which):
    return [json.loads(p.read_text()) for p in sorted((FAMILIES / which).glob("*/truth.json"))]


@pytest.fixture(scope="module", params=SETS)
def scored(request):
    return request.param, score.score(FAMILIES / request.param)


def test_the_corpus_is_what_issue_21_asks_for():
    tuning, heldout = truths("tuning"), truths("heldout")
    assert len(tuning) >= 30 and sorted(t["name"] for t in heldout) == sorted(t["name"] for t in tuning)
    for which in (tuning, heldout):
        assert len({t["family"] for t in which}) >= 6
        assert sum(t["healthy"] for t in which) * 3 >= len(which)  # a third healthy
        assert {t["injected"] for t in which} >= CAUSES
        assert any(t["every"] > 1 for t in which if t["healthy"]) and any(
            t["every"] > 1 for t in which if not t["healthy"]
        )
        for t in which:
            assert FIELDS <= set(t), t["name"]
            assert (t["onset"] is None) == t["healthy"] and bool(t["actions"]) != t["healthy"]
    # The held-out rerun differs: other seeds, and other onsets where there is one.
    by_name = {t["name"]: t for t in tuning}
    assert all(t["seed"] != by_name[t["name"]]["seed"] for t in heldout)
    moved = [t for t in heldout if t["onset"] not in (None, 0) and t["onset"] != by_name[t["name"]]["onset"]]
    assert len(moved) >= 10
    for path in FAMILIES.glob("*/*/metrics.csv"):
        assert path.stat().st_size < 25_000, path


GOALS = ["first_action", "verdict", "onset", "offline_false_alarms", "online_warnings_kept", "late_warnings"]
# Measured on the held-out rerun and not met: two logs of every 10th step warn later than one window (50
# steps) after their blow-up, since `sustain` counts points (100 steps there). Left so rather than tuned
# on the held-out set; strict, so that this entry goes once the goal holds.
UNMET = {("heldout", "late_warnings")}


@pytest.mark.parametrize("goal", GOALS)
def test_the_goals_hold(scored, goal, request):
    which, rows = scored
    if (which, goal) in UNMET:
        request.applymarker(pytest.mark.xfail(strict=True, reason="measured unmet on the held-out rerun"))
    found = score.goals(rows)[goal]
    assert found["met"], f"{which}: {goal} {found}\n{score.table(rows)}"


def test_the_scorer_never_needs_scikit_learn(scored):
    assert "sklearn" not in sys.modules
