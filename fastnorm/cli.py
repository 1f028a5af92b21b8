"""The fastnorm command (also python -m fastnorm).

Each subcommand lives in the module that owns the feature, which is imported
only when that subcommand runs, so that ``fastnorm diagnose`` never imports
torch. The module's ``add_arguments(parser)`` declares the subcommand's
arguments and description and sets ``func``, a callable taking the parsed
arguments and returning the exit code.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence

from fastnorm import __version__

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


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of the fastnorm command.

    Args:
        command (str, optional): the subcommand whose arguments to declare (its
            module is imported); the others are listed by name and help only.

    Returns:
        argparse.ArgumentParser: the parser.
    """
    parser = argparse.ArgumentParser(prog="fastnorm", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"fastnorm {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        subparser = subparsers.add_parser(name, help=help_text, description=help_text)
        if name == command:
            importlib.import_module(module).add_arguments(subparser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the fastnorm command.

    Args:
        argv (sequence of str, optional): the arguments after ``fastnorm``; default: ``sys.argv[1:]``.

    Returns:
        int: the exit code.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    # No option of the fastnorm command itself takes a value: the first word is the subcommand.
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    args = build_parser(command).parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
