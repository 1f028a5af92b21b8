"""Regenerates the corpus: short real training runs with known causes, kept as test fixtures.

    python tests/corpus/make_corpus.py             # every run
    python tests/corpus/make_corpus.py NAME ...    # some of them
    python tests/corpus/make_corpus.py --list
    python tests/corpus/make_corpus.py --seed 1 --out /tmp/runs   # the same runs on other seeds

Each run trains a small model on the CPU (seconds, one thread), logging every
step's gradient norm through fastnorm's own path: plain loops through a
GradNormMonitor into a JsonlLogger (with the loss given to ``update``, and
per-layer norms from LayerGradNorms where the case needs them), Lightning runs
through GradNormCallback into Lightning's CSVLogger. Quantities a trainer logs
by itself beside the norm (the learning rate, a loss scaler's scale) are added
by step, as a trainer writing one metrics file would.

Each run writes ``tests/corpus/NAME/metrics.csv`` (every logged step kept;
values rounded to 4 significant digits, so that a fixture is a few KB) and
``truth.json``, all decided here from what the script did (the step it changed
the learning rate, fed a NaN, ...), never from the diagnosis:

* ``verdict``: the verdict expected;
* ``onset``: the step the trouble starts (None for a healthy run), and
  ``onset_kind``, the kind of event that must start there (default: the verdict);
* ``action``: a phrase the advice of that event must hold; ``also``: phrases
  the diagnosis's actions must hold besides;
* case-specific facts: ``spikes`` (steps of planted outliers) with
  ``spike_action``, ``skipped`` (the steps the loss scaler skipped).

Each run is a function whose keyword arguments (the seed, the step the trouble
starts, the learning-rate factor, the model's size, the run's length) default
to the corpus's values and which returns the records and the truth; held-out
variations of every run come from tests/corpus/heldout.py. tests/test_corpus.py
reads the fixtures (nothing is retrained there).
"""

from __future__ import annotations

import argparse
import builtins
import csv
import json
import math
import random
import sys
import tempfile
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import fastnorm

HERE = Path(__file__).resolve().parent
RUNS = {}


def run(fn):
    RUNS[fn.__name__] = fn
    return fn


def reseed(n: int) -> None:
    torch.manual_seed(n)
    random.seed(n)


def sig(value: float) -> float | str:
    """4 significant digits; the words json and csv readers take for the rest."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return float(f"{value:.4g}")


def short(value: float) -> str:
    """A rate in a cause's words: 1e-6, 9e-2."""
    return f"{value:.0e}".replace("e-0", "e-") if value < 0.1 else f"{value:g}"


def undone(records: dict[int, dict], onset: int) -> bool:
    """Whether the run lost all it had learned after ``onset``: its loss stayed above its initial level
    (the median of its first 5 values), or was not finite, for 10 consecutive steps. A learning-rate
    change that does less was survived, whether or not the run later learned it all again."""
    losses = [
        (s, records[s]["gradient_norm_loss"]) for s in sorted(records) if "gradient_norm_loss" in records[s]
    ]
    initial = sorted(v for _, v in losses[:5])[2]
    streak = 0
    for step, value in losses:
        streak = streak + 1 if step >= onset and not value <= initial else 0
        if streak == 10:
            return True
    return False


def lr_change(
    records: dict[int, dict], onset: int, cause: str, diverged: str = "", **more
) -> tuple[dict[int, dict], dict]:
    """The truth of a learning-rate change at ``onset``: a divergence (``diverged`` added to the cause,
    ``more`` to the truth) where it undid the run."""
    if undone(records, onset):
        truth = {"cause": cause + diverged, "verdict": "diverged", "onset": onset}
        return records, {**truth, "action": "Lower the learning rate", **more}
    cause += "; the loss never went back above its initial level: survived"
    return records, {"cause": cause, "verdict": "stable", "onset": None, "action": None}


def write(folder: Path, records: dict[int, dict], truth: dict) -> None:
    """``records``: step -> metrics. Writes metrics.csv (columns in first-seen order) and truth.json."""
    name = folder.name
    folder.mkdir(parents=True, exist_ok=True)
    columns = ["step"]
    for metrics in records.values():
        columns += [k for k in metrics if k not in columns]
    with open(folder / "metrics.csv", "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(columns)
        for step in sorted(records):
            metrics = records[step]
            writer.writerow([step] + [sig(metrics[c]) if c in metrics else "" for c in columns[1:]])
    (folder / "truth.json").write_text(json.dumps({"name": name, **truth}, indent=2) + "\n")
    size = (folder / "metrics.csv").stat().st_size
    print(f"{name}: {len(records)} steps, {size / 1024:.1f} KB, truth {truth['verdict']} @ {truth['onset']}")


class Plain:
    """A plain loop's logging: a GradNormMonitor into a JsonlLogger, read back as step -> metrics."""

    def __init__(self, window: int = 25, layers: fastnorm.LayerGradNorms | None = None, max_norm=None):
        self.tmp = tempfile.TemporaryDirectory()
        self.path = Path(self.tmp.name) / "metrics.jsonl"
        self.layers = layers
        self.monitor = fastnorm.GradNormMonitor(
            window,
            [fastnorm.JsonlLogger(self.path)],
            max_norm=max_norm,
            layer_names=layers.names if layers is not None else None,
            diagnose=False,
        )
        self.extra: dict[int, dict] = {}

    def update(self, step: int, norm=None, loss=None, **extra: float):
        """Records the step: ``norm`` as given, or from the LayerGradNorms (logged with the layers once
        per window); returns the per-layer norms when computed."""
        per_layer = None
        if norm is None:
            norm, per_layer = self.layers()
        self.monitor.update(norm, step, layers=per_layer if self.monitor.due else None, loss=loss)
        if extra:
            self.extra[step] = extra
        return per_layer

    def records(self) -> dict[int, dict]:
        self.monitor.close()
        records = {}
        keep = ("gradient_norm", "gradient_norm_loss", "gradient_norm_max_norm")
        for line in self.path.read_text().splitlines():
            r = json.loads(line)
            records[r["step"]] = {
                k: v for k, v in r.items() if k in keep or k.startswith("gradient_norm_layer/")
            }
        for step, extra in self.extra.items():
            records[step].update(extra)
        self.tmp.cleanup()
        return records


# ----------------------------------------------------------------------------
# Data and models
# ----------------------------------------------------------------------------


def text() -> str:
    """About 60 KB of English: the docstrings of Python's builtins."""
    docs = [getattr(builtins, n).__doc__ or "" for n in sorted(dir(builtins))]
    return "\n".join(d for d in docs if len(d) > 40)


class CharLM(nn.Module):
    """A small causal transformer over characters (``depth`` pre-norm layers of width ``d``)."""

    def __init__(self, vocab: int, d: int = 64, context: int = 32, depth: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(context, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(context))

    def forward(self, x):
        h = self.embed(x) + self.pos[: x.shape[1]]
        return self.head(self.blocks(h, mask=self.mask, is_causal=True))


def char_data(context: int = 32):
    data = text()
    chars = sorted(set(data))
    ids = torch.tensor([chars.index(c) for c in data])

    def batch(size: int = 32):
        start = torch.randint(0, len(ids) - context - 1, (size,))
        x = torch.stack([ids[s : s + context] for s in start])
        y = torch.stack([ids[s + 1 : s + context + 1] for s in start])
        return x, y

    return len(chars), batch


def lm_loss(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def regression_data(n: int = 512, d: int = 16):
    x = torch.randn(n, d)
    y = (x[:, :4].sum(1, keepdim=True)).sin() + 0.1 * x[:, 4:5]
    return x, y


def blobs(n: int = 1024, d: int = 16, classes: int = 4):
    """Gaussian blobs: a classification a small MLP learns to near zero loss."""
    centers = torch.randn(classes, d) * 2
    labels = torch.randint(0, classes, (n,))
    return centers[labels] + torch.randn(n, d), labels


def mlp(sizes, act=nn.Tanh, bias=True):
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b, bias=bias))
        if i < len(sizes) - 2:
            layers.append(act())
    return nn.Sequential(*layers)


# ----------------------------------------------------------------------------
# The runs: each returns (records, truth); its keyword arguments default to the corpus's run
# ----------------------------------------------------------------------------


def lm_run(seed, steps, jump_at, factor, width, depth, layers, log_lr):
    reseed(seed)
    vocab, batch = char_data()
    model = CharLM(vocab, width, depth=depth)
    base = 3e-3
    optimizer = torch.optim.AdamW(model.parameters(), lr=base, weight_decay=0.01)
    log = Plain(layers=fastnorm.LayerGradNorms(model) if layers else None)
    for step in range(steps):
        if step == jump_at:
            optimizer.param_groups[0]["lr"] = base * factor
        x, y = batch()
        loss = lm_loss(model, x, y)
        optimizer.zero_grad()
        loss.backward()
        extra = {"lr": optimizer.param_groups[0]["lr"]} if log_lr else {}
        if layers:
            log.update(step, loss=loss, **extra)
        else:
            log.update(step, fastnorm.total_norm(model.parameters()), loss, **extra)
        optimizer.step()
    return log.records()


@run
def charlm_healthy(seed=0, steps=400, width=64, depth=2, layers=False, log_lr=False):
    return lm_run(seed, steps, None, 1.0, width, depth, layers, log_lr), {
        "cause": f"char-level transformer LM ({depth} layers, AdamW 3e-3) learning normally",
        "verdict": "stable",
        "onset": None,
        "action": None,
    }


@run
def charlm_lr_x30(seed=0, steps=400, onset=200, factor=30.0, width=64, depth=2, layers=False, log_lr=False):
    records = lm_run(seed, steps, onset, factor, width, depth, layers, log_lr)
    return lr_change(
        records, onset, f"the char-level LM's AdamW learning rate multiplied by {factor:g} at step {onset}"
    )


@run
def charlm_lr_x10(seed=101, steps=400, onset=200, width=64, depth=2, layers=False, log_lr=False):
    """A jump the LM recovers from only by learning again: its loss climbs above where the run began,
    then falls back over a hundred steps."""
    return charlm_lr_x30(seed, steps, onset, 10.0, width, depth, layers, log_lr)


def classify_run(
    model,
    optimizer,
    steps,
    *,
    data=None,
    window=25,
    layers=False,
    before_step=None,
    batch_size=64,
    max_norm=None,
):
    """A classification loop on Gaussian blobs; ``before_step(step, x)`` may change the batch or optimizer."""
    x_all, y_all = data if data is not None else blobs()
    log = Plain(window, fastnorm.LayerGradNorms(model) if layers else None, max_norm)
    for step in range(steps):
        idx = torch.randint(0, len(x_all), (batch_size,))
        x, y = x_all[idx], y_all[idx]
        if before_step is not None:
            x = before_step(step, x)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        if layers:
            log.update(step, loss=loss)
        elif max_norm is not None:
            log.update(step, fastnorm.clip_(model.parameters(), max_norm), loss)
        else:
            log.update(step, fastnorm.total_norm(model.parameters()), loss)
        optimizer.step()
    return log.records()


@run
def mlp_healthy(seed=1, steps=400, width=64, depth=2, layers=False):
    reseed(seed)
    model = mlp([16] + [width] * depth + [4])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return classify_run(model, optimizer, steps, layers=layers), {
        "cause": "MLP on Gaussian blobs, SGD with momentum",
        "verdict": "stable",
        "onset": None,
        "action": None,
    }


@run
def mlp_spikes(seed=2, steps=400, outliers=(90, 180, 260, 330), target=100.0, width=64):
    reseed(seed)
    model = mlp([16, width, width, 1])
    x_all, y_all = regression_data()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    log = Plain()
    for step in range(steps):
        idx = torch.randint(0, len(x_all), (32,))
        y = y_all[idx]
        if step in outliers:
            y = y.clone()
            y[0] = target  # one mislabelled sample: a target far outside the data's range (about +-1)
        loss = F.mse_loss(model(x_all[idx]), y)
        optimizer.zero_grad()
        loss.backward()
        log.update(step, fastnorm.total_norm(model.parameters()), loss)
        optimizer.step()
    outliers = [s for s in outliers if s < steps]
    at = ", ".join(map(str, outliers[:-1])) + f" and {outliers[-1]}"
    return log.records(), {
        "cause": f"a healthy MLP regression whose batches at steps {at} hold one gross outlier target each",
        "verdict": "stable",
        "onset": None,
        "action": None,
        "spikes": outliers,
        "spike_action": "check that batch",
    }


@run
def nan_from_data(seed=3, steps=300, onset=230, width=64):
    reseed(seed)
    model = mlp([16, width, width, 4])

    def poison(step, x):
        if step == onset:
            x = x.clone()
            x[5, 3] = math.nan  # a NaN feature in one sample
        return x

    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return classify_run(model, optimizer, steps, before_step=poison), {
        "cause": f"one input sample holds a NaN at step {onset}; SGD applies the NaN gradient",
        "verdict": "nonfinite",
        "onset": onset,
        "action": "Check the data",
    }


@run
def explode_to_nan(seed=4, steps=300, onset=200, lr=1.0, width=64, log_lr=False):
    reseed(seed)
    model = mlp([16, width, width, 1])
    x_all, y_all = regression_data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    log = Plain()
    overflowed = False
    for step in range(steps):
        if step == onset:
            optimizer.param_groups[0]["lr"] = lr  # far past what SGD can take on this problem
        idx = torch.randint(0, len(x_all), (32,))
        loss = F.mse_loss(model(x_all[idx]), y_all[idx])
        overflowed |= not math.isfinite(loss.item())
        optimizer.zero_grad()
        loss.backward()
        extra = {"lr": optimizer.param_groups[0]["lr"]} if log_lr else {}
        log.update(step, fastnorm.total_norm(model.parameters()), loss, **extra)
        optimizer.step()
    cause = f"an MLP regression whose SGD learning rate goes from 0.01 to {lr!r} at step {onset}"
    if not overflowed:
        return lr_change(log.records(), onset, cause, ": the norm explodes")
    return log.records(), {
        "cause": cause + ": the norm explodes, then overflows to inf/NaN",
        "verdict": "nonfinite",
        "onset": onset,
        "onset_kind": "diverged",
        "action": "Lower the learning rate",
        "also": ["Re-run from the latest checkpoint"],
    }


@run
def vanishing_depth(seed=5, steps=200, depth=40, width=32, window=20, layers=True):
    reseed(seed)
    model = mlp([16] + [width] * (depth - 1) + [4], act=nn.Sigmoid)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return classify_run(model, optimizer, steps, window=window, layers=layers), {
        "cause": f"a {depth}-layer sigmoid MLP: the first layers' gradients vanish from the start, "
        "the loss stays at chance",
        "verdict": "vanishing",
        "onset": 0,
        "action": "initialisation",
    }


@run
def vanishing_weight_decay(seed=6, steps=300, onset=50, decay=1.0, width=64, window=10, layers=True):
    reseed(seed)
    model = mlp([16, width, width, width, 4])
    x_all, y_all = blobs()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    all_layers = fastnorm.LayerGradNorms(model)
    log = Plain(window, all_layers if layers else None)
    vanished = None
    for step in range(steps):
        if step == onset:
            optimizer.param_groups[0]["weight_decay"] = decay  # shrinks every weight lr * decay a step
        idx = torch.randint(0, len(x_all), (64,))
        loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
        optimizer.zero_grad()
        loss.backward()
        if layers:
            per_layer = log.update(step, loss=loss).tolist()
        else:
            total, per_layer = all_layers()
            log.update(step, total, loss)
            per_layer = per_layer.tolist()
        spread = math.log10(max(per_layer) / max(min(per_layer), 1e-45))
        if spread >= 6 and vanished is None:
            vanished = step
        elif spread < 6:
            vanished = None  # the onset is where the spread exceeds a million for good
        optimizer.step()
    cause = f"an MLP with biases whose weight decay goes from 0 to {decay:g} at step {onset}: the weights "
    if vanished is None:  # shrinking, they undid the learning before any layer's gradient vanished
        return log.records(), {
            "cause": cause + "shrink and the loss goes back up; the per-layer spread never stays above 10^6",
            "verdict": "stalled",
            "onset": None,
            "action": "weight decay",
        }
    return log.records(), {
        "cause": cause + "collapse, the first layers' gradients vanish while the last bias keeps the total "
        "flat; the onset is the step from which the per-layer spread stays above 10^6 (every step measured)",
        "verdict": "vanishing",
        "onset": vanished,
        "action": "Raise the learning rate",
    }


@run
def deep_relu_small_init(seed=7, steps=300, depth=5, width=64, init=0.5, layers=False):
    reseed(seed)
    model = mlp([16] + [width] * depth + [1], act=nn.ReLU, bias=False)
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(init)  # below the default initialisation: the signal shrinks layer by layer
    x_all, y_all = regression_data(2048)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    log = Plain(layers=fastnorm.LayerGradNorms(model) if layers else None)
    for step in range(steps):
        idx = torch.randint(0, len(x_all), (256,))
        loss = F.mse_loss(model(x_all[idx]), y_all[idx])
        optimizer.zero_grad()
        loss.backward()
        if layers:
            log.update(step, loss=loss)
        else:
            log.update(step, fastnorm.total_norm(model.parameters()), loss)
        optimizer.step()
    return log.records(), {
        "cause": f"a bias-free {depth + 1}-layer ReLU MLP leaving its small initialisation: the norm grows "
        "by orders of magnitude while the loss falls steadily",
        "verdict": "stable",
        "onset": None,
        "action": None,
    }


@run
def stalled_low_lr(seed=8, steps=300, lr=1e-6, width=64):
    reseed(seed)
    model = mlp([16, width, width, 4])
    return classify_run(model, torch.optim.Adam(model.parameters(), lr=lr), steps), {
        "cause": f"an MLP trained with Adam at lr {short(lr)}: the loss never improves",
        "verdict": "stalled",
        "onset": 0,
        "action": "Raise the learning rate",
    }


@run
def fp16_scaler(seed=9, steps=300, init_scale=2.0**32, growth=20, width=128):
    reseed(seed)
    model = mlp([16, width, width, 4], act=nn.ReLU)
    x_all, y_all = blobs()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth)
    log = Plain()
    skipped = []
    for step in range(steps):
        idx = torch.randint(0, len(x_all), (64,))
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        scale = scaler.get_scale()
        log.update(step, fastnorm.total_norm(model.parameters()), loss, loss_scale=scale)
        scaler.step(optimizer)
        scaler.update()
        if scaler.get_scale() < scale:
            skipped.append(step)  # the scaler found inf/NaN gradients and skipped the step
    return log.records(), {
        "cause": f"fp16 autocast with a dynamic GradScaler starting at 2**{math.log2(init_scale):g} (growth "
        f"every {growth} steps): it skips overflowing steps, many at first, then one after each growth",
        "verdict": "stable",
        "onset": None,
        "action": None,
        "skipped": skipped,
    }


@run
def fp16_overflow(seed=10, steps=250, onset=150, factor=1000.0, width=64):
    reseed(seed)
    model = mlp([16, width, width, 1]).half()
    x_all, y_all = regression_data()
    x_all, y_all = x_all.half(), y_all.half()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    log = Plain()
    overflow = None
    for step in range(steps):
        idx = torch.randint(0, len(x_all), (32,))
        y = y_all[idx]
        if step >= onset:
            y = y * factor  # the targets arrive unnormalised from here on: fp16 squares overflow
        loss = F.mse_loss(model(x_all[idx]), y)
        if overflow is None and not torch.isfinite(loss):
            overflow = step
        optimizer.zero_grad()
        loss.backward()
        log.update(step, fastnorm.total_norm(model.parameters()), loss)
        optimizer.step()
    return log.records(), {
        "cause": f"a pure fp16 MLP whose regression targets arrive {factor:g}x larger from step {onset}: "
        "the fp16 loss overflows to inf and the gradients turn inf/NaN",
        "verdict": "nonfinite",
        "onset": overflow,
        "action": "fp32",
    }


@run
def mlp_clipped_lr_x300(seed=13, steps=300, onset=150, lr=3.0, max_norm=1.0, log_lr=False):
    reseed(seed)
    model = mlp([16, 64, 64, 1])
    x_all, y_all = regression_data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    log = Plain(max_norm=max_norm)
    for step in range(steps):
        if step == onset:
            optimizer.param_groups[0]["lr"] = lr
        idx = torch.randint(0, len(x_all), (32,))
        loss = F.mse_loss(model(x_all[idx]), y_all[idx])
        optimizer.zero_grad()
        loss.backward()
        extra = {"lr": optimizer.param_groups[0]["lr"]} if log_lr else {}
        log.update(step, fastnorm.clip_(model.parameters(), max_norm), loss, **extra)
        optimizer.step()
    cause = (
        f"an MLP regression clipped at max_norm={max_norm:g} whose SGD learning rate goes from 0.01 "
        f"to {lr!r} at step {onset}"
    )
    also = [f"Tighten the gradient clipping: max_norm={max_norm:g} is set"]
    diverged = ": clipping bounds each update, yet the run diverges"
    return lr_change(log.records(), onset, cause, diverged, also=also)


def lightning_run(module, steps: int) -> dict[int, dict]:
    """Fits ``module`` with GradNormCallback and LearningRateMonitor into a CSVLogger; returns its CSV."""
    import lightning
    from lightning.pytorch.callbacks import LearningRateMonitor
    from lightning.pytorch.loggers import CSVLogger

    from fastnorm.integrations.lightning import GradNormCallback

    with tempfile.TemporaryDirectory() as tmp:
        trainer = lightning.Trainer(
            max_steps=steps,
            logger=CSVLogger(tmp, name="csv"),
            callbacks=[GradNormCallback(log_every_n_steps=25, diagnose=False), LearningRateMonitor("step")],
            accelerator="cpu",
            log_every_n_steps=1,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(module)
        records: dict[int, dict] = {}
        with open(Path(trainer.logger.log_dir) / "metrics.csv", newline="") as f:
            for row in csv.DictReader(f):
                metrics = {
                    k: float(v) for k, v in row.items() if v not in ("", None) and k not in ("step", "epoch")
                }
                records.setdefault(int(row["step"]), {}).update(metrics)
    return records


def lightning_module(model, loss_fn, batches, lr: float, schedule):
    """A LightningModule around ``model``: AdamW with the per-step ``schedule`` (a LambdaLR factor)."""
    import lightning

    class Module(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model

        def training_step(self, batch, batch_idx):
            loss = loss_fn(self.model, *batch)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            optimizer = torch.optim.AdamW(self.parameters(), lr=lr, weight_decay=0.01)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

        def train_dataloader(self):
            return torch.utils.data.DataLoader(batches, batch_size=None)

    return Module()


@run
def lightning_healthy(seed=11, steps=400, warmup=50, width=64):
    reseed(seed)
    x_all, y_all = regression_data(4096)
    batches = [(x_all[i : i + 64], y_all[i : i + 64]) for i in range(0, 4096, 64)] * (steps // 64 + 1)
    model = mlp([16, width, width, 1])

    def schedule(step):
        return min(1.0, (step + 1) / warmup)  # linear warmup, then constant

    module = lightning_module(model, lambda m, x, y: F.mse_loss(m(x), y), batches, 3e-3, schedule)
    return lightning_run(module, steps), {
        "cause": f"a Lightning MLP regression, AdamW with a {warmup}-step linear warmup",
        "verdict": "stable",
        "onset": None,
        "action": None,
    }


@run
def lightning_lr_x300(seed=12, steps=400, onset=200, factor=300.0, width=64):
    reseed(seed)
    vocab, batch = char_data()
    batches = [batch() for _ in range(steps)]

    def schedule(step):
        return factor if step >= onset else 1.0

    module = lightning_module(CharLM(vocab, width), lm_loss, batches, 3e-4, schedule)
    cause = (
        "a Lightning char-level transformer LM whose AdamW learning rate is multiplied by "
        f"{factor:g} (3e-4 to {short(3e-4 * factor)}) at step {onset} by its schedule"
    )
    return lr_change(lightning_run(module, steps), onset, cause)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="runs to regenerate (default: all)")
    parser.add_argument("--list", action="store_true", help="list the runs")
    parser.add_argument("--seed", type=int, help="train every run from this seed instead of its own")
    parser.add_argument("--out", type=Path, default=HERE, help="write the runs here (default: the corpus)")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(RUNS))
        return 0
    unknown = [n for n in args.names if n not in RUNS]
    if unknown:
        parser.error(f"unknown runs: {', '.join(unknown)}")
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", UserWarning)
    for name in args.names or RUNS:
        records, truth = RUNS[name]() if args.seed is None else RUNS[name](seed=args.seed)
        write(args.out / name, records, truth)
    return 0


if __name__ == "__main__":
    sys.exit(main())
