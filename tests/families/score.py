"""Scores the diagnosis on the families corpus: a table of every run, then the goals.

    python tests/families/score.py                  # the tuning set
    python tests/families/score.py --set tuning2    # the first rerun, tuned on since
    python tests/families/score.py --set tuning3    # the second rerun, tuned on since
    python tests/families/score.py --set tuning4    # the third rerun, tuned on since
    python tests/families/score.py --set heldout    # the held-out rerun
    python tests/families/score.py --root DIR       # runs written elsewhere by make_runs.py --out DIR
    python tests/families/score.py --lofo           # leave-one-family-out: the novel families, public logs

Beside the set's table it prints the leave-one-family-out table: the novel
families (``make_novel.py``: objectives and kinds of training the rules were
never tuned on) and the public logs (``public/``: ``trainer_state.json`` files
people committed, each with its source and a truth labelled from its numbers
before any diagnosis; a truth's ``family`` names a later batch, ``public2``,
collected after the first was frozen), each scored by rules that were not
changed while looking at it. ``ledger.json`` records every rule change and the families
looked at while making it; a family looked at is scored by the rows frozen
there before the first change that looked at it, any other by the rules as
they are now.

Offline, each run's folder is read as ``fastnorm diagnose`` reads it. Online,
its log is replayed window by window through a GradNormMonitor (the same code a
training loop runs: each step's norm and loss given to ``update``, the logged
learning rate and optimizer settings set on a stand-in optimizer's
``param_groups`` before the step they were read at, the precision the run logged,
the run's own window), and every warning it emits is recorded with its step.

Per run: the verdict against the acceptable ones, the onset against the truth
(within max(10 steps, 2 logging intervals)), the first action's id against the
acceptable ones, the online lead time (the loss's blow-up step minus the step of
the first warning given at or after the fault's onset; >= 0 is a warning in
time) and the online false alarms: every warning on a healthy run (and whether
the last one was withdrawn by the end), the warnings before the fault on a
faulty one, which are not a warning of it. Needs torch (the monitor's path),
never scikit-learn.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from fastnorm import GradNormMonitor, read_series
from fastnorm.monitoring.command import diagnose_series
from fastnorm.monitoring.diagnosis import STABLE, Diagnosis
from fastnorm.monitoring.diagnosis.objective import from_keys
from fastnorm.monitoring.monitor import RecoveredWarning, UnstableGradientWarning

HERE = Path(__file__).resolve().parent
SETS = ("tuning", "tuning2", "tuning3", "tuning4", "heldout")
NOVEL, PUBLIC = "novel", "public"  # scored leave-one-family-out, never tuned on as a whole
LEDGER = HERE / "ledger.json"

GOALS = {
    "first_action": 0.90,
    "verdict": 0.95,
    "onset": 0.90,
}


class _Optimizer:
    """What the monitor reads of an optimizer: its param_groups, set from the log."""

    def __init__(self) -> None:
        self.param_groups: list[dict] = [{"params": []}]


@dataclass
class Online:
    warnings: list[tuple[int, str]]  # (step, verdict or "recovered")
    final: Diagnosis | None

    def first_warning(self, since: int = 0) -> int | None:
        """The step of the first warning at or after ``since``."""
        return next((s for s, v in self.warnings if v != "recovered" and s >= since), None)

    @property
    def withdrawn(self) -> bool:
        """Every warning was taken back: the last notice is "recovered" and the verdict is stable."""
        if not self.warnings:
            return True
        return self.warnings[-1][1] == "recovered" and self.final is not None and self.final.verdict == STABLE


def replay(folder: Path, truth: dict) -> Online:
    """The run's log through the monitor's online path, window by window; the warnings it gave."""
    series = read_series(folder)
    settings: dict[int, dict] = {}
    tracks = {"lr": series.lr, **series.optimizer}
    for name, track in tracks.items():
        if track is not None:
            for step, value in zip(track.steps, track.values):
                settings.setdefault(step, {})[name] = value
    optimizer = _Optimizer()
    # What the user knows and says, as the log shows it: a discriminator's loss or a reward logged beside
    # the norm is a GAN or a policy gradient.
    named = from_keys(series.columns)
    monitor = GradNormMonitor(
        truth["window"],
        [],
        optimizer=optimizer,
        precision=series.precision,
        warn=True,
        objective=named[0] if named else None,
    )
    losses = dict(zip(series.loss.steps, series.loss.values)) if series.loss else {}
    rewards = dict(zip(series.reward.steps, series.reward.values)) if series.reward else {}
    seen: list[tuple[int, str]] = []
    group = optimizer.param_groups[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step, value in zip(series.steps, series.values):
            for name, v in settings.get(step, {}).items():
                if name in ("beta1", "beta2"):
                    betas = list(group.get("betas", (0.9, 0.999)))
                    betas[name == "beta2"] = v
                    group["betas"] = tuple(betas)
                else:
                    group[name] = v
            before = len(caught)
            reward = rewards.get(step)
            reward = reward if isinstance(reward, float) else None  # as logged; a word is no reward
            monitor.update(float(value), step, loss=losses.get(step), reward=reward)
            for w in caught[before:]:
                if issubclass(w.category, RecoveredWarning):
                    seen.append((step, "recovered"))
                elif issubclass(w.category, UnstableGradientWarning):
                    seen.append((step, str(w.message).split(":", 1)[1].split(".", 1)[0].strip()))
        monitor.close()
    return Online(seen, monitor.diagnosis)


@dataclass
class Row:
    name: str
    truth: dict
    offline: Diagnosis
    online: Online

    @property
    def faulty(self) -> bool:
        return not self.truth["healthy"]

    @property
    def verdict_ok(self) -> bool:
        return self.offline.verdict in self.truth["verdicts"]

    @property
    def tolerance(self) -> int:
        return max(10, 2 * self.truth["every"])

    @property
    def onset_ok(self) -> bool | None:
        if self.truth["onset"] is None:
            return None
        onset = self.offline.onset
        return onset is not None and abs(onset - self.truth["onset"]) <= self.tolerance

    @property
    def first_action(self) -> str | None:
        return self.offline.action_ids[0] if self.offline.action_ids else None

    @property
    def first_candidates(self) -> tuple[str, ...]:
        """The causes the first action names: its id, or the two it says the log cannot tell apart."""
        return self.offline.action_candidates[0] if self.offline.actions else ()

    @property
    def action_ok(self) -> bool | None:
        """The first action fits: it names the cause, alone or as one of the two it cannot tell apart."""
        return any(c in self.truth["actions"] for c in self.first_candidates) if self.faulty else None

    @property
    def action_strict(self) -> bool | None:
        """The first action's own id fits (a "can't tell" counted only for the cause it puts first)."""
        return self.first_action in self.truth["actions"] if self.faulty else None

    @property
    def first_two_ok(self) -> bool | None:
        """The fitting action among the first two."""
        if not self.faulty:
            return None
        return any(a in self.truth["actions"] for a in self.offline.action_ids[:2])

    @property
    def lead(self) -> int | None:
        """Steps from the first online warning since the fault's onset to the blow-up (>= 0: in time); None
        without either."""
        blow, first = self.truth["blowup_step"], self.online.first_warning(self.truth["onset"] or 0)
        if not self.faulty or blow is None or first is None:
            return None
        return blow - first

    @property
    def lead_ok(self) -> bool | None:
        """In time where the norm rises first; within one window on abrupt faults."""
        if not self.faulty or self.truth["blowup_step"] is None:
            return None
        if self.lead is None:
            return False
        window = self.truth["window"] * self.truth["every"]
        return self.lead >= (-window if self.truth["abrupt"] else 0)

    @property
    def false_alarms(self) -> int:
        """Online warnings of nothing: all of a healthy run's, those before the fault of a faulty run's."""
        before = self.truth["onset"] if self.faulty else None
        return sum(v != "recovered" and (before is None or s < before) for s, v in self.online.warnings)


def score_run(folder: Path) -> Row:
    """One run, offline and online."""
    truth = json.loads((folder / "truth.json").read_text())
    series = read_series(folder)
    if "window" not in truth:  # a public log: its interval from its steps, a window of 5 points
        gaps = sorted(b - a for a, b in zip(series.steps, series.steps[1:]))
        truth = {
            "family": PUBLIC,
            "every": gaps[len(gaps) // 2] if gaps else 1,
            "window": 5,
            "blowup_step": None,
            "abrupt": False,
            **truth,
        }
    return Row(folder.name, truth, diagnose_series(series), replay(folder, truth))


def score(root: Path) -> list[Row]:
    return [score_run(p) for p in sorted(root.iterdir()) if (p / "truth.json").is_file()]


def _mark(ok: bool | None) -> str:
    return " " if ok is None else ("ok" if ok else "XX")


def table(rows: list[Row]) -> str:
    head = (
        f"{'run':28s} {'cause':10s} {'verdict':22s} {'onset':13s} {'first action':22s} "
        f"{'lead':>6s} {'alarms':>6s}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        t = r.truth
        cause = "healthy" if not r.faulty else "fault"
        verdict = f"{r.offline.verdict} {_mark(r.verdict_ok)}"
        onset = "" if t["onset"] is None else f"{r.offline.onset}/{t['onset']} {_mark(r.onset_ok)}"
        action = "" if not r.faulty else f"{'|'.join(r.first_candidates) or None} {_mark(r.action_ok)}"
        lead = "" if r.lead_ok is None else f"{r.lead if r.lead is not None else '-'} {_mark(r.lead_ok)}"
        if r.faulty:
            alarms = f"{r.false_alarms}" if r.false_alarms else ""
        else:
            alarms = f"{r.false_alarms}{'' if r.online.withdrawn else ' XX'}"
        lines.append(
            f"{r.name:28s} {cause:10s} {verdict:22s} {onset:13s} {action:22s} {lead:>6s} {alarms:>6s}"
        )
    return "\n".join(lines)


def goals(rows: list[Row]) -> dict[str, dict]:
    """Each goal: the share (or count) measured, the target, met or not."""
    faulty = [r for r in rows if r.faulty]
    healthy = [r for r in rows if not r.faulty]
    with_onset = [r for r in faulty if r.onset_ok is not None]
    leads = [r for r in faulty if r.lead_ok is not None]

    def share(part: list[Row], ok) -> float:
        return sum(1 for r in part if ok(r)) / len(part) if part else 1.0

    found = {
        "first_action": (share(faulty, lambda r: r.action_ok), GOALS["first_action"]),
        # A "can't tell" counted for the cause it puts first only, against the same goal.
        "first_action_strict": (share(faulty, lambda r: r.action_strict), GOALS["first_action"]),
        "verdict": (share(rows, lambda r: r.verdict_ok), GOALS["verdict"]),
        "onset": (share(with_onset, lambda r: r.onset_ok), GOALS["onset"]),
    }
    out = {name: {"measured": v, "target": g, "met": v >= g} for name, (v, g) in found.items()}
    offline_alarms = sum(r.offline.unstable for r in healthy if "loss" in r.offline.signals)
    out["offline_false_alarms"] = {"measured": offline_alarms, "target": 0, "met": offline_alarms == 0}
    kept = sum(not r.online.withdrawn for r in healthy)
    out["online_warnings_kept"] = {"measured": kept, "target": 0, "met": kept == 0}
    late = sum(not r.lead_ok for r in leads)
    out["late_warnings"] = {"measured": late, "target": 0, "met": late == 0}
    return out


def report(rows: list[Row]) -> str:
    lines = [table(rows), ""]
    faulty = sum(r.faulty for r in rows)
    lines.append(f"{len(rows)} runs: {len(rows) - faulty} healthy, {faulty} faulty")
    lines += [goal_line(name, g) for name, g in goals(rows).items()]
    return "\n".join(lines)


def goal_line(name: str, g: dict) -> str:
    """One goal as the tables print it: measured, the goal, met or not."""
    measured = g["measured"]
    text = f"{measured:.0%}" if isinstance(measured, float) else str(measured)
    target = f">= {g['target']:.0%}" if isinstance(g["target"], float) else f"= {g['target']}"
    return f"  {name:22s} {text:>5s} (goal {target}): {'met' if g['met'] else 'NOT MET'}"


# The goals on runs the rules were not tuned on: the same verdicts, a first action that fits less often,
# but the fitting one among the first two almost always.
# A first action that says the log cannot tell two causes apart fits either; `first_action_strict` counts it
# for the one it puts first only.
LOFO_GOALS = {"verdict": 0.95, "first_action": 0.80, "first_action_strict": 0.80, "first_two": 0.95}


def summary(r: Row) -> dict:
    """What the leave-one-family-out table keeps of a run (and freezes in the ledger)."""
    return {
        "name": r.name,
        "family": r.truth["family"],
        "healthy": not r.faulty,
        "verdict": r.offline.verdict,
        "verdict_ok": r.verdict_ok,
        "first_action": r.first_action,
        "action_ok": r.action_ok,
        "action_strict": r.action_strict,
        "first_two_ok": r.first_two_ok,
        "lead": r.lead,
        "lead_ok": r.lead_ok,
        "offline_alarm": (not r.faulty) and r.offline.unstable,
        "withdrawn": r.online.withdrawn,
    }


def lofo_goals(rows: list[dict]) -> dict[str, dict]:
    """The goals over run summaries: shares, and counts that must be 0."""
    faulty = [r for r in rows if not r["healthy"]]

    def share(part, key):
        return sum(1 for r in part if r[key]) / len(part) if part else 1.0

    out = {}
    for name, key, part in (
        ("verdict", "verdict_ok", rows),
        ("first_action", "action_ok", faulty),
        ("first_action_strict", "action_strict", faulty),
        ("first_two", "first_two_ok", faulty),
    ):
        # rows frozen before "can't tell" actions named their two causes were scored by the first's id
        v = share([{**r, "action_strict": r.get("action_strict", r["action_ok"])} for r in part], key)
        out[name] = {"measured": v, "target": LOFO_GOALS[name], "met": v >= LOFO_GOALS[name]}
    for name, bad in (
        ("offline_false_alarms", sum(r["offline_alarm"] for r in rows)),
        ("online_warnings_kept", sum(r["healthy"] and not r["withdrawn"] for r in rows)),
        ("late_warnings", sum(r["lead_ok"] is False for r in rows)),
    ):
        out[name] = {"measured": bad, "target": 0, "met": bad == 0}
    return out


def ledger() -> dict:
    return json.loads(LEDGER.read_text()) if LEDGER.is_file() else {"changes": [], "frozen": {}}


def held_out(root: Path = HERE) -> tuple[dict[str, list[dict]], dict[str, str]]:
    """Each novel family's and the public logs' runs, as scored by rules not changed while looking at them:
    frozen in the ledger where a change looked at the family, live otherwise. Also whence each came."""
    book = ledger()
    live: dict[str, list[dict]] = {}
    for which in (NOVEL, PUBLIC):
        if (root / which).is_dir():
            for r in score(root / which):
                live.setdefault(r.truth["family"], []).append(summary(r))
    families, whence = {}, {}
    for family, rows in sorted(live.items()):
        frozen = book["frozen"].get(family)
        families[family] = frozen["rows"] if frozen else rows
        whence[family] = f"frozen before: {frozen['before']}" if frozen else "live"
    return families, whence


def lofo_report(families: dict[str, list[dict]], whence: dict[str, str]) -> str:
    head = (
        f"{'family':12s} {'runs':>4s} {'faulty':>6s} {'verdict':>8s} {'first':>6s} {'first 2':>7s} "
        f"{'alarms':>6s} {'kept':>4s} {'late':>4s}  scored by"
    )
    lines = ["leave-one-family-out (novel families and public logs)", head, "-" * len(head)]
    every: list[dict] = []
    for family, rows in families.items():
        g = lofo_goals(rows)
        every += rows
        faulty = sum(not r["healthy"] for r in rows)
        lines.append(
            f"{family:12s} {len(rows):4d} {faulty:6d} {g['verdict']['measured']:8.0%} "
            f"{g['first_action']['measured'] if faulty else float('nan'):6.0%} "
            f"{g['first_two']['measured'] if faulty else float('nan'):7.0%} "
            f"{g['offline_false_alarms']['measured']:6d} {g['online_warnings_kept']['measured']:4d} "
            f"{g['late_warnings']['measured']:4d}  {whence[family]}"
        )
    misses = [
        f"  {r['family']}/{r['name']}: {r['verdict']}, first action {r['first_action']}"
        for r in every
        if not r["verdict_ok"] or r["action_ok"] is False or r["offline_alarm"] or r["lead_ok"] is False
    ]
    # Public logs are families "public" (the first batch) and "public2", ... (batches collected after a rule
    # change froze the ones before: scored live, by rules no one changed while looking at them).
    novel = [r for r in every if not r["family"].startswith(PUBLIC)]
    public = [r for r in every if r["family"].startswith(PUBLIC)]
    for label, part in (("novel families", novel), ("public logs", public), ("all", every)):
        if not part:
            continue
        faulty = sum(not r["healthy"] for r in part)
        lines.append(f"{label}: {len(part)} runs, {len(part) - faulty} healthy, {faulty} faulty")
        lines += [goal_line(name, g) for name, g in lofo_goals(part).items()]
    if misses:
        lines += ["missed (a verdict, a first action, an offline alarm or a late warning):", *misses]
    return "\n".join(lines)


def freeze(looked_at: list[str], rule: str, root: Path = HERE) -> None:
    """Records a rule change made while looking at ``looked_at`` (families, or ``public``), freezing the
    rows of each not frozen yet: from now on it is scored by the rules as they were before the change."""
    book = ledger()
    families, _ = held_out(root)
    for family in looked_at:
        if family not in families:
            raise SystemExit(f"score.py: no family {family!r} in {NOVEL} or {PUBLIC}")
        book["frozen"].setdefault(family, {"before": rule, "rows": families[family]})
    book["changes"].append({"rule": rule, "looked_at": sorted(looked_at)})
    LEDGER.write_text(json.dumps(book, indent=1) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=(*SETS, NOVEL, PUBLIC), default="tuning")
    parser.add_argument("--root", type=Path, default=HERE, help="the folder holding the sets")
    parser.add_argument("--lofo", action="store_true", help="only the leave-one-family-out table")
    parser.add_argument(
        "--freeze", nargs="+", metavar="FAMILY", help="record a rule change that looked at these families"
    )
    parser.add_argument("--rule", help="the rule change --freeze records")
    args = parser.parse_args(argv)
    if args.freeze:
        if not args.rule:
            parser.error("--freeze needs --rule")
        freeze(args.freeze, args.rule, args.root)
        return 0
    ok = True
    if not args.lofo:
        rows = score(args.root / args.set)
        print(report(rows))
        print()
        ok = all(g["met"] for g in goals(rows).values())
    families, whence = held_out(args.root)
    print(lofo_report(families, whence))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
