"""The CPU kernels' software prefetch distance, compared within one run.

Registers ``fastnorm.total_norm/pf-N`` and ``fastnorm.tensor_stats/pf-N`` for
each distance N (bytes; 0 for none), each setting ``_C.set_prefetch_bytes(N)``
around its call, and runs ``fastnorm bench`` on them: the distances are timed
in the same interleaved rounds, against the same roofline, so that a memory
whose speed drifts between runs (a shared VM's) compares them fairly. The
default distance of this CPU is ``fastnorm._C.prefetch_bytes()`` at start.

Run: ``python benchmarks/prefetch_sweep.py --distances 0,1024,2048,4096 --out DIR [bench options]``
(every other option is ``fastnorm bench``'s; the default workloads are
gpt2-small, resnet50 and llama-300m in fp32 and bf16).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import Any, Callable

import torch

import fastnorm
from fastnorm.backends import cpp
from fastnorm.bench import cli
from fastnorm.bench.contenders import Contender, register_contender


def _at(distance: int, fn: Callable[[list[Any]], Any]) -> Callable[[Any, float | None], Callable[[], Any]]:
    def make(w: Any, max_norm: float | None) -> Callable[[], Any]:
        groups = w.groups
        setting, current = cpp._C.set_prefetch_bytes, cpp._C.prefetch_bytes

        def call() -> Any:
            default = current()
            setting(distance)
            try:
                return [fn(group) for group in groups]
            finally:
                setting(default)

        return call

    return make


def register(distances: list[int]) -> list[str]:
    names = []
    for d in distances:
        for what, fn in (
            ("total_norm", fastnorm.total_norm),
            ("tensor_stats", lambda params: fastnorm.tensor_stats(params)[0]),
        ):
            name = f"fastnorm.{what}/pf-{d}"
            register_contender(
                Contender(name, "norm", _at(d, fn), "torch.get_total_norm", "fastnorm", default_on=("cpu",))
            )
            names.append(name)
    return names


def main(argv: list[str] | None = None) -> int:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--distances", default="0,1024,2048,4096")
    known, rest = own.parse_known_args(argv)
    distances = [int(d) for d in known.distances.split(",")]
    if cpp._C is None:
        print(f"the C++ kernels are not available: {cpp._IMPORT_ERROR}", file=sys.stderr)
        return 1
    print(f"this CPU's default prefetch distance: {cpp._C.prefetch_bytes()} bytes; sweeping {distances}")
    names = register(distances)
    parser = argparse.ArgumentParser(prog="prefetch_sweep")
    cli.add_arguments(parser)
    defaults = ["--device", "cpu", "--workloads", "gpt2-small,resnet50,llama-300m", "--dtypes", "fp32,bf16"]
    args = parser.parse_args([*defaults, "--contenders", ",".join(["torch.get_total_norm", *names]), *rest])
    torch.manual_seed(0)
    rc = cli.main(args)
    results = Path(args.out) / "results.csv"
    if results.is_file():
        text = table(list(csv.DictReader(results.open())), distances)
        (Path(args.out) / "prefetch.md").write_text(text + "\n")
        print(text)
    return rc


def table(rows: list[dict], distances: list[int]) -> str:
    """total_norm at each distance: ms and % of the read roofline; tensor_stats / total_norm beside it."""
    runs: dict[tuple[str, str], dict[str, dict]] = {}
    for r in rows:
        runs.setdefault((r["workload"], r["dtype"]), {})[r["contender"]] = r
    head = ["workload", "dtype", "roofline GB/s", *(f"total_norm, {d} B" for d in distances)]
    head += [f"tensor_stats / total_norm, {d} B" for d in distances]
    rule = ["---"] * 2 + ["---:"] * (len(head) - 2)
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(rule) + " |"]
    for (workload, dtype), by in runs.items():
        roof = next(iter(by.values()))["roofline_read_gbps"]
        cells = [workload, dtype, f"{float(roof):.1f}"]
        for d in distances:
            r = by.get(f"fastnorm.total_norm/pf-{d}")
            ok = r and r["disturbed"] not in ("True", "true", "1")
            cells.append(f"{float(r['ms']):.3g} ms ({float(r['roofline_pct']):.0f}%)" if ok else "disturbed")
        for d in distances:
            n, t = by.get(f"fastnorm.total_norm/pf-{d}"), by.get(f"fastnorm.tensor_stats/pf-{d}")
            cells.append(f"{float(t['ms']) / float(n['ms']):.2f}" if n and t else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
