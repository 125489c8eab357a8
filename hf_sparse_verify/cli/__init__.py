"""The hf-sparse-verify command: speculative generation, tuning, calibration and step benchmarks.

  hf-sparse-verify generate     generate text with speculative decoding (offline demo pair without --model)
  hf-sparse-verify tune         tune ratio and K of the self-speculative strategies (vegas, streaming, quest)
  hf-sparse-verify calibrate    calibrate LOSSY sparse verification for a model
  hf-sparse-verify bench step   time one decode/verify step against transformers (meant for a GPU)

A mistake in the arguments ends with exit status 2 and one line saying what to change, checked before any model
loads where possible; add --debug to see the traceback instead. Each subcommand is one module of this folder.
"""

from __future__ import annotations

import argparse
import sys

from . import bench, calibrate, generate, tune
from ._common import Parser, UsageError, read_prompt_file

#: subcommand -> its module (``add_parser(sub, parents)`` and ``run(args) -> exit status``)
COMMANDS = {"generate": generate, "tune": tune, "calibrate": calibrate, "bench": bench}

__all__ = ["COMMANDS", "UsageError", "main", "read_prompt_file"]


def build_parser() -> argparse.ArgumentParser:
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument(
        "--debug", action="store_true", help="show the traceback of an error instead of one line"
    )
    parser = Parser(
        prog="hf-sparse-verify", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    for module in COMMANDS.values():
        module.add_parser(sub, [debug])
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status.

    Example:
        >>> main(["generate", "--prompt", ""])
        2
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    prog = " ".join([parser.prog, args.command, getattr(args, "bench_command", "")]).strip()
    try:
        return COMMANDS[args.command].run(args)
    except UsageError as err:
        if args.debug:
            raise
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
