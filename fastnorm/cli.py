"""The fastnorm command (also python -m fastnorm).

Each subcommand lives in the module that owns the feature, which is imported
only when that subcommand runs, so that ``fastnorm diagnose`` never imports
torch. The module's ``add_arguments(parser)`` declares the subcommand's
arguments and description and sets ``func``, a callable taking the parsed
arguments and returning the exit code.

Exit codes, the same for every subcommand: 0 when it did its job, 1 for a
verdict that a subcommand documents (``diagnose --fail-on-unstable`` on a run
that is not stable, ``kernels`` with a kernel that failed to compile, ``bench``
with a contender that computed a wrong norm), 2 for anything that stopped it
before an answer: a bad argument, a file that cannot be read or holds bad
values, an output that cannot be written or that its reader closed (``| head``).
:func:`main` is the one place where those errors become one line on stderr
that names the argument or the file, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from fastnorm import __version__
from fastnorm.checks import InputError

DESCRIPTION = "fastnorm: the total gradient norm in one fused pass; benchmark, diagnose and inspect it."

# name: (the module that declares it, the one-line help of `fastnorm --help`)
COMMANDS = {
    "info": ("fastnorm.cli", "which backend runs on each device, and why"),
    "bench": ("fastnorm.bench.cli", "benchmark fastnorm against torch and the memory-bandwidth roofline"),
    "diagnose": (
        "fastnorm.monitoring.command",
        "diagnose a run's gradient norm (and loss): stable, or what went wrong and what to do",
    ),
    "kernels": (
        "fastnorm.backends.triton_aot",
        "compile the Triton kernels for GPU architectures (no GPU needed) and read their machine code",
    ),
}


def _info(args: argparse.Namespace) -> int:
    import torch

    from fastnorm.backends import cpp, report
    from fastnorm.integrations import patch

    rows = report()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"fastnorm {__version__}, torch {torch.__version__}")
    print(cpp.kernels_line())
    print(f"CPU threads: {torch.get_num_threads()}, from {cpp.threads_source()}")
    for row in rows:
        print(f"\n{row['device']} (FASTNORM_BACKEND={row['requested']}): runs {row['selected']}")
        for name, reasons in row["backends"].items():
            status = "available" if not reasons else "unavailable: " + "; ".join(reasons)
            print(f"  {name:7s} {status}")
    print("\nfastnorm.patch() replaces (call it after importing the framework):")
    for row in patch.targets():
        where = f"{row['package']} {row['version']}" if row["version"] else f"{row['package']} not installed"
        state = f": patched in {len(row['reached'])} places" if row["patched"] else ""
        print(f"  {row['name']} ({where}){state}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declares the arguments of ``fastnorm info``."""
    parser.description = (
        "Lists, for the CPU and every CUDA device, the backend that runs there and why each other one "
        "does not, the C++ kernels' instruction set and the thread count."
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=_info)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors are one line like every other error of the command."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of the fastnorm command.

    Args:
        command (str, optional): the subcommand whose arguments to declare (its
            module is imported); the others are listed by name and help only.

    Returns:
        argparse.ArgumentParser: the parser.
    """
    parser = _Parser(prog="fastnorm", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"fastnorm {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        subparser = subparsers.add_parser(name, help=help_text, description=help_text)
        if name == command:
            importlib.import_module(module).add_arguments(subparser)
    return parser


def _stdout_to_devnull() -> None:
    """After a reader closed stdout: what is still buffered goes nowhere, so that the interpreter's
    last flush at exit does not fail again with a traceback of its own."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):  # a stdout without a file (a test's capture)
        pass


def _error_line(error: BaseException) -> str | None:
    """The one line that says what stopped the command, for the errors that bad input causes;
    None for any other (a defect of fastnorm, whose traceback is the report)."""
    if isinstance(error, BrokenPipeError):
        return "the output was closed by its reader before it was all written (as `| head` does)"
    if isinstance(error, InputError):
        return str(error)
    if isinstance(error, OSError):
        if error.filename is not None and error.strerror:
            return f"{error.filename}: {error.strerror}"
        return str(error)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the fastnorm command.

    Args:
        argv (sequence of str, optional): the arguments after ``fastnorm``; default: ``sys.argv[1:]``.

    Returns:
        int: the exit code: 0, 1 for a subcommand's documented verdict, 2 for a bad argument or input
        (one line on stderr that names it) and for a defect of fastnorm (its traceback, then that line).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    # No option of the fastnorm command itself takes a value: the first word is the subcommand.
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    args = build_parser(command).parse_args(argv)
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a reader that closed stdout is found here, not at the interpreter's exit
    except Exception as error:
        line = _error_line(error)
        if isinstance(error, BrokenPipeError):
            _stdout_to_devnull()
        if line is None:  # never exit 1 for it, which CI would read as a verdict
            traceback.print_exc()
            line = f"{type(error).__name__} inside fastnorm (a defect: please report the traceback above)"
        print(f"fastnorm {args.command}: error: {line}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
