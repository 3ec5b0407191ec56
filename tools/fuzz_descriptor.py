"""atheris fuzz harness for the descriptor decoders (as safetensors fuzzes ``load``).

It calls only the public decode functions, ``hurray_wire.decode_descriptor`` and
``hurray_wire.decode_header``, and fails on any exception that is not a
``HurrayWireError``: hostile bytes must be refused with our error, never with
``struct.error``, ``IndexError``, ``KeyError``, ``RecursionError`` or a foreign
``ValueError``. A descriptor that decodes must also encode back to exactly the bytes it
was decoded from, and pass the general path.

Usage (atheris is not a project dependency: ``pip install atheris``)::

    mkdir -p /tmp/hw-corpus
    python tools/fuzz_descriptor.py -max_total_time=180 /tmp/hw-corpus \\
        fixtures/conformance/block_paged/descriptors fixtures/conformance/block_paged/invalid \\
        fixtures/conformance/reference/descriptors

The first directory collects the corpus libFuzzer grows; the others are the seed corpus
(libFuzzer only writes to the first one, so never name a fixtures folder first). With no
corpus argument at all, the conformance vectors are copied into
``$TMPDIR/hurray-wire-fuzz-corpus`` (kept and reused between runs) and that is the corpus.
Any libFuzzer flag (``-runs=``, ``-jobs=``, ``-max_len=``, ...) passes through.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import atheris  # type: ignore[import-untyped]

with atheris.instrument_imports(include=["hurray_wire"]):
    import hurray_wire as hw

ROOT = Path(__file__).resolve().parent.parent
SEEDS = [
    ROOT / "fixtures" / "conformance" / "block_paged" / "descriptors",
    ROOT / "fixtures" / "conformance" / "block_paged" / "invalid",
    ROOT / "fixtures" / "conformance" / "reference" / "descriptors",
]


def test_one_input(data: bytes) -> None:
    """One fuzz case: both decoders either accept exactly or raise our error."""
    try:
        desc = hw.decode_descriptor(data)
    except hw.HurrayWireError:
        desc = None
    try:
        header = hw.decode_header(data)
    except hw.HurrayWireError:
        header = None
    if desc is not None:
        if hw.encode_descriptor(desc) != data[: desc.descriptor_length]:
            raise AssertionError("decode -> encode changed the bytes")
        if header is None:
            raise AssertionError("decode_descriptor accepted what decode_header refused")
        if header.descriptor_length != desc.descriptor_length:
            raise AssertionError("the two decoders disagree on descriptor_length")


def _seeded_argv(argv: list[str]) -> list[str]:
    """Add a corpus seeded with the conformance vectors when no corpus dir was given.

    libFuzzer ends the process with exit(), so the directory is a fixed, reused one
    rather than a temporary directory that nothing would remove.
    """
    if any(not arg.startswith("-") for arg in argv[1:]):
        return argv
    corpus = Path(tempfile.gettempdir()) / "hurray-wire-fuzz-corpus"
    corpus.mkdir(exist_ok=True)
    for folder in SEEDS:
        for path in sorted(folder.glob("*.bin")):
            shutil.copy(path, corpus / f"{folder.parent.name}-{folder.name}-{path.name}")
    return [*argv, str(corpus)]


def main() -> None:
    atheris.Setup(_seeded_argv(sys.argv), test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
