"""Scores the diagnosis on the families corpus: a table of every run, then the goals.

    python tests/families/score.py                  # the tuning set
    python tests/families/score.py --set tuning2    # the first rerun, tuned on since
    python tests/families/score.py --set tuning3    # the second rerun, tuned on since
    python tests/families/score.py --set tuning4    # the third rerun, tuned on since
    python tests/families/score.py --set heldout    # the held-out rerun
    python tests/families/score.py --root DIR       # runs written elsewhere by make_runs.py --out DIR

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
from fastnorm.monitoring.monitor import RecoveredWarning, UnstableGradientWarning

HERE = Path(__file__).resolve().parent
SETS = ("tuning", "tuning2", "tuning3", "tuning4", "heldout")

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
    monitor = GradNormMonitor(truth["window"], [], optimizer=optimizer, precision=series.precision, warn=True)
    losses = dict(zip(series.loss.steps, series.loss.values)) if series.loss else {}
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
            monitor.update(float(value), step, loss=losses.get(step))
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
    def action_ok(self) -> bool | None:
        return self.first_action in self.truth["actions"] if self.faulty else None

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
    return Row(folder.name, truth, diagnose_series(read_series(folder)), replay(folder, truth))


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
        action = "" if not r.faulty else f"{r.first_action} {_mark(r.action_ok)}"
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
    for name, g in goals(rows).items():
        measured = g["measured"]
        text = f"{measured:.0%}" if isinstance(measured, float) else str(measured)
        target = f">= {g['target']:.0%}" if isinstance(g["target"], float) else f"= {g['target']}"
        lines.append(f"  {name:22s} {text:>5s} (goal {target}): {'met' if g['met'] else 'NOT MET'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=SETS, default="tuning")
    parser.add_argument("--root", type=Path, default=HERE, help="the folder holding the sets")
    args = parser.parse_args(argv)
    rows = score(args.root / args.set)
    print(report(rows))
    return 0 if all(g["met"] for g in goals(rows).values()) else 1


if __name__ == "__main__":
    sys.exit(main())
