"""Regenerates the families corpus: real CPU training runs of six model families, causes injected here.

    python tests/families/make_runs.py                   # every run of every set
    python tests/families/make_runs.py --set tuning      # the runs the diagnosis is tuned on
    python tests/families/make_runs.py --set tuning2     # a rerun on other seeds and onsets, tuned on too
    python tests/families/make_runs.py --set tuning3     # a second rerun, held out until looked at
    python tests/families/make_runs.py --set tuning4     # a third rerun, held out until looked at
    python tests/families/make_runs.py --set heldout     # the rerun kept out of the tuning
    python tests/families/make_runs.py NAME ...          # some runs (a name of every set)
    python tests/families/make_runs.py --list            # names, family and cause

Needs scikit-learn (its bundled data sets: digits, iris, wine, breast_cancer,
diabetes; nothing is downloaded); the tests never retrain and never import it.

The families: a recurrent net (a GRU, tanh cells) over sequences of 60 steps, a small CNN on the digits,
a post-LayerNorm transformer over characters, tabular MLPs on iris, wine,
breast_cancer and diabetes, a tanh autoencoder of the digits, and precision
variants (fp16 autocast with and without a GradScaler, pure bf16). Each run is a
spec: a family, a cause (or none: healthy) and the keyword arguments of its run
in each set, each set on its own seeds, with other onsets and, where it makes
sense, other magnitudes and logging intervals. ``tuning`` and ``tuning2`` to
``tuning4`` (the first three held-out reruns, each looked at since) are what
the diagnosis is tuned on; ``heldout`` is scored once the code is final and
never tuned on.

Each run logs through fastnorm's own path, as a user's loop would: a
GradNormMonitor told the optimizer (its learning rate and settings read once per
window) and, where the user would know it, the precision, into a JsonlLogger,
every step's norm with its loss (every ``every``-th step for a thinned log). The
log is kept as ``metrics.csv`` (values to 4 significant digits, a few KB) beside
``truth.json``, written here from what the script did, never from the diagnosis:

* ``cause``, ``healthy``, ``family``, ``precision``, ``optimizer``, ``every``
  (the logging interval in steps) and ``window`` (the monitor's, in updates);
* ``verdicts``: the acceptable verdicts; ``onset``: the step the fault was
  injected (None when healthy); ``actions``: the acceptable first actions (ids);
  ``abrupt``: the fault is a one-step change;
* ``blowup_step``: the first step whose loss is not finite, or 10x its running
  level (the median of the 20 losses before it) and held there (the median of
  the 10 steps from it 10x that level too), from every step's loss; None if none.

A spec whose injected cause does not do what it should (a learning-rate jump the
run survives, or whose loss only blips for a batch; labels that still teach
something) stops the script with the measurement, rather than writing a truth
that the run does not bear out.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import csv
import json
import math
import random
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import fastnorm

HERE = Path(__file__).resolve().parent
SETS = ("tuning", "tuning2", "tuning3", "tuning4", "heldout")
STEPS = 300
THINNED_STEPS = 1000  # a log of every 10th step: 100 points
KEEP = ("gradient_norm", "gradient_norm_loss", "gradient_norm_lr")  # and the settings, by prefix


# ----------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------


def _sklearn(name: str):
    try:
        from sklearn import datasets
    except ImportError as exc:
        raise SystemExit("make_runs.py needs scikit-learn to regenerate: pip install scikit-learn") from exc
    return getattr(datasets, f"load_{name}")()


def tabular(name: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A bundled scikit-learn data set, inputs standardised: (x, y, classes; 0 for a regression)."""
    d = _sklearn(name)
    x = torch.tensor(d.data, dtype=torch.float32)
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    if name == "diabetes":
        y = torch.tensor(d.target, dtype=torch.float32)[:, None]
        return x, (y - y.mean()) / y.std(), 0
    y = torch.tensor(d.target, dtype=torch.long)
    return x, y, int(y.max()) + 1


def digits_images() -> tuple[torch.Tensor, torch.Tensor]:
    d = _sklearn("digits")
    return torch.tensor(d.images, dtype=torch.float32)[:, None] / 16.0, torch.tensor(d.target)


def sequences(n: int = 2048, length: int = 60) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of noise whose class is the sign of their sum: the net must carry it across every step."""
    x = torch.randn(n, length, 1)
    return x, (x[:, :, 0].sum(1) > 0).long()


def characters(context: int = 24) -> tuple[int, Callable[[int], tuple[torch.Tensor, torch.Tensor]]]:
    """Next-character prediction over Python's builtin docstrings (about 60 KB of English)."""
    text = "\n".join(
        d for d in (getattr(builtins, n).__doc__ or "" for n in sorted(dir(builtins))) if len(d) > 40
    )
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(c) for c in text])

    def batch(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = torch.randint(0, len(ids) - context - 1, (size,))
        return torch.stack([ids[s : s + context] for s in start]), torch.stack(
            [ids[s + 1 : s + context + 1] for s in start]
        )

    return len(chars), batch


# ----------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------


def mlp(sizes: list[int], act: type[nn.Module] = nn.Tanh, batchnorm: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers += [nn.BatchNorm1d(b), act()] if batchnorm else [act()]
    return nn.Sequential(*layers)


class RNN(nn.Module):
    """A GRU over the whole sequence: its tanh cell carries the sum across every step."""

    def __init__(self, hidden: int = 32):
        super().__init__()
        self.rnn = nn.GRU(1, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 2)

    def forward(self, x):
        return self.head(self.rnn(x)[0][:, -1])


class CNN(nn.Module):
    def __init__(self, batchnorm: bool = False):
        super().__init__()
        norm = (lambda c: nn.BatchNorm2d(c)) if batchnorm else (lambda c: nn.Identity())
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1),
            norm(8),
            nn.ReLU(),
            nn.Conv2d(8, 16, 3, padding=1),
            norm(16),
            nn.ReLU(),
        )
        self.head = nn.Linear(16 * 16, 10)

    def forward(self, x):
        return self.head(F.max_pool2d(self.features(x), 2).flatten(1))


class PostLN(nn.Module):
    """A causal transformer over characters with the original post-LayerNorm blocks (norm_first=False)."""

    def __init__(self, vocab: int, d: int = 48, depth: int = 2, context: int = 24):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(context, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.0, batch_first=True, norm_first=False)
        self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(context))

    def forward(self, x):
        h = self.blocks(self.embed(x) + self.pos[: x.shape[1]], mask=self.mask, is_causal=True)
        return self.head(h)


# ----------------------------------------------------------------------------
# The loop: every run trains through it and logs through fastnorm's monitor
# ----------------------------------------------------------------------------


@dataclass
class Loop:
    """How a run trains: what changes when. Every field defaults to a healthy run."""

    steps: int = STEPS
    batch: int = 32
    lr_factor: Callable[[int], float] = lambda step: 1.0
    every: int = 1  # log every this many steps (a thinned log)
    window: int = 25  # the monitor's window, in logged steps
    precision: str | None = None  # what the monitor is told (None: the user did not say)
    autocast_from: int | None = None  # fp16 autocast from this step on
    scaler: bool = False  # a GradScaler around the fp16 steps
    loss_scale: float = 1.0  # the loss backward runs on is this times the logged one
    shuffle_labels: bool = False
    dtype: torch.dtype = torch.float32


@dataclass
class Trained:
    records: dict[int, dict]  # step -> metrics, as logged
    losses: list[float]  # every step's loss, logged or not
    optimizer: str  # its class


def train(model: nn.Module, optimizer: torch.optim.Optimizer, data, loss_fn, loop: Loop) -> Trained:
    """Trains ``model`` on ``data`` (``data(step, size) -> (x, y)``) and logs it through a GradNormMonitor."""
    model.to(loop.dtype)
    bases = [g["lr"] for g in optimizer.param_groups]
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16) if loop.scaler else None
    losses: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "metrics.jsonl"
        monitor = fastnorm.GradNormMonitor(
            loop.window,
            [fastnorm.JsonlLogger(path)],
            optimizer=optimizer,
            precision=loop.precision,
            diagnose=False,
        )
        with monitor:
            for step in range(loop.steps):
                for group, base in zip(optimizer.param_groups, bases):
                    group["lr"] = base * loop.lr_factor(step)
                x, y = data(step, loop.batch)
                if loop.dtype != torch.float32 and x.is_floating_point():
                    x = x.to(loop.dtype)
                on = loop.autocast_from is not None and step >= loop.autocast_from
                context = torch.autocast("cpu", dtype=torch.float16) if on else contextlib.nullcontext()
                with context:
                    loss = loss_fn(model, x, y).float()
                optimizer.zero_grad()
                scaled = loss * loop.loss_scale
                (scaler.scale(scaled) if scaler is not None else scaled).backward()
                if scaler is not None:
                    scaler.unscale_(optimizer)
                norm = fastnorm.total_norm(model.parameters())
                if step % loop.every == 0:
                    monitor.update(norm, step, loss=loss.detach())
                if scaler is not None:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                losses.append(float(loss))
        records: dict[int, dict] = {}
        for line in path.read_text().splitlines():
            r = json.loads(line)
            kept = {k: v for k, v in r.items() if k in KEEP or _setting(k)}
            if kept:
                records.setdefault(r["step"], {}).update(kept)
    return Trained(records, losses, type(optimizer).__name__)


def _setting(key: str) -> bool:
    from fastnorm.monitoring.series import OPTIMIZER_KEYS, PRECISION_PREFIX

    return key in OPTIMIZER_KEYS.values() or key.startswith(PRECISION_PREFIX)


def sampler(x: torch.Tensor, y: torch.Tensor, shuffle_labels: bool = False):
    def data(step: int, size: int):
        idx = torch.randint(0, len(x), (size,))
        if shuffle_labels:  # the labels shuffled apart from the inputs: they no longer match
            return x[idx], y[torch.randint(0, len(y), (size,))]
        return x[idx], y[idx]

    return data


def cross_entropy(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))


def mse(model, x, y):
    return F.mse_loss(model(x).float(), y.float())


def reconstruction(model, x, y):
    return F.mse_loss(model(x).float(), x.float())


# ----------------------------------------------------------------------------
# Measurements of what a run did (never of what the diagnosis says)
# ----------------------------------------------------------------------------


HOLD = 10  # steps a blow-up holds for: the diagnosis's sustain, over which a level counts as sustained


def blowup_step(losses: list[float], start: int = 0) -> int | None:
    """The first step from ``start`` whose loss is not finite, or 10x the median of the 20 before it and held
    there: the median of the ``HOLD`` steps from it 10x that level too (non-finite losses counted as
    infinite). One batch 10x a loss near 0, the next steps back at its level, is that batch, not a blow-up:
    a learning-rate jump whose run only went on learning would otherwise pass for one that acted."""
    for i, v in enumerate(losses[start:], start):
        if not math.isfinite(v):
            return i
        before = sorted(losses[max(0, i - 20) : i])
        if len(before) >= 3 and v > 10 * before[len(before) // 2]:
            if level(losses, i, i + HOLD) > 10 * before[len(before) // 2]:
                return i
    return None


def level(losses: list[float], start: int, end: int) -> float:
    part = sorted(v if math.isfinite(v) else math.inf for v in losses[start:end])
    return part[len(part) // 2]


def require(condition: bool, what: str) -> None:
    """The injected cause did what it should; otherwise the spec needs another magnitude."""
    if not condition:
        raise SystemExit(f"make_runs.py: the cause did not act as its truth says: {what}")


def stalled(losses: list[float], chance: float | None = None) -> bool:
    """The loss ended where it began (its median over the last 50 steps at least 95% of that over the
    first 20, whether or not it improved in between) and, for a classifier, near chance."""
    first, end = level(losses, 0, 20), level(losses, len(losses) - 50, len(losses))
    near = chance is None or abs(end - chance) < 0.1 * chance
    return end >= 0.95 * first and near


def undone(losses: list[float], onset: int) -> bool:
    """After ``onset`` the loss stayed above its initial level (or not finite) for 10 steps running."""
    initial = level(losses, 0, 5)
    streak = 0
    for v in losses[onset:]:
        streak = streak + 1 if not v <= initial else 0
        if streak >= 10:
            return True
    return False


# ----------------------------------------------------------------------------
# The causes: each a run function(seed, **kwargs) -> (Trained, truth entries)
# ----------------------------------------------------------------------------


def reseed(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)


def tabular_run(
    seed,
    dataset,
    loop,
    *,
    lr=1e-2,
    opt="adam",
    weight_decay=0.0,
    eps=1e-8,
    act=nn.Tanh,
    width=32,
    batchnorm=False,
):
    reseed(seed)
    x, y, classes = tabular(dataset)
    model = mlp([x.shape[1], width, width, classes or 1], act, batchnorm)
    optimizer = make_optimizer(opt, model, lr, weight_decay, eps)
    loss = cross_entropy if classes else mse
    return train(model, optimizer, sampler(x, y, loop.shuffle_labels), loss, loop), classes


def make_optimizer(kind, model, lr, weight_decay=0.0, eps=1e-8):
    if kind == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr, eps=eps, weight_decay=weight_decay)
    if kind == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=lr, eps=eps, weight_decay=weight_decay)
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=weight_decay)


def jump(onset: int, factor: float, until: int | None = None):
    return lambda step: factor if step >= onset and (until is None or step < until) else 1.0


def family_run(family: str, seed: int, loop: Loop, **kw):
    """One run of ``family`` (the model, its data, its optimizer) under ``loop``."""
    reseed(seed)
    if family in ("iris", "wine", "cancer", "diabetes"):
        name = {"cancer": "breast_cancer"}.get(family, family)
        return tabular_run(seed, name, loop, **kw)
    if family == "cnn":
        x, y = digits_images()
        model = CNN(kw.pop("batchnorm", False))
        optimizer = make_optimizer(
            kw.pop("opt", "adam"), model, kw.pop("lr", 2e-3), kw.pop("weight_decay", 0.0)
        )
        return train(model, optimizer, sampler(x, y, loop.shuffle_labels), cross_entropy, loop), 10
    if family == "rnn":
        x, y = sequences()
        model = RNN()
        optimizer = make_optimizer(kw.pop("opt", "adam"), model, kw.pop("lr", 3e-3))
        return train(model, optimizer, sampler(x, y), cross_entropy, loop), 2
    if family == "postln":
        vocab, batch = characters()
        model = PostLN(vocab)
        optimizer = make_optimizer("adam", model, kw.pop("lr", 1e-3))
        return train(model, optimizer, lambda step, size: batch(size), cross_entropy, loop), vocab
    if family == "autoencoder":
        x, _ = digits_images()
        x = x.flatten(1)
        model = mlp([64, 32, 8, 32, 64], nn.Tanh)
        optimizer = make_optimizer(
            kw.pop("opt", "adam"), model, kw.pop("lr", 3e-3), kw.pop("weight_decay", 0.0)
        )
        return train(model, optimizer, sampler(x, x), reconstruction, loop), 0
    if family == "digits-mlp":  # the precision variants' model
        x, y = digits_images()
        x = x.flatten(1)
        model = mlp([64, 64, 64, 10], nn.Tanh)
        optimizer = make_optimizer(kw.pop("opt", "adam"), model, kw.pop("lr", 2e-3), eps=kw.pop("eps", 1e-8))
        return train(model, optimizer, sampler(x, y), cross_entropy, loop), 10
    raise ValueError(family)


def healthy(family, seed=0, warmup=0, every=1, precision="fp32", dtype=torch.float32, scaler=False, **kw):
    """The family learning normally."""
    factor = (lambda s: min(1.0, (s + 1) / warmup)) if warmup else (lambda s: 1.0)
    autocast = 0 if scaler else None
    loop = Loop(
        lr_factor=factor, every=every, precision=precision, dtype=dtype, scaler=scaler, autocast_from=autocast
    )
    if every > 1:
        loop.steps, loop.window = THINNED_STEPS, 5
    trained, _ = family_run(family, seed, loop, **kw)
    what = "learning normally" + (f" with a {warmup}-step warmup" if warmup else "")
    if scaler:
        what += " in fp16 autocast with a GradScaler (it skips the steps that overflow)"
    if dtype == torch.bfloat16:
        what += " in pure bf16"
    return trained, {"cause": what, "verdicts": ["stable"], "onset": None, "actions": [], "abrupt": False}


def lr_too_high(family, seed=0, factor=300.0, every=1, **kw):
    """A learning rate far too high from the first step: a blow-up, then a loss stuck at chance."""
    loop = Loop(lr_factor=lambda s: factor, every=every, precision="fp32")
    if every > 1:
        loop.steps, loop.window = THINNED_STEPS, 5
    trained, classes = family_run(family, seed, loop, **kw)
    chance = math.log(classes) if classes else None
    blew = blowup_step(trained.losses) is not None or undone(trained.losses, 0)
    end = level(trained.losses, len(trained.losses) - 50, len(trained.losses))
    require(blew or stalled(trained.losses, chance) or (chance and end > 0.9 * chance), "it learned")
    return trained, {
        "cause": f"a learning rate {factor:g}x the healthy one from the first step",
        # A blow-up in the first steps, then a loss stuck at chance: diverged, or (the blow-up too short
        # to see) stalled; either way the learning rate is the cause.
        "verdicts": ["diverged", "nonfinite", "stalled"],
        "onset": 0,
        "actions": ["lower_lr"],
        "abrupt": True,  # wrong from the first step: the blow-up comes at once, not after a rise
    }


def shuffled_labels(family, seed=0, **kw):
    """Labels shuffled once: they no longer match the inputs; the loss stays at ln(classes)."""
    loop = Loop(shuffle_labels=True, precision="fp32")
    trained, classes = family_run(family, seed, loop, **kw)
    require(stalled(trained.losses, math.log(classes)), "the loss learned something")
    return trained, {
        "cause": f"labels shuffled apart from the inputs: the loss stays at ln "
        f"{classes} ({math.log(classes):.3g})",
        "verdicts": ["stalled"],
        "onset": 0,
        "actions": ["check_labels", "check_data"],
        "abrupt": False,
    }


def batchnorm_batch2(family, seed=0, **kw):
    """BatchNorm trained on batches of 2: each batch normalised by its own two samples."""
    loop = Loop(batch=2, precision="fp32")
    trained, classes = family_run(family, seed, loop, batchnorm=True, **kw)
    # A batch of 2 makes the loss noise itself: compared over 100 steps at each end, it did not improve.
    first, end = level(trained.losses, 0, 100), level(trained.losses, STEPS - 100, STEPS)
    require(end >= 0.9 * first, f"the loss improved from {first:.3g} to {end:.3g}")
    return trained, {
        "cause": "BatchNorm layers trained on batches of 2",
        "verdicts": ["stalled"],
        "onset": 0,
        "actions": ["batch_size"],
        "abrupt": False,
    }


def adam_eps(family, seed=0, scale=1e-11, **kw):
    """Gradients far below Adam's eps (a loss scaled down by ``scale``): eps dominates the denominator,
    so the effective step is lr * g / eps, orders of magnitude below lr."""
    loop = Loop(loss_scale=scale, precision="fp32")
    trained, classes = family_run(family, seed, loop, **kw)
    require(stalled(trained.losses, math.log(classes) if classes else None), "the loss improved")
    return trained, {
        "cause": f"Adam (eps 1e-8) on gradients scaled by {scale:g}: its effective learning rate is too low",
        "verdicts": ["stalled"],
        "onset": 0,
        "actions": ["adam_eps"],
        "abrupt": False,
    }


def weight_decay(family, seed=0, decay=5.0, **kw):
    """A weight decay so strong that it holds the weights near zero."""
    loop = Loop(precision="fp32")
    trained, classes = family_run(family, seed, loop, opt="adamw", weight_decay=decay, **kw)
    require(stalled(trained.losses, math.log(classes) if classes else None), "the loss improved")
    return trained, {
        "cause": f"AdamW with weight decay {decay:g}: the weights are held near zero",
        "verdicts": ["stalled", "vanishing"],
        "onset": 0,
        "actions": ["weight_decay"],
        "abrupt": False,
    }


def no_warmup(family, seed=0, lr=1e-2, **kw):
    """A post-LN transformer at a learning rate it trains at only after a warmup, without one."""
    loop = Loop(precision="fp32")
    trained, classes = family_run(family, seed, loop, lr=lr, **kw)
    plateau = level(trained.losses, 100, 120) - level(trained.losses, STEPS - 20, STEPS)
    require(
        plateau < 0.05 * level(trained.losses, 100, 120), f"it still learned {plateau:.3g} after step 100"
    )
    return trained, {
        "cause": f"a post-LayerNorm transformer at Adam lr {lr:g} without a warmup",
        "verdicts": ["stalled", "diverged", "exploding"],
        "onset": 0,
        "actions": ["warmup", "lower_lr"],
        "abrupt": False,
    }


def fp16_underflow(family, seed=0, onset=150, scale=1e-6, **kw):
    """fp16 autocast switched on at ``onset`` without a GradScaler, on a loss whose gradients are small
    (scaled by ``scale``): they underflow fp16 and reach the weights as exact zeros."""
    loop = Loop(autocast_from=onset, loss_scale=scale, precision="fp16-mixed")
    trained, classes = family_run(family, seed, loop, eps=1e-12, **kw)
    zeros = [s for s, r in trained.records.items() if s >= onset and r.get("gradient_norm") == 0]
    require(len(zeros) > 0.5 * (STEPS - onset), f"only {len(zeros)} zero norms after {onset}")
    return trained, {
        "cause": f"fp16 autocast from step {onset} without a GradScaler: the gradients underflow to 0",
        "verdicts": ["vanishing", "stalled"],
        "onset": onset,
        "actions": ["grad_scaler", "bf16"],
        "abrupt": True,
    }


def lr_jump(family, seed=0, onset=150, factor=30.0, every=1, dtype=torch.float32, precision="fp32", **kw):
    """The learning rate multiplied by ``factor`` at ``onset`` (a schedule's mistake)."""
    loop = Loop(lr_factor=jump(onset, factor), every=every, dtype=dtype, precision=precision)
    if every > 1:
        loop.steps, loop.window = THINNED_STEPS, 5
    trained, _ = family_run(family, seed, loop, **kw)
    require(
        undone(trained.losses, onset) or blowup_step(trained.losses, onset) is not None, "the run survived"
    )
    return trained, {
        "cause": f"the learning rate multiplied by {factor:g} at step {onset}",
        "verdicts": ["diverged", "nonfinite", "exploding"],
        "onset": onset,
        "actions": ["lower_lr", "lr_schedule"],
        "abrupt": True,
    }


def lr_negative(family, seed=0, onset=150, **kw):
    """The learning rate turns negative at ``onset`` (a schedule that overshoots zero): gradient ascent."""
    loop = Loop(lr_factor=jump(onset, -1.0), precision="fp32")
    trained, _ = family_run(family, seed, loop, **kw)
    require(undone(trained.losses, onset) or blowup_step(trained.losses, onset) is not None, "the loss held")
    return trained, {
        "cause": f"the learning rate turned negative at step {onset}",
        "verdicts": ["diverged", "nonfinite", "exploding"],
        "onset": onset,
        "actions": ["lr_schedule"],
        "abrupt": True,
    }


def explode_then_chance(family, seed=0, onset=150, factor=1000.0, length=5, **kw):
    """A burst of ``factor`` times the learning rate for ``length`` steps at ``onset``: the ReLUs die and
    the loss stays at chance ever after."""
    loop = Loop(lr_factor=jump(onset, factor, onset + length), precision="fp32")
    trained, classes = family_run(family, seed, loop, act=nn.ReLU, **kw)
    require(undone(trained.losses, onset), "the loss came back")
    return trained, {
        "cause": f"the learning rate {factor:g}x for {length} steps from step "
        f"{onset}: an explosion, then a loss "
        f"stuck at chance (ln {classes} = {math.log(classes):.3g})",
        "verdicts": ["diverged", "nonfinite"],
        "onset": onset,
        "actions": ["lower_lr", "checkpoint"],
        "abrupt": True,
    }


def slow_rise(family, seed=0, onset=120, growth=1.05, **kw):
    """The learning rate grows by ``growth`` per step from ``onset``: the norm rises for tens of steps
    before the loss turns."""
    loop = Loop(lr_factor=lambda s: growth ** max(0, s - onset), precision="fp32")
    trained, _ = family_run(family, seed, loop, **kw)
    blew = blowup_step(trained.losses, onset)
    require(blew is not None and blew > onset + 10, f"blow-up at {blew}")
    return trained, {
        "cause": f"the learning rate grows {growth:g}x per step from step {onset}",
        "verdicts": ["diverged", "nonfinite", "exploding"],
        "onset": onset,
        "actions": ["lower_lr", "lr_schedule"],
        "abrupt": False,
    }


# ----------------------------------------------------------------------------
# The specs: family, cause, and the arguments of each set
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    name: str
    family: str
    cause: Callable
    tuning: dict = field(default_factory=dict)
    tuning2: dict = field(default_factory=dict)  # over the tuning arguments, as are the other sets
    tuning3: dict = field(default_factory=dict)
    tuning4: dict = field(default_factory=dict)
    heldout: dict = field(default_factory=dict)

    def args(self, which: str) -> dict:
        if which == "tuning":
            return {"seed": 0, **self.tuning}
        return {"seed": 1, **self.tuning, **getattr(self, which)}


SPECS = [
    # healthy: a third and more of the runs
    Spec(
        "rnn-healthy",
        "rnn",
        healthy,
        {},
        {"seed": 11},
        {"seed": 111},
        {"seed": 211, "every": 5},
        {"seed": 311},
    ),
    Spec(
        "cnn-healthy",
        "cnn",
        healthy,
        {},
        {"seed": 12},
        {"seed": 112},
        {"seed": 212},
        {"seed": 312, "every": 5},
    ),
    Spec(
        "cnn-bn-healthy",
        "cnn",
        healthy,
        {"batchnorm": True},
        {"seed": 13},
        {"seed": 113},
        {"seed": 213},
        {"seed": 313},
    ),
    Spec(
        "postln-healthy",
        "postln",
        healthy,
        {"warmup": 50},
        {"seed": 14, "warmup": 80},
        {"seed": 114, "warmup": 60},
        {"seed": 214, "warmup": 100},
        {"seed": 314, "warmup": 70},
    ),
    Spec(
        "iris-healthy",
        "iris",
        healthy,
        {},
        {"seed": 15},
        {"seed": 115},
        {"seed": 215, "every": 10},
        {"seed": 315, "every": 5},
    ),
    Spec(
        "wine-healthy",
        "wine",
        healthy,
        {"precision": None},
        {"seed": 16},
        {"seed": 116},
        {"seed": 216},
        {"seed": 316, "every": 10},
    ),
    Spec(
        "cancer-healthy",
        "cancer",
        healthy,
        {"opt": "sgd", "lr": 1e-2},
        {"seed": 17},
        {"seed": 117, "lr": 2e-2},
        {"seed": 217, "lr": 5e-3},
        {"seed": 317, "lr": 1.5e-2},
    ),
    Spec(
        "diabetes-healthy",
        "diabetes",
        healthy,
        {},
        {"seed": 18},
        {"seed": 118, "every": 10},
        {"seed": 218},
        {"seed": 318, "every": 5},
    ),
    Spec(
        "autoencoder-healthy",
        "autoencoder",
        healthy,
        {},
        {"seed": 19},
        {"seed": 119},
        {"seed": 219},
        {"seed": 319, "every": 10},
    ),
    Spec(
        "fp16-scaler-healthy",
        "digits-mlp",
        healthy,
        {"scaler": True, "precision": "fp16-mixed"},
        {"seed": 20},
        {"seed": 120},
        {"seed": 220},
        {"seed": 320},
    ),
    Spec(
        "bf16-healthy",
        "digits-mlp",
        healthy,
        {"dtype": torch.bfloat16, "precision": None},
        {"seed": 21},
        {"seed": 121},
        {"seed": 221},
        {"seed": 321},
    ),
    Spec(
        "cnn-thinned-healthy",
        "cnn",
        healthy,
        {"every": 10},
        {"seed": 22},
        {"seed": 122, "every": 5},
        {"seed": 222, "every": 10},
        {"seed": 322, "every": 10},
    ),
    # faulty
    Spec(
        "wine-lr-too-high",
        "wine",
        lr_too_high,
        {"factor": 300.0, "act": nn.ReLU},
        {"seed": 31, "factor": 1000.0},
        {"seed": 131, "factor": 500.0},
        {"seed": 231, "factor": 2000.0},
        {"seed": 331, "factor": 1200.0},
    ),
    Spec(
        "cnn-lr-too-high",
        "cnn",
        lr_too_high,
        {"factor": 1000.0},
        {"seed": 32, "factor": 3000.0},
        {"seed": 132, "factor": 2000.0},
        {"seed": 232, "factor": 5000.0},
        {"seed": 332, "factor": 4000.0, "every": 5},
    ),
    Spec(
        "iris-thinned-lr-too-high",
        "iris",
        lr_too_high,
        {"every": 10, "factor": 300.0, "act": nn.ReLU},
        {"seed": 33},
        {"seed": 133, "every": 5, "factor": 1000.0},
        {"seed": 233, "every": 10, "factor": 500.0},
        {"seed": 333, "every": 5, "factor": 5000.0},
    ),
    Spec(
        "iris-shuffled-labels",
        "iris",
        shuffled_labels,
        {},
        {"seed": 34},
        {"seed": 134},
        {"seed": 234},
        {"seed": 334},
    ),
    Spec(
        "cnn-shuffled-labels",
        "cnn",
        shuffled_labels,
        {},
        {"seed": 35},
        {"seed": 135},
        {"seed": 235},
        {"seed": 335},
    ),
    Spec(
        "wine-shuffled-labels",
        "wine",
        shuffled_labels,
        {},
        {"seed": 36},
        {"seed": 136},
        {"seed": 236},
        {"seed": 336},
    ),
    Spec(
        "diabetes-bn-batch2",
        "diabetes",
        batchnorm_batch2,
        {},
        {"seed": 37},
        {"seed": 137},
        {"seed": 255},
        {"seed": 337},
    ),
    Spec(
        "diabetes-adam-eps",
        "diabetes",
        adam_eps,
        {"scale": 1e-11},
        {"seed": 38, "scale": 3e-12},
        {"seed": 138, "scale": 5e-12},
        {"seed": 238, "scale": 2e-12},
        {"seed": 338, "scale": 4e-12},
    ),
    Spec(
        "cancer-adam-eps",
        "cancer",
        adam_eps,
        {"scale": 1e-11},
        {"seed": 39, "scale": 3e-12},
        {"seed": 139, "scale": 5e-12},
        {"seed": 239, "scale": 8e-12},
        {"seed": 339, "scale": 2e-12},
    ),
    Spec(
        "autoencoder-weight-decay",
        "autoencoder",
        weight_decay,
        {"decay": 50.0},
        {"seed": 40, "decay": 200.0},
        {"seed": 140, "decay": 100.0},
        {"seed": 240, "decay": 150.0},
        {"seed": 340, "decay": 120.0},
    ),
    Spec(
        "wine-weight-decay",
        "wine",
        weight_decay,
        {"decay": 50.0},
        {"seed": 41, "decay": 100.0},
        {"seed": 141, "decay": 70.0},
        {"seed": 241, "decay": 150.0},
        {"seed": 341, "decay": 120.0},
    ),
    Spec(
        "postln-no-warmup",
        "postln",
        no_warmup,
        {"lr": 1e-1},
        {"seed": 42, "lr": 5e-2},
        {"seed": 142, "lr": 7e-2},
        {"seed": 242, "lr": 4e-2},
        {"seed": 342, "lr": 6e-2},
    ),
    Spec(
        "fp16-underflow",
        "digits-mlp",
        fp16_underflow,
        {"onset": 150},
        {"seed": 43, "onset": 100},
        {"seed": 143, "onset": 200},
        {"seed": 243, "onset": 120},
        {"seed": 343, "onset": 160},
    ),
    Spec(
        "rnn-lr-jump",
        "rnn",
        lr_jump,
        {"onset": 150, "factor": 100.0},
        {"seed": 44, "onset": 180, "factor": 300.0},
        {"seed": 144, "onset": 130, "factor": 200.0},
        {"seed": 244, "onset": 170, "factor": 150.0},
        {"seed": 344, "onset": 140, "factor": 250.0},
    ),
    Spec(
        "wine-lr-jump",
        "wine",
        lr_jump,
        {"onset": 150},
        {"seed": 45, "onset": 200, "factor": 100.0},
        {"seed": 145, "onset": 450, "factor": 50.0, "every": 5},
        {"seed": 245, "onset": 555, "factor": 80.0, "every": 10},
        {"seed": 345, "onset": 380, "factor": 60.0, "every": 5},
    ),
    Spec(
        "bf16-lr-jump",
        "digits-mlp",
        lr_jump,
        {"onset": 150, "factor": 100.0, "dtype": torch.bfloat16, "precision": None},
        {"seed": 46, "onset": 120},
        {"seed": 146, "onset": 170, "factor": 50.0},
        {"seed": 246, "onset": 210, "factor": 70.0},
        {"seed": 346, "onset": 190, "factor": 60.0},
    ),
    Spec(
        "cancer-thinned-lr-jump",
        "cancer",
        lr_jump,
        {"onset": 500, "every": 10},
        {"seed": 47, "onset": 600},
        {"seed": 147, "onset": 700, "factor": 50.0},
        {"seed": 247, "onset": 643, "factor": 40.0, "every": 5},
        {"seed": 347, "onset": 577, "factor": 60.0, "every": 10},
    ),
    Spec(
        "iris-lr-negative",
        "iris",
        lr_negative,
        {"onset": 150},
        {"seed": 48, "onset": 200},
        {"seed": 148, "onset": 170},
        {"seed": 248, "onset": 230},
        {"seed": 348, "onset": 190},
    ),
    Spec(
        "cnn-lr-negative",
        "cnn",
        lr_negative,
        {"onset": 150},
        {"seed": 49, "onset": 120},
        {"seed": 149, "onset": 220},
        {"seed": 249, "onset": 180},
        {"seed": 349, "onset": 160},
    ),
    Spec(
        "cancer-explode-then-chance",
        "cancer",
        explode_then_chance,
        {"onset": 150},
        {"seed": 50, "onset": 180},
        {"seed": 150, "onset": 130, "factor": 3000.0, "length": 3},
        {"seed": 250, "onset": 170, "factor": 2000.0, "length": 4},
        {"seed": 350, "onset": 140, "factor": 2500.0, "length": 5},
    ),
    Spec(
        "iris-explode-then-chance",
        "iris",
        explode_then_chance,
        {"onset": 150},
        {"seed": 51, "onset": 100},
        {"seed": 151, "onset": 200},
        {"seed": 251, "onset": 120, "factor": 1500.0},
        {"seed": 351, "onset": 170, "factor": 1200.0},
    ),
    Spec(
        "diabetes-slow-rise",
        "diabetes",
        slow_rise,
        {"onset": 120},
        {"seed": 52, "onset": 150, "growth": 1.04},
        {"seed": 152, "onset": 100, "growth": 1.06},
        {"seed": 252, "onset": 130, "growth": 1.045},
        {"seed": 352, "onset": 140, "growth": 1.055},
    ),
    Spec(
        "rnn-slow-rise",
        "rnn",
        slow_rise,
        {"onset": 120, "opt": "sgd", "lr": 0.05},
        {"seed": 53, "onset": 100},
        {"seed": 153, "onset": 140, "growth": 1.04},
        {"seed": 253, "onset": 110, "growth": 1.06},
        {"seed": 353, "onset": 130, "growth": 1.05},
    ),
]
BY_NAME = {s.name: s for s in SPECS}


def make(spec: Spec, which: str, out: Path) -> dict:
    args = spec.args(which)
    started = time.perf_counter()
    trained, truth = spec.cause(spec.family, **args)
    loop_every = args.get("every", 1)
    records = trained.records
    precision = next(
        (
            k.rsplit("/", 1)[1]
            for r in records.values()
            for k in r
            if k.startswith("gradient_norm_precision/")
        ),
        None,
    )
    truth = {
        "name": spec.name,
        "set": which,
        "family": spec.family,
        "injected": spec.cause.__name__,
        "healthy": truth["onset"] is None,
        **truth,
        # Of a faulty run, from the step the fault was injected: a jump before it is not the fault's.
        "blowup_step": blowup_step(trained.losses, truth["onset"] or 0),
        "precision": precision,
        "optimizer": trained.optimizer,
        "every": loop_every,
        "window": 5 if loop_every > 1 else 25,
        "steps": len(trained.losses),
        "seed": args["seed"],
    }
    folder = out / which / spec.name
    write(folder, records, truth)
    size = (folder / "metrics.csv").stat().st_size
    print(
        f"{which}/{spec.name}: {len(records)} steps logged, {size / 1024:.1f} KB, {truth['verdicts'][0]} @ "
        f"{truth['onset']}, blow-up {truth['blowup_step']} ({time.perf_counter() - started:.1f} s)"
    )
    return truth


def _sig(value) -> float | str:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return float(f"{value:.4g}")


def write(folder: Path, records: dict[int, dict], truth: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    columns = ["step"]
    for metrics in records.values():
        columns += [k for k in metrics if k not in columns]
    with open(folder / "metrics.csv", "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(columns)
        for step in sorted(records):
            writer.writerow(
                [step] + [_sig(records[step][c]) if c in records[step] else "" for c in columns[1:]]
            )
    (folder / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="runs to regenerate (default: all of the set)")
    parser.add_argument("--list", action="store_true", help="list the runs")
    parser.add_argument("--set", choices=SETS, help="only this set (default: every one)")
    parser.add_argument("--out", type=Path, default=HERE, help="write under this folder (default: here)")
    args = parser.parse_args(argv)
    if args.list:
        for s in SPECS:
            print(f"{s.name:28s} {s.family:12s} {s.cause.__name__}: {s.cause.__doc__.splitlines()[0]}")
        return 0
    unknown = [n for n in args.names if n not in BY_NAME]
    if unknown:
        parser.error(f"unknown runs: {', '.join(unknown)}")
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", UserWarning)
    for which in [args.set] if args.set else SETS:
        for spec in [BY_NAME[n] for n in args.names] or SPECS:
            make(spec, which, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
