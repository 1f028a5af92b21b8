"""The locator's counts (``_C.count_stats``, one thread) at each software
prefetch distance, beside ``torch.sum`` of the same tensors: 40 tensors of 2.4M
elements each (9.6 MB in float32), read in turn, beyond every cache; GB/s, best
of 5 interleaved rounds. The distance is restored to this CPU's default at the end.

Run: ``python benchmarks/counts_prefetch.py``
"""

from __future__ import annotations

import time

import torch

from fastnorm._stats import COLUMNS
from fastnorm.backends import cpp

DISTANCES = (0, 1024, 2048, 4096, 8192, 16384)


def main() -> None:
    torch.set_num_threads(1)
    count_stats, _, task, table = cpp.count_stats_args(1)
    out = torch.empty(len(COLUMNS), dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    default = cpp._C.prefetch_bytes()
    print(f"this CPU's default distance: {default} bytes")
    try:
        for dtype in (torch.float32, torch.bfloat16):
            xs = [torch.randn(2_400_000, generator=gen).to(dtype) for _ in range(40)]
            nbytes = sum(x.numel() * x.element_size() for x in xs)
            code = cpp.DTYPE_CODES[dtype]
            times: dict[object, list[float]] = {}
            for _ in range(5):
                for d in (*DISTANCES, "torch.sum"):
                    start = time.perf_counter()
                    if d == "torch.sum":
                        for x in xs:
                            x.sum()
                    else:
                        cpp._C.set_prefetch_bytes(d)
                        for x in xs:
                            count_stats(x.data_ptr(), x.numel(), code, -1, task, table, out.data_ptr(), 1)
                    times.setdefault(d, []).append(time.perf_counter() - start)
            row = " | ".join(f"{d}: {nbytes / min(t) / 1e9:.1f}" for d, t in times.items())
            print(f"{str(dtype)[6:]:9s} | {row} GB/s")
    finally:
        cpp._C.set_prefetch_bytes(default)


if __name__ == "__main__":
    main()
