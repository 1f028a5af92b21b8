"""The mutation campaign's list (tools/mutant_list.py) stays plantable: each mutant's snippet occurs
exactly once in its file, so a change that moves the code it mutates does not leave it stale (the
campaign would report it "stale", and nobody runs the campaign on every change)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIST = ROOT / "tools" / "mutant_list.py"

pytestmark = pytest.mark.skipif(not LIST.exists(), reason="needs the checkout's tools/")


def _mutants() -> list[dict]:
    spec = importlib.util.spec_from_file_location("mutant_list", LIST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MUTANTS


def test_every_mutants_snippet_occurs_once_in_its_file():
    mutants = _mutants()
    names = [m["name"] for m in mutants]
    assert len(set(names)) == len(names), "two mutants share a name"
    stale = {}
    for m in mutants:
        path = ROOT / m["path"]
        count = path.read_text().count(m["old"]) if path.is_file() else -1
        if count != 1:
            stale[m["name"]] = f"{m['path']}: {'missing' if count < 0 else f'{count} occurrences'}"
        assert m["old"] != m["new"], m["name"]
        for test in m["tests"]:
            assert (ROOT / test.split("::")[0]).is_file(), f"{m['name']}: no test file {test}"
    assert not stale, stale
