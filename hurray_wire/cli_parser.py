"""The ``hurray-wire`` command's parser and exit codes, apart from ``cli.py`` so that
``--help`` and a usage error load argparse and nothing of the library."""

from __future__ import annotations

import argparse
import os
import textwrap
from contextlib import suppress

from hurray_wire._version import __version__

__all__ = ["EXIT_CODES", "build_parser"]

EXIT_OK, EXIT_INVALID, EXIT_USAGE, EXIT_FILE, EXIT_INTERNAL = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130
EXIT_CODES = {
    EXIT_OK: "ok: every input valid, the output written",
    EXIT_INVALID: "invalid input: an input is not valid hurray-wire (validation failed)",
    EXIT_USAGE: "usage: bad arguments or options, or an output format that cannot hold the "
    "input (several tensors into one .hrwb blob)",
    EXIT_FILE: "file access: an input cannot be read or the output cannot be written "
    "(missing, a directory, no permission, or the output is an input)",
    EXIT_INTERNAL: "internal error: a bug in hurray-wire, reported on one line (please "
    "report it with the command and the input)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C): no output file is left behind",
}
STDIO = "-"
_EXTENSIONS = {
    ".hrwb": "blob",
    ".hrws": "blob-stream",
    ".hrrs": "reference-stream",
    ".hrry": "hrry-file",
}
#: The JSON Schemas of ``dump --json`` and ``validate --json``, installed with the package.
SCHEMAS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schemas")
DUMP_SCHEMA = os.path.join(SCHEMAS, "dump.schema.json")
VALIDATE_SCHEMA = os.path.join(SCHEMAS, "validate.schema.json")


# -- the parser --------------------------------------------------------------------------------
def _epilog() -> str:
    lines = ["exit codes:"]
    for code, text in EXIT_CODES.items():
        lines += textwrap.wrap(text, 78, initial_indent=f"  {code:<4} ", subsequent_indent=" " * 7)
    return "\n".join(lines)


def _bound(text: str) -> float:
    """``--max-input-bytes`` / ``--input-timeout``: a number in [0, 2**63) (NaN refused)."""
    with suppress(ValueError):
        if 0 <= float(text) < 2**63:
            return int(text) if text.isdigit() else float(text)
    raise argparse.ArgumentTypeError(f"not a number >= 0: {text!r}")


def _format(text: str) -> str:
    """``--to``: a format name, or the extension users think in (``hrwb``, ``.hrws``)."""
    return _EXTENSIONS.get("." + text.removeprefix("."), text)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the command."""
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="hurray-wire",
        description="Inspect, validate and convert Hurray block-paged KV-cache blobs, blob "
        "streams, reference stream records and .hrry files.",
        epilog=_epilog(),
        formatter_class=formatter,
    )
    parser.add_argument("--version", action="version", version=f"hurray-wire {__version__}")
    common = argparse.ArgumentParser(add_help=False)  # what every command takes
    group = common.add_mutually_exclusive_group()
    group.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    group.add_argument("--progress", action="store_true",
                       help="a progress bar on stderr even if it is not a terminal")  # fmt: skip
    for flag, text in (  # the defaults are containers.io's, set by cli.run
        ("--max-input-bytes", "refuse a pipe, FIFO or device input "
         "(read into memory; files are mapped) longer than this (default 1 GiB)"),
        ("--input-timeout", "refuse such an input after this many "
         "seconds without a byte (default 30; 0: wait for ever)"),
    ):  # fmt: skip
        common.add_argument(flag, type=_bound, default=None, metavar="N", help=text)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(
            name, help=text, parents=[common], epilog=_epilog(), formatter_class=formatter
        )

    dump = command("dump", "print a readable summary of each input")
    dump.add_argument("paths", nargs="+", metavar="PATH",
                      help="a descriptor, blob, blob stream, reference stream or .hrry file; "
                      "- reads stdin")  # fmt: skip
    shape = dump.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true",
                       help=f"JSON, valid against the schema {DUMP_SCHEMA}")  # fmt: skip
    shape.add_argument("--hex", action="store_true",
                       help="annotated hex of a descriptor, a blob or every record of a blob "
                       "stream")  # fmt: skip
    dump.add_argument("--no-verify", action="store_true", help="skip section checksums")
    dump.add_argument(
        "--index", action="store_true", help="the index arrays too: block_table, seq_ptr, seq_lens"
    )
    validate = command("validate", "check every input: one line each, exit 1 if any is invalid")
    validate.add_argument("paths", nargs="+", metavar="PATH",
                          help="an input of any kind; - reads stdin")  # fmt: skip
    validate.add_argument("--json", action="store_true",
                          help=f"one JSON array instead of lines, valid against the schema "
                          f"{VALIDATE_SCHEMA}")  # fmt: skip
    convert = command(
        "convert", "convert between blob, blob stream, reference stream (.hrrs) and .hrry file"
    )
    convert.add_argument("input", metavar="IN", help="the input (any kind but a bare "
                         "descriptor); - reads stdin")  # fmt: skip
    convert.add_argument("output", metavar="OUT",
                         help="the output, written atomically, never onto IN; - writes stdout "
                         "(not for .hrry; needs --to)")  # fmt: skip
    convert.add_argument(
        "--to",
        type=_format,
        choices=sorted(set(_EXTENSIONS.values())),
        metavar="FORMAT",
        help="output format, by name or extension: "
        + ", ".join(f"{name} ({ext[1:]})" for ext, name in _EXTENSIONS.items())
        + " (default: from OUT's extension)",
    )
    convert.add_argument(
        "--compression",
        default=None,
        help="blob codec: none, zstd[:LEVEL], shuffle-zstd[:LEVEL], "
        "chunked-shuffle-zstd[:LEVEL], default (chunked-shuffle-zstd:1)",
    )
    convert.add_argument("--no-checksum", action="store_true", help="blobs without checksums")
    return parser
