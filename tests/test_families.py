"""The diagnosis on the families corpus: real runs of six model families, scored against its goals.

tests/families/make_runs.py made every run (a tuning set, four reruns on other
seeds, onsets and magnitudes that were held out and have been tuned on since,
and a held-out rerun) and wrote its truth from what it injected;
tests/families/score.py diagnoses each run as ``fastnorm diagnose`` does and replays
its log through the monitor's online path. Nothing is retrained here, and
scikit-learn (needed only to regenerate) is never imported.
"""

import itertools
import json
import math
import sys
from pathlib import Path

import pytest

FAMILIES = Path(__file__).resolve().parent / "families"
sys.path.insert(0, str(FAMILIES))
import make_runs  # noqa: E402
import score  # noqa: E402

SETS = score.SETS
# Every pattern the diagnosis must tell apart, by the generator's cause function.
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


def test_the_corpus_covers_every_family_and_cause_in_every_set():
    sets = {which: truths(which) for which in SETS}
    names = sorted(t["name"] for t in sets["tuning"])
    assert len(names) >= 30
    for which, runs in sets.items():
        assert sorted(t["name"] for t in runs) == names, which
        assert all(t["set"] == which for t in runs), which
        assert len({t["family"] for t in runs}) >= 6
        assert sum(t["healthy"] for t in runs) * 3 >= len(runs)  # a third healthy
        assert {t["injected"] for t in runs} >= CAUSES
        assert any(t["every"] > 1 for t in runs if t["healthy"]) and any(
            t["every"] > 1 for t in runs if not t["healthy"]
        )
        for t in runs:
            assert FIELDS <= set(t), t["name"]
            assert (t["onset"] is None) == t["healthy"] and bool(t["actions"]) != t["healthy"]
    # Each rerun differs from every other set: its own seeds, and other onsets where there is one.
    for a, b in itertools.combinations(SETS, 2):
        by_name = {t["name"]: t for t in sets[a]}
        assert all(t["seed"] != by_name[t["name"]]["seed"] for t in sets[b]), (a, b)
        moved = [
            t for t in sets[b] if t["onset"] not in (None, 0) and t["onset"] != by_name[t["name"]]["onset"]
        ]
        assert len(moved) >= 10, (a, b)
    # The held-out set runs on seeds no other set used, and logs some runs, healthy and faulty, every 5th
    # step and some every 10th.
    used = {t["seed"] for which in SETS[:-1] for t in sets[which]}
    assert not used & {t["seed"] for t in sets["heldout"]}
    for healthy in (True, False):
        assert {t["every"] for t in sets["heldout"] if t["healthy"] == healthy} == {1, 5, 10}
    for path in FAMILIES.glob("*/*/metrics.csv"):
        assert path.stat().st_size < 25_000, path


GOALS = [
    "first_action",
    "first_action_strict",
    "verdict",
    "onset",
    "offline_false_alarms",
    "online_warnings_kept",
    "late_warnings",
]
# Goals measured unmet, left so rather than tuned on. Strict, so that an entry goes once its goal holds.
# tuning4 late_warnings: its thinned log of wine, whose learning rate jumped 80x at step 555, has a truth its
# generator's check now rejects: the run only went on learning (its loss, near 1e-4, fell to 1e-6 and
# below), and the blow-up that truth records is one batch (step 613: 2.5e-5, 10x a level near 2e-6, back at
# it the next step). The diagnosis reads the healthy decay it is; no warning comes, so the "blow-up" is
# warned of late. The fixture and its truth stay as they were made.
UNMET = {("tuning4", "late_warnings")}


def row(onset, warnings, healthy=False):
    truth = {"healthy": healthy, "onset": onset, "blowup_step": 101, "window": 25, "every": 1, "abrupt": True}
    return score.Row("run", truth, None, score.Online(warnings, None))


def test_a_warning_before_the_fault_is_a_false_alarm_not_a_lead():
    r = row(100, [(50, "stalled"), (75, "recovered"), (120, "diverged")])
    assert r.lead == 101 - 120 and r.lead_ok and r.false_alarms == 1
    assert row(100, [(50, "diverged")]).lead is None and not row(100, [(50, "diverged")]).lead_ok
    assert row(None, [(50, "stalled"), (75, "recovered")], healthy=True).false_alarms == 1


@pytest.mark.parametrize("goal", GOALS)
def test_the_goals_hold(scored, goal, request):
    which, rows = scored
    if (which, goal) in UNMET:
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"measured unmet on {which}"))
    found = score.goals(rows)[goal]
    assert found["met"], f"{which}: {goal} {found}\n{score.table(rows)}"


def test_the_scorer_never_needs_scikit_learn(scored):
    assert "sklearn" not in sys.modules


def test_the_generator_counts_a_blowup_only_where_it_holds():
    # A loss near 1e-4 whose one batch is 12x its level: that batch, not a blow-up; the generator's check
    # that a learning-rate jump acted must not take it for one. Held for the 10 steps from it, or gone
    # non-finite, it is one.
    base = [1e-4 * (1 + 0.1 * math.sin(i)) for i in range(100)]
    blip = base[:60] + [1.2e-3] + base[61:]
    assert make_runs.blowup_step(blip) is None
    held = base[:60] + [1.2e-3] * 6 + base[66:]
    assert make_runs.blowup_step(held) == 60 and make_runs.blowup_step(held, start=70) is None
    assert make_runs.blowup_step(base[:80] + [math.nan] + base[81:]) == 80


def test_a_floor_reached_early_that_the_loss_keeps_falling_from_is_no_plateau():
    # A healthy diabetes regression (tuning4): its loss fell from 0.87 to 0.49 by step 18, within 5% of
    # where it ended by its batches' noise, yet over the rest of the run it fell 9% more (0.46 to 0.42, the
    # medians of the two halves): still learning, no plateau. A post-LN transformer without warmup stops for
    # good (its halves within 2%): stalled, warm the learning rate up, in every tuning set.
    run = score.score_run(FAMILIES / "tuning4" / "diabetes-healthy")
    assert run.offline.verdict == "stable" and run.online.withdrawn, run.offline.report()
    for which in SETS[:-1]:
        run = score.score_run(FAMILIES / which / "postln-no-warmup")
        assert run.offline.verdict == "stalled" and run.first_action == "warmup", which


LOG_FILES = ("trainer_state.json", ".jsonl", ".csv", ".log", ".txt", ".md")


def test_the_novel_families_and_public_logs_carry_their_truths_and_sources():
    novel = truths(score.NOVEL)
    assert len({t["family"] for t in novel}) >= 7 and sum(t["healthy"] for t in novel) * 3 >= len(novel)
    assert {t["objective"] for t in novel} >= {"minimise", "adversarial", "reinforcement", "contrastive"}
    for healthy in (True, False):  # logs with and without the learning rate, healthy and faulty
        assert {t["lr_logged"] for t in novel if t["healthy"] == healthy} == {True, False}
    for t in novel:
        assert FIELDS - {"injected"} <= set(t), t["name"]
    public = truths(score.PUBLIC)
    assert len(public) >= 15
    for t in public:
        source = t["source"]
        # a trainer_state.json, or a training log its author kept beside the code (a notes file, a .log)
        assert source["repo"].count("/") == 1 and source["path"].endswith(LOG_FILES), t["name"]
        assert len(source["commit"]) == 40 and t["labelled"].startswith("From the numbers"), t["name"]
        assert (t["onset"] is None) == t["healthy"] and bool(t["actions"]) != t["healthy"], t["name"]


def test_a_family_looked_at_while_changing_a_rule_is_scored_by_its_rows_from_before(tmp_path, monkeypatch):
    frozen = [{"name": "x", "family": "stdlm", "healthy": True, "verdict": "diverged", "verdict_ok": False,
               "first_action": None, "action_ok": None, "first_two_ok": None, "lead": None, "lead_ok": None,
               "offline_alarm": True, "withdrawn": False}]
    ledger = {
        "changes": [{"rule": "r", "looked_at": ["stdlm"]}],
        "frozen": {"stdlm": {"before": "r", "rows": frozen}},
    }
    monkeypatch.setattr(score, "LEDGER", tmp_path / "ledger.json")
    (tmp_path / "ledger.json").write_text(json.dumps(ledger))
    families, whence = score.held_out()
    assert families["stdlm"] == frozen and whence["stdlm"] == "frozen before: r"
    assert whence["contrastive"] == "live" and len(families["contrastive"]) == 4
    goals = score.lofo_goals(families["stdlm"])
    assert goals["offline_false_alarms"]["measured"] == 1 and goals["online_warnings_kept"]["measured"] == 1


def test_a_first_action_that_cannot_tell_two_causes_apart_fits_either_and_is_counted_apart():
    from fastnorm.monitoring.diagnosis import Diagnosis
    from fastnorm.monitoring.diagnosis.advice import Action

    tell = Action("precision", "fp16 underflow or a detached loss: log the precision", unless="no_gradient")
    truth = {"healthy": False, "onset": 150, "blowup_step": None, "window": 25, "every": 1, "abrupt": True,
             "verdicts": ["vanishing"], "actions": ["no_gradient"], "family": "segment"}
    r = score.Row("run", truth, Diagnosis("vanishing", actions=(tell,)), score.Online([], None))
    assert r.first_candidates == ("precision", "no_gradient") and r.action_ok and r.action_strict is False
    guess = score.Row("run", truth, Diagnosis("vanishing", actions=(Action("precision", "fp16"),)), r.online)
    assert not guess.action_ok
    goals = score.lofo_goals([score.summary(r)])
    assert goals["first_action"]["measured"] == 1.0 and goals["first_action_strict"]["measured"] == 0.0
