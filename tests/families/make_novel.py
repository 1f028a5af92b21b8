"""Generates the novel families: runs of model families the diagnosis was never tuned on, causes injected here.

    nice -n 10 python tests/families/make_novel.py            # every run (a few minutes of one core)
    nice -n 10 python tests/families/make_novel.py NAME ...   # some runs
    python tests/families/make_novel.py --list                # names, family, objective and cause

Needs only torch and Python's own files: nothing is downloaded. Twenty-five families,
each on another objective or another kind of training than ``make_runs.py``'s:

* ``stdlm``: a character language model (an embedding and an MLP over the last
  8 characters) on the source text of some standard-library modules;
* ``shapes``: a small CNN on generated 16x16 images (bars and rings);
* ``finetune``: a net pretrained here on one task, then frozen, with a new
  adapter and head fine-tuned on another;
* ``denoiser``: a diffusion-style denoiser of 2-D points (predicts the noise at
  a random noise level);
* ``gan``: a tiny GAN on a ring of 8 Gaussians (the generator's norm and loss
  logged, the discriminator's loss beside them);
* ``contrastive``: an encoder trained with InfoNCE on two noisy views, 31
  negatives per anchor (a collapse sits at ln 32);
* ``bandit``: REINFORCE on a 10-armed contextual bandit (a loss near 0, of
  either sign; batches whose rewards tie give a gradient of exactly 0; the
  mean reward logged beside it);
* ``vae``: a variational autoencoder of 8-D points near a 2-D sheet (the
  reconstruction error plus the KL term);
* ``tabular``: an MLP regressor on 12 standardised features of mixed scales,
  SGD with momentum.

``vae`` and ``tabular`` are a second batch, added after every rule change the
ledger records then: their first score is the rules' on families they never
saw; so are ``gru`` and ``ranker`` (a third batch) and ``attnlm`` (a 2-layer
pre-LN causal transformer character LM) and ``forecast`` (an LSTM forecaster
of noisy sines, Huber loss), the fourth; ``grpo`` (a group-relative policy
gradient with a KL term to its initial copy, its mean reward logged) and
``vit`` (a 2-layer vision transformer on the shapes), the fifth; ``gnn`` (a
two-layer GCN on a stochastic block model, full-batch), ``distill`` (an MLP
student distilled from a fixed teacher, KL at temperature 4), ``ctc`` (a
convolution and a bidirectional GRU under the CTC loss, speech-shaped) and
``dpo`` (direct preference optimisation against a frozen reference), the sixth;
``mlm`` (a 2-layer bidirectional transformer pretrained as a masked LM),
``segment`` (a fully convolutional net, per-pixel cross-entropy) and ``ppo``
(PPO's clipped objective with a critic and an entropy bonus, its reward
logged), the seventh; ``flow`` (a normalising flow of 2-D points, fitted by its
negative log-likelihood), ``seq2seq`` (a GRU encoder-decoder reversing
token sequences, teacher-forced) and ``mf`` (matrix factorisation of ratings,
embeddings and biases under squared error), the eighth; ``moe`` (a mixture of
experts behind a top-1 softmax router with its load-balancing loss) and
``triplet`` (metric learning under the triplet margin loss, whose satisfied
triplets add exactly 0), the ninth.

Each run logs through ``GradNormMonitor`` + ``JsonlLogger`` as a user's loop
does: some told the optimizer (the learning rate and settings logged), some
only the norm and the loss. Its ``truth.json`` is written here from what was
injected and what the run measurably did, before any diagnosis is run on it:
the fields of ``make_runs.py``'s truths, with ``objective`` (minimise,
adversarial, reinforcement, contrastive) and ``collapse_level`` where known.
A cause that did not act as its truth says stops the script with the
measurement.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_runs import blowup_step, level, require, write  # noqa: E402

HERE = Path(__file__).resolve().parent
SET = "novel"
STEPS = 300
KEEP_PREFIX = "gradient_norm"
EXTRA = ("reward", "loss_discriminator")


@dataclass
class Loop:
    """How a run trains and what it logs."""

    steps: int = STEPS
    every: int = 1
    window: int = 25
    log_settings: bool = True  # the monitor told the optimizer (lr and settings logged)
    precision: str | None = "fp32"
    lr_factor: Callable[[int], float] = lambda step: 1.0
    detached_from: int | None = None  # from this step the loss reaches no trainable weight: gradients 0
    underflow_from: int | None = None  # from this step the gradients pass through fp16 scaled by 1e-8
    grad_factor: Callable[[int], float] = lambda step: 1.0  # the gradient times this (a code change)


@dataclass
class Trained:
    records: dict[int, dict]
    losses: list[float]
    norms: list[float]
    extras: dict[str, list[float]]
    optimizer: str


def train(step_fn, params: list[torch.Tensor], optimizer: torch.optim.Optimizer, loop: Loop) -> Trained:
    """``step_fn(step) -> (loss, extras)``: the loss to minimise for ``params`` (any other player's step
    taken inside it). Trains and logs through a GradNormMonitor, as a user's loop does."""
    bases = [g["lr"] for g in optimizer.param_groups]
    losses: list[float] = []
    norms: list[float] = []
    extras: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "metrics.jsonl"
        logger = fastnorm.JsonlLogger(path)
        monitor = fastnorm.GradNormMonitor(
            loop.window,
            [logger],
            optimizer=optimizer if loop.log_settings else None,
            precision=loop.precision,
            diagnose=False,
        )
        side: dict[int, dict] = {}
        with monitor:
            for step in range(loop.steps):
                for group, base in zip(optimizer.param_groups, bases):
                    group["lr"] = base * loop.lr_factor(step)
                loss, extra = step_fn(step)
                optimizer.zero_grad(set_to_none=False)
                if loop.detached_from is not None and step >= loop.detached_from:
                    # The loss computed apart from the weights (a .detach(), a no_grad forward, an adapter
                    # that is not attached): backward reaches every weight with an exact zero.
                    (loss.detach() + 0.0 * sum(p.sum() for p in params)).backward()
                else:
                    (loss * loop.grad_factor(step)).backward()
                if loop.underflow_from is not None and step >= loop.underflow_from:
                    for p in params:  # fp16 gradients of a loss scaled down, unscaled in fp32 after
                        p.grad.copy_((p.grad * 1e-8).half().float() * 1e8)
                norm = fastnorm.total_norm(params)
                if step % loop.every == 0:
                    monitor.update(norm, step, loss=loss.detach())
                    if extra:
                        side[step] = extra
                optimizer.step()
                losses.append(float(loss))
                norms.append(float(norm))
                for k, v in (extra or {}).items():
                    extras.setdefault(k, []).append(v)
        records: dict[int, dict] = {}
        for line in path.read_text().splitlines():
            r = json.loads(line)
            kept = {k: v for k, v in r.items() if k.startswith(KEEP_PREFIX)}
            if kept:
                records.setdefault(r["step"], {}).update(kept)
        for step, extra in side.items():
            records.setdefault(step, {}).update(extra)
    return Trained(records, losses, norms, extras, type(optimizer).__name__)


def mlp(sizes: list[int], act: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(act())
    return nn.Sequential(*layers)


def adam(params, lr, weight_decay=0.0, betas=(0.9, 0.999)):
    if weight_decay:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas)
    return torch.optim.Adam(params, lr=lr, betas=betas)


# ----------------------------------------------------------------------------
# The families: each family(loop, **kw) -> (Trained, facts about its objective)
# ----------------------------------------------------------------------------


def stdlib_text() -> str:
    """The source of some standard-library modules and the Zen of Python (rot13 in ``this.s``)."""
    import codecs
    import contextlib
    import io
    import json.decoder
    import textwrap

    with contextlib.redirect_stdout(io.StringIO()):  # importing it prints the Zen; its text is this.s
        import this  # noqa: F401

    return "\n".join(
        [inspect.getsource(json.decoder), inspect.getsource(textwrap), codecs.decode(sys.modules["this"].s, "rot13")]
    )


def stdlm(loop: Loop, lr=3e-3, opt="adam", init_scale=1.0, **_):
    text = stdlib_text()
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(c) for c in text])
    context, vocab = 8, len(chars)
    model = nn.Sequential(nn.Embedding(vocab, 24), nn.Flatten(), mlp([24 * context, 128, vocab]))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(init_scale)
    params = list(model.parameters())
    optimizer = adam(params, lr) if opt == "adam" else torch.optim.SGD(params, lr=lr, momentum=0.9)

    def step_fn(step):
        start = torch.randint(0, len(ids) - context - 1, (32,))
        x = torch.stack([ids[s : s + context] for s in start])
        y = ids[start + context]
        return F.cross_entropy(model(x), y), None

    return train(step_fn, params, optimizer, loop), {"chance": math.log(vocab), "objective": "minimise"}


def shapes_data(n=2048):
    """16x16 images of three shapes at random places, in noise: a horizontal bar, a vertical bar, a ring."""
    x = torch.randn(n, 1, 16, 16) * 0.3
    y = torch.randint(0, 3, (n,))
    r, c = torch.randint(2, 10, (n,)), torch.randint(2, 10, (n,))
    for i in range(n):
        a, b = int(r[i]), int(c[i])
        if y[i] == 0:
            x[i, 0, a, b : b + 5] += 1
        elif y[i] == 1:
            x[i, 0, a : a + 5, b] += 1
        else:
            x[i, 0, a : a + 4, b] += 1
            x[i, 0, a : a + 4, b + 3] += 1
            x[i, 0, a, b : b + 4] += 1
            x[i, 0, a + 3, b : b + 4] += 1
    return x, y


class Residual(nn.Module):
    def __init__(self, width: int, scale: float):
        super().__init__()
        self.linear = nn.Linear(width, width)
        with torch.no_grad():
            self.linear.weight.mul_(scale)

    def forward(self, x):
        return x + self.linear(x)


def shapes(loop: Loop, lr=2e-3, opt="adam", init_scale=1.0, weight_decay=0.0, blocks=0, **_):
    """A CNN; ``blocks`` residual blocks without normalisation before its head, their weights initialised
    ``init_scale`` times too large (each block multiplies the activations' scale)."""
    x, y = shapes_data()
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), *[Residual(256, init_scale) for _ in range(blocks)], nn.Linear(256, 3),
    )  # fmt: skip
    params = list(model.parameters())
    if opt == "sgd":
        optimizer = torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay)
    else:
        optimizer = adam(params, lr, weight_decay)

    def step_fn(step):
        i = torch.randint(0, len(x), (32,))
        return F.cross_entropy(model(x[i]), y[i]), None

    return train(step_fn, params, optimizer, loop), {"chance": math.log(3), "objective": "minimise"}


def finetune(loop: Loop, lr=1e-3, weight_decay=0.0, attached=True, **_):
    """Pretrains a backbone on 8 Gaussian clusters, freezes it, fine-tunes an adapter and a head on another
    labelling of the same inputs (which of two groups of clusters)."""
    centres = torch.randn(8, 16) * 2
    groups = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1])

    def sample(n):
        k = torch.randint(0, 8, (n,))
        return centres[k] + torch.randn(n, 16), k

    backbone = mlp([16, 64, 32])
    pre_head = nn.Linear(32, 8)
    pre = torch.optim.Adam([*backbone.parameters(), *pre_head.parameters()], lr=3e-3)
    for _ in range(200):
        xb, kb = sample(64)
        pre.zero_grad()
        F.cross_entropy(pre_head(torch.relu(backbone(xb))), kb).backward()
        pre.step()
    backbone.requires_grad_(False)
    adapter, head = nn.Linear(32, 32), nn.Linear(32, 2)
    nn.init.zeros_(adapter.weight)
    nn.init.zeros_(adapter.bias)
    params = [*adapter.parameters(), *head.parameters()]
    optimizer = adam(params, lr, weight_decay)
    other_head = nn.Linear(32, 2)  # built after the optimizer was: it never sees this head

    def step_fn(step):
        xb, kb = sample(32)
        h = torch.relu(backbone(xb))
        if attached:
            return F.cross_entropy(head(h + adapter(h)), groups[kb]), None
        # The adapter built and handed to the optimizer but never called, and the head replaced after the
        # optimizer was built: nothing the optimizer holds is in the graph.
        return F.cross_entropy(other_head(h), groups[kb]), None

    return train(step_fn, params, optimizer, loop), {"chance": math.log(2), "objective": "minimise"}


def denoiser(loop: Loop, lr=1e-3, **_):
    def points(n):
        t = torch.rand(n) * 3 * math.pi
        return torch.stack([t * torch.cos(t), t * torch.sin(t)], 1) / 5 + 0.05 * torch.randn(n, 2)

    model = mlp([3, 64, 64, 2], nn.SiLU)
    params = list(model.parameters())
    optimizer = adam(params, lr)

    def step_fn(step):
        x0 = points(64)
        sigma = torch.rand(64, 1)
        noise = torch.randn_like(x0)
        xt = (1 - sigma**2).sqrt() * x0 + sigma * noise
        return F.mse_loss(model(torch.cat([xt, sigma], 1)), noise), None

    return train(step_fn, params, optimizer, loop), {"chance": None, "objective": "minimise"}


def gan(loop: Loop, lr=1e-3, d_lr=1e-3, d_steps=1, saturating=False, **_):
    angles = torch.arange(8) * (2 * math.pi / 8)
    modes = torch.stack([angles.cos(), angles.sin()], 1) * 2

    def real(n):
        return modes[torch.randint(0, 8, (n,))] + 0.05 * torch.randn(n, 2)

    g, d = mlp([4, 64, 64, 2]), mlp([2, 64, 64, 1], nn.LeakyReLU)
    params = list(g.parameters())
    optimizer = adam(params, lr, betas=(0.5, 0.999))
    d_opt = adam(list(d.parameters()), d_lr, betas=(0.5, 0.999))

    def step_fn(step):
        for _ in range(d_steps):
            fake = g(torch.randn(64, 4)).detach()
            d_loss = F.binary_cross_entropy_with_logits(d(real(64)), torch.ones(64, 1))
            d_loss = d_loss + F.binary_cross_entropy_with_logits(d(fake), torch.zeros(64, 1))
            d_opt.zero_grad()
            d_loss.backward()
            d_opt.step()
        logits = d(g(torch.randn(64, 4)))
        if saturating:  # minimise log(1 - D(G(z))): its gradient vanishes as the discriminator wins
            loss = -F.softplus(logits).mean()
        else:  # the non-saturating loss, -log D(G(z))
            loss = F.binary_cross_entropy_with_logits(logits, torch.ones(64, 1))
        return loss, {"loss_discriminator": float(d_loss)}

    return train(step_fn, params, optimizer, loop), {"chance": None, "objective": "adversarial"}


def contrastive(loop: Loop, lr=1e-3, **_):
    latents = torch.randn(512, 8)
    mix = torch.randn(8, 16)
    encoder = mlp([16, 64, 32])
    params = list(encoder.parameters())
    optimizer = adam(params, lr)

    def step_fn(step):
        z = latents[torch.randint(0, len(latents), (32,))] @ mix
        a = F.normalize(encoder(z + 0.3 * torch.randn_like(z)), dim=1)
        b = F.normalize(encoder(z + 0.3 * torch.randn_like(z)), dim=1)
        return F.cross_entropy(a @ b.T / 0.2, torch.arange(32)), None

    facts = {"chance": math.log(32), "objective": "contrastive", "collapse_level": math.log(32)}
    return train(step_fn, params, optimizer, loop), facts


def bandit(loop: Loop, lr=3e-2, **_):
    arms = torch.randn(10, 8)
    policy = nn.Linear(8, 10)
    params = list(policy.parameters())
    optimizer = adam(params, lr)

    def step_fn(step):
        c = torch.randn(16, 8)
        logp = F.log_softmax(policy(c), 1)
        a = torch.multinomial(logp.exp().detach(), 1)[:, 0]
        r = torch.bernoulli(torch.sigmoid(2 * (c * arms[a]).sum(1)))
        advantage = r - r.mean()  # a batch whose rewards tie: an advantage, and a gradient, of exactly 0
        loss = -(advantage * logp[torch.arange(16), a]).mean()
        return loss, {"reward": float(r.mean())}

    return train(step_fn, params, optimizer, loop), {"chance": None, "objective": "reinforcement"}


def vae(loop: Loop, lr=2e-3, **_):
    """A variational autoencoder of 8-D points near a 2-D sheet: reconstruction plus the KL term."""
    mix = torch.randn(2, 8) / 2

    def points(n):
        z = torch.rand(n, 2) * 4 - 2
        return torch.tanh(z @ mix) + 0.05 * torch.randn(n, 8)

    enc, dec = mlp([8, 64, 4], nn.Tanh), mlp([2, 64, 8], nn.Tanh)
    params = [*enc.parameters(), *dec.parameters()]
    optimizer = adam(params, lr)

    def step_fn(step):
        x = points(128)
        mu, log_var = enc(x).chunk(2, 1)
        z = mu + (0.5 * log_var).exp() * torch.randn_like(mu)
        recon = F.mse_loss(dec(z), x, reduction="none").sum(1).mean()
        kl = (-0.5 * (1 + log_var - mu**2 - log_var.exp()).sum(1)).mean()
        return recon + kl, None

    return train(step_fn, params, optimizer, loop), {"chance": None, "objective": "minimise"}


def tabular(loop: Loop, lr=0.01, opt="sgd", **_):
    """An MLP regressor on 12 tabular features of mixed scales (standardised), SGD with momentum."""
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(12, generator=gen)
    x_all = torch.randn(4096, 12, generator=gen) * torch.logspace(-1, 1, 12)
    y_all = torch.sin(x_all[:, :4] @ w[:4] / 4) * 3 + (x_all[:, 4:] / torch.logspace(-1, 1, 12)[4:]) @ w[4:] / 3
    y_all = y_all + 0.3 * torch.randn(4096, generator=gen)
    x_all = (x_all - x_all.mean(0)) / x_all.std(0)
    model = mlp([12, 64, 64, 1], nn.ReLU)
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr, momentum=0.9) if opt == "sgd" else adam(params, lr)

    def step_fn(step):
        idx = torch.randint(0, 4096, (64,))
        return F.mse_loss(model(x_all[idx]).squeeze(1), y_all[idx]), None

    return train(step_fn, params, optimizer, loop), {"chance": None, "objective": "minimise"}


def gru(loop: Loop, lr=3e-3, opt="adam", weight_decay=0.0, **_):
    """A GRU that reads 10 tokens of 8 and writes them back reversed: a recurrent net's bursty norm."""
    vocab, length = 8, 10
    emb, rnn, head = nn.Embedding(vocab + 1, 16), nn.GRU(16, 64, batch_first=True), nn.Linear(64, vocab)
    params = [*emb.parameters(), *rnn.parameters(), *head.parameters()]
    if opt == "adam":
        optimizer = adam(params, lr, weight_decay=weight_decay)
    else:
        optimizer = torch.optim.SGD(params, lr=lr, momentum=0.9)

    def step_fn(step):
        x = torch.randint(0, vocab, (32, length))
        out, _ = rnn(emb(torch.cat([x, torch.full_like(x, vocab)], 1)))  # read, then write on a blank token
        logits = head(out[:, length:])
        return F.cross_entropy(logits.reshape(-1, vocab), x.flip(1).reshape(-1)), None

    return train(step_fn, params, optimizer, loop), {"chance": math.log(vocab), "objective": "minimise"}


def ranker(loop: Loop, lr=0.05, **_):
    """An MLP scorer of 16 features trained on pairs with a margin ranking (hinge) loss, SGD with momentum:
    a loss that is exactly 0 on the pairs it orders by the margin."""
    gen = torch.Generator().manual_seed(11)
    w = torch.randn(16, generator=gen)
    model = mlp([16, 32, 1], nn.ReLU)
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr, momentum=0.9)

    def step_fn(step):
        a, b = torch.randn(64, 16), torch.randn(64, 16)
        target = torch.sign((a - b) @ w + 0.3 * torch.randn(64))
        return F.margin_ranking_loss(model(a).squeeze(1), model(b).squeeze(1), target, margin=1.0), None

    return train(step_fn, params, optimizer, loop), {"chance": None, "objective": "minimise"}


def attnlm(loop: Loop, lr=1e-3, opt="adam", weight_decay=0.0, **_):
    """A 2-layer pre-LayerNorm causal transformer character LM (16 characters of context) on the
    standard-library source: attention, LayerNorm and a learned position embedding, as small LMs are built."""
    text = stdlib_text()
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(c) for c in text])
    context, vocab, width = 16, len(chars), 48
    emb, pos = nn.Embedding(vocab, width), nn.Parameter(torch.zeros(context, width))
    layer = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
    body, norm, head = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), nn.LayerNorm(width), nn.Linear(width, vocab)
    params = [*emb.parameters(), pos, *body.parameters(), *norm.parameters(), *head.parameters()]
    if opt == "adam":
        optimizer = adam(params, lr, weight_decay=weight_decay, betas=(0.9, 0.95))
    else:
        optimizer = torch.optim.SGD(params, lr=lr, momentum=0.9)
    mask = nn.Transformer.generate_square_subsequent_mask(context)

    def step_fn(step):
        start = torch.randint(0, len(ids) - context - 1, (32,))
        x = torch.stack([ids[s : s + context] for s in start])
        y = torch.stack([ids[s + 1 : s + context + 1] for s in start])
        h = norm(body(emb(x) + pos, mask=mask, is_causal=True))
        return F.cross_entropy(head(h).reshape(-1, vocab), y.reshape(-1)), None

    return train(step_fn, params, optimizer, loop), {"chance": math.log(vocab), "objective": "minimise"}


def forecast(loop: Loop, lr=3e-3, **_):
    """An LSTM that forecasts the next 4 points of a noisy sum of three sines from its last 24, with the
    Huber loss (smooth L1): a regression whose floor is the noise's, not 0."""

    def series(n: int) -> torch.Tensor:
        t = torch.arange(28, dtype=torch.float32) + torch.rand(n, 1) * 1000
        phase = torch.rand(n, 3) * 6.283
        wave = sum(torch.sin(t / period + phase[:, i : i + 1]) / (i + 1) for i, period in enumerate((3.0, 7.0, 17.0)))
        return (wave + 0.1 * torch.randn(n, 28)).unsqueeze(-1)

    rnn, head = nn.LSTM(1, 48, batch_first=True), nn.Linear(48, 4)
    params = [*rnn.parameters(), *head.parameters()]
    optimizer = adam(params, lr)

    def step_fn(step):
        x = series(32)
        out, _ = rnn(x[:, :24])
        return F.smooth_l1_loss(head(out[:, -1]), x[:, 24:, 0]), None

    return train(step_fn, params, optimizer, loop), {"chance": None, "objective": "minimise"}


def grpo(loop: Loop, lr=3e-3, beta=0.04, reward_bug=False, **_):
    """A group-relative policy gradient (GRPO's objective, small): for each of 8 prompts (a context of 12
    features) the policy samples a group of 8 answers among 16; an answer is rewarded 1 if it is the
    prompt's right one (a hidden linear rule) and 0.2 if it is a neighbour of it; advantages are the
    rewards' differences from their group's mean over its spread, and a KL term (beta) holds the policy
    near its initial copy. A group whose rewards all tie has no advantage. ``reward_bug``: the reward is
    computed against answers shuffled apart from their prompts (labels that lost their alignment), so it
    pays at random."""
    rule = torch.randn(12, 16)
    policy, ref = mlp([12, 64, 16], nn.Tanh), mlp([12, 64, 16], nn.Tanh)
    ref.load_state_dict(policy.state_dict())
    ref.requires_grad_(False)
    params = list(policy.parameters())
    optimizer = adam(params, lr)

    def step_fn(step):
        c = torch.randn(8, 12)
        right = (c @ rule).argmax(1)
        logp = F.log_softmax(policy(c), 1)
        answers = torch.multinomial(logp.exp().detach(), 8, replacement=True)  # (prompts, group)
        target = torch.randint(0, 16, (8,)) if reward_bug else right
        distance = (answers - target[:, None]).abs()
        r = (distance == 0).float() + 0.2 * (distance == 1).float()
        advantage = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)
        chosen = logp.gather(1, answers)
        ref_logp = F.log_softmax(ref(c), 1)
        kl = (logp.exp() * (logp - ref_logp)).sum(1).mean()
        loss = -(advantage * chosen).mean() + beta * kl
        return loss, {"reward": float(r.mean())}

    return train(step_fn, params, optimizer, loop), {"chance": None, "objective": "reinforcement"}


def vit(loop: Loop, lr=1e-3, opt="adam", weight_decay=0.0, **_):
    """A tiny vision transformer on the 16x16 shapes: 4x4 patches, a class token, a learned position
    embedding and 2 pre-LayerNorm encoder layers of width 32."""
    x, y = shapes_data()
    width = 32
    patch = nn.Linear(16, width)
    cls, pos = nn.Parameter(torch.zeros(1, 1, width)), nn.Parameter(torch.zeros(1, 17, width))
    layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.0, batch_first=True, norm_first=True)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    norm, head = nn.LayerNorm(width), nn.Linear(width, 3)
    params = [*patch.parameters(), cls, pos, *encoder.parameters(), *norm.parameters(), *head.parameters()]
    optimizer = adam(params, lr, weight_decay)

    def step_fn(step):
        i = torch.randint(0, len(x), (32,))
        patches = x[i].unfold(2, 4, 4).unfold(3, 4, 4).reshape(32, 16, 16)  # (batch, 16 patches, 4x4)
        tokens = torch.cat([cls.expand(32, 1, width), patch(patches)], 1) + pos
        return F.cross_entropy(head(norm(encoder(tokens)[:, 0])), y[i]), None

    return train(step_fn, params, optimizer, loop), {"chance": math.log(3), "objective": "minimise"}


def gnn(loop: Loop, lr=1e-2, opt="adam", weight_decay=0.0, **_):
    """A two-layer graph convolutional network (GCN) classifying the nodes of a stochastic block model: 600
    nodes in 4 communities, 16 noisy features a node, trained full-batch on half the nodes (the same batch
    at every step, dropout its only noise), as node classifiers are trained."""
    n, k = 600, 4
    y = torch.arange(n) % k
    a = (torch.rand(n, n) < torch.where(y[:, None] == y[None, :], 0.04, 0.006)).float().triu(1)
    a = a + a.T + torch.eye(n)
    d = a.sum(1).rsqrt()
    adj = d[:, None] * a * d[None, :]  # the symmetric normalisation, self-loops included
    x = 0.4 * torch.randn(k, 16)[y] + torch.randn(n, 16)
    train_nodes = torch.randperm(n)[: n // 2]
    first, second = nn.Linear(16, 32), nn.Linear(32, k)
    params = [*first.parameters(), *second.parameters()]
    optimizer = adam(params, lr, weight_decay) if opt == "adam" else torch.optim.SGD(params, lr=lr, momentum=0.9)

    def step_fn(step):
        h = F.dropout(F.relu(adj @ first(x)), 0.5)
        out = adj @ second(h)
        return F.cross_entropy(out[train_nodes], y[train_nodes]), None

    return train(step_fn, params, optimizer, loop), {"chance": math.log(k), "objective": "minimise"}


def distill(loop: Loop, lr=2e-3, opt="adam", weight_decay=0.0, **_):
    """Knowledge distillation: a small MLP student learns a larger, fixed teacher's softened outputs on
    10 classes (the KL divergence at temperature 4, times 16 as Hinton's recipe scales it): the loss
    falls toward what the student's capacity leaves, not toward 0."""
    teacher = mlp([20, 128, 128, 10])
    with torch.no_grad():
        for layer in teacher[::2]:
            layer.weight.mul_(2.0)  # a confident teacher: logits spread over several units
    teacher.requires_grad_(False)
    student = mlp([20, 24, 10])
    params = list(student.parameters())
    optimizer = adam(params, lr, weight_decay) if opt == "adam" else torch.optim.SGD(params, lr=lr, momentum=0.9)
    t = 4.0

    def step_fn(step):
        x = torch.randn(64, 20)
        target = F.log_softmax(teacher(x) / t, 1)
        return F.kl_div(F.log_softmax(student(x) / t, 1), target, log_target=True, reduction="batchmean") * t * t, None

    return train(step_fn, params, optimizer, loop), {"chance": None, "objective": "minimise"}


def ctc(loop: Loop, lr=3e-3, opt="adam", **_):
    """A speech-recognition-shaped model: a 1-D convolution and a bidirectional GRU read 48 frames of noisy
    8-D features, in which 3 to 6 symbols (of 10) are each held for 4 to 8 frames, and are trained with the
    CTC loss (the blank is class 0), as acoustic models are."""
    codebook = torch.randn(11, 8)
    codebook[0] = 0.0  # silence
    conv, rnn, head = nn.Conv1d(8, 32, 5, padding=2), nn.GRU(32, 32, batch_first=True, bidirectional=True), nn.Linear(64, 11)
    params = [*conv.parameters(), *rnn.parameters(), *head.parameters()]
    optimizer = adam(params, lr) if opt == "adam" else torch.optim.SGD(params, lr=lr, momentum=0.9)
    frames = 48

    def batch(n: int):
        feats, targets, lengths = torch.zeros(n, frames, 8), [], []
        for i in range(n):
            symbols = torch.randint(1, 11, (int(torch.randint(3, 7, ())),))
            at = int(torch.randint(0, 4, ()))
            for s in symbols.tolist():
                hold = int(torch.randint(4, 9, ()))
                feats[i, at : at + hold] = codebook[s]
                at += hold
            targets.append(symbols)
            lengths.append(len(symbols))
        return feats + 0.6 * torch.randn_like(feats), torch.cat(targets), torch.tensor(lengths)

    def step_fn(step):
        feats, targets, lengths = batch(16)
        h = F.relu(conv(feats.transpose(1, 2))).transpose(1, 2)
        out, _ = rnn(h)
        logp = F.log_softmax(head(out), -1).transpose(0, 1)  # (frames, batch, classes)
        every = torch.full((16,), frames, dtype=torch.long)
        return F.ctc_loss(logp, targets, every, lengths), None

    return train(step_fn, params, optimizer, loop), {"chance": None, "objective": "minimise"}


def dpo(loop: Loop, lr=3e-3, beta=0.1, weight_decay=0.0, reward_bug=False, **_):
    """Direct preference optimisation (DPO's loss, small): a policy over 16 answers to a context of 12
    features and a frozen copy of it as the reference; of each pair of answers the preferred one scores
    higher under a hidden linear rule. The loss starts at ln 2 and falls as the policy's log-ratio margin
    grows. ``reward_bug``: the preferences are a coin flip, apart from the pairs (labels that lost their
    alignment): there is nothing to learn."""
    rule = torch.randn(12, 16)
    policy, ref = mlp([12, 64, 16], nn.Tanh), mlp([12, 64, 16], nn.Tanh)
    ref.load_state_dict(policy.state_dict())
    ref.requires_grad_(False)
    params = list(policy.parameters())
    optimizer = adam(params, lr, weight_decay)

    def step_fn(step):
        c = torch.randn(32, 12)
        a, b = torch.randint(0, 16, (2, 32, 1))
        score = c @ rule
        prefer_a = torch.rand(32, 1) < 0.5 if reward_bug else score.gather(1, a) > score.gather(1, b)
        chosen, rejected = torch.where(prefer_a, a, b), torch.where(prefer_a, b, a)
        ratio = F.log_softmax(policy(c), 1) - F.log_softmax(ref(c), 1)
        margin = beta * (ratio.gather(1, chosen) - ratio.gather(1, rejected))
        return -F.logsigmoid(margin).mean(), None

    return train(step_fn, params, optimizer, loop), {"chance": math.log(2), "objective": "minimise"}


def mlm(loop: Loop, lr=1e-3, opt="adam", weight_decay=0.0, **_):
    """A 2-layer bidirectional transformer pretrained as a masked language model (BERT's objective, small):
    15% of 24 characters of standard-library source replaced by a mask token, the loss read at those."""
    text = stdlib_text()
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(c) for c in text])
    context, vocab, width, mask_id = 24, len(chars), 48, len(chars)
    emb, pos = nn.Embedding(vocab + 1, width), nn.Parameter(torch.zeros(context, width))
    layer = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
    body, head = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), nn.Linear(width, vocab)
    params = [*emb.parameters(), pos, *body.parameters(), *head.parameters()]
    optimizer = adam(params, lr, weight_decay) if opt == "adam" else torch.optim.SGD(params, lr=lr, momentum=0.9)

    def step_fn(step):
        start = torch.randint(0, len(ids) - context, (32,))
        y = torch.stack([ids[s : s + context] for s in start])
        masked = torch.rand(32, context) < 0.15
        masked[:, 0] |= ~masked.any(1)  # at least one position a sequence
        x = torch.where(masked, torch.full_like(y, mask_id), y)
        logits = head(body(emb(x) + pos))
        return F.cross_entropy(logits[masked], y[masked]), None

    return train(step_fn, params, optimizer, loop), {"chance": math.log(vocab), "objective": "minimise"}


def segment(loop: Loop, lr=2e-3, opt="adam", weight_decay=0.0, **_):
    """A small fully convolutional net segmenting 24x24 images: per-pixel cross-entropy of 3 classes
    (background, filled squares, rings) in noise, as segmentation heads are trained."""
    n, size = 1024, 24
    x, y = torch.randn(n, 1, size, size) * 0.4, torch.zeros(n, size, size, dtype=torch.long)
    for i in range(n):
        for _ in range(2):
            kind, r, c, k = int(torch.randint(1, 3, ())), *(int(v) for v in torch.randint(0, size - 8, (2,))), 6
            if kind == 1:
                x[i, 0, r : r + k, c : c + k] += 1.0
                y[i, r : r + k, c : c + k] = 1
            else:
                ring = torch.zeros(k, k, dtype=torch.bool)
                ring[0], ring[-1], ring[:, 0], ring[:, -1] = True, True, True, True
                x[i, 0, r : r + k, c : c + k] += ring.float()
                y[i, r : r + k, c : c + k] = torch.where(ring, 2, y[i, r : r + k, c : c + k])
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=2, dilation=2), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=4, dilation=4), nn.ReLU(), nn.Conv2d(16, 3, 1),
    )  # fmt: skip
    params = list(model.parameters())
    optimizer = adam(params, lr, weight_decay) if opt == "adam" else torch.optim.SGD(params, lr=lr, momentum=0.9)

    def step_fn(step):
        i = torch.randint(0, n, (16,))
        return F.cross_entropy(model(x[i]), y[i]), None

    return train(step_fn, params, optimizer, loop), {"chance": math.log(3), "objective": "minimise"}


def ppo(loop: Loop, lr=3e-3, reward_bug=False, **_):
    """Proximal policy optimisation on a contextual bandit of 12 arms (PPO's clipped objective, small): an
    actor and a critic share a trunk; each batch of 32 contexts is sampled from a copy of the policy
    refreshed every 4 steps, so the ratio moves and the clip acts; the loss is the clipped policy term,
    half the critic's squared error and an entropy bonus. ``reward_bug``: the reward ignores the action."""
    arms = torch.randn(12, 8)
    trunk, actor, critic = mlp([8, 64], nn.Tanh), nn.Linear(64, 12), nn.Linear(64, 1)
    params = [*trunk.parameters(), *actor.parameters(), *critic.parameters()]
    optimizer = adam(params, lr)
    old = [mlp([8, 64], nn.Tanh), nn.Linear(64, 12)]

    def step_fn(step):
        if step % 4 == 0:
            old[0].load_state_dict(trunk.state_dict())
            old[1].load_state_dict(actor.state_dict())
        c = torch.randn(32, 8)
        with torch.no_grad():
            old_logp = F.log_softmax(old[1](torch.tanh(old[0](c))), 1)
        a = torch.multinomial(old_logp.exp(), 1)[:, 0]
        payoff = (c * arms[torch.randint(0, 12, (32,)) if reward_bug else a]).sum(1)
        r = torch.bernoulli(torch.sigmoid(2 * payoff))
        h = torch.tanh(trunk(c))
        logp = F.log_softmax(actor(h), 1)
        value = critic(h)[:, 0]
        advantage = (r - value).detach()
        ratio = (logp[torch.arange(32), a] - old_logp[torch.arange(32), a]).exp()
        policy = -torch.min(ratio * advantage, ratio.clamp(0.8, 1.2) * advantage).mean()
        entropy = -(logp.exp() * logp).sum(1).mean()
        loss = policy + 0.5 * F.mse_loss(value, r) - 0.01 * entropy
        return loss, {"reward": float(r.mean())}

    return train(step_fn, params, optimizer, loop), {"chance": None, "objective": "reinforcement"}


class Coupling(nn.Module):
    """An affine coupling layer (RealNVP's): one coordinate of a 2-D point scales and shifts the other."""

    def __init__(self, flip: bool) -> None:
        super().__init__()
        self.flip, self.net = flip, mlp([1, 64, 64, 2], nn.Tanh)

    def forward(self, x):
        a, b = (x[:, 1:], x[:, :1]) if self.flip else (x[:, :1], x[:, 1:])
        log_s, t = self.net(a).chunk(2, 1)
        log_s = torch.tanh(log_s)
        b = b * log_s.exp() + t
        return (torch.cat([b, a], 1) if self.flip else torch.cat([a, b], 1)), log_s[:, 0]


def flow(loop: Loop, lr=2e-3, opt="adam", weight_decay=0.0, **_):
    """A normalising flow (six affine couplings, RealNVP-style) fitted by maximum likelihood to two moons of
    2-D points: its loss, the negative log-likelihood of a continuous density, falls from about 2.3 toward
    0.1 as the density sharpens (a likelihood, not a distance to targets: no floor at 0)."""
    n = 4096
    angle = torch.rand(n) * math.pi
    upper = torch.rand(n) < 0.5
    x = torch.stack([torch.cos(angle), torch.sin(angle)], 1)
    x = torch.where(upper[:, None], x, torch.stack([1 - x[:, 0], 0.5 - x[:, 1]], 1))
    data = (x - x.mean(0)) * 0.5 + 0.15 * torch.randn(n, 2)
    layers = nn.ModuleList([Coupling(i % 2 == 1) for i in range(6)])
    params = list(layers.parameters())
    optimizer = adam(params, lr, weight_decay) if opt == "adam" else torch.optim.SGD(params, lr=lr, momentum=0.9)

    def step_fn(step):
        z, logdet = data[torch.randint(0, n, (256,))], 0.0
        for layer in layers:
            z, ld = layer(z)
            logdet = logdet + ld
        nll = 0.5 * (z**2).sum(1) + math.log(2 * math.pi) - logdet
        return nll.mean(), None

    return train(step_fn, params, optimizer, loop), {"chance": None, "objective": "minimise"}


def seq2seq(loop: Loop, lr=3e-3, opt="adam", weight_decay=0.0, **_):
    """A GRU encoder-decoder that reverses sequences of 8 tokens from 12, trained with teacher forcing: the
    decoder reads the encoder's last state and the target shifted right, per-token cross-entropy."""
    vocab, length, width = 12, 8, 64
    emb, dec_emb = nn.Embedding(vocab, width), nn.Embedding(vocab + 1, width)
    encoder, decoder = nn.GRU(width, width, batch_first=True), nn.GRU(width, width, batch_first=True)
    head = nn.Linear(width, vocab)
    params = [*emb.parameters(), *dec_emb.parameters(), *encoder.parameters(), *decoder.parameters()]
    params += list(head.parameters())
    optimizer = adam(params, lr, weight_decay) if opt == "adam" else torch.optim.SGD(params, lr=lr, momentum=0.9)

    def step_fn(step):
        src = torch.randint(0, vocab, (32, length))
        tgt = src.flip(1)
        _, state = encoder(emb(src))
        shifted = torch.cat([torch.full((32, 1), vocab), tgt[:, :-1]], 1)
        out, _ = decoder(dec_emb(shifted), state)
        return F.cross_entropy(head(out).reshape(-1, vocab), tgt.reshape(-1)), None

    return train(step_fn, params, optimizer, loop), {"chance": math.log(vocab), "objective": "minimise"}


def mf(loop: Loop, lr=1e-2, opt="adam", weight_decay=0.0, **_):
    """Matrix factorisation of ratings (a recommender's first model): 300 users and 200 items, a rank-4
    truth plus noise, 15% of the pairs observed; embeddings of 16 and biases fitted to batches of 512
    ratings by squared error. Each step's gradient touches only the rows of its batch."""
    users, items, rank = 300, 200, 4
    truth = torch.randn(users, rank) @ torch.randn(rank, items) / 2 + 0.3 * torch.randn(users, 1)
    pairs = (torch.rand(users, items) < 0.15).nonzero()
    ratings = truth[pairs[:, 0], pairs[:, 1]] + 0.3 * torch.randn(len(pairs))
    u, v = nn.Embedding(users, 16), nn.Embedding(items, 16)
    nn.init.normal_(u.weight, std=0.1)
    nn.init.normal_(v.weight, std=0.1)
    bu, bv = nn.Parameter(torch.zeros(users)), nn.Parameter(torch.zeros(items))
    params = [u.weight, v.weight, bu, bv]
    optimizer = adam(params, lr, weight_decay) if opt == "adam" else torch.optim.SGD(params, lr=lr, momentum=0.9)

    def step_fn(step):
        i = torch.randint(0, len(pairs), (512,))
        a, b = pairs[i, 0], pairs[i, 1]
        guess = (u(a) * v(b)).sum(1) + bu[a] + bv[b]
        return F.mse_loss(guess, ratings[i]), None

    return train(step_fn, params, optimizer, loop), {"chance": None, "objective": "minimise"}


def moe(loop: Loop, lr=2e-3, opt="adam", weight_decay=0.0, **_):
    """A mixture of four expert MLPs behind a softmax router, top-1 routing scaled by the gate (Switch
    style) with its load-balancing loss (0.01 of it), classifying 16-D points into the 10 classes a
    fixed random teacher gives them."""
    dim, classes, experts = 16, 10, 4
    teacher = mlp([dim, 64, classes])
    for q in teacher.parameters():
        q.requires_grad_(False)
    router = nn.Linear(dim, experts)
    bank = nn.ModuleList(mlp([dim, 32, classes]) for _ in range(experts))
    params = [*router.parameters(), *bank.parameters()]
    sgd = opt != "adam"
    optimizer = torch.optim.SGD(params, lr=lr, momentum=0.9) if sgd else adam(params, lr, weight_decay)

    def step_fn(step):
        x = torch.randn(128, dim)
        target = teacher(x).argmax(1)
        gates = router(x).softmax(1)
        top, chosen = gates.max(1)
        out = torch.zeros(len(x), classes)
        for e, expert in enumerate(bank):
            rows = (chosen == e).nonzero().squeeze(1)
            if len(rows):
                out = out.index_add(0, rows, expert(x[rows]) * top[rows, None])
        share = torch.bincount(chosen, minlength=experts).float() / len(x)
        balance = experts * (share * gates.mean(0)).sum()
        return F.cross_entropy(out, target) + 0.01 * balance, None

    return train(step_fn, params, optimizer, loop), {"chance": math.log(classes), "objective": "minimise"}


def triplet(loop: Loop, lr=1e-3, opt="adam", weight_decay=0.0, **_):
    """Metric learning: an MLP embeds 16-D points of 8 clusters into 8-D, trained by the triplet margin loss
    (margin 1) on random triplets. A triplet already apart by the margin adds exactly 0, so a healthy run's
    loss and norm fall toward 0 as more triplets are satisfied."""
    dim, clusters = 16, 8
    gen = torch.Generator().manual_seed(7)
    centres = torch.randn(clusters, dim, generator=gen) * 1.5
    net = mlp([dim, 64, 8])
    params = list(net.parameters())
    sgd = opt != "adam"
    optimizer = torch.optim.SGD(params, lr=lr, momentum=0.9) if sgd else adam(params, lr, weight_decay)

    def points(labels):
        return centres[labels] + torch.randn(len(labels), dim)

    def step_fn(step):
        a = torch.randint(0, clusters, (128,))
        n = (a + torch.randint(1, clusters, (128,))) % clusters
        anchor, positive, negative = net(points(a)), net(points(a)), net(points(n))
        return F.triplet_margin_loss(anchor, positive, negative, margin=1.0), None

    return train(step_fn, params, optimizer, loop), {"chance": None, "objective": "minimise"}


FAMILIES = {
    f.__name__: f
    for f in (
        stdlm, shapes, finetune, denoiser, gan, contrastive, bandit, vae, tabular, gru, ranker, attnlm, forecast,
        grpo, vit, gnn, distill, ctc, dpo, mlm, segment, ppo, flow, seq2seq, mf, moe, triplet,
    )
}  # fmt: skip


# ----------------------------------------------------------------------------
# The causes: each cause(family, loop, **kw) -> (Trained, facts, truth entries)
# ----------------------------------------------------------------------------


def _run(family, loop, kw):
    return FAMILIES[family](loop, **kw)


def _blowup(trained: Trained, facts: dict, start: int = 0) -> int | None:
    """The blow-up of a run's loss: its first non-finite value for a loss near 0 of either sign (a policy
    gradient's, a GAN's: no "10x its level" there), make_runs.blowup_step otherwise."""
    if facts["objective"] in ("reinforcement", "adversarial"):
        return next((i for i, v in enumerate(trained.losses[start:], start) if not math.isfinite(v)), None)
    return blowup_step(trained.losses, start)


def healthy(family, loop, **kw):
    """The family learning normally."""
    trained, facts = _run(family, loop, kw)
    return trained, facts, {"cause": "learning normally", "verdicts": ["stable"], "onset": None, "actions": []}


def _mean(xs):
    return sum(xs) / len(xs)


def lr_too_high(family, loop, factor=1000.0, **kw):
    """A learning rate far too high from the first step."""
    loop.lr_factor = lambda s: factor
    trained, facts = _run(family, loop, kw)
    end = level(trained.losses, len(trained.losses) - 50, len(trained.losses))
    blew = _blowup(trained, facts) is not None or not math.isfinite(end)
    chance = facts["chance"]
    worse = end > 10 * abs(trained.losses[0])  # a regression (no chance level) that ended far above its start
    require(blew or worse or (chance is not None and end > 0.9 * chance), f"it learned (loss {end:.3g})")
    return trained, facts, {
        "cause": f"a learning rate {factor:g}x the healthy one from the first step",
        "verdicts": ["diverged", "nonfinite", "stalled"],
        "onset": 0,
        "actions": ["lower_lr"],
        "abrupt": True,
    }


def nothing_trains(family, loop, onset=0, **kw):
    """The loss reaches no trainable weight: every gradient exactly 0 from ``onset``."""
    if family == "finetune" and onset == 0:
        kw["attached"] = False
    else:
        loop.detached_from = onset
    trained, facts = _run(family, loop, kw)
    require(all(n == 0 for n in trained.norms[onset:]), "a gradient was not 0")
    where = "at every step" if onset == 0 else f"from step {onset}"
    return trained, facts, {
        "cause": f"the loss reaches no trainable weight: the gradient norm is exactly 0 {where}",
        "verdicts": ["vanishing", "stalled"],
        "onset": onset,
        "actions": ["no_gradient"],
        "abrupt": True,
    }


def fp16_underflow(family, loop, onset=150, **kw):
    """From ``onset`` the gradients pass through fp16 unscaled: every one underflows to exactly 0."""
    loop.underflow_from = onset
    loop.precision = None
    trained, facts = _run(family, loop, kw)
    require(all(n == 0 for n in trained.norms[onset:]) and trained.norms[onset - 1] > 0, "no underflow")
    return trained, facts, {
        "cause": f"fp16 gradients without a loss scaler from step {onset}: all underflow to exactly 0",
        "verdicts": ["vanishing", "stalled"],
        "onset": onset,
        "actions": ["grad_scaler", "bf16", "precision"],
        "abrupt": True,
    }


def weight_decay(family, loop, decay=100.0, **kw):
    """A weight decay so strong that it holds the weights near zero."""
    trained, facts = _run(family, loop, {**kw, "weight_decay": decay})
    chance = facts["chance"]
    end = level(trained.losses, len(trained.losses) - 50, len(trained.losses))
    require(chance is not None and end > 0.9 * chance, f"it learned (loss {end:.3g})")
    return trained, facts, {
        "cause": f"AdamW with weight decay {decay:g}: the weights are held near zero",
        "verdicts": ["stalled", "vanishing"],
        "onset": 0,
        "actions": ["weight_decay"],
        "abrupt": False,
    }


def plateau(family, loop, onset=30, warmup=0, **kw):
    """The learning rate cut 10^4x at ``onset`` (a schedule's mistake): the loss stays put for the rest."""
    loop.lr_factor = lambda s: (min(1.0, (s + 1) / warmup) if warmup else 1.0) * (1e-4 if s >= onset else 1)
    trained, facts = _run(family, loop, kw)
    n = len(trained.losses)
    mid, end = level(trained.losses, onset + 20, onset + 60), level(trained.losses, n - 40, n)
    require(end > 0.97 * mid, f"it still learned after step {onset} ({mid:.3g} to {end:.3g})")
    return trained, facts, {
        "cause": f"the learning rate cut 10^4x at step {onset}"
        + (f" after a {warmup}-step warmup" if warmup else "")
        + f": the loss stays put for the last {100 - 100 * onset // n}% of the run",
        "verdicts": ["stalled"],
        "onset": onset,
        "actions": ["raise_lr", "lr_schedule"],
        "abrupt": True,
    }


def slow_rise(family, loop, onset=120, growth=1.05, **kw):
    """The learning rate grows by ``growth`` per step from ``onset``: the norm rises before the loss turns."""
    loop.lr_factor = lambda s: growth ** max(0, s - onset)
    trained, facts = _run(family, loop, kw)
    blew = _blowup(trained, facts, onset)
    require(blew is not None and blew > onset + 10, f"blow-up at {blew}")
    return trained, facts, {
        "cause": f"the learning rate grows {growth:g}x per step from step {onset}",
        "verdicts": ["diverged", "nonfinite", "exploding"],
        "onset": onset,
        "actions": ["lower_lr", "lr_schedule"],
        "abrupt": False,
    }


def bad_init(family, loop, init_scale=30.0, **kw):
    """An unnormalised residual stack initialised ``init_scale`` times too large: a first loss thousands of
    times chance, then NaN."""
    trained, facts = _run(family, loop, {**kw, "init_scale": init_scale})
    first = trained.losses[0]
    require(first > 100 * facts["chance"], f"first loss {first:.3g}")
    require(any(not math.isfinite(v) for v in trained.losses[1:5] + trained.norms[1:5]), "no NaN at once")
    return trained, facts, {
        "cause": f"residual blocks without normalisation initialised {init_scale:g}x too large: a first loss of {first:.3g} "
        f"({first / facts['chance']:.0f}x chance), non-finite from the next steps",
        "verdicts": ["nonfinite", "diverged"],
        "onset": 0,
        "actions": ["normalisation"],
        "abrupt": True,
    }


def resume_jump(family, loop, onset=150, factor=7.0, **kw):
    """A resumed run whose code changed at ``onset``: every gradient ``factor`` times what it was (a loss
    summed where it was averaged; SGD takes a step that much longer)."""
    loop.grad_factor = lambda s: factor if s >= onset else 1.0
    trained, facts = _run(family, loop, kw)
    before, after = level(trained.norms, onset - 20, onset), level(trained.norms, onset, onset + 5)
    require(after > 4 * before, f"the norm went from {before:.3g} to {after:.3g}")
    blew = _blowup(trained, facts, onset)
    n = len(trained.losses)
    worse = level(trained.losses, n - 30, n) > 1.2 * level(trained.losses, onset - 30, onset)
    require(blew is not None or worse, "the run only went on learning")
    return trained, facts, {
        "cause": f"a resumed run's code change at step {onset}: every gradient {factor:g}x (the norm "
        f"{before:.3g} to {after:.3g}), a step too long for SGD",
        "verdicts": ["diverged", "nonfinite", "exploding"],
        "onset": onset,
        "actions": ["lower_lr", "lr_schedule"],
        "abrupt": True,
    }


def discriminator_wins(family, loop, **kw):
    """A discriminator that wins: 30x the generator's learning rate, 5 steps to its 1, and the generator on
    the saturating loss log(1 - D(G(z))), whose gradient vanishes as D(G(z)) goes to 0."""
    trained, facts = _run(family, loop, {"lr": 1e-4, **kw, "d_lr": 3e-3, "d_steps": 5, "saturating": True})
    n = len(trained.norms)
    start, end = level(trained.norms, 0, 20), level(trained.norms, n - 50, n)
    d_end = _mean(trained.extras["loss_discriminator"][-50:])
    require(end < start / 30 and d_end < 0.1, f"norm {start:.3g} to {end:.3g}, D loss {d_end:.3g}")
    return trained, facts, {
        "cause": f"the discriminator wins (its loss {d_end:.2g} at the end): the generator's gradient "
        f"vanishes ({start:.3g} to {end:.3g})",
        "verdicts": ["vanishing", "stalled"],
        "onset": 0,
        "actions": ["discriminator"],
        "abrupt": False,
    }


def collapse(family, loop, onset=100, factor=1e4, length=5, **kw):
    """A burst of ``factor`` times the learning rate at ``onset`` kills the encoder's units: the inputs map
    to nearly one embedding, the loss sits within 10% of ln 32 and the norm falls 100x and more."""
    loop.lr_factor = lambda s: factor if onset <= s < onset + length else 1.0
    trained, facts = _run(family, loop, kw)
    n = len(trained.losses)
    end = level(trained.losses, n - 50, n)
    before, after = level(trained.norms, onset - 20, onset), level(trained.norms, n - 50, n)
    require(end > 0.9 * facts["collapse_level"] and after < before / 100, f"loss {end:.4g}, norm {after:.3g}")
    return trained, facts, {
        "cause": f"a {length}-step burst of {factor:g}x the learning rate at step {onset}: a collapse "
        f"(the loss {end:.4g} ever after, ln 32 = {facts['collapse_level']:.4g}; the norm {before:.3g} to "
        f"{after:.3g})",
        "verdicts": ["diverged", "stalled", "vanishing"],
        "onset": onset,
        "actions": ["lower_lr", "checkpoint"],
        "abrupt": True,
    }


def policy_saturates(family, loop, factor=100.0, **kw):
    """A policy-gradient learning rate far too high: the policy turns deterministic on the arms of its first
    batches, its gradient falls to 0 and the reward stops improving."""
    loop.lr_factor = lambda s: factor
    trained, facts = _run(family, loop, kw)
    n = len(trained.norms)
    end = level(trained.norms, n - 50, n)
    require(end < level(trained.norms, 0, 20) / 10, f"norm at the end {end:.3g}")
    return trained, facts, {
        "cause": f"a learning rate {factor:g}x the healthy one: the policy saturates, its gradient falls to 0",
        "verdicts": ["vanishing", "stalled"],
        "onset": 0,
        "actions": ["lower_lr"],
        "abrupt": False,
    }


def _reward_rise(trained: Trained) -> tuple[float, float]:
    r = trained.extras["reward"]
    return _mean(r[:60]), _mean(r[-100:])


def reward_never_pays(family, loop, **kw):
    """The reward is computed against answers shuffled apart from their prompts: it pays at random, whatever
    the policy answers, and the reward never rises."""
    trained, facts = _run(family, loop, {**kw, "reward_bug": True})
    first, last = _reward_rise(trained)
    require(last < first + 0.02, f"the reward rose from {first:.3g} to {last:.3g}")
    return trained, facts, {
        "cause": f"a reward computed against answers shuffled apart from their prompts: it pays at random "
        f"({first:.3g} over the "
        f"first 60 steps, {last:.3g} over the last 100)",
        "verdicts": ["stalled"],
        "onset": 0,
        "actions": ["check_labels"],
        "abrupt": False,
    }


def lr_too_low(family, loop, factor=1e-3, **kw):
    """A learning rate far too low from the first step: the model barely moves, the reward (or, without one,
    the loss) stays put."""
    loop.lr_factor = lambda s: factor
    trained, facts = _run(family, loop, kw)
    if "reward" in trained.extras:
        first, last = _reward_rise(trained)
        require(last < first + 0.02, f"the reward rose from {first:.3g} to {last:.3g}")
        what = "the reward"
    else:
        first, last = level(trained.losses, 0, 20), level(trained.losses, len(trained.losses) - 50, len(trained.losses))
        require(last > 0.95 * first, f"the loss fell from {first:.3g} to {last:.3g}")
        what = "the loss"
    return trained, facts, {
        "cause": f"a learning rate {factor:g}x the healthy one: {what} stays put ({first:.3g} to {last:.3g})",
        "verdicts": ["stalled"],
        "onset": 0,
        "actions": ["raise_lr"],
        "abrupt": False,
    }


def labels_shuffled(family, loop, **kw):
    """The labels lost their alignment with the inputs (a preference pair's order is a coin flip): the loss
    stays at its chance level, whatever the model does."""
    trained, facts = _run(family, loop, {**kw, "reward_bug": True})
    chance, n = facts["chance"], len(trained.losses)
    end = level(trained.losses, n - 50, n)
    require(end > 0.97 * chance, f"it learned (loss {end:.3g}, chance {chance:.3g})")
    return trained, facts, {
        "cause": f"labels that lost their alignment with the inputs: the loss stays at chance ({end:.3g}, "
        f"ln 2 = {chance:.3g})",
        "verdicts": ["stalled"],
        "onset": 0,
        "actions": ["check_labels", "check_data"],
        "abrupt": False,
    }


@dataclass(frozen=True)
class Spec:
    name: str
    family: str
    cause: Callable
    args: dict = field(default_factory=dict)
    loop: dict = field(default_factory=dict)
    seed: int = 0


NOLR = {"log_settings": False, "precision": None}
SPECS = [
    Spec("stdlm-healthy", "stdlm", healthy, seed=401),
    Spec("stdlm-healthy-nolr", "stdlm", healthy, loop=NOLR, seed=402),
    Spec("stdlm-healthy-thinned", "stdlm", healthy, loop={"steps": 1000, "every": 10, "window": 5}, seed=403),
    Spec("stdlm-lr-too-high", "stdlm", lr_too_high, {"factor": 1000.0}, seed=404),
    Spec("stdlm-lr-too-high-nolr", "stdlm", lr_too_high, {"factor": 3000.0}, NOLR, seed=405),
    Spec("stdlm-plateau-warmup", "stdlm", plateau, {"onset": 30, "warmup": 20}, seed=406),
    Spec("stdlm-plateau-nolr", "stdlm", plateau, {"onset": 30}, NOLR, seed=407),
    Spec("stdlm-resume-jump-nolr", "stdlm", resume_jump, {"opt": "sgd", "lr": 0.3}, NOLR, seed=408),
    Spec("shapes-healthy", "shapes", healthy, seed=411),
    Spec("shapes-healthy-sgd-nolr", "shapes", healthy, {"opt": "sgd", "lr": 0.02}, NOLR, seed=412),
    Spec("shapes-lr-too-high-nolr", "shapes", lr_too_high, {"factor": 1000.0}, NOLR, seed=413),
    Spec("shapes-bad-init-nolr", "shapes", bad_init, {"opt": "sgd", "lr": 0.5, "init_scale": 6.0, "blocks": 8}, NOLR, 414),
    Spec("shapes-weight-decay-nolr", "shapes", weight_decay, {"decay": 100.0}, NOLR, seed=415),
    Spec("finetune-healthy", "finetune", healthy, seed=421),
    Spec("finetune-healthy-nolr", "finetune", healthy, loop=NOLR, seed=422),
    Spec("finetune-not-attached", "finetune", nothing_trains, seed=423),
    Spec("finetune-not-attached-nolr", "finetune", nothing_trains, loop=NOLR, seed=424),
    Spec("finetune-weight-decay", "finetune", weight_decay, {"decay": 800.0}, seed=425),
    Spec("denoiser-healthy", "denoiser", healthy, seed=431),
    Spec("denoiser-healthy-thinned-nolr", "denoiser", healthy, loop={**NOLR, "steps": 1000, "every": 5,
                                                                      "window": 5}, seed=432),
    Spec("denoiser-slow-rise", "denoiser", slow_rise, {"onset": 120, "growth": 1.05}, seed=433),
    Spec("denoiser-slow-rise-nolr", "denoiser", slow_rise, {"onset": 150, "growth": 1.04}, NOLR, seed=434),
    Spec("denoiser-fp16-underflow", "denoiser", fp16_underflow, {"onset": 150}, NOLR, seed=435),
    Spec("gan-healthy", "gan", healthy, seed=441),
    Spec("gan-healthy-nolr", "gan", healthy, loop=NOLR, seed=442),
    Spec("gan-discriminator-wins", "gan", discriminator_wins, seed=443),
    Spec("gan-discriminator-wins-nolr", "gan", discriminator_wins, loop=NOLR, seed=444),
    Spec("contrastive-healthy", "contrastive", healthy, seed=451),
    Spec("contrastive-healthy-nolr", "contrastive", healthy, loop=NOLR, seed=452),
    Spec("contrastive-collapse", "contrastive", collapse, {"onset": 100}, seed=453),
    Spec("contrastive-collapse-nolr", "contrastive", collapse, {"onset": 140}, NOLR, seed=454),
    Spec("bandit-healthy", "bandit", healthy, seed=461),
    Spec("bandit-healthy-nolr", "bandit", healthy, loop=NOLR, seed=462),
    Spec("bandit-detached-nolr", "bandit", nothing_trains, loop=NOLR, seed=463),
    Spec("bandit-detached-midway", "bandit", nothing_trains, {"onset": 150}, seed=464),
    Spec("bandit-policy-saturates", "bandit", policy_saturates, {"factor": 100.0}, seed=465),
    # A second batch, scored live from the first run of the diagnosis on it: families no rule has seen.
    Spec("vae-healthy", "vae", healthy, seed=471),
    Spec("vae-healthy-nolr", "vae", healthy, loop=NOLR, seed=472),
    Spec("vae-lr-too-high-nolr", "vae", lr_too_high, {"factor": 1000.0}, NOLR, seed=473),
    Spec("vae-plateau", "vae", plateau, {"onset": 40}, seed=474),
    Spec("vae-slow-rise-nolr", "vae", slow_rise, {"onset": 120, "growth": 1.05}, NOLR, seed=475),
    Spec("tabular-healthy", "tabular", healthy, seed=481),
    Spec("tabular-healthy-nolr", "tabular", healthy, loop=NOLR, seed=482),
    Spec("tabular-lr-too-high", "tabular", lr_too_high, {"factor": 300.0}, seed=483),
    Spec("tabular-plateau-warmup-nolr", "tabular", plateau, {"onset": 25, "warmup": 10}, NOLR, seed=484),
    Spec("tabular-slow-rise", "tabular", slow_rise, {"onset": 100, "growth": 1.06}, seed=485),
    # A third batch, made after the rule change "a collapse that a divergence led into", scored live from the
    # first run of the diagnosis on it.
    Spec("gru-healthy", "gru", healthy, seed=491),
    Spec("gru-healthy-nolr", "gru", healthy, loop=NOLR, seed=492),
    Spec("gru-lr-too-high-nolr", "gru", lr_too_high, {"factor": 300.0}, NOLR, seed=493),
    Spec("gru-slow-rise", "gru", slow_rise, {"onset": 120, "growth": 1.06, "opt": "sgd", "lr": 0.1}, seed=494),
    Spec("gru-plateau-nolr", "gru", plateau, {"onset": 40}, NOLR, seed=495),
    Spec("gru-weight-decay", "gru", weight_decay, {"decay": 100.0}, seed=496),
    Spec("ranker-healthy", "ranker", healthy, seed=501),
    Spec("ranker-healthy-nolr", "ranker", healthy, loop=NOLR, seed=502),
    Spec("ranker-lr-too-high", "ranker", lr_too_high, {"factor": 1000.0}, seed=503),
    Spec("ranker-slow-rise-nolr", "ranker", slow_rise, {"onset": 100, "growth": 1.06}, NOLR, seed=504),
    Spec("ranker-plateau-warmup", "ranker", plateau, {"onset": 30, "warmup": 10}, seed=505),
    # A fourth batch, made after the rule change "a plateau in a log without the learning rate names both
    # causes", scored live from the first run of the diagnosis on it.
    Spec("attnlm-healthy", "attnlm", healthy, seed=511),
    Spec("attnlm-healthy-nolr", "attnlm", healthy, loop=NOLR, seed=512),
    Spec("attnlm-lr-too-high-nolr", "attnlm", lr_too_high, {"factor": 3000.0}, NOLR, seed=513),
    Spec("attnlm-plateau-nolr", "attnlm", plateau, {"onset": 40}, NOLR, seed=514),
    Spec("attnlm-slow-rise", "attnlm", slow_rise, {"onset": 120, "growth": 1.05}, seed=515),
    Spec("attnlm-weight-decay", "attnlm", weight_decay, {"decay": 100.0}, seed=516),
    Spec("forecast-healthy", "forecast", healthy, seed=521),
    Spec("forecast-healthy-nolr", "forecast", healthy, loop=NOLR, seed=522),
    Spec("forecast-lr-too-high", "forecast", lr_too_high, {"factor": 1000.0}, seed=523),
    Spec("forecast-fp16-underflow-nolr", "forecast", fp16_underflow, {"onset": 150}, NOLR, seed=524),
    Spec("forecast-plateau-warmup", "forecast", plateau, {"onset": 40, "warmup": 10}, seed=525),
    Spec("forecast-detached-midway", "forecast", nothing_trains, {"onset": 150}, seed=526),
    # A fifth batch, made after the rule changes "a reward-driven run's logged reward is evidence" and "a
    # tied batch's drop is ordinary", scored live from the first run of the diagnosis on it.
    Spec("grpo-healthy", "grpo", healthy, seed=531),
    Spec("grpo-healthy-nolr", "grpo", healthy, loop=NOLR, seed=532),
    Spec("grpo-reward-never-pays", "grpo", reward_never_pays, seed=533),
    Spec("grpo-reward-never-pays-nolr", "grpo", reward_never_pays, loop=NOLR, seed=534),
    Spec("grpo-lr-too-low", "grpo", lr_too_low, {"factor": 1e-3}, seed=535),
    Spec("grpo-policy-saturates", "grpo", policy_saturates, {"factor": 100.0}, seed=536),
    Spec("vit-healthy", "vit", healthy, seed=541),
    Spec("vit-healthy-nolr", "vit", healthy, loop=NOLR, seed=542),
    Spec("vit-lr-too-high-nolr", "vit", lr_too_high, {"factor": 1000.0}, NOLR, seed=543),
    Spec("vit-plateau-warmup", "vit", plateau, {"onset": 30, "warmup": 10}, seed=544),
    Spec("vit-slow-rise-nolr", "vit", slow_rise, {"onset": 120, "growth": 1.05}, NOLR, seed=545),
    Spec("vit-weight-decay", "vit", weight_decay, {"decay": 100.0}, seed=546),
    # A sixth batch, made after the rule changes "a loss rising into inf diverged from the start", "a norm
    # never finite leads with the precision" and "a plateau at a logged cut is dated from the cut", scored
    # live from the first run of the diagnosis on it.
    Spec("gnn-healthy", "gnn", healthy, seed=551),
    Spec("gnn-healthy-nolr", "gnn", healthy, loop=NOLR, seed=552),
    Spec("gnn-lr-too-high-nolr", "gnn", lr_too_high, {"factor": 300.0}, NOLR, seed=553),
    Spec("gnn-weight-decay", "gnn", weight_decay, {"decay": 100.0}, seed=554),
    Spec("gnn-plateau-warmup", "gnn", plateau, {"onset": 40, "warmup": 10}, seed=555),
    Spec("gnn-detached-midway", "gnn", nothing_trains, {"onset": 150}, seed=556),
    Spec("distill-healthy", "distill", healthy, seed=561),
    Spec("distill-healthy-nolr", "distill", healthy, loop=NOLR, seed=562),
    Spec("distill-lr-too-high", "distill", lr_too_high, {"factor": 1e4}, seed=563),
    Spec("distill-slow-rise-nolr", "distill", slow_rise, {"onset": 120, "growth": 1.05}, NOLR, seed=564),
    Spec("distill-fp16-underflow-nolr", "distill", fp16_underflow, {"onset": 150}, NOLR, seed=565),
    Spec("distill-resume-jump-nolr", "distill", resume_jump, {"opt": "sgd", "lr": 1.0}, NOLR, seed=566),
    Spec("ctc-healthy", "ctc", healthy, seed=571),
    Spec("ctc-healthy-nolr", "ctc", healthy, loop=NOLR, seed=572),
    Spec("ctc-lr-too-high-nolr", "ctc", lr_too_high, {"factor": 1e4}, NOLR, seed=573),
    Spec("ctc-slow-rise", "ctc", slow_rise, {"onset": 100, "growth": 1.06}, seed=574),
    Spec("ctc-plateau-nolr", "ctc", plateau, {"onset": 40}, NOLR, seed=575),
    Spec("dpo-healthy", "dpo", healthy, seed=581),
    Spec("dpo-healthy-nolr", "dpo", healthy, loop=NOLR, seed=582),
    Spec("dpo-labels-shuffled", "dpo", labels_shuffled, seed=583),
    Spec("dpo-labels-shuffled-nolr", "dpo", labels_shuffled, loop=NOLR, seed=584),
    Spec("dpo-lr-too-low-nolr", "dpo", lr_too_low, {"factor": 1e-3}, NOLR, seed=585),
    Spec("dpo-lr-too-high", "dpo", lr_too_high, {"factor": 1000.0}, seed=586),
    # A seventh batch, made after the rule changes "a loss made worse from its first point is a rate too
    # high", "a flat loss without the rate is said, not judged" and "a climbing baseline warns", scored live
    # from the first run of the diagnosis on it.
    Spec("mlm-healthy", "mlm", healthy, seed=591),
    Spec("mlm-healthy-nolr", "mlm", healthy, loop=NOLR, seed=592),
    Spec("mlm-lr-too-high-nolr", "mlm", lr_too_high, {"factor": 1000.0}, NOLR, seed=593),
    Spec("mlm-slow-rise-nolr", "mlm", slow_rise, {"onset": 120, "growth": 1.05}, NOLR, seed=594),
    Spec("mlm-weight-decay", "mlm", weight_decay, {"decay": 100.0}, seed=595),
    Spec("mlm-plateau-warmup", "mlm", plateau, {"onset": 40, "warmup": 10}, seed=596),
    Spec("segment-healthy", "segment", healthy, seed=601),
    Spec("segment-healthy-nolr", "segment", healthy, loop=NOLR, seed=602),
    Spec("segment-lr-too-high", "segment", lr_too_high, {"factor": 1e4}, seed=603),
    Spec("segment-slow-rise", "segment", slow_rise, {"onset": 120, "growth": 1.05}, seed=604),
    Spec("segment-fp16-underflow-nolr", "segment", fp16_underflow, {"onset": 150}, NOLR, seed=605),
    Spec("segment-detached-midway-nolr", "segment", nothing_trains, {"onset": 150}, NOLR, seed=606),
    Spec("ppo-healthy", "ppo", healthy, seed=611),
    Spec("ppo-healthy-nolr", "ppo", healthy, loop=NOLR, seed=612),
    Spec("ppo-reward-never-pays", "ppo", reward_never_pays, seed=613),
    Spec("ppo-lr-too-low-nolr", "ppo", lr_too_low, {"factor": 1e-3}, NOLR, seed=614),
    # An eighth batch, made after the rule changes "a 'can't tell' action names both causes", "a loss still
    # falling along its line after an early fall is learning" and "a noisy norm lifted inside its band
    # warns", scored live from the first run of the diagnosis on it.
    Spec("flow-healthy", "flow", healthy, seed=621),
    Spec("flow-healthy-nolr", "flow", healthy, loop=NOLR, seed=622),
    Spec("flow-lr-too-high-nolr", "flow", lr_too_high, {"factor": 1000.0}, NOLR, seed=623),
    Spec("flow-slow-rise", "flow", slow_rise, {"onset": 120, "growth": 1.05}, seed=624),
    Spec("flow-lr-too-low", "flow", lr_too_low, {"factor": 1e-5}, seed=625),
    Spec("flow-detached-midway-nolr", "flow", nothing_trains, {"onset": 150}, NOLR, seed=626),
    Spec("seq2seq-healthy", "seq2seq", healthy, seed=631),
    Spec("seq2seq-healthy-nolr", "seq2seq", healthy, loop=NOLR, seed=632),
    Spec("seq2seq-lr-too-high-nolr", "seq2seq", lr_too_high, {"factor": 1000.0}, NOLR, seed=633),
    Spec("seq2seq-weight-decay", "seq2seq", weight_decay, {"decay": 100.0}, seed=634),
    Spec("seq2seq-plateau-nolr", "seq2seq", plateau, {"onset": 30}, NOLR, seed=635),
    Spec("seq2seq-fp16-underflow-nolr", "seq2seq", fp16_underflow, {"onset": 150}, NOLR, seed=636),
    Spec("mf-healthy", "mf", healthy, seed=641),
    Spec("mf-healthy-nolr", "mf", healthy, loop=NOLR, seed=642),
    Spec("mf-lr-too-high", "mf", lr_too_high, {"factor": 1000.0}, seed=643),
    Spec("mf-resume-jump-nolr", "mf", resume_jump, {"opt": "sgd", "lr": 3.0}, NOLR, seed=644),
    Spec("mf-slow-rise-nolr", "mf", slow_rise, {"onset": 120, "growth": 1.05}, NOLR, seed=645),
    Spec("mf-lr-too-low-nolr", "mf", lr_too_low, {"factor": 1e-3}, NOLR, seed=646),
    Spec("moe-healthy", "moe", healthy, seed=651),
    Spec("moe-healthy-nolr", "moe", healthy, loop=NOLR, seed=652),
    Spec("moe-lr-too-high-nolr", "moe", lr_too_high, {"factor": 1000.0}, NOLR, seed=653),
    Spec("moe-plateau-nolr", "moe", plateau, {"onset": 30}, NOLR, seed=654),
    Spec("moe-slow-rise", "moe", slow_rise, {"onset": 120, "growth": 1.06, "opt": "sgd", "lr": 0.1}, {}, 655),
    Spec("moe-weight-decay", "moe", weight_decay, {"decay": 100.0}, seed=656),
    Spec("triplet-healthy", "triplet", healthy, seed=661),
    Spec("triplet-healthy-nolr", "triplet", healthy, loop=NOLR, seed=662),
    Spec("triplet-lr-too-high-nolr", "triplet", lr_too_high, {"factor": 1000.0}, NOLR, seed=663),
    Spec("triplet-plateau-nolr", "triplet", plateau, {"onset": 30}, NOLR, seed=664),
    Spec("triplet-slow-rise", "triplet", slow_rise, {"growth": 1.06, "opt": "sgd", "lr": 0.05}, seed=665),
    Spec("triplet-lr-too-low", "triplet", lr_too_low, {"factor": 1e-3}, seed=666),
]
BY_NAME = {s.name: s for s in SPECS}


def make(spec: Spec, out: Path) -> dict:
    started = time.perf_counter()
    torch.manual_seed(spec.seed)
    loop = Loop(**spec.loop)
    trained, facts, truth = spec.cause(spec.family, loop, **spec.args)
    truth.setdefault("abrupt", False)
    objective = facts["objective"]
    onset = truth["onset"] or 0
    blowup = _blowup(trained, facts, onset)
    truth = {
        "name": spec.name,
        "set": SET,
        "family": spec.family,
        "injected": spec.cause.__name__,
        "healthy": truth["onset"] is None,
        **truth,
        "objective": objective,
        "collapse_level": facts.get("collapse_level"),
        "blowup_step": blowup,
        "precision": loop.precision,
        "optimizer": trained.optimizer,
        "lr_logged": loop.log_settings,
        "every": loop.every,
        "window": loop.window,
        "steps": loop.steps,
        "seed": spec.seed,
    }
    folder = out / SET / spec.name
    write(folder, trained.records, truth)
    size = (folder / "metrics.csv").stat().st_size
    print(
        f"{spec.name}: {len(trained.records)} steps logged, {size / 1024:.1f} KB, {truth['verdicts'][0]} @ "
        f"{truth['onset']}, blow-up {truth['blowup_step']} ({time.perf_counter() - started:.1f} s)",
        flush=True,
    )
    return truth


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="runs to regenerate (default: all)")
    parser.add_argument("--list", action="store_true", help="list the runs")
    parser.add_argument("--out", type=Path, default=HERE, help="write under this folder (default: here)")
    args = parser.parse_args(argv)
    if args.list:
        for s in SPECS:
            print(f"{s.name:32s} {s.family:12s} {s.cause.__name__}: {s.cause.__doc__.splitlines()[0]}")
        return 0
    unknown = [n for n in args.names if n not in BY_NAME]
    if unknown:
        parser.error(f"unknown runs: {', '.join(unknown)}")
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    for spec in [BY_NAME[n] for n in args.names] or SPECS:
        make(spec, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
