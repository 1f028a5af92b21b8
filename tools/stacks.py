"""The stack tests that cannot run in CI: timm and LightlyTrain, in an environment of their own.

Both need torchvision, and PyPI's torchvision links CUDA: it does not import
beside the CPU build of torch that CI installs (``operator torchvision::nms
does not exist``), so ``tests/test_stacks_vision.py`` skips there. This script
makes a virtual environment with torch and torchvision of one CUDA build (it
runs on the CPU just as well; 6.4 GB, made in 5 minutes here), timm and LightlyTrain, and runs
those tests in it, on this tree (through ``PYTHONPATH``, nothing installed)::

    python tools/stacks.py                 # creates .venv-vision once, then runs the tests
    python tools/stacks.py --venv DIR      # another place for the environment
    python tools/stacks.py -- -k timm      # arguments after -- go to pytest

The C++ extension is built in place first when it is missing (it does not link
torch, so one build serves both environments). Exit status: pytest's.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# torch and torchvision of one build, and the stack versions these tests were written against.
PACKAGES = ["torch==2.14.1", "torchvision==0.29.1", "timm==1.0.31", "lightly-train==0.18.0"]
EXTRA = ["pytest", "numpy", "pybind11>=2.12", "setuptools>=77"]


def run(command: list[str], **kwargs) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, **kwargs)


def environment(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        run([sys.executable, "-m", "venv", str(venv)])
        run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"])
        run([str(python), "-m", "pip", "install", "-q", *PACKAGES[:2]])
        # torch and torchvision repeated, so that nothing the stacks ask for moves them.
        run([str(python), "-m", "pip", "install", "-q", *PACKAGES, *EXTRA])
    return python


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv-vision", help="the environment's folder")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args(argv)
    python = environment(args.venv)
    if not list((ROOT / "fastnorm").glob("_C*.so")):
        run([str(python), "setup.py", "build_ext", "--inplace", "-q"], cwd=ROOT)
    versions = (
        "import platform, torch, torchvision, timm, importlib.metadata as m; "
        "print('torch', torch.__version__, '| torchvision', torchvision.__version__, '| timm', "
        "timm.__version__, '| lightly-train', m.version('lightly-train'), '|', platform.python_version())"
    )
    run([str(python), "-c", versions])
    print("CPU:", _cpu(), flush=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LIGHTLY_TRAIN_EVENTS_DISABLED": "1"}
    tests = ["tests/test_stacks_vision.py", "-v", "-rs", "-p", "no:cacheprovider"]
    command = [str(python), "-m", "pytest", *tests]
    print("+", " ".join(command + args.pytest_args), flush=True)
    return subprocess.run(command + args.pytest_args, cwd=ROOT, env=env, check=False).returncode


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
