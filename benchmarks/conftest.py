"""pytest-benchmark suites over the workloads and contenders of ``fastnorm bench``.

Not part of the default test run (``testpaths`` is ``tests``)::

    pytest benchmarks/ --benchmark-only                          # full size, this device
    pytest benchmarks/ --benchmark-only --bench-quick            # small shapes, seconds
    pytest benchmarks/ --benchmark-only --bench-workloads gpt2-small --bench-dtypes fp32 \\
        --bench-contenders fastnorm,torch,roofline --benchmark-group-by=group

Every contender is checked against the float64 reference before it is timed,
as in ``fastnorm bench``; ``fastnorm bench`` remains the tool for interleaved
timing and the roofline columns, these suites plug into pytest-benchmark's
storage and comparison (``--benchmark-autosave``, ``--benchmark-compare``).
"""

from __future__ import annotations

import pytest
import torch

from fastnorm.bench import contenders, workloads


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fastnorm bench")
    group.addoption("--bench-device", choices=("cpu", "cuda"), help="default: cuda when present, else cpu")
    group.addoption("--bench-workloads", help="comma list (default: the device's defaults)")
    group.addoption("--bench-dtypes", help="comma list (default: each workload's, fp32,bf16 for most)")
    group.addoption("--bench-contenders", help="comma list of name prefixes (default: the device's defaults)")
    group.addoption("--bench-quick", action="store_true", help="the small --quick shapes")


def _split(value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


def bench_device(config: pytest.Config) -> torch.device:
    name = config.getoption("--bench-device") or ("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case" not in metafunc.fixturenames:
        return
    config = metafunc.config
    device = bench_device(config)
    names = _split(config.getoption("--bench-workloads")) or workloads.defaults(device)
    dtypes = _split(config.getoption("--bench-dtypes"))
    prefixes = _split(config.getoption("--bench-contenders"))
    wanted = contenders.by_prefix(prefixes) if prefixes else contenders.default_wanted(device)
    # Workload-major order: the session fixture keeps one prepared workload at a time.
    cases = []
    for name in names:
        workload = workloads.WORKLOADS[name]
        chosen, _ = contenders.for_workload(workload, device, wanted)
        for d in dtypes or workload.dtypes or ["fp32", "bf16"]:
            cases += [(name, d, c.name) for c in chosen]
    metafunc.parametrize("case", cases, ids=[f"{w}-{d}-{c}" for w, d, c in cases])


class _OnePrepared:
    """The prepared workload of the current case; the previous one is freed first."""

    def __init__(self, device: torch.device, quick: bool) -> None:
        self.device, self.quick = device, quick
        self.key: tuple[str, str] | None = None
        self.value: workloads.Prepared | None = None

    def get(self, name: str, dtype: str) -> workloads.Prepared:
        if self.key != (name, dtype):
            self.value = None  # free before allocating the next one
            self.value = workloads.prepare(
                workloads.WORKLOADS[name], workloads.DTYPES[dtype], self.device, quick=self.quick
            )
            self.key = (name, dtype)
        return self.value


@pytest.fixture(scope="session")
def prepared_workloads(pytestconfig: pytest.Config) -> _OnePrepared:
    device = bench_device(pytestconfig)
    if device.type == "cuda" and not torch.cuda.is_available():
        pytest.skip("--bench-device cuda, but torch sees no CUDA device")
    return _OnePrepared(device, pytestconfig.getoption("--bench-quick"))
