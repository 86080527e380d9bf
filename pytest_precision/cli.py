"""The ``pytest-precision`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ._errors import PrecisionError
from ._version import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pytest-precision",
        description="Numerical-precision tools for LLM inference: compare, inspect, replay.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_inspect(subparsers)
    return parser


def _add_inspect(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    inspect = subparsers.add_parser(
        "inspect",
        help="summarize a dump (native, msprobe or a plain folder) or list its records",
        description="Print a dump's format, ranks, steps, record counts by kind, dtypes and "
        "size on disk; with --list, one line per record (name, slot, dtype, shape, stats).",
    )
    inspect.add_argument("dump", metavar="DUMP", help="dump folder or file")
    inspect.add_argument(
        "--list",
        dest="pattern",
        nargs="?",
        const="*",
        metavar="GLOB",
        help="list the records whose name or name.slot matches GLOB (default: all)",
    )
    inspect.set_defaults(handler=_inspect)


def _inspect(args: argparse.Namespace) -> int:
    from .dump import load_dump
    from .dump._summary import list_records, summarize

    dump = load_dump(args.dump)
    if args.pattern is None:
        print(summarize(dump))
    else:
        for line in list_records(dump, args.pattern):
            print(line)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.handler(args))
    except PrecisionError as exc:
        print(f"pytest-precision {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into `head`: not an error
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
