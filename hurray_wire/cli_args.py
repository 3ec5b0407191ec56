"""The console script's entry: parses with ``cli_parser`` (``--help`` loads nothing of the
library), then imports the commands (``cli``, below it: no circle) and runs one."""

from __future__ import annotations

from collections.abc import Sequence

from hurray_wire.cli_parser import build_parser

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: the exit code (``cli_parser.EXIT_CODES``); usage errors exit 2 through
    argparse. Only a command that runs loads the library (``cli``)."""
    args = build_parser().parse_args(argv)
    from hurray_wire import cli  # the commands, after the arguments parsed

    return cli.run(args)
