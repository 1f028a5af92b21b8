"""Every contender on every workload, through pytest-benchmark."""

from __future__ import annotations

import pytest
import torch

from fastnorm.bench.contenders import CONTENDERS, Staged
from fastnorm.bench.harness import check
from fastnorm.bench.workloads import WORKLOADS


@pytest.fixture
def threads(case):
    """torch's thread count as the workload asks (1 for the single-core one)."""
    wanted = WORKLOADS[case[0]].threads
    before = torch.get_num_threads()
    if wanted is not None:
        torch.set_num_threads(wanted)
    yield
    torch.set_num_threads(before)


def test_norm(benchmark, case, prepared_workloads, threads) -> None:
    workload, dtype, name = case
    w = prepared_workloads.get(workload, dtype)
    contender = CONTENDERS[name]
    reasons = contender.reasons(w.device) + contender.dtype_reasons(w.device, w.dtype)
    if reasons:
        pytest.skip("; ".join(reasons))
    call = contender.make(w, contender.max_norm(w))
    checked = check([contender], w, {name: call})
    if checked.dropped:
        pytest.skip("; ".join(checked.dropped[name]))
    benchmark.extra_info["norm_error"] = checked.errors.get(name)

    # A staged call's first part (a norm computed anyway) runs untimed, in the setup.
    before, body = (call.before, call.call) if isinstance(call, Staged) else (None, call)

    def sync() -> None:
        if w.device.type == "cuda":
            torch.cuda.synchronize(w.device)

    def timed():  # on CUDA, the device's work, not just the launch
        body()
        sync()

    def setup() -> None:
        # Each round clips (or steps on) the original values: restore them first, untimed.
        w.restore()
        if before is not None:
            before()
        sync()

    benchmark.group = f"{workload} {dtype}"
    benchmark.extra_info.update(
        kind=contender.kind, bytes_moved=contender.bytes_moved(w), tensors=len(w.grads)
    )
    if contender.restores:
        benchmark.pedantic(timed, setup=setup, rounds=20, warmup_rounds=2)
        w.restore()
    else:
        benchmark(timed)
    median = benchmark.stats.stats.median
    benchmark.extra_info["gbps"] = contender.bytes_moved(w) / median / 1e9
