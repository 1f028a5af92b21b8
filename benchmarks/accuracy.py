"""How far torch's and fastnorm's total gradient norms are from the exact one, on GPT-2 small's gradients.

A GPT-2 small (124M parameters, 148 tensors) built from transformers' default
config, random weights, one backward pass of a random batch per seed; its
float32 gradients (and the same gradients rounded to bfloat16) are normed by
``torch.nn.utils.get_total_norm`` and by ``fastnorm.total_norm``, and both are
compared with the exact norm (NumPy, float64 on the concatenated values: no
code shared with either). Writes ``benchmarks/results/cpu/accuracy.json`` and
prints the table the docs quote::

    python benchmarks/accuracy.py            # needs transformers (pip install 'torch-fastnorm[hf]')
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import numpy as np
import torch

import fastnorm

OUT = Path(__file__).resolve().parent / "results" / "cpu" / "accuracy.json"
SEEDS = (0, 1, 2)


def exact(grads: list[torch.Tensor]) -> float:
    x = np.concatenate([g.detach().to(torch.float64).reshape(-1).numpy() for g in grads])
    top = float(np.abs(x).max())
    return top * float(np.sqrt(np.sum(np.square(x / top))))


def gradients(seed: int) -> list[torch.Tensor]:
    import transformers

    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    tokens = torch.randint(0, model.config.vocab_size, (2, 128))
    model(input_ids=tokens, labels=tokens).loss.backward()
    return [p.grad for p in model.parameters() if p.grad is not None]


def cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> int:
    rows = []
    for seed in SEEDS:
        grads = gradients(seed)
        for dtype in (torch.float32, torch.bfloat16):
            given = [g.to(dtype) for g in grads]
            truth = exact(given)
            theirs = torch.nn.utils.get_total_norm(given)
            ours = fastnorm.total_norm(given)
            rows.append(
                {
                    "seed": seed,
                    "gradients": str(dtype).removeprefix("torch."),
                    "tensors": len(given),
                    "elements": sum(g.numel() for g in given),
                    "exact": truth,
                    "torch": float(theirs),
                    "torch_dtype": str(theirs.dtype).removeprefix("torch."),
                    "torch_rel_err": abs(float(theirs) - truth) / truth,
                    "fastnorm": float(ours),
                    "fastnorm_dtype": str(ours.dtype).removeprefix("torch."),
                    "fastnorm_rel_err": abs(float(ours) - truth) / truth,
                }
            )
    meta = {
        "cpu": cpu(),
        "torch": torch.__version__,
        "fastnorm": fastnorm.__version__,
        "python": platform.python_version(),
        "command": "python benchmarks/accuracy.py",
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"GPT-2 small gradients, {meta['cpu']}, torch {meta['torch']}")
    print("| seed | gradients | exact norm | torch (rel. error) | fastnorm (rel. error) |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['seed']} | {r['gradients']} | {r['exact']:.9g} "
            f"| {r['torch']:.9g} {r['torch_dtype']} ({r['torch_rel_err']:.1e}) "
            f"| {r['fastnorm']:.9g} {r['fastnorm_dtype']} ({r['fastnorm_rel_err']:.1e}) |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
