"""The ``fastnorm`` command (also ``python -m fastnorm``).

Each subcommand lives in the module that owns the feature and registers
itself here through ``add_parser(subparsers)``, which sets ``func``, a callable
taking the parsed arguments and returning the exit code.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from fastnorm import bench, kernels
from fastnorm.monitoring import command as diagnose_command


def _info(args: argparse.Namespace) -> int:
    import torch

    from fastnorm import __version__
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


def _add_info(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("info", help="which backend runs on each device, and why")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=_info)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastnorm", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_info(subparsers)
    bench.add_parser(subparsers)
    diagnose_command.add_parser(subparsers)
    kernels.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
