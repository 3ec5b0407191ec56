"""The ``hurray-wire`` command. The only module that prints."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hurray_wire import __version__


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the command."""
    parser = argparse.ArgumentParser(
        prog="hurray-wire",
        description="Inspect, validate and convert Hurray block-paged KV-cache blobs.",
    )
    parser.add_argument("--version", action="version", version=f"hurray-wire {__version__}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: exit 0 ok, 1 invalid input, 2 usage."""
    parser = build_parser()
    parser.parse_args(argv)
    parser.print_help(sys.stdout)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
