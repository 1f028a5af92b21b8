"""The docs pages' examples run and say what the code does; every link between the pages resolves."""

import inspect
import re
from pathlib import Path

import pytest
import torch

import fastnorm
from fastnorm.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))


def section(path: Path, title: str) -> str:
    """The text under the heading ``title`` of ``path``, up to the next heading of its level or above."""
    text = path.read_text()
    match = re.search(rf"^(#+) {re.escape(title)}\n", text, flags=re.M)
    assert match, (path.name, title)
    level = len(match.group(1))
    end = re.compile(rf"^#{{1,{level}}} ", flags=re.M).search(text, match.end())
    return text[match.start() : end.start() if end else None]


def section_at(path: Path, anchor: str) -> str:
    """The section of ``path`` that the link ``path#anchor`` leads to; the whole page without an anchor."""
    if not anchor:
        return path.read_text()
    (title,) = [h for h in re.findall(r"^#+ (.+)$", prose_headings(path), flags=re.M) if slug(h) == anchor]
    return section(path, title)


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def prose(text: str) -> str:
    """``text`` without its fenced code blocks and inline code spans."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def prose_headings(path: Path) -> str:
    """``path``'s text without its fenced code blocks, whose ``#`` lines are no headings."""
    return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)


def anchors(path: Path) -> set[str]:
    text = prose_headings(path)
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.M):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    targets = re.findall(r"\]\(([^)\s]+)\)", prose(path.read_text()))
    return [t for t in targets if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("path", [README, *PAGES], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_points_to_a_file_and_anchor_that_exist(path):
    links = relative_links(path)
    assert links or path == README, path
    for link in links:
        target, _, anchor = link.partition("#")
        resolved = (path.parent / target).resolve() if target else path
        assert resolved.exists(), (path.name, link)
        if anchor:
            assert resolved.suffix == ".md" and anchor in anchors(resolved), (path.name, link)


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_every_page_says_what_it_covers_and_links_back_to_the_readme(path):
    title, first_paragraph = path.read_text().split("\n\n")[:2]
    assert title.startswith("# ") and "\n" not in title, path.name
    assert not first_paragraph.startswith(("#", "```", "|", "-")), path.name
    assert "](../README.md)" in first_paragraph, path.name


def test_the_readme_links_to_every_page_and_stays_short():
    listed = re.findall(r"^- \[.+?\]\(docs/(\w+\.md)\)", section(README, "Documentation"), flags=re.M)
    assert sorted(listed) == [page.name for page in PAGES]
    assert len(README.read_text().splitlines()) <= 250


def test_the_monitoring_loop_runs_and_diagnoses_as_shown(tmp_path, monkeypatch, capsys, one_thread):
    page = ROOT / "docs" / "monitoring.md"
    text = section(page, "A plain PyTorch loop")
    code = blocks(text, "python")[0]
    monkeypatch.chdir(tmp_path)
    namespace = {}
    with pytest.warns(UserWarning, match="diverged"):
        exec(compile(code, str(page), "exec"), namespace)
    assert namespace["monitor"].diagnosis.verdict == "diverged"
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1000
    capsys.readouterr()

    shown = blocks(text, "console")[0].splitlines()
    command = shown[0].removeprefix("$ fastnorm ").split()
    assert main(command) == 1
    printed = capsys.readouterr().out.splitlines()
    assert printed[:2] == shown[1:3]

    def events(lines):  # the event lines, then their actions, as printed
        return [line.split(":")[0] for line in lines if line.startswith("  ")]

    assert events(printed) == events(shown[3:])
    assert (tmp_path / "grad_norm.png").stat().st_size > 0
    (image,) = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert (page.parent / image).stat().st_size < 200_000


def test_distributed_snippets_come_from_the_examples():
    # Each snippet is cut from the example linked just before it (which
    # test_examples.py runs): every line of code in it is in that file.
    text = section(ROOT / "docs" / "distributed.md", "Distributed")
    snippets = blocks(text, "python")
    assert len(snippets) == 2
    for snippet in snippets:
        before = text[: text.index(snippet)]
        name = re.findall(r"\(\.\./examples/(\w+\.py)\)", before)[-1]
        source = (ROOT / "examples" / name).read_text()
        for line in snippet.splitlines():
            code = line.split("#")[0].strip()
            assert code in ("", "...") or code in source, (name, code)


def test_the_compile_page_names_the_registered_ops():
    import fastnorm.custom_ops  # noqa: F401  (registers the custom ops)

    text = section(ROOT / "docs" / "distributed.md", "torch.compile and CUDA graphs")
    named = set(re.findall(r"`(?:fastnorm)?::(\w+)`", text))
    registered = set(torch.ops.fastnorm)
    assert named == registered, (named, registered)


def written(function) -> str:
    """``function``'s signature as the rules page writes it: names and defaults, no annotations."""
    parameters = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind is parameter.KEYWORD_ONLY and "*" not in parameters:
            parameters.append("*")
        default = "" if parameter.default is parameter.empty else f"={parameter.default!r}"
        parameters.append(parameter.name + default)
    return f"{function.__name__}({', '.join(parameters)})"


def test_the_rules_page_writes_each_signature_as_the_code_has_it():
    table = section(ROOT / "docs" / "rules.md", "Signatures")
    listed = re.findall(r"^\| `(\w+\(.*?\))` \|", table, flags=re.M)
    assert listed == [written(getattr(fastnorm, name)) for name in ("total_norm", "clip_", "tensor_norms", "tensor_stats")]
