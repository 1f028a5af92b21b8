"""What watching a training step costs: the locator against the tools it replaces, on the same step.

``train-gpt2-small`` (a GPT-2-small-shaped model: d 768, 12 heads, 4 layers,
the 50257-token vocabulary, 128 positions) and ``train-resnet`` (a ResNet-18-
shaped network on 8 images of 64 x 64) time one forward and backward pass on
one fixed batch, on the CPU with one thread, no optimizer step:

- ``train.plain``: the bare step, the baseline;
- ``train.locator``: the same with one ``fastnorm.Locator(model)`` that lives
  as long as the workload, as a user leaves it on, closed by ``locator.step()``
  (every module's outputs and output gradients and the parameters' gradients
  reduced into the device buffer; nothing read); its hooks are installed at
  the start of each call (``resume``) and removed at its end (``pause``), so
  that they never run in another contender's call;
- ``train.hf-debug-overflow``: Hugging Face's ``DebugUnderflowOverflow``
  (forward hooks, four host reads per tensor), its hooks removed after the call;
- ``train.detect-anomaly``: inside ``torch.autograd.detect_anomaly()``.

Each call zeroes the gradients in place and recomputes them from the same
weights and batch, so that every call leaves the same gradients: the check
before timing sees bitwise the gradients the bare step leaves (a watcher that
changed a value would fail it). Installing the hooks is inside the clock for
every watcher alike (well under a millisecond); what the locator learnt of the
model's sites in earlier calls it keeps, as it does in a run. Each result's ``paired_ratio``
is its time over the bare step's in the same round: the overhead.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

import fastnorm
from fastnorm.bench.contenders import Call, Contender, register_contender
from fastnorm.bench.workloads import Prepared, Shape, Workload, register_workload

PLAIN = "train.plain"
LOCATOR = "train.locator"
HF_DEBUG = "train.hf-debug-overflow"
ANOMALY = "train.detect-anomaly"


class _Block(nn.Module):
    """A GPT-2 block: pre-norm attention and MLP, with GPT-2's module names."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.Module()
        self.attn.c_attn, self.attn.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential()
        self.mlp.c_fc, self.mlp.act = nn.Linear(d, 4 * d), nn.GELU("tanh")
        self.mlp.c_proj = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.attn.c_attn(self.ln_1(x)).view(b, t, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.attn.c_proj(a)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2's shape: token and position embeddings, blocks, a final norm and the tied head."""

    def __init__(self, layers: int = 4, d: int = 768, heads: int = 12, vocab: int = 50257, ctx: int = 128):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.h = nn.ModuleList([_Block(d, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.ctx, self.vocab = ctx, vocab

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.T
        return F.cross_entropy(logits.flatten(0, 1), tokens.roll(-1, 1).flatten())


class _Basic(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.downsample = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    """ResNet-18's shape (torchvision's module names), on small images."""

    def __init__(self, width: int = 64, classes: int = 1000) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width)
        self.relu, self.maxpool = nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        stages, cin = [], width
        for i in range(4):
            cout = width * 2**i
            stages.append(nn.Sequential(_Basic(cin, cout, 1 if i == 0 else 2), _Basic(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(cin, classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(images))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return F.cross_entropy(self.fc(x.mean((2, 3))), labels)


# name -> (description, the model at full and at --quick size, its batch)
_MODELS: dict[str, tuple[str, Callable[[bool], nn.Module], Callable[[nn.Module, torch.Generator], tuple]]] = {
    "gpt2-small": (
        "a GPT-2-small-shaped model (4 layers, d 768, 128 tokens)",
        lambda quick: GPT(layers=2, ctx=32) if quick else GPT(),
        lambda m, g: (torch.randint(0, m.vocab, (1, m.ctx), generator=g),),
    ),
    "resnet": (
        "a ResNet-18-shaped network (8 images of 64 x 64)",
        lambda quick: ResNet(width=16, classes=10) if quick else ResNet(),
        lambda m, g: (
            torch.randn(2 if m.fc.out_features == 10 else 8, 3, 64, 64, generator=g),
            torch.randint(0, m.fc.out_features, (2 if m.fc.out_features == 10 else 8,), generator=g),
        ),
    ),
}


class TrainPrepared(Prepared):
    """A prepared workload whose parameters belong to a model, with the batch every call reuses."""

    model: nn.Module
    batch: tuple

    def step(self) -> torch.Tensor:
        """Zeroes the gradients in place and recomputes them: the same gradients every call."""
        self.model.zero_grad(set_to_none=False)
        loss = self.model(*self.batch)
        loss.backward()
        return loss


def _shapes(name: str, quick: bool) -> list[Shape]:
    with torch.device("meta"):
        model = _MODELS[name][1](quick)
    return [tuple(p.shape) for p in model.parameters()]


def _builder(name: str) -> Callable[..., TrainPrepared]:
    def build(*, dtype: torch.dtype, device: torch.device, quick: bool, seed: int) -> TrainPrepared:
        torch.manual_seed(seed)
        model = _MODELS[name][1](quick).to(device=device, dtype=dtype)
        batch = tuple(t.to(device) for t in _MODELS[name][2](model, torch.Generator().manual_seed(seed)))
        model(*batch).backward()
        params = [p for p in model.parameters() if p.grad is not None]
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        w = TrainPrepared(f"train-{name}", dtype, device, params, flat)
        w.model, w.batch = model, batch
        return w

    return build


# ----------------------------------------------------------------------------
# The contenders: each does one step and returns nothing (kind "step")
# ----------------------------------------------------------------------------


def _plain(w: TrainPrepared, max_norm: float | None) -> Call:
    return w.step


def _locator(w: TrainPrepared, max_norm: float | None) -> Call:
    model, step = w.model, w.step
    locator = fastnorm.Locator(model)  # always on, as a user leaves it: one locator for every call
    locator.pause()

    def call() -> None:
        locator.resume()  # its hooks installed inside the clock, as every watcher's are
        try:
            step()
            locator.step()
        finally:
            locator.pause()  # out of the other contenders' calls

    return call


def _hf_debug(w: TrainPrepared, max_norm: float | None) -> Call:
    from transformers.debug_utils import DebugUnderflowOverflow

    model, step = w.model, w.step

    def call() -> None:
        before = {id(m): set(m._forward_hooks) for m in model.modules()}
        DebugUnderflowOverflow(model)
        try:
            step()
        finally:
            for m in model.modules():
                for key in set(m._forward_hooks) - before[id(m)]:
                    del m._forward_hooks[key]

    return call


def _anomaly(w: TrainPrepared, max_norm: float | None) -> Call:
    step = w.step

    def call() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Anomaly Detection has been enabled", every call
            with torch.autograd.detect_anomaly():
                step()

    return call


def _needs_transformers(device: torch.device) -> list[str]:
    return [] if importlib.util.find_spec("transformers") else ["transformers is not installed"]


CONTENDERS = (
    Contender(PLAIN, "step", _plain, group="torch", only_listed=True),
    Contender(LOCATOR, "step", _locator, PLAIN, "fastnorm", only_listed=True),
    Contender(
        HF_DEBUG,
        "step",
        _hf_debug,
        PLAIN,
        "other",
        reasons=_needs_transformers,
        optional=True,
        only_listed=True,
    ),
    Contender(ANOMALY, "step", _anomaly, PLAIN, "other", only_listed=True),
)
for _contender in CONTENDERS:
    register_contender(_contender)

for _name, (_what, _, _) in _MODELS.items():
    register_workload(
        Workload(
            f"train-{_name}",
            f"forward and backward of {_what}, one thread: the locator against HF's overflow debugger "
            "and autograd's anomaly mode",
            lambda n=_name: _shapes(n, False),
            lambda n=_name: _shapes(n, True),
            devices=("cpu",),
            default_on=(),
            build=_builder(_name),
            contenders=tuple(c.name for c in CONTENDERS),
            threads=1,
            dtypes=("fp32",),
            copies=3,
        )
    )
