"""Running from a source checkout (``python -m fastnorm`` in the repository root
imports the tree, not the installed package): the kernels of an installed build
of the same sources are used, or one line says why not and what to run."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fastnorm import _build
from fastnorm.backends import cpp

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    cpp._C is None or not (ROOT / ".git").exists() or shutil.which("git") is None,
    reason="needs a built fastnorm and the git checkout it came from",
)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the checkout's tracked files: a source tree without a build."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(
        b"\0"
    )
    for name in filter(None, files):
        source = ROOT / name.decode()
        if source.is_file():
            target = tmp_path / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    assert not list((tmp_path / "fastnorm").glob("_C*"))
    return tmp_path


def _info(tree: Path) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "fastnorm", "info"], cwd=tree, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return next(line for line in result.stdout.splitlines() if line.startswith("C++ kernels"))


def test_a_tree_without_a_build_uses_the_installed_build_of_the_same_sources(tree):
    if cpp._C.source_hash() != _build.source_hash(tree / "csrc"):
        pytest.skip("the installed build is not of this checkout's sources (rebuild it)")
    line = _info(tree)
    assert line.startswith(f"C++ kernels: {cpp._C.isa()}") and "same sources as this tree" in line


def test_a_tree_whose_sources_differ_says_what_to_run(tree):
    (tree / "csrc" / "lanes.h").write_text((tree / "csrc" / "lanes.h").read_text() + "\n// edited\n")
    line = _info(tree)
    assert line.startswith("C++ kernels: not available: this source tree")
    assert "built from other sources" in line and "`pip install -e .`" in line
