"""Held-out runs: the corpus's runs on other seeds and with the variations users meet, diagnosed.

    python tests/corpus/heldout.py                        # make what is missing, diagnose, print the table
    python tests/corpus/heldout.py --only charlm_lr_x30   # the variations of some runs
    python tests/corpus/heldout.py --list
    python tests/corpus/heldout.py --reseed 1000 --out /tmp/heldout-2   # a fresh set on other seeds

Each variation reruns a run of make_corpus.py with other keyword arguments (a
seed, the step the trouble starts, the learning-rate factor, the model's size,
the run's length, per-layer norms logged or not) and writes it the way some
trainer would: the corpus's CSV, JSON lines with the loss under ``train/loss``,
a Hugging Face ``trainer_state.json`` (``logging_steps`` k: the loss averaged
over the k steps, the norm of the last), or the CSV with every k-th step only.
The runs are written under ``--out`` (kept between calls; ``--force`` remakes
them) and never committed. ``fastnorm diagnose`` then reads each folder as a
user would, and the table says, per variation, the verdict against the truth,
the onset error in steps, whether the advice of the onset's event names the
expected action, and the false alarms on healthy runs.

A variation whose change makes another truth (per-layer norms left out of a
vanishing run: the loss stalls) says so in ``expect``, decided here from what
the run does, never from the diagnosis.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import math
import sys
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_corpus  # noqa: E402

from fastnorm.cli import main as cli  # noqa: E402
from fastnorm.monitoring.diagnosis import UNSTABLE  # noqa: E402


@dataclass
class Variation:
    run: str  # the make_corpus run
    label: str  # what differs from the corpus's run
    args: dict = field(default_factory=dict)
    fmt: str = "csv"  # csv, jsonl (train/ keys), hf (trainer_state.json), noloss (csv without the loss)
    every: int = 1  # the log cadence, in steps
    expect: dict = field(default_factory=dict)  # truth.json entries this variation changes

    @property
    def name(self) -> str:
        return f"{self.run}--{self.label}"


def seeds(run: str, *labels_args: tuple[str, dict], **kw) -> list[Variation]:
    """Two more seeds of ``run``, then the given variations."""
    found = [Variation(run, f"seed{s}", {"seed": s}) for s in (101, 202)]
    return found + [Variation(run, label, args, **kw) for label, args in labels_args]


VARIATIONS = [
    *seeds(
        "charlm_healthy",
        ("wide-deep", {"seed": 101, "width": 128, "depth": 4}),
        ("600-steps", {"seed": 101, "steps": 600}),
        ("layers", {"seed": 101, "layers": True}),
    ),
    Variation("charlm_healthy", "hf-10", {"seed": 202, "log_lr": True}, "hf", 10),
    Variation("charlm_healthy", "train-loss", {"seed": 202}, "jsonl"),
    *seeds(
        "charlm_lr_x30",
        ("x10", {"seed": 101, "factor": 10.0}),
        ("x100", {"seed": 101, "factor": 100.0}),
        ("onset120", {"seed": 101, "onset": 120}),
        ("onset300-500", {"seed": 101, "onset": 300, "steps": 500}),
        ("narrow-1layer", {"seed": 101, "width": 32, "depth": 1}),
        ("4layers", {"seed": 101, "depth": 4}),
        ("lr-logged", {"seed": 101, "log_lr": True}),
        ("layers", {"seed": 101, "layers": True}),
    ),
    Variation("charlm_lr_x30", "hf-5", {"seed": 202, "log_lr": True}, "hf", 5),
    Variation("charlm_lr_x30", "every10", {"seed": 202}, "csv", 10),
    Variation("charlm_lr_x30", "train-loss", {"seed": 202}, "jsonl"),
    *seeds(
        "mlp_healthy",
        ("wide-deep", {"seed": 101, "width": 256, "depth": 4}),
        ("layers", {"seed": 101, "layers": True}),
        ("1000-steps", {"seed": 101, "steps": 1000}),
    ),
    Variation("mlp_healthy", "every5", {"seed": 202}, "csv", 5),
    Variation("mlp_healthy", "train-loss", {"seed": 202}, "jsonl"),
    *seeds(
        "mlp_spikes",
        ("other-steps", {"seed": 101, "outliers": (50, 140, 300)}),
        ("target30", {"seed": 101, "target": 30.0}),
        ("600-steps", {"seed": 101, "steps": 600, "outliers": (100, 250, 400, 550)}),
    ),
    Variation("mlp_spikes", "train-loss", {"seed": 202}, "jsonl"),
    *seeds(
        "nan_from_data",
        ("onset60", {"seed": 101, "onset": 60}),
        ("onset290", {"seed": 101, "onset": 290}),
        ("wide", {"seed": 101, "width": 256}),
    ),
    Variation("nan_from_data", "hf-5", {"seed": 202}, "hf", 5),
    *seeds(
        "explode_to_nan",
        ("lr0.3", {"seed": 101, "lr": 0.3}),
        ("lr10", {"seed": 101, "lr": 10.0}),
        ("onset100", {"seed": 101, "onset": 100}),
        ("lr-logged", {"seed": 101, "log_lr": True}),
    ),
    Variation("explode_to_nan", "every5", {"seed": 202}, "csv", 5),
    *seeds(
        "vanishing_depth",
        ("depth30", {"seed": 101, "depth": 30}),
        ("depth50", {"seed": 101, "depth": 50}),
        ("layers-every50", {"seed": 101, "window": 50}),
        ("400-steps", {"seed": 101, "steps": 400}),
    ),
    Variation(
        "vanishing_depth",
        "no-layers",
        {"seed": 202, "layers": False},
        # The total norm alone cannot show which layers vanish; the loss stuck at chance can.
        expect={"verdict": "stalled", "action": "vanishing"},
    ),
    *seeds(
        "vanishing_weight_decay",
        ("onset100", {"seed": 101, "onset": 100}),
        ("decay0.5-500", {"seed": 101, "decay": 0.5, "steps": 500}),
        ("wide", {"seed": 101, "width": 128}),
    ),
    Variation(
        "vanishing_weight_decay",
        "no-layers",
        {"seed": 202, "layers": False},
        # Without per-layer norms what shows is the loss going back to chance once the weights collapse.
        expect={"verdict": "stalled", "onset": None, "action": "weight decay"},
    ),
    *seeds(
        "deep_relu_small_init",
        ("init0.3", {"seed": 101, "init": 0.3}),
        ("depth8", {"seed": 101, "depth": 8}),
        ("layers", {"seed": 101, "layers": True}),
        ("600-steps", {"seed": 101, "steps": 600}),
    ),
    *seeds(
        "stalled_low_lr",
        ("lr1e-7", {"seed": 101, "lr": 1e-7}),
        ("1000-steps", {"seed": 101, "steps": 1000}),
        ("wide", {"seed": 101, "width": 256}),
    ),
    Variation("stalled_low_lr", "hf-10", {"seed": 202}, "hf", 10),
    Variation("stalled_low_lr", "train-loss", {"seed": 202}, "jsonl"),
    *seeds(
        "fp16_scaler",
        ("init2^24", {"seed": 101, "init_scale": 2.0**24}),
        ("growth50-600", {"seed": 101, "growth": 50, "steps": 600}),
        ("init2^16", {"seed": 101, "init_scale": 2.0**16}),
    ),
    Variation("fp16_scaler", "train-loss", {"seed": 202}, "jsonl"),
    *seeds(
        "fp16_overflow",
        ("onset80", {"seed": 101, "onset": 80}),
        ("x300", {"seed": 101, "factor": 300.0}),
        ("wide", {"seed": 101, "width": 256}),
    ),
    Variation("fp16_overflow", "every5", {"seed": 202}, "csv", 5),
    *seeds(
        "mlp_clipped_lr_x300",
        ("x100", {"seed": 101, "lr": 1.0}),
        ("onset80", {"seed": 101, "onset": 80}),
        ("max_norm5", {"seed": 101, "max_norm": 5.0}),
        ("lr-logged", {"seed": 101, "log_lr": True}),
    ),
    *seeds(
        "lightning_healthy",
        ("warmup100", {"seed": 101, "warmup": 100}),
        ("600-steps", {"seed": 101, "steps": 600}),
    ),
    *seeds(
        "lightning_lr_x300",
        ("x100", {"seed": 101, "factor": 100.0}),
        ("onset300-500", {"seed": 101, "onset": 300, "steps": 500}),
    ),
    # The same runs logged without their loss (a plain monitor.update(norm)): the norm alone.
    *[
        Variation(run, f"noloss-{label}", args, "noloss")
        for run, label, args in (
            ("charlm_healthy", "seed101", {"seed": 101}),
            ("charlm_lr_x30", "seed202", {"seed": 202}),
            ("charlm_lr_x30", "x10", {"seed": 101, "factor": 10.0}),
            ("mlp_healthy", "seed101", {"seed": 101}),
            ("mlp_spikes", "seed101", {"seed": 101}),
            ("explode_to_nan", "seed101", {"seed": 101}),
            ("vanishing_depth", "seed101", {"seed": 101}),
            ("deep_relu_small_init", "seed101", {"seed": 101}),
            ("fp16_scaler", "seed101", {"seed": 101}),
            ("mlp_clipped_lr_x300", "seed101", {"seed": 101}),
            ("lightning_healthy", "seed101", {"seed": 101}),
            ("lightning_lr_x300", "seed101", {"seed": 101}),
            ("lightning_lr_x300", "x100", {"seed": 101, "factor": 100.0}),
        )
    ],
]


# ----------------------------------------------------------------------------
# Writing a run as some trainer would
# ----------------------------------------------------------------------------

NORM, LOSS = "gradient_norm", "gradient_norm_loss"


def thin(records: dict[int, dict], every: int) -> dict[int, dict]:
    return {s: r for s, r in records.items() if s % every == 0}


def write_jsonl(folder: Path, records: dict[int, dict]) -> None:
    """One object per line, the norm and loss under the train/ names many trainers use."""
    names = {NORM: "train/grad_norm", LOSS: "train/loss", "lr": "train/lr", "loss_scale": "train/loss_scale"}
    with open(folder / "metrics.jsonl", "w") as f:
        for step in sorted(records):
            r = {names.get(k, k): make_corpus.sig(v) for k, v in records[step].items() if k in names}
            f.write(json.dumps({"step": step, **r}) + "\n")


def write_trainer_state(folder: Path, records: dict[int, dict], every: int) -> None:
    """A Hugging Face trainer_state.json with logging_steps ``every``: its ``step`` counts optimizer steps
    from 1, ``loss`` averages the steps since the last log, ``grad_norm`` is the last step's."""
    history = []
    steps = sorted(records)
    for i in range(every - 1, len(steps), every):
        window = [records[s].get(LOSS, math.nan) for s in steps[i - every + 1 : i + 1]]
        r = records[steps[i]]
        entry = {"epoch": round((steps[i] + 1) / len(steps), 4), "grad_norm": make_corpus.sig(r[NORM])}
        if "lr" in r:
            entry["learning_rate"] = r["lr"]
        entry["loss"] = make_corpus.sig(sum(window) / len(window))
        entry["step"] = steps[i] + 1
        history.append(entry)
    history.append({"epoch": 1.0, "step": len(steps), "train_loss": 1.0, "train_runtime": 1.0})
    state = {"global_step": len(steps), "logging_steps": every, "log_history": history}
    (folder / "trainer_state.json").write_text(json.dumps(state, indent=1))


def trained(v: Variation, out: Path, force: bool) -> tuple[dict[int, dict], dict]:
    """The run's records and truth, trained once for every format that writes them."""
    key = hashlib.sha1(json.dumps([v.run, v.args], sort_keys=True, default=list).encode()).hexdigest()[:12]
    cache = out / ".trained" / f"{v.run}-{key}.json"
    if cache.is_file() and not force:
        saved = json.loads(cache.read_text())
        return {int(s): r for s, r in saved["records"].items()}, saved["truth"]
    records, truth = make_corpus.RUNS[v.run](**v.args)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"records": records, "truth": truth}))
    return records, truth


def without_loss(records: dict[int, dict], truth: dict) -> tuple[dict[int, dict], dict]:
    """The run as logged without its loss: a divergence then shows only as the norm's explosion."""
    records = {s: {k: v for k, v in r.items() if "loss" not in k or "scale" in k} for s, r in records.items()}
    if truth["verdict"] == "diverged":
        truth = {**truth, "verdict": "exploding"}
    if truth.get("onset_kind") == "diverged":
        truth = {**truth, "onset_kind": "exploding"}
    return records, truth


def make(v: Variation, out: Path, force: bool) -> Path:
    folder = out / v.name
    if (folder / "truth.json").is_file() and not force:
        return folder
    records, truth = trained(v, out, force)
    if v.fmt == "noloss":
        records, truth = without_loss(records, truth)
    truth = {**truth, **v.expect}
    losses = {s: r[LOSS] for s, r in records.items() if LOSS in r}
    onset = truth.get("onset")
    if onset is not None:  # what the loss did around the trouble, for a person to check the truth
        truth["loss_before"] = mean(losses, onset - 50, onset)
        truth["loss_end"] = mean(losses, max(records) - 50, max(records) + 1)
    if v.fmt == "hf":
        truth["step_offset"] = 1  # trainer_state.json counts steps from 1
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    if v.fmt in ("csv", "noloss"):
        make_corpus.write(folder, thin(records, v.every), truth)
    else:
        (folder / "truth.json").write_text(json.dumps({"name": v.name, **truth}, indent=2) + "\n")
        if v.fmt == "jsonl":
            write_jsonl(folder, thin(records, v.every))
        else:
            write_trainer_state(folder, records, v.every)
    return folder


def mean(losses: dict[int, float], start: int, end: int) -> float | None:
    finite = [v for s, v in losses.items() if start <= s < end and math.isfinite(v)]
    return round(sum(finite) / len(finite), 4) if finite else None


# ----------------------------------------------------------------------------
# Diagnosing and scoring
# ----------------------------------------------------------------------------


@dataclass
class Score:
    name: str
    truth: str
    verdict: str
    onset_error: int | None  # steps from the true onset to the first event of the expected kind
    action: bool | None  # the advice names the expected action (None: nothing expected)
    false_alarm: bool
    note: str = ""

    @property
    def ok(self) -> bool:
        onset_ok = self.onset_error is None or abs(self.onset_error) <= 10
        return self.verdict == self.truth and onset_ok and self.action is not False and not self.false_alarm


def score(v: Variation, folder: Path) -> Score:
    truth = json.loads((folder / "truth.json").read_text())
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        cli(["diagnose", str(folder), "--json"])
    out = json.loads(buffer.getvalue())
    events = out["events"]
    unstable = [e for e in events if e["kind"] in UNSTABLE]
    onset_error = action = None
    notes = []
    false_alarm = truth["verdict"] == "stable" and bool(unstable)
    if false_alarm:
        notes.append("; ".join(f"{e['kind']}@{e['start_step']}" for e in unstable))
    if truth["verdict"] != "stable":
        kind = truth.get("onset_kind", truth["verdict"])
        first = next((e for e in events if e["kind"] == kind), None)
        if first is None:
            seen = ", ".join(f"{e['kind']}@{e['start_step']}" for e in events)
            notes.append(f"no {kind} event: {seen}")
        elif truth.get("onset") is not None:
            onset_error = first["start_step"] - (truth["onset"] + truth.get("step_offset", 0))
        actions = first["actions"] if first is not None else out["actions"]
        action = any(truth["action"].lower() in a.lower() for a in actions)
        for also in truth.get("also", []):
            if not any(also in a for a in out["actions"]):
                action = False
                notes.append(f"missing {also!r}")
    if v.fmt in ("csv", "noloss") and v.every == 1 and truth.get("spikes"):
        spikes = [e for e in events if e["kind"] == "spike"]
        missed = [
            s
            for s in truth["spikes"]
            if not any(
                abs(e["start_step"] - s) <= 10 and any(truth["spike_action"] in a for a in e["actions"])
                for e in spikes
            )
        ]
        if missed:
            notes.append(f"spikes not pointed at: {missed}")
    if truth.get("loss_before") is not None:
        notes.append(f"loss {truth['loss_before']} -> {truth['loss_end']}")
    return Score(v.name, truth["verdict"], out["verdict"], onset_error, action, false_alarm, "; ".join(notes))


def table(scores: list[Score]) -> str:
    lines = ["| run | truth | verdict | onset err | action | ok | note |", "|---|---|---|---|---|---|---|"]
    for s in scores:
        action = "-" if s.action is None else ("yes" if s.action else "NO")
        onset = "-" if s.onset_error is None else f"{s.onset_error:+d}"
        ok = "ok" if s.ok else "FAIL"
        lines.append(f"| {s.name} | {s.truth} | {s.verdict} | {onset} | {action} | {ok} | {s.note} |")
    healthy = [s for s in scores if s.truth == "stable"]
    lines.append("")
    right = sum(s.verdict == s.truth for s in scores)
    alarms = sum(s.false_alarm for s in healthy)
    lines.append(
        f"{sum(s.ok for s in scores)}/{len(scores)} right; verdicts {right}/{len(scores)}; "
        f"false alarms on healthy runs: {alarms}/{len(healthy)}"
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/fastnorm-heldout"), help="where the runs go")
    parser.add_argument("--only", nargs="*", default=[], help="only these runs (make_corpus names)")
    parser.add_argument("--force", action="store_true", help="remake runs already there")
    parser.add_argument("--reseed", type=int, default=0, help="add this to every seed (a fresh set)")
    parser.add_argument("--list", action="store_true", help="list the variations")
    parser.add_argument("--json", type=Path, help="also write the scores here")
    args = parser.parse_args(argv)
    chosen = [
        replace(v, args={**v.args, "seed": v.args["seed"] + args.reseed})
        for v in VARIATIONS
        if not args.only or v.run in args.only
    ]
    if args.list:
        print("\n".join(v.name for v in chosen))
        return 0
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    scores = []
    for v in chosen:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            folder = make(v, args.out, args.force)
        scores.append(score(v, folder))
        print(f"{v.name}: {scores[-1].verdict} ({'ok' if scores[-1].ok else 'FAIL'})", file=sys.stderr)
    print(table(scores))
    if args.json:
        args.json.write_text(json.dumps([s.__dict__ for s in scores], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
