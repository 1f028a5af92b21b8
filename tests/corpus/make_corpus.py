"""Regenerates the corpus: short real training runs with known causes, kept as test fixtures.

    python tests/corpus/make_corpus.py             # every run
    python tests/corpus/make_corpus.py NAME ...    # some of them
    python tests/corpus/make_corpus.py --list

Each run trains a small model on the CPU (seconds, one thread), logging every
step's gradient norm through fastnorm's own path: plain loops through a
GradNormMonitor into a JsonlLogger (with the loss given to ``update``, and
per-layer norms from LayerNorms where the case needs them), Lightning runs
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

tests/test_corpus.py reads the fixtures (nothing is retrained there).
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


def seed(n: int) -> None:
    torch.manual_seed(n)
    random.seed(n)


def sig(value: float) -> float | str:
    """4 significant digits; the words json and csv readers take for the rest."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return float(f"{value:.4g}")


def write(name: str, records: dict[int, dict], truth: dict) -> None:
    """``records``: step -> metrics. Writes metrics.csv (columns in first-seen order) and truth.json."""
    folder = HERE / name
    folder.mkdir(exist_ok=True)
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

    def __init__(self, window: int = 25, layers: fastnorm.LayerNorms | None = None, max_norm=None):
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
        """Records the step: ``norm`` as given, or from the LayerNorms (logged with the layers once
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
    """A 2-layer causal transformer over characters."""

    def __init__(self, vocab: int, d: int = 64, context: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(context, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
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
# The runs
# ----------------------------------------------------------------------------


def lm_run(name: str, steps: int, jump_at: int | None, factor: float, truth: dict) -> None:
    seed(0)
    vocab, batch = char_data()
    model = CharLM(vocab)
    base = 3e-3
    optimizer = torch.optim.AdamW(model.parameters(), lr=base, weight_decay=0.01)
    log = Plain()
    for step in range(steps):
        if step == jump_at:
            optimizer.param_groups[0]["lr"] = base * factor
        x, y = batch()
        loss = lm_loss(model, x, y)
        optimizer.zero_grad()
        loss.backward()
        log.update(step, fastnorm.total_norm(model.parameters()), loss)
        optimizer.step()
    write(name, log.records(), truth)


@run
def charlm_healthy():
    lm_run(
        "charlm_healthy",
        400,
        None,
        1.0,
        {
            "cause": "char-level transformer LM (2 layers, AdamW 3e-3) learning normally",
            "verdict": "stable",
            "onset": None,
            "action": None,
        },
    )


@run
def charlm_lr_x30():
    lm_run(
        "charlm_lr_x30",
        400,
        200,
        30.0,
        {
            "cause": "the char-level LM's AdamW learning rate multiplied by 30 at step 200",
            "verdict": "diverged",
            "onset": 200,
            "action": "Lower the learning rate",
        },
    )


def classify_run(
    name,
    model,
    optimizer,
    steps,
    truth,
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
    log = Plain(window, fastnorm.LayerNorms(model) if layers else None, max_norm)
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
    write(name, log.records(), truth)


@run
def mlp_healthy():
    seed(1)
    model = mlp([16, 64, 64, 4])
    classify_run(
        "mlp_healthy",
        model,
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        400,
        {
            "cause": "MLP on Gaussian blobs, SGD with momentum",
            "verdict": "stable",
            "onset": None,
            "action": None,
        },
    )


@run
def mlp_spikes():
    seed(2)
    model = mlp([16, 64, 64, 1])
    x_all, y_all = regression_data()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    outliers = [90, 180, 260, 330]
    log = Plain()
    for step in range(400):
        idx = torch.randint(0, len(x_all), (32,))
        y = y_all[idx]
        if step in outliers:
            y = y.clone()
            y[0] = 100.0  # one mislabelled sample: a target 100x outside the data's range
        loss = F.mse_loss(model(x_all[idx]), y)
        optimizer.zero_grad()
        loss.backward()
        log.update(step, fastnorm.total_norm(model.parameters()), loss)
        optimizer.step()
    write(
        "mlp_spikes",
        log.records(),
        {
            "cause": "a healthy MLP regression whose batches at steps 90, 180, 260 and 330 hold one "
            "gross outlier target each",
            "verdict": "stable",
            "onset": None,
            "action": None,
            "spikes": outliers,
            "spike_action": "check that batch",
        },
    )


@run
def nan_from_data():
    seed(3)
    model = mlp([16, 64, 64, 4])

    def poison(step, x):
        if step == 230:
            x = x.clone()
            x[5, 3] = math.nan  # a NaN feature in one sample
        return x

    classify_run(
        "nan_from_data",
        model,
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        300,
        {
            "cause": "one input sample holds a NaN at step 230; SGD applies the NaN gradient",
            "verdict": "nonfinite",
            "onset": 230,
            "action": "Check the data",
        },
        before_step=poison,
    )


@run
def explode_to_nan():
    seed(4)
    model = mlp([16, 64, 64, 1])
    x_all, y_all = regression_data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    log = Plain()
    for step in range(300):
        if step == 200:
            optimizer.param_groups[0]["lr"] = 1.0  # far past what SGD can take on this problem
        idx = torch.randint(0, len(x_all), (32,))
        loss = F.mse_loss(model(x_all[idx]), y_all[idx])
        optimizer.zero_grad()
        loss.backward()
        log.update(step, fastnorm.total_norm(model.parameters()), loss)
        optimizer.step()
    write(
        "explode_to_nan",
        log.records(),
        {
            "cause": "an MLP regression whose SGD learning rate goes from 0.01 to 1.0 at step 200: "
            "the norm explodes, then overflows to inf/NaN",
            "verdict": "nonfinite",
            "onset": 200,
            "onset_kind": "diverged",
            "action": "Lower the learning rate",
            "also": ["Re-run from the latest checkpoint"],
        },
    )


@run
def vanishing_depth():
    seed(5)
    model = mlp([16] + [32] * 39 + [4], act=nn.Sigmoid)
    classify_run(
        "vanishing_depth",
        model,
        torch.optim.SGD(model.parameters(), lr=0.05),
        200,
        {
            "cause": "a 40-layer sigmoid MLP: the first layers' gradients vanish from the start, "
            "the loss stays at chance",
            "verdict": "vanishing",
            "onset": 0,
            "action": "initialisation",
        },
        window=20,
        layers=True,
    )


@run
def vanishing_weight_decay():
    seed(6)
    model = mlp([16, 64, 64, 64, 4])
    x_all, y_all = blobs()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    log = Plain(10, fastnorm.LayerNorms(model))
    onset = None
    for step in range(300):
        if step == 50:
            optimizer.param_groups[0]["weight_decay"] = 1.0  # shrinks every weight 5% a step
        idx = torch.randint(0, len(x_all), (64,))
        loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
        optimizer.zero_grad()
        loss.backward()
        per_layer = log.update(step, loss=loss).tolist()
        spread = math.log10(max(per_layer) / max(min(per_layer), 1e-45))
        if spread >= 6 and onset is None:
            onset = step
        elif spread < 6:
            onset = None  # the onset is where the spread exceeds a million for good
        optimizer.step()
    write(
        "vanishing_weight_decay",
        log.records(),
        {
            "cause": "an MLP with biases whose weight decay goes from 0 to 1 at step 50: the weights "
            "collapse, the first layers' gradients vanish while the last bias keeps the total flat; the "
            "onset is the step from which the per-layer spread stays above 10^6 (every step measured)",
            "verdict": "vanishing",
            "onset": onset,
            "action": "Raise the learning rate",
        },
    )


@run
def deep_relu_small_init():
    seed(7)
    model = mlp([16] + [64] * 5 + [1], act=nn.ReLU, bias=False)
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(0.5)  # half the default initialisation: the signal shrinks layer by layer
    x_all, y_all = regression_data(2048)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    log = Plain()
    for step in range(300):
        idx = torch.randint(0, len(x_all), (256,))
        loss = F.mse_loss(model(x_all[idx]), y_all[idx])
        optimizer.zero_grad()
        loss.backward()
        log.update(step, fastnorm.total_norm(model.parameters()), loss)
        optimizer.step()
    write(
        "deep_relu_small_init",
        log.records(),
        {
            "cause": "a bias-free 6-layer ReLU MLP leaving its small initialisation: the norm grows "
            "by orders of magnitude while the loss falls steadily",
            "verdict": "stable",
            "onset": None,
            "action": None,
        },
    )


@run
def stalled_low_lr():
    seed(8)
    model = mlp([16, 64, 64, 4])
    classify_run(
        "stalled_low_lr",
        model,
        torch.optim.Adam(model.parameters(), lr=1e-6),
        300,
        {
            "cause": "an MLP trained with Adam at lr 1e-6: the loss never improves",
            "verdict": "stalled",
            "onset": 0,
            "action": "Raise the learning rate",
        },
    )


@run
def fp16_scaler():
    seed(9)
    model = mlp([16, 128, 128, 4], act=nn.ReLU)
    x_all, y_all = blobs()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**32, growth_interval=20)
    log = Plain()
    skipped = []
    for step in range(300):
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
    write(
        "fp16_scaler",
        log.records(),
        {
            "cause": "fp16 autocast with a dynamic GradScaler starting at 2**32 (growth every 20 steps): "
            "it skips overflowing steps, many at first, then one after each growth",
            "verdict": "stable",
            "onset": None,
            "action": None,
            "skipped": skipped,
        },
    )


@run
def fp16_overflow():
    seed(10)
    model = mlp([16, 64, 64, 1]).half()
    x_all, y_all = regression_data()
    x_all, y_all = x_all.half(), y_all.half()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    log = Plain()
    onset = None
    for step in range(250):
        idx = torch.randint(0, len(x_all), (32,))
        y = y_all[idx]
        if step >= 150:
            y = y * 1000  # the targets arrive unnormalised from here on: fp16 squares overflow
        loss = F.mse_loss(model(x_all[idx]), y)
        if onset is None and not torch.isfinite(loss):
            onset = step
        optimizer.zero_grad()
        loss.backward()
        log.update(step, fastnorm.total_norm(model.parameters()), loss)
        optimizer.step()
    write(
        "fp16_overflow",
        log.records(),
        {
            "cause": "a pure fp16 MLP whose regression targets arrive 1000x larger from step 150: "
            "the fp16 loss overflows to inf and the gradients turn inf/NaN",
            "verdict": "nonfinite",
            "onset": onset,
            "action": "fp32",
        },
    )


@run
def mlp_clipped_lr_x300():
    seed(13)
    model = mlp([16, 64, 64, 1])
    x_all, y_all = regression_data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    log = Plain(max_norm=1.0)
    for step in range(300):
        if step == 150:
            optimizer.param_groups[0]["lr"] = 3.0
        idx = torch.randint(0, len(x_all), (32,))
        loss = F.mse_loss(model(x_all[idx]), y_all[idx])
        optimizer.zero_grad()
        loss.backward()
        log.update(step, fastnorm.clip_(model.parameters(), 1.0), loss)
        optimizer.step()
    write(
        "mlp_clipped_lr_x300",
        log.records(),
        {
            "cause": "an MLP regression clipped at max_norm=1 whose SGD learning rate goes from 0.01 to "
            "3.0 at step 150: clipping bounds each update, yet the run diverges",
            "verdict": "diverged",
            "onset": 150,
            "action": "Lower the learning rate",
            "also": ["Tighten the gradient clipping: max_norm=1 is set"],
        },
    )


def lightning_run(name: str, module, steps: int, truth: dict) -> None:
    """Fits ``module`` with GradNormCallback and LearningRateMonitor into a CSVLogger; keeps its CSV."""
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
    write(name, records, truth)


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
def lightning_healthy():
    seed(11)
    x_all, y_all = regression_data(4096)
    batches = [(x_all[i : i + 64], y_all[i : i + 64]) for i in range(0, 4096, 64)] * 8
    model = mlp([16, 64, 64, 1])
    warmup = 50

    def schedule(step):
        return min(1.0, (step + 1) / warmup)  # linear warmup, then constant

    module = lightning_module(model, lambda m, x, y: F.mse_loss(m(x), y), batches, 3e-3, schedule)
    lightning_run(
        "lightning_healthy",
        module,
        400,
        {
            "cause": "a Lightning MLP regression, AdamW with a 50-step linear warmup",
            "verdict": "stable",
            "onset": None,
            "action": None,
        },
    )


@run
def lightning_lr_x300():
    seed(12)
    vocab, batch = char_data()
    batches = [batch() for _ in range(400)]
    jump = 200

    def schedule(step):
        return 300.0 if step >= jump else 1.0

    module = lightning_module(CharLM(vocab), lm_loss, batches, 3e-4, schedule)
    lightning_run(
        "lightning_lr_x300",
        module,
        400,
        {
            "cause": "a Lightning char-level transformer LM whose AdamW learning rate is multiplied by 300 "
            "(3e-4 to 9e-2) at step 200 by its schedule",
            "verdict": "diverged",
            "onset": jump,
            "action": "Lower the learning rate",
        },
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="runs to regenerate (default: all)")
    parser.add_argument("--list", action="store_true", help="list the runs")
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
        RUNS[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
