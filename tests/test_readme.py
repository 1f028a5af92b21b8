"""The README's quick start runs, and its API table names every public name, each with its page."""

import importlib
import re

import torch
from test_docs import README, blocks, section, section_at

import fastnorm
import reference


def quick_start_oracle() -> list[float]:
    """The quick start's loop in float64 with torch's clip, from the same draws."""
    return reference.torch_clip_loop((64, 64, 8), batch=32)


def test_quick_start_prints_the_norms_of_its_loop(capsys):
    (code,) = blocks(section(README, "Quick start"), "python")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        exec(compile(code, "README.md", "exec"), {})
        printed = capsys.readouterr().out.splitlines()
        oracle = quick_start_oracle()
    assert [line.split(":")[0] for line in printed] == ["step 0", "step 1", "step 2"]
    for line, ref in zip(printed, oracle):
        # 4 decimals of a float32 loop against the float64 one
        assert abs(float(line.split("=")[1]) - ref) <= 5e-5 + 1e-5 * ref, (printed, oracle)


def resolve(name: str):
    """The object a dotted ``fastnorm.`` name stands for, importing its module where needed."""
    module, _, attribute = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attribute)
    except ModuleNotFoundError:
        return getattr(resolve(module), attribute)


def test_the_api_table_has_one_line_per_public_name_each_with_its_page():
    row = r"^\| `(fastnorm\.[\w.]+)` \| .+ \| \[[\w ]+\]\(docs/([\w.]+)#?([\w-]*)\) \|$"
    rows = re.findall(row, section(README, "API"), flags=re.M)
    names = [name for name, _, _ in rows]
    assert len(names) == len(set(names))
    top_level = {name.removeprefix("fastnorm.") for name in names if name.count(".") == 1}
    assert top_level == set(fastnorm.__all__) - {"__version__"}
    for name, page, anchor in rows:
        assert callable(resolve(name)), name
        # the page (or its section) it links to explains that name
        short = name.rpartition(".")[2]
        explained = section_at(README.parent / "docs" / page, anchor)
        assert re.search(rf"\b{re.escape(short)}\b", explained), (name, page, anchor)
