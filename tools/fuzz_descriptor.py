#!/usr/bin/env python3
"""atheris fuzz harness for the descriptor decoders (as safetensors fuzzes ``load``).

It calls only the public decode functions, ``hurray_wire.decode_descriptor`` and
``hurray_wire.decode_header``, and fails on any exception that is not a
``HurrayWireError``: hostile bytes must be refused with our error, never with
``struct.error``, ``IndexError``, ``KeyError``, ``RecursionError`` or a foreign
``ValueError``. A descriptor that decodes must also encode back to exactly the bytes it
was decoded from, and pass the general path. Both decoders must give the same verdict and
error (type, field, offset) on the bytes, a ``bytearray`` and a ``memoryview`` slice at offset
3 of a larger buffer; bytes after a good descriptor change nothing; the input is never
modified.

``--fix-checksums`` (the flag the other harnesses use for their structure-aware mutator;
a descriptor has no checksum) installs a custom mutator: one to three block-paged fields
(type, shape, page_size, num_pages, num_seqs, kv_role, layer, index type) set to boundary
values with the buffer sizes repaired (``fuzz_blob.mutate_descriptor_fields``), the
version minor or ``descriptor_length`` changed, trailing bytes added, or a plain byte
mutation. ``check_descriptor`` is the target (``test_one_input`` is its old name).

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

import functools
import random
import shutil
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any

try:
    import atheris  # type: ignore[import-untyped]
except ImportError:  # tests/test_fuzz_smoke.py replays the target without atheris
    atheris = None

if atheris is not None and __name__ == "__main__":
    with atheris.instrument_imports(include=["hurray_wire"]):
        import _instrumented  # the lazy package: every module now, instrumented

        import hurray_wire as hw

        _instrumented.import_all()
else:
    import hurray_wire as hw

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_blob  # boundary values, descriptor field edits, byte mutations, flags

ROOT = Path(__file__).resolve().parent.parent
SEEDS = [
    ROOT / "fixtures" / "conformance" / "block_paged" / "descriptors",
    ROOT / "fixtures" / "conformance" / "block_paged" / "invalid",
    ROOT / "fixtures" / "conformance" / "reference" / "descriptors",
]


def _error_key(error: hw.HurrayWireError | None) -> Any:
    return None if error is None else (type(error), error.field, error.offset)


def _same(a: Any, b: Any) -> bool:
    """Equal results (descriptors by their bytes: a NaN statistic is not equal to itself)."""
    if isinstance(a, hw.TensorDescriptor) and isinstance(b, hw.TensorDescriptor):
        return hw.encode_descriptor(a) == hw.encode_descriptor(b)
    return a == b or repr(a) == repr(b)


def _agree(decoder: Any, data: bytes) -> tuple[Any, hw.HurrayWireError | None]:
    """The decoder's outcome on the bytes, after checking the other input paths agree."""
    result, error = fuzz_blob.outcome(lambda: decoder(data))
    padded = bytearray(b"xyz" + data + b"!")
    sources = [bytearray(data), memoryview(padded)[3:-1]]
    for source in sources:
        other, other_error = fuzz_blob.outcome(functools.partial(decoder, source))
        if _error_key(error) != _error_key(other_error) or not _same(result, other):
            raise AssertionError(f"{decoder.__name__}: bytes vs {type(source).__name__} differ")
    if padded[3:-1] != data:
        raise AssertionError(f"{decoder.__name__} modified its input")
    return result, error


def check_descriptor(data: bytes) -> None:
    """One fuzz case: both decoders either accept exactly or raise our error."""
    desc, _ = _agree(hw.decode_descriptor, data)
    header, _ = _agree(hw.decode_header, data)
    if desc is not None and not _same(hw.decode_descriptor(data + b"\x00HRRY"), desc):
        raise AssertionError("bytes after a good descriptor changed what it decodes to")
    if desc is not None:
        if hw.encode_descriptor(desc) != data[: desc.descriptor_length]:
            raise AssertionError("decode -> encode changed the bytes")
        if header is None:
            raise AssertionError("decode_descriptor accepted what decode_header refused")
        if header.descriptor_length != desc.descriptor_length:
            raise AssertionError("the two decoders disagree on descriptor_length")


test_one_input = check_descriptor  # the name of the first version


# -- the structure-aware mutator -------------------------------------------------------------
def _mutate(data: bytes, max_size: int, seed: int) -> bytes:
    rng = random.Random(seed)
    choice = rng.random()
    if choice < 0.45 and len(data) >= 133:
        out = fuzz_blob.mutate_descriptor_fields(data, rng)
    elif choice < 0.6 and len(data) >= 10:
        buf = bytearray(data)
        if rng.random() < 0.5:
            buf[5] = rng.choice([0, 1, 2, 255])  # version minor
        else:
            buf += rng.randbytes(rng.choice([1, 7, 8, 64]))  # unknown trailing bytes
        length = len(buf) if rng.random() < 0.8 else fuzz_blob.interesting(rng, 4, len(buf))
        struct.pack_into("<I", buf, 6, length)
        out = bytes(buf)
    else:
        out = fuzz_blob.libfuzzer_mutate(data, rng, max_size)
    return out[:max_size]


MUTATOR_ERRORS: list[str] = []


def mutate(data: bytes, max_size: int, seed: int) -> bytes:
    """The structure-aware mutator (``--fix-checksums``)."""
    return fuzz_blob.guarded_mutate(
        "fuzz_descriptor", MUTATOR_ERRORS, _mutate, lambda d: d, data, max_size, seed
    )


def seed_inputs() -> dict[str, bytes]:
    """The conformance vectors (valid and invalid descriptors)."""
    return {
        f"{folder.parent.name}-{folder.name}-{path.name}": path.read_bytes()
        for folder in SEEDS
        for path in sorted(folder.glob("*.bin"))
    }


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
    fix, argv = fuzz_blob.fix_mode(sys.argv)
    argv = _seeded_argv(argv)
    if fix:
        fuzz_blob._IN_LIBFUZZER.append(True)
        atheris.Setup(argv, check_descriptor, custom_mutator=mutate)
    else:
        atheris.Setup(argv, check_descriptor)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
