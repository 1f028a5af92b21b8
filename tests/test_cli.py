"""The fastnorm command: its version, plain-text help, subcommands imported only when they run, and
the one place where every subcommand's errors become one line and exit code 2."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

from fastnorm import __version__
from fastnorm.cli import COMMANDS, main
from helpers import run_python


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


# ----------------------------------------------------------------------------
# Every subcommand's errors: one line that names the argument or the file, exit 2
# ----------------------------------------------------------------------------


def _run(capsys, argv):
    """main(argv) as the shell sees it: the exit code (also of argparse's exit), stdout, stderr."""
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["diagnose", "{log}", "--max-norm", "-1"], "argument --max-norm: must be a number >= 0, got '-1'"),
        (["diagnose", "{log}", "--max-norm", "nan"], "argument --max-norm: must be a number >= 0, got 'nan'"),
        (["diagnose", "{log}", "--max-norm", "x"], "argument --max-norm: must be a number >= 0, got 'x'"),
        (["bench", "--budget", "nan"], "argument --budget: must be a finite number > 0, got 'nan'"),
        (["bench", "--budget", "inf"], "argument --budget: must be a finite number > 0, got 'inf'"),
        (["bench", "--budget", "0"], "argument --budget: must be a finite number > 0, got '0'"),
        (["bench", "--out", "{log}"], "argument --out: {log} is a file, not a folder"),
        (["bench", "--out", "{log}/results"], "argument --out: {log}/results: {log} is a file, not a folder"),
        (["kernels", "--jobs", "0"], "argument --jobs: must be a whole number >= 1, got '0'"),
        (["kernels", "--jobs", "1.5"], "argument --jobs: must be a whole number >= 1, got '1.5'"),
        (["bench", "--repeats", "x"], "argument --repeats: invalid int value: 'x'"),
    ],
)
def test_a_bad_argument_is_one_line_that_names_it_and_exit_2(tmp_path, capsys, argv, message):
    log = tmp_path / "metrics.csv"
    log.write_text("step,grad_norm\n0,1.0\n")
    argv = [a.format(log=log) for a in argv]
    code, out, err = _run(capsys, argv)
    assert (code, out) == (2, "")
    assert err == f"fastnorm {argv[0]}: error: {message.format(log=log)} (see fastnorm {argv[0]} --help)\n"


def test_an_input_error_or_an_os_error_inside_a_command_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    from fastnorm import checks
    from fastnorm.monitoring import command

    log = tmp_path / "metrics.csv"
    log.write_text("step,grad_norm\n0,1.0\n1,1.1\n")
    for error, line in [
        (checks.InputError(f"{log}: the file says no"), f"{log}: the file says no"),
        (PermissionError(13, "Permission denied", "/out/x.json"), "/out/x.json: Permission denied"),
    ]:

        def fail(*args, error=error, **kwargs):
            raise error

        monkeypatch.setattr(command, "diagnose_series", fail)
        assert _run(capsys, ["diagnose", str(log)]) == (2, "", f"fastnorm diagnose: error: {line}\n")


def test_a_defect_shows_its_traceback_and_never_exits_1(tmp_path, capsys, monkeypatch):
    # 1 is --fail-on-unstable's verdict: CI must not read a crash as "unstable".
    from fastnorm.monitoring import command

    def crash(*args, **kwargs):
        return 1 / 0

    monkeypatch.setattr(command, "diagnose_series", crash)
    log = tmp_path / "metrics.csv"
    log.write_text("step,grad_norm\n0,1.0\n1,1.1\n")
    code, out, err = _run(capsys, ["diagnose", str(log), "--fail-on-unstable"])
    assert code == 2 and out == ""
    assert err.startswith("Traceback") and "ZeroDivisionError: division by zero" in err
    assert err.splitlines()[-1] == (
        "fastnorm diagnose: error: ZeroDivisionError inside fastnorm "
        "(a defect: please report the traceback above)"
    )


@pytest.mark.parametrize("buffered", [True, False])
@pytest.mark.parametrize("argv", [["diagnose", "{log}"], ["diagnose", "{log}", "--json"]])
def test_a_reader_that_closes_stdout_is_one_line_and_exit_2(tmp_path, argv, buffered):
    # `fastnorm diagnose run.csv | head -1`: the reader is gone before the report is written (by
    # print, unbuffered, or by the last flush of a buffered stdout).
    log = tmp_path / "metrics.csv"
    log.write_text("step,grad_norm\n" + "".join(f"{i},{1 + i % 3 / 10}\n" for i in range(50)))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    child = subprocess.Popen(
        [sys.executable, *([] if buffered else ["-u"]), "-m", "fastnorm", *(a.format(log=log) for a in argv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=os.path.dirname(os.path.abspath(__file__)),
    )
    child.stdout.close()  # before the child has imported anything: its first write finds no reader
    err = child.stderr.read()
    assert child.wait(timeout=60) == 2
    assert err == (
        "fastnorm diagnose: error: the output was closed by its reader before it was all written "
        "(as `| head` does)\n"
    )
