"""Workloads: gradient lists shaped like real models' parameter lists.

A workload is a named recipe for a list of parameter shapes. ``prepare`` turns
it into a :class:`Prepared` workload for one dtype and device: parameters whose
``.grad`` holds fresh random data (never zeros, which the kernel may not even
read at full cost), scaled so that the total norm is about 1, as near a usual
clipping threshold; and a flat buffer holding an exact copy of every gradient,
back to back, that serves three purposes: the roofline kernels read it, the
correctness check compares against it, and a contender that clips is undone
by copying it back.

The shapes come from the architectures themselves (no model is built, so no
memory beyond the gradients is needed); the tests check the tensor counts and
parameter totals against the published ones.

Other modules add workloads with :func:`register_workload` (a distributed
workload, for instance, prepares DTensor gradients with its own ``build``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.nn import Parameter

Shape = tuple[int, ...]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}

# Roughly what a reference check or a restore touches at once: small enough to
# bound the transient memory of float64 temporaries, large enough to stay fast.
_CHUNK = 1 << 24


# ----------------------------------------------------------------------------
# Shapes of real models
# ----------------------------------------------------------------------------


def gpt2_shapes(n_layer: int = 12, d: int = 768, vocab: int = 50257, ctx: int = 1024) -> list[Shape]:
    """GPT-2's parameters in Hugging Face order (the LM head is tied to ``wte``)."""
    shapes: list[Shape] = [(vocab, d), (ctx, d)]  # wte, wpe
    for _ in range(n_layer):
        shapes += [
            (d,),
            (d,),  # ln_1
            (d, 3 * d),
            (3 * d,),  # attn.c_attn (Conv1D: in x out)
            (d, d),
            (d,),  # attn.c_proj
            (d,),
            (d,),  # ln_2
            (d, 4 * d),
            (4 * d,),  # mlp.c_fc
            (4 * d, d),
            (d,),  # mlp.c_proj
        ]
    return shapes + [(d,), (d,)]  # ln_f


def resnet_shapes(
    blocks: tuple[int, ...] = (3, 4, 6, 3), width: int = 64, classes: int = 1000, in_channels: int = 3
) -> list[Shape]:
    """A bottleneck ResNet's parameters in torchvision's order (ResNet-50 by default)."""
    expansion = 4
    shapes: list[Shape] = [(width, in_channels, 7, 7), (width,), (width,)]  # conv1, bn1
    inplanes = width
    for stage, count in enumerate(blocks):
        planes = width * 2**stage
        for block in range(count):
            shapes += [
                (planes, inplanes, 1, 1),
                (planes,),
                (planes,),
                (planes, planes, 3, 3),
                (planes,),
                (planes,),
                (planes * expansion, planes, 1, 1),
                (planes * expansion,),
                (planes * expansion,),
            ]
            if block == 0:  # the downsample branch: a 1x1 conv and its batch norm
                shapes += [(planes * expansion, inplanes, 1, 1), (planes * expansion,), (planes * expansion,)]
            inplanes = planes * expansion
    return shapes + [(classes, inplanes), (classes,)]  # fc


def llama_shapes(
    n_layer: int, d: int, intermediate: int, vocab: int = 32000, kv_dim: int | None = None
) -> list[Shape]:
    """A LLaMA-style decoder: embedding, blocks (attention, SwiGLU MLP, two RMSNorms),
    final norm and an untied LM head, in Hugging Face order."""
    kv = d if kv_dim is None else kv_dim
    shapes: list[Shape] = [(vocab, d)]
    for _ in range(n_layer):
        shapes += [
            (d, d),
            (kv, d),
            (kv, d),
            (d, d),  # q, k, v, o
            (intermediate, d),
            (intermediate, d),
            (d, intermediate),  # gate, up, down
            (d,),
            (d,),  # input and post-attention RMSNorm
        ]
    return shapes + [(d,), (vocab, d)]


# ----------------------------------------------------------------------------
# The registry
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """A named list of parameter shapes, at full size and at ``--quick`` size.

    ``devices``: device types where it may run; ``default_on``: those where it
    runs when ``--workloads`` is not given. ``build``, when set, replaces
    :func:`prepare` (for gradients that are not plain tensors on one device).
    ``ranks`` > 1: it runs on that many processes of a process group, each
    timing the same rounds in lockstep (fastnorm/bench/distributed.py).
    ``contenders``, when set: the only contenders that apply to it (also ones
    not run by default). ``groups`` > 1: the tensors form that many equal
    parameter groups, each reduced or clipped by its own call, as per-group
    clipping does. ``threads``: torch's thread count while it runs (1 for
    the single-core kernel workload). ``dtypes``: the dtypes it runs in when
    ``--dtypes`` is not given. ``host_cost``: the tensors are tiny, so its
    time is the host's: the table shows it per tensor. ``copies``: how many
    arrays of the gradients' size it holds while it runs (the gradients and
    their flat copy; an optimizer step adds the parameters and its state), for
    the memory check (and the time it takes to prepare them).
    """

    name: str
    description: str
    full: Callable[[], list[Shape]]
    quick: Callable[[], list[Shape]]
    devices: tuple[str, ...] = ("cpu", "cuda")
    default_on: tuple[str, ...] = ("cpu", "cuda")
    build: Callable[..., Prepared] | None = None
    ranks: int = 1
    contenders: tuple[str, ...] | None = None
    groups: int = 1
    threads: int | None = None
    dtypes: tuple[str, ...] | None = None
    host_cost: bool = False
    copies: int = 2

    def shapes(self, quick: bool = False) -> list[Shape]:
        return self.quick() if quick else self.full()

    def numel(self, quick: bool = False) -> int:
        return sum(math.prod(s) for s in self.shapes(quick))

    def not_supported_reasons(self, device: torch.device) -> list[str]:
        if device.type not in self.devices:
            return [f"{self.name} runs on {', '.join(self.devices)} only (its size is chosen for those)"]
        return []


WORKLOADS: dict[str, Workload] = {}


def register_workload(workload: Workload, *, replace: bool = False) -> Workload:
    """Adds a workload to ``fastnorm bench`` (and to the pytest-benchmark suites)."""
    if workload.name in WORKLOADS and not replace:
        raise ValueError(f"a workload named {workload.name!r} is already registered")
    WORKLOADS[workload.name] = workload
    return workload


def defaults(device: torch.device) -> list[str]:
    """The workloads run on ``device`` when none are named."""
    return [w.name for w in WORKLOADS.values() if device.type in w.default_on]


# Workloads of many calls (one per group, or per rank's shards): fastnorm's and
# torch's calls, and the roofline of the same bytes.
GROUPED_CONTENDERS = (
    "fastnorm.total_norm",
    "fastnorm.clip_/noop",
    "fastnorm.clip_/clips",
    "torch.get_total_norm",
    "torch.clip_grad_norm_/noop",
    "torch.clip_grad_norm_/clips",
    "roofline.read/sum",
    "roofline.read/dot",
    "roofline.rw/mul_",
)


def _tiny(count: int, what: str, default_on: tuple[str, ...] = ("cpu", "cuda"), groups: int = 1) -> Workload:
    """``count`` tensors of 16 elements (a tenth of them with --quick)."""
    name = "tiny" if count == 2000 else f"tiny-{count}"
    grouped = f" in {groups} groups, one call per group" if groups > 1 else ""
    return Workload(
        name if groups == 1 else f"tiny-groups-{groups}",
        f"{count} tensors of 16 elements{grouped}: {what}",
        lambda: [(16,)] * count,
        lambda: [(16,)] * (count // 10 // groups * groups),
        default_on=default_on,
        groups=groups,
        host_cost=True,
        contenders=None if groups == 1 else GROUPED_CONTENDERS,
    )


# One flat tensor, 128 MB in float32: four times the last-level cache of most
# CPUs, so it streams from memory.
FLAT_NUMEL = 1 << 25

# The instruction sets of the CPU kernels: the single-core workload runs each
# one the CPU has against torch.sum of the same tensor.
ISAS = ("generic", "avx2", "avx512")
KERNEL_CONTENDERS = (
    "roofline.read/sum",
    "roofline.read/int64-sum",
    "roofline.read/dot",
    "roofline.read/amax",
) + tuple(f"fastnorm.total_norm/{isa}" for isa in ISAS)


for _workload in (
    Workload(
        "gpt2-small",
        "GPT-2 small: 148 tensors, 124.4M parameters",
        gpt2_shapes,
        lambda: gpt2_shapes(n_layer=2, d=64, vocab=1000, ctx=128),
    ),
    Workload(
        "resnet50",
        "ResNet-50: 161 tensors, 25.6M parameters, many of them small (batch norms)",
        resnet_shapes,
        lambda: resnet_shapes(blocks=(1, 1, 1, 1), width=8, classes=10),
    ),
    Workload(
        # 18 blocks of width 1024: 297M parameters, 1.2 GB of fp32 gradients.
        "llama-300m",
        "LLaMA-style decoder, 18 blocks of width 1024: 165 tensors, 297M parameters",
        lambda: llama_shapes(n_layer=18, d=1024, intermediate=2816),
        lambda: llama_shapes(n_layer=2, d=64, intermediate=176, vocab=500),
        default_on=("cpu",),
    ),
    Workload(
        # LLaMA-2 7B's shapes: 27 GB of fp32 gradients, for GPUs only.
        "llama-7b",
        "LLaMA-2 7B: 291 tensors, 6.74B parameters",
        lambda: llama_shapes(n_layer=32, d=4096, intermediate=11008),
        lambda: llama_shapes(n_layer=2, d=128, intermediate=352, vocab=1000),
        devices=("cuda",),
        default_on=("cuda",),
    ),
    Workload(
        "many-small",
        "2000 tensors of 4096 elements: per-tensor overhead at moderate size",
        lambda: [(4096,)] * 2000,
        lambda: [(4096,)] * 100,
    ),
    _tiny(2000, "nearly all host cost per call"),
    # The host cost per call at other tensor counts (not run by default).
    _tiny(150, "host cost per call", default_on=()),
    _tiny(10000, "host cost per call", default_on=()),
    # Per-group clipping: 24 lists every step, each its own cached plan.
    _tiny(2016, "the host cost of per-group clipping", default_on=("cpu",), groups=24),
    Workload(
        "kernel-1t",
        f"one flat tensor of {FLAT_NUMEL >> 20}M elements on one core: the CPU kernels of every "
        "instruction set against torch.sum",
        lambda: [(FLAT_NUMEL,)],
        lambda: [(FLAT_NUMEL >> 6,)],
        devices=("cpu",),
        default_on=("cpu",),
        contenders=KERNEL_CONTENDERS,
        threads=1,
        dtypes=("fp32", "bf16", "fp16"),
    ),
):
    register_workload(_workload)


# ----------------------------------------------------------------------------
# A prepared workload
# ----------------------------------------------------------------------------


def _chunks(t: Tensor) -> Iterator[Tensor]:
    flat = t.reshape(-1)
    for start in range(0, flat.numel(), _CHUNK):
        yield flat[start : start + _CHUNK]


class _Scratch:
    """One reused buffer of up to ``_CHUNK`` elements: a fresh temporary for every
    chunk of a 1 GB model would cost a page fault per 4 kB, more than the arithmetic."""

    def __init__(self, dtype: torch.dtype, device: torch.device) -> None:
        self.dtype, self.device = dtype, device
        self._buffer: Tensor | None = None

    def view(self, numel: int) -> Tensor:
        """The first ``numel`` elements (``numel`` <= ``_CHUNK``)."""
        if self._buffer is None or self._buffer.numel() < numel:
            self._buffer = torch.empty(min(_CHUNK, max(numel, 1 << 20)), dtype=self.dtype, device=self.device)
        return self._buffer[:numel]

    def copy(self, chunk: Tensor) -> Tensor:
        """``chunk`` converted into the buffer."""
        return self.view(chunk.numel()).copy_(chunk)


@dataclass
class Prepared:
    """Parameters with gradients on one device, and an exact flat copy of them.

    ``ref_norm`` is the float64 L2 norm of the gradients as stored (after
    rounding to ``dtype``), computed without any backend under test. For
    DTensor gradients, ``flat`` and the restore/compare helpers hold this
    rank's shards, and the builder sets ``ref_norm`` to the whole model's norm.
    """

    name: str
    dtype: torch.dtype
    device: torch.device
    params: list[Parameter]
    flat: Tensor
    num_groups: int = 1
    ref_norm: float = field(init=False)
    groups: list[list[Parameter]] = field(init=False)
    ref_norms: list[float] = field(init=False)  # each group's
    _grads: list[Tensor] = field(init=False, repr=False)
    _originals: list[Tensor] = field(init=False, repr=False)
    _group_of: list[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        size = math.ceil(len(self.params) / self.num_groups)
        self.groups = [self.params[i : i + size] for i in range(0, len(self.params), size)]
        self._grads, self._originals, self._group_of = [], [], []
        squares = [0.0] * len(self.groups)
        offset = 0
        wide = _Scratch(torch.float64, self.device)
        for index, group in enumerate(self.groups):
            for p in group:
                if p.grad is None:
                    continue
                g = getattr(p.grad, "_local_tensor", p.grad)  # a DTensor's shard on this rank
                n = g.numel()
                original = self.flat[offset : offset + n]
                for chunk in _chunks(original):
                    exact = wide.copy(chunk)  # each square of a float32 value is exact in float64
                    squares[index] += float(torch.dot(exact, exact))
                self._grads.append(g)
                self._originals.append(original.view(g.shape))
                self._group_of.append(index)
                offset += n
        self.ref_norms = [math.sqrt(s) for s in squares]
        self.ref_norm = math.sqrt(sum(squares))

    @property
    def grads(self) -> list[Tensor]:
        return [p.grad for p in self.params if p.grad is not None]

    @property
    def numel(self) -> int:
        return self.flat.numel()

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()

    def originals(self) -> Iterator[tuple[Tensor, Tensor]]:
        """Each gradient with the view of ``flat`` that holds its original values."""
        return zip(self._grads, self._originals)

    def restore(self) -> None:
        """Puts the original values back into every gradient (exact)."""
        with torch.no_grad():
            torch._foreach_copy_(self._grads, self._originals)

    def applied_coef(self) -> float:
        """The factor the gradients now hold over the originals: the least-squares
        fit, in float64 (one group)."""
        dot = 0.0
        got_wide, orig_wide = _Scratch(torch.float64, self.device), _Scratch(torch.float64, self.device)
        for g, original in self.originals():
            for got, orig in zip(_chunks(g), _chunks(original)):
                dot += float(torch.dot(got_wide.copy(got), orig_wide.copy(orig)))
        return dot / self.ref_norm**2

    def compare(self, coefs: float | list[float], rtol: float) -> str | None:
        """Why the gradients are not ``coef`` times the originals (None when they are).

        ``coefs``: one coefficient, or one per group. 1 asks for bitwise
        equality: nothing was to be written.
        """
        # float32 is exact enough for the tolerances of float32 and 16-bit values,
        # and moves half the bytes of float64 through a 1 GB model.
        wide = torch.float64 if self.dtype == torch.float64 else torch.float32
        # Mixed-dtype arithmetic is several times slower than a conversion, then same-dtype arithmetic.
        want_of, error_of = _Scratch(wide, self.device), _Scratch(wide, self.device)
        for index, (g, original) in enumerate(self.originals()):
            coef = coefs[self._group_of[index]] if isinstance(coefs, list) else coefs
            if coef == 1.0:
                if not torch.equal(g, original):
                    return f"gradient {index} {tuple(g.shape)} changed although nothing was to be clipped"
                continue
            for got, orig in zip(_chunks(g), _chunks(original)):
                want = want_of.copy(orig).mul_(coef)
                # A right element has |got - want| <= rtol * |want| + 1e-30 (1e-30: exact
                # zeros); written so that a NaN fails.
                error = error_of.copy(got).sub_(want).abs_()
                error.sub_(want.abs_(), alpha=rtol)
                if not float(error.max()) <= 1e-30:
                    i = int((~(error <= 1e-30)).nonzero()[0, 0])
                    return (
                        f"gradient {index} {tuple(g.shape)}: element {float(got[i])!r} where "
                        f"{float(orig[i]) * coef!r} (= {float(orig[i])!r} * {coef:.6g}) was expected"
                    )
        return None


def make_gradients(
    shapes: list[Shape], dtype: torch.dtype, device: torch.device, *, seed: int = 0, values: bool = False
) -> tuple[list[Parameter], Tensor]:
    """Parameters whose ``.grad`` holds seeded normal values of total norm ~1, and
    a flat copy of those gradients, back to back.

    With ``values``, the parameters have memory of their own, filled with small
    normal values (an optimizer step reads and writes them); otherwise they are
    zero-stride views of one element, never read, so that their memory stays
    out of the measurement (7B fp32 is 27 GB).
    """
    numel = sum(math.prod(s) for s in shapes)
    scale = 1.0 / math.sqrt(numel)
    flat = torch.empty(numel, dtype=dtype, device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    params = []
    offset = 0
    with torch.no_grad():
        for shape in shapes:
            n = math.prod(shape)
            if values:
                value = torch.empty(shape, dtype=dtype, device=device).normal_(0.0, 0.02, generator=generator)
                param = Parameter(value)
            else:
                param = Parameter(torch.empty((), dtype=dtype, device=device).expand(shape))
            # Drawn in the gradients' dtype: no float32 temporary, no conversion pass.
            grad = torch.empty(shape, dtype=dtype, device=device).normal_(0.0, scale, generator=generator)
            param.grad = grad
            flat[offset : offset + n].copy_(grad.reshape(-1))
            params.append(param)
            offset += n
    return params, flat


def prepare(
    workload: Workload, dtype: torch.dtype, device: torch.device, *, quick: bool = False, seed: int = 0
) -> Prepared:
    """The workload's gradients, filled with seeded normal values of total norm ~1."""
    if workload.build is not None:
        return workload.build(dtype=dtype, device=device, quick=quick, seed=seed)
    reasons = workload.not_supported_reasons(device)
    if reasons:
        raise ValueError("; ".join(reasons))
    params, flat = make_gradients(workload.shapes(quick), dtype, device, seed=seed)
    return Prepared(workload.name, dtype, device, params, flat, workload.groups)
