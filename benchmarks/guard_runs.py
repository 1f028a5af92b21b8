"""The spike guard on real training runs: a poisoned batch and a learning-rate blip, guarded and not.

Three families, each a small model trained from scratch on data drawn from a
fixed generator (no downloads), by a torch fused optimizer whose step a
:class:`fastnorm.StepClipper` arms:

* ``mlp``: a 3-layer MLP classifying a 10-class Gaussian mixture (fused AdamW);
* ``cnn``: a 2-conv-layer net classifying noisy 12x12 class templates (fused SGD, momentum 0.9);
* ``lm``: a 2-layer causal transformer on sequences of a sparse Markov chain (fused AdamW).

Each faulty run is the healthy run of the same seed (same data, same order)
with one fault at ``FAULT_AT``:

* ``poison``: one bad batch. Unnormalised inputs (mlp x1000, cnn x255, raw pixels)
  or, for the LM, random tokens whose loss is summed instead of averaged;
* ``lr_blip``: one step taken at 100x the learning rate (a schedule bug).

Each faulty run is trained unguarded (``skip_spikes=False``) and guarded
(``skip_spikes=True``, the default rule), both under the same ``max_norm``:
``inf`` (no clip, the guard alone) and ``1.0`` (a clip as well). The score is
the loss on a fixed held-out set at the end, against the healthy run's. The
healthy runs are also trained guarded, for ``HEALTHY_STEPS`` steps per seed,
and every step the guard skips there is a false skip.

Writes ``benchmarks/results/cpu/guard_runs.json`` and prints the tables
docs/clipping.md quotes::

    python benchmarks/guard_runs.py              # about 6 minutes on 2 cores
    python benchmarks/guard_runs.py --quick      # one seed, short runs (a smoke test)
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

import fastnorm
from fastnorm.bench.report import _cpu_name

OUT = Path(__file__).resolve().parent / "results" / "cpu" / "guard_runs.json"
FAMILIES = ("mlp", "cnn", "lm")
FAULTS = ("poison", "lr_blip")
FAULT_STEPS = 1200  # steps of a faulty run (and of its healthy twin)
FAULT_AT = 600
HEALTHY_STEPS = 2500  # steps of each guarded healthy run that counts false skips
SEEDS = {"mlp": (0, 1, 2, 3), "cnn": (0, 1), "lm": (0, 1)}  # healthy seeds; faulty runs use the first two
LR_BLIP = 100.0
AFTER = 10  # the damage is read this many steps after the fault's step


# -- the families -------------------------------------------------------------------------------


class Family:
    """A model, its optimizer and its data stream, all from one seed."""

    name = ""
    lr = 0.0

    def __init__(self, seed: int) -> None:
        self.seed = seed
        gen = torch.Generator().manual_seed(1000 + seed)
        self.world(gen)
        torch.manual_seed(seed)
        self.model = self.build()
        self.data = torch.Generator().manual_seed(2000 + seed)
        self.held_out = [self.batch(torch.Generator().manual_seed(9000 + i)) for i in range(8)]

    def world(self, gen: torch.Generator) -> None:
        """The fixed generator the data are drawn from."""

    def build(self) -> nn.Module:
        raise NotImplementedError

    def optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.model.parameters(), lr=self.lr, weight_decay=0.01, fused=True)

    def batch(self, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def poison(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
        """The bad batch made of a good one, and its loss's factor."""
        raise NotImplementedError

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.model(x), y)

    @torch.no_grad()
    def evaluate(self) -> float:
        self.model.eval()
        value = sum(self.loss(x, y).item() for x, y in self.held_out) / len(self.held_out)
        self.model.train()
        return value


class Mlp(Family):
    name, lr = "mlp", 3e-3

    def world(self, gen):
        self.centres = torch.randn(10, 20, generator=gen) * 1.2

    def build(self):
        return nn.Sequential(nn.Linear(20, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 10))

    def batch(self, gen):
        y = torch.randint(0, 10, (64,), generator=gen)
        return self.centres[y] + torch.randn(64, 20, generator=gen), y

    def poison(self, x, y):
        return x * 1000.0, y.roll(1), 1.0  # unscaled features of misaligned records


class Cnn(Family):
    name, lr = "cnn", 0.02

    def world(self, gen):
        self.templates = torch.randn(10, 1, 12, 12, generator=gen)

    def build(self):
        return nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 9, 10),
        )  # fmt: skip

    def optimizer(self):
        return torch.optim.SGD(self.model.parameters(), lr=self.lr, momentum=0.9, weight_decay=1e-4, fused=True)

    def batch(self, gen):
        y = torch.randint(0, 10, (32,), generator=gen)
        return 0.5 * self.templates[y] + torch.randn(32, 1, 12, 12, generator=gen), y

    def poison(self, x, y):
        return x * 255.0, y, 1.0


class Lm(Family):
    name, lr = "lm", 2e-3
    vocab, length, width = 32, 32, 64

    def world(self, gen):
        # Each token is followed by one of 3 others: a chain with about ln 3 nats of entropy per token.
        nxt = torch.randint(0, self.vocab, (self.vocab, 3), generator=gen)
        self.table = nxt

    def build(self):
        model = nn.Module()
        model.embed = nn.Embedding(self.vocab, self.width)
        model.pos = nn.Parameter(torch.randn(self.length, self.width) * 0.02)
        layer = nn.TransformerEncoderLayer(self.width, 4, 4 * self.width, dropout=0.0, batch_first=True, norm_first=True)
        model.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        model.head = nn.Linear(self.width, self.vocab)
        mask = nn.Transformer.generate_square_subsequent_mask(self.length)

        def forward(tokens):
            h = model.embed(tokens) + model.pos
            return model.head(model.blocks(h, mask=mask, is_causal=True))

        model.forward = forward
        return model

    def batch(self, gen):
        tokens = torch.empty(16, self.length + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, self.vocab, (16,), generator=gen)
        for t in range(self.length):
            pick = torch.randint(0, 3, (16,), generator=gen)
            tokens[:, t + 1] = self.table[tokens[:, t], pick]
        return tokens[:, :-1], tokens[:, 1:]

    def loss(self, x, y):
        return nn.functional.cross_entropy(self.model(x).reshape(-1, self.vocab), y.reshape(-1))

    def poison(self, x, y):
        gen = torch.Generator().manual_seed(7)
        return torch.randint(0, self.vocab, x.shape, generator=gen), y, float(y.numel())


MAKERS = {"mlp": Mlp, "cnn": Cnn, "lm": Lm}


# -- one run ------------------------------------------------------------------------------------


@dataclass
class Outcome:
    family: str
    seed: int
    fault: str  # "none", "poison", "lr_blip"
    guarded: bool
    max_norm: float
    steps: int
    final_loss: float  # held-out, at the end
    after_fault_loss: float | None  # held-out, AFTER steps after the fault's step (None: no fault step)
    skipped_for_spike: int
    skipped_nonfinite: int
    first_skips: list  # the first steps the guard skipped
    seconds: float


def train(family: str, seed: int, steps: int, fault: str = "none", guarded: bool = False,
          max_norm: float = math.inf, fault_at: int = FAULT_AT) -> Outcome:  # fmt: skip
    """Trains one run; the guard's flags are read once, at the end (the loop itself reads nothing)."""
    torch.manual_seed(seed)
    fam = MAKERS[family](seed)
    opt = fam.optimizer()
    clipper = fastnorm.StepClipper(opt, max_norm, skip_spikes=guarded)
    reasons = []
    after = None
    start = time.perf_counter()
    for step in range(steps):
        x, y = fam.batch(fam.data)
        factor = 1.0
        if fault == "poison" and step == fault_at:
            x, y, factor = fam.poison(x, y)
        blip = fault == "lr_blip" and step == fault_at
        for g in opt.param_groups:  # as a scheduler sets it, before the step's arm()
            g["lr"] = fam.lr * (LR_BLIP if blip else 1.0)
        loss = fam.loss(x, y) * factor
        loss.backward()
        clipper.arm(loss=loss.detach())
        opt.step()
        opt.zero_grad(set_to_none=True)
        reasons.append(clipper.skip_reason)
        if step == fault_at + AFTER:
            after = fam.evaluate()
    seconds = time.perf_counter() - start
    codes = torch.stack(reasons).tolist()  # the one host read of the run
    final = fam.evaluate()
    return Outcome(
        family, seed, fault, guarded, max_norm, steps, final, after,
        sum(c == 2.0 for c in codes), sum(c == 1.0 for c in codes),
        [i for i, c in enumerate(codes) if c == 2.0][:8], seconds,
    )  # fmt: skip


# -- the tables ---------------------------------------------------------------------------------


def faulty_table(outcomes: list[Outcome], steps: int) -> list[dict]:
    """Per family, fault and clip: the final held-out loss of healthy, unguarded and guarded runs."""
    rows = []
    healthy = {(o.family, o.seed, o.max_norm): o for o in outcomes if o.fault == "none" and o.steps == steps}
    for family in FAMILIES:
        for fault in FAULTS:
            for max_norm in sorted({o.max_norm for o in outcomes}, reverse=True):
                runs = [o for o in outcomes if (o.family, o.fault, o.max_norm) == (family, fault, max_norm)]
                if not runs:
                    continue
                row = {"family": family, "fault": fault, "max_norm": max_norm, "seeds": []}
                for seed in sorted({o.seed for o in runs}):
                    h = healthy.get((family, seed, max_norm))
                    u = next(o for o in runs if o.seed == seed and not o.guarded)
                    g = next(o for o in runs if o.seed == seed and o.guarded)
                    row["seeds"].append({
                        "seed": seed, "healthy": h.final_loss if h else None,
                        "unguarded": u.final_loss, "guarded": g.final_loss,
                        "after_fault": {"healthy": h.after_fault_loss if h else None,
                                        "unguarded": u.after_fault_loss, "guarded": g.after_fault_loss},
                        "unguarded_vs_healthy": u.final_loss / h.final_loss - 1 if h else None,
                        "guarded_vs_healthy": g.final_loss / h.final_loss - 1 if h else None,
                        "guard_skipped": g.first_skips, "guard_skips": g.skipped_for_spike,
                    })  # fmt: skip
                rows.append(row)
    return rows


def print_tables(faulty: list[dict], false_skips: dict) -> None:
    print(f"held-out loss {AFTER} steps after the fault's step (healthy -> unguarded / guarded), and at the end:")
    print("| family | fault | max_norm | after the fault | healthy, at the end | unguarded | guarded | the guard skipped |")
    print("|---|---|---|---|---|---|---|---|")
    for row in faulty:
        for s in row["seeds"]:
            a = s["after_fault"]
            skipped = ", ".join(map(str, s["guard_skipped"])) or "none"
            if s["guard_skips"] > len(s["guard_skipped"]):
                skipped += f", ... ({s['guard_skips']} in all)"
            print(
                f"| {row['family']} (seed {s['seed']}) | {row['fault']} | {row['max_norm']:g} "
                f"| {a['healthy']:.3f} -> {a['unguarded']:.3f} / {a['guarded']:.3f} | {s['healthy']:.3f} "
                f"| {s['unguarded']:.3f} ({s['unguarded_vs_healthy']:+.1%}) "
                f"| {s['guarded']:.3f} ({s['guarded_vs_healthy']:+.1%}) | {skipped} |"
            )
    print()
    print(
        f"healthy guarded runs: {false_skips['steps']} steps, {false_skips['skips']} false skips "
        f"({false_skips['per_10k']:.2f} per 10,000 steps); by family: {false_skips['by_family']}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one seed, short runs; writes nothing")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the same flags on every machine: one thread, a fixed order
    steps, at, healthy_steps = (300, 150, 300) if args.quick else (FAULT_STEPS, FAULT_AT, HEALTHY_STEPS)
    outcomes: list[Outcome] = []
    for family in FAMILIES:
        seeds = SEEDS[family][:1] if args.quick else SEEDS[family][:2]
        for seed in seeds:
            for max_norm in (math.inf, 1.0):
                outcomes.append(train(family, seed, steps, max_norm=max_norm, fault_at=at))
                for fault in FAULTS:
                    for guarded in (False, True):
                        outcomes.append(train(family, seed, steps, fault, guarded, max_norm, fault_at=at))
                print(f"{family} seed {seed} max_norm {max_norm:g}: done", file=sys.stderr, flush=True)
    healthy = []
    for family in FAMILIES:
        for seed in SEEDS[family][:1] if args.quick else SEEDS[family]:
            healthy.append(train(family, seed, healthy_steps, guarded=True))
    total = sum(o.steps for o in healthy)
    skips = sum(o.skipped_for_spike for o in healthy)
    by_family = {f: sum(o.skipped_for_spike for o in healthy if o.family == f) for f in FAMILIES}
    false_skips = {"steps": total, "skips": skips, "per_10k": skips / total * 1e4, "by_family": by_family,
                   "where": {f"{o.family}/{o.seed}": o.first_skips for o in healthy if o.first_skips}}  # fmt: skip
    faulty = faulty_table(outcomes, steps)
    print_tables(faulty, false_skips)
    if not args.quick:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        machine = {"cpu": _cpu_name(), "torch": torch.__version__, "python": platform.python_version(),
                   "threads": 1}  # fmt: skip
        record = {"machine": machine, "faulty": faulty, "false_skips": false_skips,
                  "runs": [asdict(o) for o in outcomes + healthy]}  # fmt: skip
        OUT.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
