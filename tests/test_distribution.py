"""This project's distribution and what the README says of installing it: every install hint names
the distribution (the package named ``fastnorm`` on the index is another project, and a hint that says
``pip install 'fastnorm[hf]'`` would install it), the torch every figure comes from, the extras' sizes."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = (ROOT / "pyproject.toml").read_text()
# The words of a command: quoted requirements, or bare words up to where a code span, a string or a
# sentence ends it.
WORDS = re.compile(r"(?:[ \t]+(?:'[^'\n]*'|\"[^\"\n]*\"|[^\s`\"'),;&]+))*")
# Options of `pip install` whose next word is a value, not a requirement.
TAKES_A_VALUE = {"--index-url", "--extra-index-url", "-i", "-r", "-c", "--constraint", "-d"}


def distribution() -> str:
    (name,) = re.findall(r'^\[project\]\nname = "([\w.-]+)"$', PYPROJECT, flags=re.M)
    return name


def extras() -> dict[str, str]:
    """Each extra of ``[project.optional-dependencies]``, with its requirement lines as written."""
    table = PYPROJECT.split("[project.optional-dependencies]\n", 1)[1].split("\n[", 1)[0]
    found = re.findall(r"^(\w+) = \[(.*?)\]$", table, flags=re.M | re.S)
    return dict(found)


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def hint_sources() -> list[Path]:
    """What a user reads or the library prints: the package, the README, the docs, the benchmarks' scripts."""
    return [
        *sorted((ROOT / "fastnorm").rglob("*.py")),
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "benchmarks").glob("*.py")),
    ]


def install_hints() -> list[tuple[str, list[str]]]:
    """Every ``pip install ...`` in the hint sources: (where, the requirements it names)."""
    hints = []
    for path in hint_sources():
        text = path.read_text()
        for match in re.finditer(r"pip install\b", text):
            words = WORDS.match(text, match.end()).group().split()
            requirements, skip = [], False
            for word in words:
                if skip or word.startswith("-"):
                    skip = not skip and word in TAKES_A_VALUE
                    continue
                requirements.append(word.strip("'\""))
            line = text.count("\n", 0, match.start()) + 1
            hints.append((f"{path.relative_to(ROOT)}:{line}", requirements))
    return hints


def test_the_distribution_is_not_the_other_projects_name_and_the_import_name_stays():
    assert normalized(distribution()) != "fastnorm"
    assert 'include = ["fastnorm*"]' in PYPROJECT
    assert (ROOT / "fastnorm" / "__init__.py").exists()


def test_the_extras_that_name_this_project_name_its_distribution():
    own = 0
    for extra, requirements in extras().items():
        for requirement in re.findall(r'"([^"]+)"', requirements):
            name = re.match(r"[\w.-]+", requirement).group()
            assert normalized(name) != "fastnorm", (extra, requirement)
            if normalized(name) == normalized(distribution()):
                own += 1
                (named,) = re.findall(r"\[([\w,]+)\]", requirement)
                assert set(named.split(",")) <= set(extras()), (extra, requirement)
    assert own >= 2  # stacks -> [hf], test -> [stacks]


def test_every_install_hint_names_this_distribution_never_a_bare_fastnorm():
    hints = install_hints()
    ours = []
    for where, requirements in hints:
        for requirement in requirements:
            name, _, rest = requirement.partition("[")
            if name in (".", ""):  # a clone: `pip install ".[test]"`, `pip install -e .`
                continue
            name = re.match(r"[\w.-]+", name).group()
            assert normalized(name) != "fastnorm", (where, requirement)
            if rest:  # an extra belongs to this project only
                assert normalized(name) == normalized(distribution()), (where, requirement)
                ours.append((where, rest.rstrip("]")))
    # The optional integrations all say what to install, and each extra they name exists.
    assert len(ours) >= 8, ours
    for where, extra in ours:
        assert extra.startswith("{") or extra in extras(), (where, extra)


def test_the_readme_installs_the_torch_ci_runs_and_every_figure_comes_from():
    ci = (ROOT / ".ci" / "run").read_text()
    (pinned,) = re.findall(r"^python -m pip install -q torch==([\d.]+)$", ci, flags=re.M)
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"pip install torch=={pinned} --index-url" in readme
    assert f"Every figure and test result here comes from torch {pinned}" in readme
    assert set(re.findall(r"torch (\d+\.\d+\.\d+)\+cpu", readme)) == {pinned}  # each figure's torch
    (floor,) = re.findall(r'^dependencies = \["torch>=([\d.]+)"\]$', PYPROJECT, flags=re.M)
    assert f"asks only for `torch>={floor}`" in readme


def _pulled(requirements: list[str]) -> tuple[set[str], set[str]]:
    """The installed distributions ``requirements`` pull, transitively; and the ones not installed."""
    from importlib import metadata

    from packaging.requirements import Requirement

    dists = {normalized(d.metadata["Name"]): d for d in metadata.distributions()}
    seen, missing, stack = set(), set(), [Requirement(r) for r in requirements]
    while stack:
        req = stack.pop()
        name = normalized(req.name)
        if name in seen or name in missing:
            continue
        if name not in dists:
            missing.add(name)
            continue
        seen.add(name)
        for line in dists[name].requires or []:
            sub = Requirement(line)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in req.extras or {""}):
                stack.append(sub)
    return seen, missing


def _bytes(names: set[str]) -> int:
    from importlib import metadata

    dists = {normalized(d.metadata["Name"]): d for d in metadata.distributions()}
    return sum(f.size or 0 for name in names for f in dists[name].files or [])


def _extra(name: str) -> list[str]:
    """An extra's requirements, this project's own extras expanded, those whose marker fails dropped."""
    from packaging.requirements import Requirement

    found = []
    for line in re.findall(r'"([^"]+)"', extras()[name]):
        req = Requirement(line)
        if normalized(req.name) == normalized(distribution()):
            found += [r for extra in sorted(req.extras) for r in _extra(extra)]
        elif req.marker is None or req.marker.evaluate():
            found.append(line)
    return found


@pytest.mark.parametrize(
    "extra, said",
    [
        ("test", r"\.\[test\] adds about ([\d.]+) GB beside torch"),
        ("bench", r"`\.\[bench\]` about ([\d.]+) GB"),
    ],
)
def test_the_readme_says_how_much_the_extras_install_beside_torch(extra, said):
    pytest.importorskip("packaging")
    pulled, missing = _pulled(_extra(extra))
    if missing:
        pytest.skip(f"the {extra} extra is not installed here: {sorted(missing)}")
    beside = _bytes(pulled - _pulled(["torch"])[0])
    (gb,) = set(re.findall(said, " ".join((ROOT / "README.md").read_text().split())))
    # said roughly: within a quarter (the wheels differ by platform and version)
    assert abs(beside / 1e9 - float(gb)) <= 0.25 * float(gb) + 0.05, (extra, beside, gb)
