"""Contenders: small named callables over a prepared workload.

Each contender is one way to compute (or clip) the total gradient norm. Its
``kind`` says what it must do, which fixes three things at once:

========== ============================ ==================== ======================
kind       max_norm it is given         bytes it must move   what it is checked for
========== ============================ ==================== ======================
norm       -                            one read (N)         the norm
clip-noop  ``NOOP_MAX_NORM`` (1e9)      one read (N)         the norm; no gradient
                                                             changed, bit for bit
clip       half the gradients' norm     N + a read and a     the norm; every
           (of the smallest group's)    write (3N)           gradient scaled by ~0.5
read       -                            N (flat buffer)      - (a roofline kernel)
read-write -                            2N (flat buffer)     - (a roofline kernel)
step       -                            the step's own (7N   no gradient changed,
                                        for AdamW)           bit for bit
clip-step  half the gradients' norm     the norm's read and  the norm; every
                                        the step (8N)        gradient the step used
                                                             scaled by ~0.5
scale-step half the gradients' norm     the step (7N): the   as clip-step
                                        norm is computed
                                        before the clock
========== ============================ ==================== ======================

The references (kinds ``read`` and ``read-write`` and the one-flat-tensor
fastnorm row) run on ``Prepared.flat`` and are timed in the same rounds as the
contenders, so that the roofline sees the same machine.

The step kinds are optimizer steps without the backward pass (the ``step-*``
workloads of fastnorm/bench/step.py), timed against the bare step in the same
rounds. The gradients they leave are the ones the step used (torch's fused
kernels write back the gradient divided by ``grad_scale``), which is how the
check sees that a step clipped. The bytes of AdamW's step: it reads the
parameter, the gradient and two moments and writes three of them.

A call whose first part must not be timed (a norm computed for a monitor
anyway, before the step that uses it) is a :class:`Staged` call.

On a workload of several parameter groups, the fastnorm and torch contenders
make one call per group, as per-group clipping does, and return the list of
the groups' norms.

Other modules add contenders with :func:`register_contender`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

import fastnorm
from fastnorm.backends import cpp
from fastnorm.bench.workloads import ISAS, Prepared

KINDS = ("norm", "clip-noop", "clip", "read", "read-write", "step", "clip-step", "scale-step")
# The kinds whose calls scale the gradients by the clip coefficient.
CLIPPING = ("clip", "clip-step", "scale-step")
# Optimizer steps: timed against the bare step, not against the roofline.
STEPS = ("step", "clip-step", "scale-step")
# The least bytes a call of each kind moves, in bytes of the gradients.
_TRAFFIC = {"clip": 3, "read-write": 2, "step": 7, "clip-step": 8, "scale-step": 7}

# Far above any norm of the workloads (~1): the coefficient clamps to exactly 1.
NOOP_MAX_NORM = 1e9
# Clipping to half the norm scales by ~0.5. Every timed call clips the same
# values, because the gradients are restored from the flat copy after each call,
# outside the timed region: repeated scaling would otherwise shrink them
# geometrically into the denormals, where the CPU slows down many times over.
CLIP_FRACTION = 0.5

Call = Callable[[], Any]


@dataclass(frozen=True)
class Staged:
    """A call whose first part is not timed: ``before()``, then ``call()`` under the clock.

    Called as a whole (the correctness check), it runs both.
    """

    before: Callable[[], Any]
    call: Call

    def __call__(self) -> Any:
        self.before()
        return self.call()


@dataclass(frozen=True)
class Contender:
    """One way to compute the norm (or to clip, or to step).

    Args:
        name: unique; ``--contenders`` selects by prefix (``fastnorm``, ``torch.clip``).
        kind: one of ``KINDS`` (see the module docstring).
        make: ``make(workload, max_norm) -> call``; the call does one timed
            operation and returns the norm (a tensor, or None for the roofline
            and the bare step); a :class:`Staged` call for untimed work first.
        baseline: the contender whose time the speedup column divides by
            (and the paired ratio, per round, is taken against).
        group: ``fastnorm``, ``torch``, ``other`` or ``reference``.
        default_on: device types where it runs when ``--contenders`` is not given.
        reasons: ``reasons(device) -> list[str]``, why it cannot run there.
        optional: an exception in its correctness call skips it (with the
            reason) instead of aborting the run: for third-party code.
        roofline: a read (or read-write) kernel that competes for the roofline.
        only_listed: runs only on workloads that name it in their ``contenders``.
        dtype_reasons: ``dtype_reasons(device, dtype) -> list[str]``, why it does
            not run on gradients of that dtype there.
    """

    name: str
    kind: str
    make: Callable[[Prepared, float | None], Call]
    baseline: str | None = None
    group: str = "other"
    default_on: tuple[str, ...] = ("cpu", "cuda")
    reasons: Callable[[torch.device], list[str]] = field(default=lambda device: [])
    optional: bool = False
    roofline: bool = False
    only_listed: bool = False
    dtype_reasons: Callable[[torch.device, torch.dtype], list[str]] = field(default=lambda device, dtype: [])

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"contender {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")

    def max_norm(self, workload: Prepared) -> float | None:
        if self.kind == "clip-noop":
            return NOOP_MAX_NORM
        if self.kind in CLIPPING:
            return CLIP_FRACTION * min(workload.ref_norms)
        return None

    @property
    def passes(self) -> int:
        """The least traffic of one call, in passes over the gradients' bytes (its kind's)."""
        return _TRAFFIC.get(self.kind, 1)

    def bytes_moved(self, workload: Prepared) -> int:
        """The least traffic the operation needs: the numerator of GB/s."""
        return workload.nbytes * self.passes

    @property
    def restores(self) -> bool:
        """Whether each call is followed by putting the original gradients back (untimed)."""
        return self.kind in CLIPPING or self.kind in STEPS


CONTENDERS: dict[str, Contender] = {}


def register_contender(contender: Contender, *, replace: bool = False) -> Contender:
    """Adds a contender to ``fastnorm bench`` (and to the pytest-benchmark suites)."""
    if contender.name in CONTENDERS and not replace:
        raise ValueError(f"a contender named {contender.name!r} is already registered")
    CONTENDERS[contender.name] = contender
    return contender


def unregister_contender(name: str) -> None:
    CONTENDERS.pop(name, None)


# ----------------------------------------------------------------------------
# fastnorm
# ----------------------------------------------------------------------------


def _per_group(w: Prepared, fn: Callable[[list[Any]], Any]) -> Call:
    """One call of ``fn`` on all parameters, or one per group, as the workload has them."""
    if len(w.groups) == 1:
        params = w.params
        return lambda: fn(params)
    groups = w.groups
    return lambda: [fn(group) for group in groups]


def _fastnorm_norm(w: Prepared, max_norm: float | None) -> Call:
    return _per_group(w, fastnorm.total_norm)


def _fastnorm_clip(w: Prepared, max_norm: float | None) -> Call:
    clip = fastnorm.clip_
    return _per_group(w, lambda params: clip(params, max_norm))


def _fastnorm_stats(w: Prepared, max_norm: float | None) -> Call:
    """fastnorm.tensor_stats: the total norm and every tensor's statistics, one pass."""
    stats = fastnorm.tensor_stats
    return _per_group(w, lambda params: stats(params)[0])


def _fastnorm_flat(w: Prepared, max_norm: float | None) -> Call:
    flat = [w.flat]
    return lambda: fastnorm.total_norm(flat)


def _fastnorm_isa(isa: str) -> Callable[[Prepared, float | None], Call]:
    """fastnorm.total_norm with the CPU kernels of one instruction set (same bits)."""

    def make(w: Prepared, max_norm: float | None) -> Call:
        params = w.params
        use_isa, current = cpp._C.use_isa, cpp._C.isa

        def call() -> torch.Tensor:
            default = current()
            use_isa(isa)
            try:
                return fastnorm.total_norm(params)
            finally:
                use_isa(default)

        return call

    return make


# ----------------------------------------------------------------------------
# torch (foreach=None: torch's own choice, the foreach kernels where it supports
# them, i.e. on CUDA; on the CPU it loops, as users get by default)
# ----------------------------------------------------------------------------


def _torch_norm(w: Prepared, max_norm: float | None) -> Call:
    get_total_norm = torch.nn.utils.get_total_norm
    # As clip_grad_norm_ does it: the list of gradients is built in the call.
    return _per_group(w, lambda params: get_total_norm([p.grad for p in params if p.grad is not None]))


def _torch_clip(w: Prepared, max_norm: float | None) -> Call:
    clip = torch.nn.utils.clip_grad_norm_
    return _per_group(w, lambda params: clip(params, max_norm))


def _loop(w: Prepared, max_norm: float | None) -> Call:
    params = w.params

    def call() -> torch.Tensor:
        # What many training loops do. The per-tensor sums are stacked and summed
        # once, so that a 16-bit running total does not stall.
        return torch.stack([p.grad.pow(2).sum() for p in params if p.grad is not None]).sum().sqrt()

    return call


def _compiled_clip(w: Prepared, max_norm: float | None) -> Call:
    params = w.params
    clip = torch.nn.utils.clip_grad_norm_
    return torch.compile(lambda: clip(params, max_norm))


def _apex_reasons(device: torch.device) -> list[str]:
    reasons = []
    if device.type != "cuda":
        reasons.append("apex's kernels are CUDA only")
    if importlib.util.find_spec("amp_C") is None:
        reasons.append("apex is not installed with its CUDA extensions (amp_C)")
    return reasons


def _apex_l2norm(w: Prepared, max_norm: float | None) -> Call:
    import amp_C
    from apex.multi_tensor_apply import multi_tensor_applier

    params = w.params
    overflow = torch.zeros(1, dtype=torch.int, device=w.device)
    l2norm = amp_C.multi_tensor_l2norm
    return lambda: multi_tensor_applier(
        l2norm, overflow, [[p.grad for p in params if p.grad is not None]], False
    )[0]


def _compile_reasons(device: torch.device) -> list[str]:
    import torch._dynamo

    if not torch._dynamo.is_dynamo_supported():
        return ["torch.compile is not supported on this Python or platform"]
    return []


# ----------------------------------------------------------------------------
# The roofline: plain torch kernels over the flat copy of the same bytes
# ----------------------------------------------------------------------------


def _read(op: Callable[[torch.Tensor], Any]) -> Callable[[Prepared, float | None], Call]:
    def make(w: Prepared, max_norm: float | None) -> Call:
        flat = w.flat
        return lambda: op(flat)

    return make


def _dot_reasons(device: torch.device, dtype: torch.dtype) -> list[str]:
    if device.type == "cpu" and dtype == torch.bfloat16:
        # benchmarks/results/cpu/cpu.json: 287 ms against torch.sum's 8.3 ms on gpt2-small bf16
        return [
            "torch's CPU dot of bfloat16 is not vectorized: 30x slower than torch.sum, never the roofline"
        ]
    return []


def _read_words(w: Prepared, max_norm: float | None) -> Call:
    """The flat buffer's bytes (all but the last < 8) summed as 64-bit integers:
    the least arithmetic per byte of any torch reduction, the read that comes
    nearest memory's pace where the others are bound by their arithmetic (one
    core: torch.sum of bfloat16 converts every element)."""
    flat = w.flat.reshape(-1)
    words = flat.view(torch.uint8)[: flat.numel() * flat.element_size() // 8 * 8].view(torch.int64)
    return lambda: words.sum()


def _read_write(op: Callable[[torch.Tensor], Any]) -> Callable[[Prepared, float | None], Call]:
    def make(w: Prepared, max_norm: float | None) -> Call:
        flat = w.flat

        def call() -> None:
            op(flat)  # leaves the values as they are: the flat copy stays exact

        return call

    return make


for _contender in (
    Contender("fastnorm.total_norm", "norm", _fastnorm_norm, "torch.get_total_norm", "fastnorm"),
    Contender("fastnorm.clip_/noop", "clip-noop", _fastnorm_clip, "torch.clip_grad_norm_/noop", "fastnorm"),
    Contender("fastnorm.clip_/clips", "clip", _fastnorm_clip, "torch.clip_grad_norm_/clips", "fastnorm"),
    Contender("fastnorm.tensor_stats", "norm", _fastnorm_stats, "fastnorm.total_norm", "fastnorm"),
    Contender("torch.get_total_norm", "norm", _torch_norm, None, "torch"),
    Contender("torch.clip_grad_norm_/noop", "clip-noop", _torch_clip, None, "torch"),
    Contender("torch.clip_grad_norm_/clips", "clip", _torch_clip, None, "torch"),
    Contender("loop.pow(2).sum()", "norm", _loop, "torch.get_total_norm", "other"),
    Contender(
        "compile.clip_grad_norm_/noop",
        "clip-noop",
        _compiled_clip,
        "torch.clip_grad_norm_/noop",
        "torch",
        default_on=("cuda",),
        reasons=_compile_reasons,
        optional=True,
    ),
    Contender(
        "compile.clip_grad_norm_/clips",
        "clip",
        _compiled_clip,
        "torch.clip_grad_norm_/clips",
        "torch",
        default_on=("cuda",),
        reasons=_compile_reasons,
        optional=True,
    ),
    Contender(
        "apex.multi_tensor_l2norm",
        "norm",
        _apex_l2norm,
        "torch.get_total_norm",
        "other",
        default_on=("cuda",),
        reasons=_apex_reasons,
        optional=True,
    ),
    # References: the roofline, and fastnorm on one flat tensor (the multi-tensor
    # overhead is the gap between this row and fastnorm.total_norm).
    Contender("fastnorm.total_norm/flat", "norm", _fastnorm_flat, None, "reference"),
    Contender("roofline.read/sum", "read", _read(torch.sum), group="reference", roofline=True),
    Contender("roofline.read/amax", "read", _read(torch.amax), group="reference", roofline=True),
    Contender("roofline.read/int64-sum", "read", _read_words, group="reference", roofline=True),
    Contender(
        "roofline.read/dot",
        "read",
        _read(lambda t: torch.dot(t, t)),
        group="reference",
        roofline=True,
        dtype_reasons=_dot_reasons,
    ),
    Contender(
        "roofline.read/vector_norm", "read", _read(torch.linalg.vector_norm), group="reference", roofline=True
    ),
    Contender(
        "roofline.rw/mul_", "read-write", _read_write(lambda t: t.mul_(1.0)), group="reference", roofline=True
    ),
    Contender(
        "roofline.rw/add_", "read-write", _read_write(lambda t: t.add_(0.0)), group="reference", roofline=True
    ),
):
    register_contender(_contender)


def _isa_reasons(isa: str) -> Callable[[torch.device], list[str]]:
    def reasons(device: torch.device) -> list[str]:
        if device.type != "cpu":
            return ["the CPU kernels run on CPU tensors"]
        if cpp._C is None:
            return [f"the C++ kernels are not available: {cpp._IMPORT_ERROR}"]
        if isa not in cpp._C.supported_isas():
            return [f"this CPU does not run {isa} (it runs {', '.join(cpp._C.supported_isas())})"]
        return []

    return reasons


# The kernel of each instruction set, on the single-core workload (baseline:
# torch.sum of the same flat tensor).
for _isa in ISAS:
    register_contender(
        Contender(
            f"fastnorm.total_norm/{_isa}",
            "norm",
            _fastnorm_isa(_isa),
            "roofline.read/sum",
            "fastnorm",
            default_on=("cpu",),
            reasons=_isa_reasons(_isa),
            only_listed=True,
        )
    )


def for_workload(
    workload: Any, device: torch.device, wanted: Callable[[Contender], bool] | None = None
) -> tuple[list[Contender], dict[str, list[str]]]:
    """The contenders of one workload: among those it names (a workload that lists
    its own runs them whether or not they run by default), else among all, the
    ``wanted`` ones (default: those that run by default on the device), with
    why each wanted one cannot run."""
    if wanted is None:
        wanted = default_wanted(device)
    if workload.contenders is not None:
        pool = [CONTENDERS[n] for n in workload.contenders if n in CONTENDERS and wanted(CONTENDERS[n])]
    else:
        pool = [c for c in CONTENDERS.values() if wanted(c) and not c.only_listed]
    return _runnable(pool, device)


def _runnable(pool: list[Contender], device: torch.device) -> tuple[list[Contender], dict[str, list[str]]]:
    """Those of ``pool`` that can run on ``device``, and why each other one cannot."""
    chosen, skipped = [], {}
    for c in pool:
        reasons = c.reasons(device)
        if reasons:
            skipped[c.name] = reasons
        else:
            chosen.append(c)
    return chosen, skipped


def default_wanted(device: torch.device) -> Callable[[Contender], bool]:
    """Those that run by default on ``device``, and every reference."""
    return lambda c: c.group == "reference" or device.type in c.default_on


def by_prefix(prefixes: list[str]) -> Callable[[Contender], bool]:
    """Those whose name starts with one of ``prefixes``, and the roofline kernels."""
    return lambda c: c.roofline or c.name.startswith(tuple(prefixes))


def select(
    device: torch.device, prefixes: list[str] | None = None
) -> tuple[list[Contender], dict[str, list[str]]]:
    """The contenders to run on ``device``, and why each other one does not run.

    With ``prefixes``, every contender whose name starts with one of them (even
    one not run by default there); the references always run.
    """
    default = default_wanted(device)

    def wanted(c: Contender) -> bool:
        if prefixes is None:
            return default(c)
        return c.group == "reference" or c.name.startswith(tuple(prefixes))

    return _runnable([c for c in CONTENDERS.values() if not c.only_listed and wanted(c)], device)
