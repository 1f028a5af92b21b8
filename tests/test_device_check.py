"""The GPU check (benchmarks/device_check.sh) names only what exists: it runs where no one can fix it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from fastnorm.bench.contenders import CONTENDERS
from fastnorm.bench.workloads import WORKLOADS

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = (ROOT / "benchmarks" / "device_check.sh").read_text()


def test_the_script_parses():
    subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "device_check.sh")], check=True)


def test_every_test_file_it_runs_exists():
    paths = set(re.findall(r"tests/[\w/]+\.py", SCRIPT))
    assert "tests/test_cuda.py" in paths
    assert [p for p in sorted(paths) if not (ROOT / p).is_file()] == []


def test_every_workload_and_contender_it_asks_for_is_known():
    workloads = {w for arg in re.findall(r"--workloads ([\w,.-]+)", SCRIPT) for w in arg.split(",")}
    contenders = {c for arg in re.findall(r"--contenders ([\w,.-]+)", SCRIPT) for c in arg.split(",")}
    assert workloads and contenders
    assert sorted(workloads - set(WORKLOADS)) == []
    known = set(CONTENDERS) | {name.split(".")[0] for name in CONTENDERS}
    assert sorted(contenders - known) == []
