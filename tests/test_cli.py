"""The fastnorm command: its version, plain-text help, and subcommands imported only when they run."""

import re
import textwrap

import pytest

from fastnorm import __version__
from fastnorm.cli import COMMANDS, main
from harness import run_python


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"fastnorm {__version__}\n"


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_is_plain_text(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"] if command is None else [command, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: fastnorm")
    assert "`" not in text and ":func:" not in text and ":class:" not in text
    if command is None:
        assert all(re.search(rf"^    {name} +\S", text, flags=re.M) for name in COMMANDS)
    else:
        assert text.count("--") >= 2  # its own options were declared: its module was imported


def test_a_subcommand_imports_only_its_own_module():
    # `fastnorm diagnose` on a CSV never imports torch, nor the modules of the other subcommands.
    script = textwrap.dedent(
        """
        import sys, tempfile, os
        from fastnorm.cli import main
        path = os.path.join(tempfile.mkdtemp(), "metrics.csv")
        with open(path, "w") as f:
            f.write("step,grad_norm\\n" + "".join(f"{i},{1 + i % 3 / 10}\\n" for i in range(50)))
        code = main(["diagnose", path])
        heavy = sorted(m for m in ("torch", "fastnorm.bench", "fastnorm.backends") if m in sys.modules)
        print("exit", code, "imported", heavy)
        """
    )
    result = run_python(["-c", script])
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "exit 0 imported []"
