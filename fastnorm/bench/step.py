"""Training-step workloads: clipping by a pass of its own, or inside the optimizer's step.

``step-gpt2-small``, ``step-llama-300m`` (CPU) and ``step-llama-7b`` (CUDA,
bf16: in fp32 its parameters, gradients, moments and the gradients' copy hold
135 GB) time torch's fused AdamW step (``fused=True``) on real parameters with
gradients, backward excluded, every call clipping (to half the gradients' norm):

- ``adamw.step``: the bare ``optimizer.step()``, the baseline;
- ``adamw.clip_+step``: ``fastnorm.clip_`` then the step, the usual recipe;
- ``adamw.folded``: :class:`fastnorm.StepClipper`'s ``arm()`` (the norm, one
  read of the gradients, nothing written), then the step, which divides each
  gradient by the coefficient as it reads it;
- ``adamw.guarded``: ``adamw.folded`` with the spike guard on (a
  :class:`fastnorm.SpikeGuard`: its decision, the learning-rate check, and the
  commit of the step into its statistics), timed against ``adamw.folded`` in
  the same rounds. The same gradients every call: the guard flags nothing, and
  the step clips as the folded one does;
- ``adamw.scale+step`` and ``adamw.folded-step``: the same two with the norm
  computed before the clock starts (``clip_(..., total_norm=norm)`` then the
  step; the armed step alone): what clipping itself costs when the norm is
  computed anyway, for a monitor.

They are contenders of the step kinds (see fastnorm/bench/contenders.py),
timed by the harness like every other: interleaved, the gradients put back
after every call, untimed, so that each call clips the same values. Each
result's ``paired_ratio`` is the median over rounds of its time divided by the
bare step's in the same round. The check before timing sees that every step
that clips left exactly the clipped gradients (torch's fused kernels write back
the gradient they used when ``grad_scale`` is set; a skipped step writes none).

What to expect, per fp32 parameter: the bare step reads the parameter, the
gradient and two moments and writes three (28 bytes); the norm reads the
gradient once more (4); ``clip_`` reads and writes it (8); the folded step
instead stores the divided gradient inside torch's kernel (4). Counted in
bytes: 40/28 = 1.43x for ``clip_`` + step, 36/28 = 1.29x folded and for
``clip_(total_norm=)`` + step, 32/28 = 1.14x for the folded step alone; more
where a plain read streams slower per byte than the step's mix of reads and
writes (one CPU core: 28 against 49 GB/s, so 1.53x, 1.39x, 1.29x, 1.14x). The
fold saves the clip's pass, not the norm's read or torch's store.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.optim import Optimizer

import fastnorm
from fastnorm.bench.contenders import Call, Contender, Staged, register_contender
from fastnorm.bench.workloads import WORKLOADS, Prepared, Workload, make_gradients, register_workload

BARE = "adamw.step"
CLIP_THEN_STEP = "adamw.clip_+step"
FOLDED = "adamw.folded"
SCALE_THEN_STEP = "adamw.scale+step"
FOLDED_STEP = "adamw.folded-step"
GUARDED = "adamw.guarded"


@dataclass
class StepPrepared(Prepared):
    """A prepared workload whose parameters have values, with a fused AdamW over them.

    The optimizer has taken one step (its state exists); the contenders share
    it, and share one :class:`fastnorm.StepClipper` (an optimizer has at most one).
    """

    optimizer: Optimizer | None = None
    _clipper: fastnorm.StepClipper | None = field(default=None, init=False, repr=False)

    def clipper(self, max_norm: float) -> fastnorm.StepClipper:
        """The clipper of the optimizer, clipping to ``max_norm`` (strict: a fold or an error)."""
        if self._clipper is None:
            self._clipper = fastnorm.StepClipper(self.optimizer, max_norm, strict=True)
        elif self._clipper.max_norm != max_norm:
            raise ValueError(f"{self.name}: the clipper clips to {self._clipper.max_norm}, not {max_norm}")
        return self._clipper


def _builder(base: Workload) -> Callable[..., StepPrepared]:
    def build(*, dtype: torch.dtype, device: torch.device, quick: bool, seed: int) -> StepPrepared:
        params, flat = make_gradients(base.shapes(quick), dtype, device, seed=seed, values=True)
        optimizer = torch.optim.AdamW(params, fused=True)
        optimizer.step()  # creates the moments, so that no contender's first call pays for them
        return StepPrepared(f"step-{base.name}", dtype, device, params, flat, optimizer=optimizer)

    return build


# ----------------------------------------------------------------------------
# The contenders: each returns the norm it clipped by (the bare step, nothing)
# ----------------------------------------------------------------------------


def _bare(w: StepPrepared, max_norm: float | None) -> Call:
    return w.optimizer.step


def _clip_then_step(w: StepPrepared, max_norm: float | None) -> Call:
    params, step, clip = w.params, w.optimizer.step, fastnorm.clip_

    def call() -> torch.Tensor:
        norm = clip(params, max_norm)
        step()
        return norm

    return call


def _folded(w: StepPrepared, max_norm: float | None) -> Call:
    clipper, step = w.clipper(max_norm), w.optimizer.step

    def call() -> torch.Tensor:
        clipper.guard = None  # the clipper is shared with adamw.guarded
        norm = clipper.arm()
        step()
        return norm

    return call


def _guarded(w: StepPrepared, max_norm: float | None) -> Call:
    clipper, step, guard = w.clipper(max_norm), w.optimizer.step, fastnorm.SpikeGuard()

    def call() -> torch.Tensor:
        clipper.guard = guard
        norm = clipper.arm()
        step()
        clipper._commit_guard()  # the commit the next arm() would make, timed with this step
        return norm

    return call


def _scale_then_step(w: StepPrepared, max_norm: float | None) -> Call:
    params, step, clip = w.params, w.optimizer.step, fastnorm.clip_
    given: dict[str, torch.Tensor] = {}

    def norm() -> None:
        given["norm"] = fastnorm.total_norm(params)

    def call() -> torch.Tensor:
        clip(params, max_norm, total_norm=given["norm"])
        step()
        return given["norm"]

    return Staged(norm, call)


def _folded_step(w: StepPrepared, max_norm: float | None) -> Call:
    clipper, step = w.clipper(max_norm), w.optimizer.step
    given: dict[str, torch.Tensor] = {}

    def arm() -> None:
        given["norm"] = clipper.arm()

    def call() -> torch.Tensor:
        step()
        return given["norm"]

    return Staged(arm, call)


CONTENDERS = (
    Contender(BARE, "step", _bare, group="torch", only_listed=True),
    Contender(CLIP_THEN_STEP, "clip-step", _clip_then_step, BARE, "fastnorm", only_listed=True),
    Contender(FOLDED, "clip-step", _folded, BARE, "fastnorm", only_listed=True),
    Contender(GUARDED, "clip-step", _guarded, FOLDED, "fastnorm", only_listed=True),
    Contender(SCALE_THEN_STEP, "scale-step", _scale_then_step, BARE, "fastnorm", only_listed=True),
    Contender(FOLDED_STEP, "scale-step", _folded_step, BARE, "fastnorm", only_listed=True),
)
for _contender in CONTENDERS:
    register_contender(_contender)


def step_workload(
    base: str, what: str, *, default_on: tuple[str, ...], dtypes: tuple[str, ...] = ("fp32",)
) -> Workload:
    """The training-step workload on the parameters of the registered workload ``base``."""
    w = WORKLOADS[base]
    return Workload(
        f"step-{base}",
        f"fused AdamW steps on {what}, backward excluded: clip_ + step against the step that clips itself",
        w.full,
        w.quick,
        devices=w.devices,
        default_on=default_on,
        build=_builder(w),
        contenders=tuple(c.name for c in CONTENDERS),
        dtypes=dtypes,
        # the parameters, the gradients, their copy and AdamW's two moments
        copies=5,
    )


for _workload in (
    step_workload("gpt2-small", "GPT-2 small (124.4M parameters)", default_on=("cpu", "cuda")),
    step_workload("llama-300m", "the LLaMA-style 300M stack", default_on=()),
    step_workload("llama-7b", "LLaMA-2 7B, in bf16", default_on=("cuda",), dtypes=("bf16",)),
):
    register_workload(_workload)
