"""The README's monitoring example runs, and says what the code does."""

import re
from pathlib import Path

import pytest
import torch

import reference
from fastnorm.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def section(title):
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def blocks(text, language):
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def test_plain_loop_example_runs_and_diagnoses_as_shown(tmp_path, monkeypatch, capsys, one_thread):
    text = section("Monitoring and diagnosis")
    code = blocks(text, "python")[0]
    monkeypatch.chdir(tmp_path)
    namespace = {}
    with pytest.warns(UserWarning, match="diverged"):
        exec(compile(code, "README.md", "exec"), namespace)
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
    assert "![" in text and (README.parent / "docs" / "grad_norm.png").stat().st_size < 200_000


def quick_start_oracle() -> list[float]:
    """The quick start's loop in float64 with torch's clip, from the same draws."""
    return reference.torch_clip_loop((64, 64, 8), batch=32)


def test_quick_start_prints_the_norms_of_its_loop(capsys):
    (code,) = blocks(section("Quick start"), "python")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        exec(compile(code, "README.md", "exec"), {})
        printed = capsys.readouterr().out.splitlines()
        oracle = quick_start_oracle()
    assert [line.split(":")[0] for line in printed] == ["step 0", "step 1", "step 2"]
    for line, ref in zip(printed, oracle):
        # 4 decimals of a float32 loop against the float64 one
        assert abs(float(line.split("=")[1]) - ref) <= 5e-5 + 1e-5 * ref, (printed, oracle)


def test_distributed_snippets_come_from_the_examples():
    # Each snippet is cut from the example linked just before it (which
    # test_examples.py runs): every line of code in it is in that file.
    text = section("Distributed")
    for snippet in blocks(text, "python"):
        before = text[: text.index(snippet)]
        name = re.findall(r"\(examples/(\w+\.py)\)", before)[-1]
        source = (README.parent / "examples" / name).read_text()
        for line in snippet.splitlines():
            code = line.split("#")[0].strip()
            assert code in ("", "...") or code in source, (name, code)
