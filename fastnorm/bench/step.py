"""The training step without backward: clipping by a pass of its own, or inside the step.

Three contenders, timed interleaved in one process on the same parameters,
gradients and fused AdamW (``fused=True``) state, clipping active at every call:

- ``clip_+step``: ``fastnorm.clip_`` then ``optimizer.step()``, today's recipe;
- ``folded``: :class:`fastnorm.StepClipper` (``clip_()`` reads the gradients
  once for the norm; the step divides them by the coefficient as it reads them);
- ``scale+step`` and ``folded-step``: the same two with the norm computed
  before the clock starts (``clip_(..., total_norm=norm)`` then the step, and
  the armed step alone): what clipping itself costs when the norm is computed
  anyway, for a monitor;
- ``step``: the bare ``optimizer.step()``, the floor.

Before every timed call the gradients get their original values back (untimed),
so each call clips. Each round times every contender once, in a rotating
order; the result keeps each contender's median and, per contender, the median
over rounds of its time divided by the bare step's in the same round (a paired
ratio, steadier than a ratio of medians on a busy machine).

``python -m fastnorm.bench.step --workloads gpt2-small llama-300m`` prints the table.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.nn import Parameter

import fastnorm
from fastnorm.bench.workloads import DTYPES, WORKLOADS

CONTENDERS = ("clip_+step", "folded", "scale+step", "folded-step", "step")
BASELINE = "step"


@dataclass
class StepTiming:
    """Times of one workload's training step without backward (seconds)."""

    workload: str
    device: str
    dtype: str
    tensors: int
    numel: int
    rounds: int
    threads: int
    medians: dict[str, float]
    ratios: dict[str, float]  # median of the paired per-round ratios to the bare step
    samples: dict[str, list[float]] = field(repr=False)

    def row(self) -> dict[str, object]:
        """A flat record (one per workload) for a table or a data file."""
        out: dict[str, object] = {
            "workload": self.workload,
            "device": self.device,
            "dtype": self.dtype,
            "tensors": self.tensors,
            "numel": self.numel,
            "rounds": self.rounds,
            "threads": self.threads,
        }
        for name in CONTENDERS:
            out[f"{name} ms"] = self.medians[name] * 1e3
            out[f"{name} / step"] = self.ratios[name]
        return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _check_folded_clips(params: list[Parameter], originals: list[Tensor], coef: float) -> None:
    """After a folded step the gradients hold what the step used: the originals times coef."""
    for i, (p, original) in enumerate(zip(params, originals)):
        expected = original.to(torch.float64) * coef
        if not torch.allclose(p.grad.to(torch.float64), expected, rtol=1e-5, atol=1e-12):
            raise RuntimeError(f"the folded step did not clip gradient {i} {tuple(p.shape)} by {coef:.6g}")


def measure(
    params: Sequence[Parameter],
    *,
    name: str = "custom",
    max_norm: float | None = None,
    rounds: int = 15,
    warmup: int = 2,
    optimizer: Callable[[list[Parameter]], torch.optim.Optimizer] | None = None,
) -> StepTiming:
    """Times ``clip_ + step``, the folded step and the bare step on ``params``.

    Args:
        params (sequence of Parameter): parameters whose ``.grad`` is set (all
            on one device). Their values and gradients are overwritten.
        name (str): the workload's name in the result.
        max_norm (float, optional): the clipping threshold; by default a tenth
            of the gradients' norm, so every call clips.
        rounds (int): timed rounds (each contender once per round).
        warmup (int): untimed rounds first (plans, optimizer state).
        optimizer (callable, optional): builds the optimizer from the
            parameters; by default ``torch.optim.AdamW(params, fused=True)``.

    Returns:
        StepTiming: medians and paired ratios to the bare step.
    """
    params = list(params)
    if not params or any(p.grad is None for p in params):
        raise ValueError("measure: every parameter needs a .grad")
    device = params[0].device
    opt = (optimizer or (lambda ps: torch.optim.AdamW(ps, fused=True)))(params)
    grads = [p.grad for p in params]
    originals = [g.clone() for g in grads]
    norm = float(fastnorm.total_norm(grads))
    bound = norm / 10 if max_norm is None else float(max_norm)
    if not norm > bound:
        raise ValueError(f"measure: max_norm {bound} would not clip gradients of norm {norm}")
    clipper = fastnorm.StepClipper(opt, bound, strict=True)

    def restore() -> None:
        with torch.no_grad():
            torch._foreach_copy_(grads, originals)

    def clip_then_step() -> None:
        fastnorm.clip_(params, bound)
        opt.step()

    def folded() -> None:
        clipper.clip_()
        opt.step()

    given: dict[str, Tensor] = {}

    def norm_only() -> None:
        given["norm"] = fastnorm.total_norm(params)

    def scale_then_step() -> None:
        fastnorm.clip_(params, bound, total_norm=given["norm"])
        opt.step()

    calls = {
        "clip_+step": clip_then_step,
        "folded": folded,
        "scale+step": scale_then_step,
        "folded-step": opt.step,
        "step": opt.step,
    }
    # Untimed, before the clock starts.
    prepare = {"scale+step": norm_only, "folded-step": clipper.clip_}
    try:
        restore()
        folded()
        _sync(device)
        _check_folded_clips(params, originals, bound / (norm + 1e-6))
        samples: dict[str, list[float]] = {c: [] for c in CONTENDERS}
        for r in range(warmup + rounds):
            for k in range(len(CONTENDERS)):
                contender = CONTENDERS[(r + k) % len(CONTENDERS)]
                restore()
                if contender in prepare:
                    prepare[contender]()
                _sync(device)
                start = time.perf_counter()
                calls[contender]()
                _sync(device)
                if r >= warmup:
                    samples[contender].append(time.perf_counter() - start)
    finally:
        clipper.remove()
        restore()
    base = samples[BASELINE]
    return StepTiming(
        workload=name,
        device=str(device),
        dtype=str(params[0].dtype).replace("torch.", ""),
        tensors=len(params),
        numel=sum(p.numel() for p in params),
        rounds=rounds,
        threads=torch.get_num_threads(),
        medians={c: statistics.median(s) for c, s in samples.items()},
        ratios={c: statistics.median(t / b for t, b in zip(s, base)) for c, s in samples.items()},
        samples=samples,
    )


def workload_params(
    workload: str,
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    quick: bool = False,
    seed: int = 0,
) -> list[Parameter]:
    """Real parameters shaped like a registered workload, with random gradients of norm ~10."""
    shapes = WORKLOADS[workload].shapes(quick)
    scale = 10.0 / math.sqrt(sum(math.prod(s) for s in shapes))
    generator = torch.Generator(device=device).manual_seed(seed)
    params = []
    for shape in shapes:
        p = Parameter(torch.randn(shape, generator=generator, device=device).to(dtype) * 0.02)
        p.grad = (torch.randn(shape, generator=generator, device=device) * scale).to(dtype)
        params.append(p)
    return params


def measure_workload(
    workload: str,
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    quick: bool = False,
    rounds: int = 15,
    warmup: int = 2,
) -> StepTiming:
    """:func:`measure` on a registered workload's shapes (``fastnorm bench``'s names)."""
    name = f"{workload} (quick)" if quick else workload
    return measure(
        workload_params(workload, dtype=dtype, device=device, quick=quick),
        name=name,
        rounds=rounds,
        warmup=warmup,
    )


def table(results: Sequence[StepTiming]) -> str:
    """A plain-text table: medians in ms and paired ratios to the bare step."""
    header = ["workload", "dtype", "tensors", "params"]
    for c in CONTENDERS:
        header += [f"{c} ms", f"{c} / step"] if c != BASELINE else [f"{c} ms"]
    rows = [header]
    for r in results:
        row = [r.workload, r.dtype, str(r.tensors), f"{r.numel / 1e6:.1f}M"]
        for c in CONTENDERS:
            row.append(f"{r.medians[c] * 1e3:.1f}")
            if c != BASELINE:
                row.append(f"{r.ratios[c]:.3f}")
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fastnorm.bench.step", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument(
        "--workloads", nargs="+", default=["gpt2-small", "llama-300m"], choices=sorted(WORKLOADS)
    )
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="the workloads' small variants")
    parser.add_argument("--threads", type=int, help="torch's intra-op threads (default: torch's own)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    results = []
    for w in args.workloads:
        results.append(
            measure_workload(
                w, dtype=DTYPES[args.dtype], device=args.device, quick=args.quick, rounds=args.rounds
            )
        )
        print(f"{w}: done", file=sys.stderr, flush=True)
    print(table(results))
    print(f"device {args.device}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
