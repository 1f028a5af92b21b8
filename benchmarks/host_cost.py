"""Where the host time of a cached ``fastnorm.total_norm`` call goes.

    python benchmarks/host_cost.py [--tensors 2000] [--numel 16]

On one thread, warm in cache (best of several repeats), for parameters whose
``.grad`` holds ``--numel`` elements:

* each fact the plan cache checks per tensor, read from Python (what a check
  written in Python pays: the attribute read and the interpreter around it);
* the same facts read in the extension (``fastnorm._C.Snapshot.matches``);
* the kernel on the plan (``fastnorm._C.reduce``);
* the whole call, and its fixed part (one tensor).
"""

from __future__ import annotations

import argparse
import timeit
from operator import attrgetter

import torch

import fastnorm
from fastnorm import _plan
from fastnorm.backends import cpp


def _best(fn, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=7)) / number


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=2000)
    parser.add_argument("--numel", type=int, default=16)
    args = parser.parse_args()
    if cpp._C is None:
        raise SystemExit(f"the C++ kernels are not available: {cpp._IMPORT_ERROR}")
    torch.set_num_threads(1)
    n = args.tensors
    params = [torch.nn.Parameter(torch.zeros(args.numel)) for _ in range(n)]
    for p in params:
        p.grad = torch.randn(args.numel)
    grads = [p.grad for p in params]
    fastnorm.clear_cache()
    fastnorm.total_norm(params)
    plan = _plan.lookup(params, None, 2.0).plan
    entry = next(iter(_plan._CACHE._entries.values()))
    partial = torch.empty(2, dtype=torch.float64)
    root = torch.empty((), dtype=torch.float32)
    prepared = plan.norm_groups[0].prepared
    number = max(1, 200_000 // n)

    def per_tensor(fn) -> float:
        return _best(fn, number) / n * 1e9

    print(f"{n} parameters of {args.numel} elements, 1 thread, C++ kernels {cpp.isa()}; ns per tensor:")
    python_reads = {
        "id(item)": lambda: list(map(id, params)),
        "param.grad": lambda: list(map(attrgetter("grad"), params)),
        "grad.data_ptr()": lambda: list(map(torch.Tensor.data_ptr, grads)),
        "grad.numel()": lambda: list(map(torch.Tensor.numel, grads)),
        "grad.dtype": lambda: list(map(attrgetter("dtype"), grads)),
        "grad.is_contiguous()": lambda: list(map(torch.Tensor.is_contiguous, grads)),
    }
    total = 0.0
    for name, fn in python_reads.items():
        cost = per_tensor(fn)
        total += cost
        print(f"  read from Python: {name:22s} {cost:6.1f}")
    print(f"  read from Python, together        {total:6.1f}")
    print(f"  read in the extension (all facts) {per_tensor(lambda: entry.snapshot.matches(params)):6.1f}")
    addrs = partial.data_ptr(), root.data_ptr()
    kernel = per_tensor(lambda: cpp._C.reduce(prepared, 0, 2.0, *addrs, False, 0, 1))
    print(f"  kernel                            {kernel:6.1f}")
    call = per_tensor(lambda: fastnorm.total_norm(params))
    print(f"  the whole cached call             {call:6.1f}")
    # Nothing to clip: the same reads, each written gradient checked (an
    # inference tensor is refused) and its version bumped for autograd.
    noclip = per_tensor(lambda: fastnorm.clip_(params, 1e30))
    print(f"  the whole cached clip_ (no clip)  {noclip:6.1f}")
    one = [params[0]]
    fastnorm.total_norm(one)
    fixed = _best(lambda: fastnorm.total_norm(one), 20_000) * 1e6
    print(f"fixed cost of a call (one tensor): {fixed:.1f} us")


if __name__ == "__main__":
    main()
