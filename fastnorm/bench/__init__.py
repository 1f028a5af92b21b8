"""``fastnorm bench``: fastnorm against torch and the memory-bandwidth roofline.

The layers, each usable alone:

* ``workloads``: gradient lists shaped like real models (GPT-2 small,
  ResNet-50, LLaMA-style stacks, many small and tiny tensors);
* ``contenders``: named callables over a prepared workload (fastnorm, torch,
  a plain loop, the roofline kernels);
* ``harness``: correctness first, then interleaved timing and the summary;
* ``report``, ``goals`` and ``plot``: the table, JSON, CSV, Markdown, the
  targets and the PNG;
* ``cli``: the ``fastnorm bench`` subcommand (``add_arguments``, ``main``).

Other modules extend the suite through :func:`register_workload` and
:func:`register_contender`, as ``distributed`` (DTensor gradients over a gloo
group) and ``step`` (torch's fused AdamW step, clipping through it or not) do;
the pytest-benchmark suites under ``benchmarks/`` use the same registries.
"""

from fastnorm.bench import distributed, step  # noqa: F401  (register their workloads)
from fastnorm.bench import locate  # noqa: F401  (the train-* workloads: what watching a step costs)
from fastnorm.bench.contenders import Contender, register_contender
from fastnorm.bench.harness import CorrectnessError, run_workload
from fastnorm.bench.workloads import Workload, prepare, register_workload

__all__ = [
    "Contender",
    "CorrectnessError",
    "Workload",
    "prepare",
    "register_contender",
    "register_workload",
    "run_workload",
]
