"""The counts alone (the locator's activations: ``_C.count_stats``, one thread)
of float32 and bfloat16 tensors under every instruction set this CPU runs,
beside ``torch.sum`` of the same tensor, in GB/s read (best of 15).

Run: ``python benchmarks/counts_isa.py``
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from fastnorm._stats import COLUMNS
from fastnorm.backends import cpp


def best(f: Callable[[], object], reps: int = 15) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    torch.set_num_threads(1)
    count_stats, _, task, table = cpp.count_stats_args(1)
    out = torch.empty(len(COLUMNS), dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    default = cpp._C.isa()
    for dtype in (torch.float32, torch.bfloat16):
        for mb in (2, 16, 64):
            n = mb * 2**20 // (torch.finfo(dtype).bits // 8)
            x = torch.randn(n, generator=gen).to(dtype)
            code = cpp.DTYPE_CODES[dtype]
            args = (x.data_ptr(), n, code, -1, task, table, out.data_ptr(), 1)
            row = [f"{str(dtype)[6:]:9s} {mb:3d} MB"]
            for isa in cpp._C.supported_isas():
                cpp._C.use_isa(isa)
                t = best(lambda args=args: count_stats(*args))
                row.append(f"{isa} {mb * 2**20 / t / 1e9:5.1f}")
            cpp._C.use_isa(default)
            t = best(lambda x=x: torch.sum(x))
            row.append(f"torch.sum {mb * 2**20 / t / 1e9:5.1f}")
            print(" | ".join(row))


if __name__ == "__main__":
    main()
