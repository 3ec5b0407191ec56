#!/usr/bin/env python3
"""atheris fuzz harness for the blob decoder, ``hurray_wire.decode``.

Every input goes through ``check_blob``, which fails on any exception that is not a
``HurrayWireError`` (hostile bytes must be refused with our error, never with
``struct.error``, ``IndexError``, ``KeyError``, ``OverflowError``, ``MemoryError``, a foreign
``ValueError`` / ``TypeError`` or ``RecursionError``) and on any disagreement between ways of
decoding the same bytes:

* ``verify=True`` and ``verify=False``: the latter skips only the section checksums and the
  page-digest comparison, so both accept, or both refuse with the same error unless
  ``verify=True`` found a checksum error or a page whose digest differs;
* ``threads=0`` and ``threads=2`` (the chunks of chunked-shuffle-zstd sections decode on
  two threads): the same verdict, the same error (type, section, field, offset: the lowest
  failing chunk, whatever the timing), equal arrays;
* the same bytes seen through a ``memoryview`` at a non-zero (odd) offset of a larger buffer:
  the same verdict, the same error, equal arrays;
* small ``DecodeLimits``: accept what the defaults accept or refuse with
  ``LimitExceededError``, and never accept what the defaults refuse;
* ``decode_report``: accepts what ``decode`` accepts with no failed page, and hands out a
  blob ``decode`` refuses only with failed pages, after a page-digest or checksum refusal;
* ``decode_into`` a flat uint8 array of the pool's byte size: the same verdict and arrays;
  every refusal leaves the array untouched; with ``one_pass=True`` (page digests checked
  while the pool is copied) only a checksum, page-digest or decompression error (or a later
  chunk frame's window) found during the copy may leave bytes.

A blob that decodes must also:

* have ``blob_length`` equal to its ``total_length``, and decode the same from exactly
  ``total_length`` bytes;
* re-encode (``hw.encode``, uncompressed, compressed with one of zstd / shuffle-zstd /
  default, and chunked with 4 or 8 KiB chunks, with and without checksums) to a blob that
  decodes to equal arrays, descriptor, seq_lens and metadata; uncompressed encoding is
  deterministic, ``encode_parts`` joins to ``encode``, and chunked encoding gives the same
  bytes on 0 and 2 threads;
* be accepted by the independent reader of ``tests/blob_reference.py`` (written from
  docs/wire-format.md and docs/integrity.md alone, page_digests and page_refs included)
  with the same buffer bytes, seq_lens and metadata keys;
* when it is in the writer's form (minor 0, every section raw, writer alignments, no
  unknown sections, seq_lens before metadata, metadata unflagged and non-empty), re-encode
  to exactly its own bytes (docs/wire-format.md § 2: encoding is deterministic). The reader
  rightly accepts more than that form (larger alignments, a REQUIRED metadata section, any
  minor version, extensions in either order), so outside it only the arrays are compared.

A blob that ``decode`` refuses with a ``DecompressionError`` in a chunk table or in one of
its frames must be refused by the independent reader too.

Modes. By default libFuzzer's byte mutations drive the search; since every blob carries a
header checksum, few of them get past it. ``--fix-checksums`` (or the environment variable
``HW_FUZZ_FIX_CHECKSUMS=1``) installs a structure-aware custom mutator instead: it parses
the blob into header fields, descriptor and sections, applies one to three mutations
(entry fields, section payloads and index elements, (de/re)compression with zstd,
shuffle-zstd and chunked-shuffle-zstd (any legal chunk size, widths 1/2/4/8), chunk tables
and their frames (``mutate_chunks``), descriptor bytes with the buffers resized to the new
descriptor, added, removed or swapped sections, metadata, and now and then plain libFuzzer
byte mutations),
lays the sections out again, and RE-COMPUTES the section checksums (xxh3_64 of each
section's stored bytes, u64 at ``32 + 48*i + 32``) and the header checksum (xxh3_64 of
``[0, header_length)``, u64 at ``header_length``). The target itself never rewrites its
input, so a crash file reproduces as it is, in either mode.

Open findings (``KNOWN_FINDINGS``: bugs that have an xfail-strict test in
tests/test_fuzz_regressions.py) are turned into a ``KnownFinding`` error, reported once on
stderr, so that a campaign goes on looking for new bugs; ``--report-known`` makes them
crashes again. docs/fuzzing.md has the campaign's results.

Usage (atheris is not a project dependency: ``pip install atheris``)::

    mkdir -p /tmp/hw-blob-corpus
    python tools/fuzz_blob.py -max_total_time=300 -timeout=20 /tmp/hw-blob-corpus \\
        fixtures/blobs fixtures/streams
    python tools/fuzz_blob.py --fix-checksums -max_total_time=300 -timeout=20 \\
        /tmp/hw-blob-corpus-fix fixtures/blobs fixtures/streams
    python tools/fuzz_blob.py crash-<sha1>          # replay one input

The first directory collects the corpus libFuzzer grows (never name a fixtures folder
first). Extra seeds built from ``BlockPagedTensor.from_arrays`` (packed int4 / uint2 /
float6 pools, per-channel, per-tensor and per-block quantization with shared and separate
zero-point buffers, uint64 indices, complex and bool pools, rich metadata, compressed
sections, pools in chunked sections of several 4 KiB chunks for each shuffle width) are
written to ``$TMPDIR/hurray-wire-fuzz-blob-seeds`` and appended as a seed directory
whenever every positional argument is a directory. With no corpus argument the fixtures
and those seeds are copied into ``$TMPDIR/hurray-wire-fuzz-blob-corpus``. Any libFuzzer
flag passes through.
"""

from __future__ import annotations

import functools
import itertools
import os
import random
import re
import shutil
import struct
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import xxhash
import zstandard

try:
    import atheris  # type: ignore[import-untyped]
except ImportError:  # the pytest smoke test replays the target without atheris
    atheris = None

if atheris is not None and __name__ == "__main__":
    with atheris.instrument_imports(include=["hurray_wire"]):
        import _instrumented  # the lazy package: every module now, instrumented

        import hurray_wire as hw
        from hurray_wire import codecs
        from hurray_wire.metadata import encode_metadata

        _instrumented.import_all()
else:
    import hurray_wire as hw
    from hurray_wire import codecs
    from hurray_wire.metadata import encode_metadata

ROOT = Path(__file__).resolve().parent.parent
SEED_DIRS = [ROOT / "fixtures" / "blobs", ROOT / "fixtures" / "streams"]
DESCRIPTOR_DIR = ROOT / "fixtures" / "conformance" / "block_paged" / "descriptors"
FIX_ENV = "HW_FUZZ_FIX_CHECKSUMS"
FIX_FLAG = "--fix-checksums"
ZSTD_REASON_ONLY = "the errors differ only in libzstd's reason"

MAGIC = b"HRWB"
HEADER_SIZE = 32
ENTRY_SIZE = 48
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_ENTRY = struct.Struct("<BBBBIQQQQI4s")  # kind, flags, codec, param, index, offset,
#                                          stored, raw, checksum, alignment, reserved
_HEADER = struct.Struct("<4sBBHQIHBBI4s")  # magic, major, minor, flags, total, header_length,
#                                             count, checksum_type, reserved, dlen, reserved

#: Limits small enough that the fixtures and seeds cross each of them.
SMALL_LIMITS = hw.DecodeLimits(
    max_descriptor_length=160,
    max_sections=5,
    max_decompressed_bytes=16 << 10,
    max_metadata_bytes=96,
)
_MAX_SYNC_BUFFER = 1 << 18  # the mutator resizes buffers up to this many bytes
#: and decompresses sections up to this many (chunk tables of more than 64 entries, which
#: decode reads through NumPy rather than struct, need more than 256 KiB of 4 KiB chunks)
_MAX_RAW = 1 << 20


# -- checksums ---------------------------------------------------------------------------------
def fix_checksums(data: bytes, start: int = 0) -> bytes:
    """Recompute the section checksums and then the header checksum of the blob at ``start``.

    Best effort: a field pointing outside the input is left alone. Section checksums are
    recomputed only when ``checksum_type`` is 1 (with 0 they must stay 0, which is a rule
    worth fuzzing too). Idempotent.
    """
    if len(data) < start + HEADER_SIZE or data[start : start + 4] != MAGIC:
        return data
    buf = bytearray(data)
    header_length = _U32.unpack_from(buf, start + 16)[0]
    count = _U16.unpack_from(buf, start + 20)[0]
    if buf[start + 22] == 1:
        for number in range(count):
            at = start + HEADER_SIZE + ENTRY_SIZE * number
            if at + ENTRY_SIZE > len(buf):
                break
            offset, stored = struct.unpack_from("<QQ", buf, at + 8)
            if start + offset + stored <= len(buf):
                digest = xxhash.xxh3_64_intdigest(
                    bytes(buf[start + offset : start + offset + stored])
                )
                _U64.pack_into(buf, at + 32, digest)
    if start + header_length + 8 <= len(buf):
        digest = xxhash.xxh3_64_intdigest(bytes(buf[start : start + header_length]))
        _U64.pack_into(buf, start + header_length, digest)
    return bytes(buf)


# -- the target --------------------------------------------------------------------------------
# -- open findings -----------------------------------------------------------------------------
class KnownFinding(hw.HurrayWireError):
    """An open finding's exception (tests/test_fuzz_regressions.py), turned into an error so
    that a campaign goes on looking for new ones; ``--report-known`` stops on them instead."""


#: Open findings: id -> (exception type, message fragments, (file, function) raising it).
#: F1 (fixed in ede8fce) was: "F1": (ValueError, ("array is too big", "Maximum allowed
#: dimension exceeded"), ("hurray_wire/tensor.py", "assemble")). F2 (fixed in session 2,
#: codecs.zstd.fresh_reason) was a disagreement the target itself reports (``_same_outcome``,
#: which consults this table before raising): "F2": (AssertionError, (ZSTD_REASON_ONLY,),
#: ("tools/fuzz_blob.py", "_same_outcome")), the reason libzstd gives for a corrupt frame
#: depending on what the thread's cached decompression context decoded before.
#: F7 (fixed: codecs.zstd checks the end of a frame that declares content size 0) was a
#: shuffle-zstd section of raw_size 0 accepted whatever followed its frame header; the
#: independent reader refused it. No finding is open.
KNOWN_FINDINGS: dict[str, tuple[type[BaseException], tuple[str, ...], tuple[str, str]]] = {}
IGNORE_KNOWN = [True]
REPORT_KNOWN_FLAG = "--report-known"
_ZSTD_REASON = re.compile(r"zstd decompress error: [^(]*")


def zstd_reason_only(e1: hw.HurrayWireError, e2: hw.HurrayWireError) -> bool:
    """Whether two errors differ only in the reason libzstd gave for a corrupt frame (F2)."""
    return (
        type(e1) is type(e2)
        and (e1.section, e1.field, e1.offset) == (e2.section, e2.field, e2.offset)
        and _ZSTD_REASON.sub("", str(e1)) == _ZSTD_REASON.sub("", str(e2))
    )


def known_finding(exc: BaseException) -> str | None:
    """The id of the open finding ``exc`` is an instance of, or None."""
    frames = traceback.extract_tb(exc.__traceback__)
    for name, (kind, messages, (path, function)) in KNOWN_FINDINGS.items():
        if (
            type(exc) is kind
            and any(m in str(exc) for m in messages)
            and any(f.filename.endswith(path) and f.name == function for f in frames)
        ):
            return name
    return None


def as_known(exc: BaseException) -> KnownFinding | None:
    """``exc`` as a ``KnownFinding`` while known findings are ignored, else None."""
    name = known_finding(exc) if IGNORE_KNOWN[0] else None
    if name is None:
        return None
    if name not in KNOWN_HITS:
        print(f"fuzz: open finding {name} reached ({exc!r}); going on", file=sys.stderr)
    KNOWN_HITS[name] = KNOWN_HITS.get(name, 0) + 1
    return KnownFinding(f"{name}: {type(exc).__name__}: {exc}")


KNOWN_HITS: dict[str, int] = {}


def outcome(call: Callable[[], Any]) -> tuple[Any, hw.HurrayWireError | None]:
    try:
        return call(), None
    except hw.HurrayWireError as exc:
        return None, exc
    except Exception as exc:
        known = as_known(exc)
        if known is None:
            raise
        return None, known


def _metadata_bytes(metadata: dict[str, Any]) -> bytes:
    return encode_metadata(metadata) if metadata else b""


def _has_empty_array(metadata: dict[str, Any]) -> bool:
    return any(isinstance(v, list) and not v for v in metadata.values())


def tensor_difference(a: hw.BlockPagedTensor, b: hw.BlockPagedTensor) -> str | None:
    """The first part in which two tensors differ (bytes, dtype and shape), or None."""
    if hw.encode_descriptor(a.descriptor) != hw.encode_descriptor(b.descriptor):
        return "descriptor"
    for name in ("page_pool", "block_table", "seq_ptr", "scales", "zero_points", "seq_lens"):
        x, y = getattr(a, name), getattr(b, name)
        if (x is None) != (y is None):
            return name
        if x is not None and (
            x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes()
        ):
            return name
    if _has_empty_array(a.metadata) or _has_empty_array(b.metadata):
        if repr(a.metadata) != repr(b.metadata):
            return "metadata"
    elif _metadata_bytes(a.metadata) != _metadata_bytes(b.metadata):
        return "metadata"
    return None


def _same_outcome(
    what: str,
    first: tuple[Any, hw.HurrayWireError | None],
    second: tuple[Any, hw.HurrayWireError | None],
) -> None:
    (t1, e1), (t2, e2) = first, second
    if (e1 is None) != (e2 is None):
        raise AssertionError(f"{what}: one decode accepted, the other raised {e1 or e2!r}")
    if (
        e1 is not None
        and e2 is not None
        and (
            type(e1) is not type(e2)
            or str(e1) != str(e2)
            or (e1.section, e1.field, e1.offset) != (e2.section, e2.field, e2.offset)
        )
    ):
        kind = ZSTD_REASON_ONLY if zstd_reason_only(e1, e2) else "different errors"
        try:
            raise AssertionError(f"{what}: {kind}: {e1!r} / {e2!r}")
        except AssertionError as exc:
            if as_known(exc) is None:  # an open finding (F2) is reported once, then ignored
                raise
    if t1 is not None:
        diff = tensor_difference(t1, t2)
        if diff is not None:
            raise AssertionError(f"{what}: tensors differ in {diff}")


def _canonical(data: bytes, tensor: hw.BlockPagedTensor) -> bool:
    """True if the blob is in the one form ``encode`` writes for its tensor."""
    if data[5] != 0:  # version_minor
        return False
    count = _U16.unpack_from(data, 20)[0]
    buffers = tensor.descriptor.buffers
    kinds = [data[HEADER_SIZE + ENTRY_SIZE * number] for number in range(count)]
    if kinds[-2:] == [3, 2]:
        return False  # the reader accepts the extensions in either order; encode writes 2, 3
    for number in range(count):
        kind, flags, codec, _, _, _, _, _, _, alignment, _ = _ENTRY.unpack_from(
            data, HEADER_SIZE + ENTRY_SIZE * number
        )
        if codec != 0 or kind not in (1, 2, 3):
            return False
        if kind == 1 and alignment != max(64, buffers[number].alignment):
            return False
        if kind != 1 and alignment != 64:
            return False
        if kind == 3 and (flags or not tensor.metadata):
            return False
    return True


def _round_trip(data: bytes, tensor: hw.BlockPagedTensor, total: int) -> None:
    """Re-encode a decoded tensor and check that it decodes to the same tensor."""
    if _has_empty_array(tensor.metadata):
        return  # documented: a KV array with no element decodes but is never written
    checksum_type = data[22]
    choice = xxhash.xxh3_64_intdigest(data) % 4
    compressions: list[hw.Compression | str | None] = [
        hw.Compression(codecs.CODEC_ZSTD, min_size=0),
        hw.Compression(codecs.CODEC_SHUFFLE_ZSTD, min_size=0),
        "default",
        None,
    ]
    compression = compressions[choice]
    # and always the chunked codec with small chunks (several per section), on 0 or 2 threads
    chunked = hw.Compression(
        codecs.CODEC_CHUNKED, min_size=0, chunk_size=4096 << (choice % 2), threads=2 * (choice // 2)
    )
    plans = (
        (None, checksum_type == 1, True),
        (compression, choice % 2 == 0, False),
        (chunked, choice % 2 == 1, False),
    )
    for spec, checksum, first in plans:
        try:
            blob = hw.encode(tensor, compression=spec, checksum=checksum)
        except hw.HurrayWireError as exc:
            raise AssertionError(f"encode refused a decoded tensor: {exc!r}") from exc
        again, error = outcome(functools.partial(hw.decode, blob))
        if error is not None:
            raise AssertionError(f"a re-encoded blob does not decode: {error!r}") from error
        diff = tensor_difference(tensor, again)
        if diff is not None:
            raise AssertionError(f"encode -> decode changed {diff} (compression {spec})")
        if spec is chunked:  # the chunked bytes do not depend on the threads
            other = replace(chunked, threads=2 - chunked.threads)
            if bytes(hw.encode(tensor, compression=other, checksum=checksum)) != bytes(blob):
                raise AssertionError("chunked encoding differs on 0 and 2 threads")
        if spec is None:
            if bytes(hw.encode(again, checksum=checksum)) != bytes(blob):
                raise AssertionError("uncompressed encoding is not deterministic")
            joined = b"".join(bytes(p) for p in hw.encode_parts(tensor, checksum=checksum))
            if joined != bytes(blob):
                raise AssertionError("encode_parts does not join to encode")
            canonical = first and checksum_type in (0, 1) and _canonical(data, tensor)
            if canonical and bytes(blob) != data[:total]:
                raise AssertionError("a canonical blob re-encodes to other bytes")


def check_blob(data: bytes) -> None:
    """One fuzz case: the decoders accept consistently or raise our error; see the module doc."""
    strict = outcome(lambda: hw.decode(data, verify=True, threads=0))
    loose = outcome(lambda: hw.decode(data, verify=False))
    # verify=False skips the section checksums and the comparison of pages with their
    # digests (the page_digests section's own rules hold with either: F8)
    if not isinstance(strict[1], (hw.errors.ChecksumError, hw.errors.PageDigestError)):
        _same_outcome("verify=True vs verify=False", strict, loose)

    # The chunks of chunked sections decode on two threads: the same verdict, the same
    # error (str covers type, section, field and offset: the lowest failing chunk), equal
    # arrays.
    _same_outcome("threads=0 vs threads=2", strict, outcome(lambda: hw.decode(data, threads=2)))

    buf = bytearray(b"\xa5" * 3) + data + b"\x5a" * 5
    shifted = outcome(lambda: hw.decode(memoryview(buf)[3 : 3 + len(data)]))
    _same_outcome("memoryview at offset 3", strict, shifted)

    limited, limit_error = outcome(lambda: hw.decode(data, limits=SMALL_LIMITS))
    if strict[1] is not None and limited is not None:
        raise AssertionError("small limits accepted a blob the default limits refuse")
    if (
        strict[1] is None
        and limit_error is not None
        and not isinstance(limit_error, hw.errors.LimitExceededError)
    ):
        raise AssertionError(f"small limits refused a valid blob with {limit_error!r}")
    if strict[1] is None and limited is not None:
        _same_outcome("small limits", strict, (limited, None))

    _check_decode_into(data, strict)
    _check_decode_report(data, strict)
    tensor = strict[0]
    if tensor is None:
        _independent_refusal(data, strict[1])
        return
    total = _U64.unpack_from(data, 8)[0]
    if hw.blob_length(data) != total:
        raise AssertionError("blob_length disagrees with total_length")
    if total != len(data):
        _same_outcome(
            "exactly total_length bytes", strict, outcome(lambda: hw.decode(data[:total]))
        )
    _round_trip(data, tensor, total)
    _independent_reader(data, tensor)


#: refusals of decode_into(one_pass=True) that may leave refused bytes in the destination,
#: found while the pool is copied or decompressed into it (docs/decisions.md); also a
#: chunk frame's window over the limit (``LimitExceededError``, field ``chunk i``)
_DIRTY_REFUSALS = (hw.errors.ChecksumError, hw.errors.PageDigestError, hw.errors.DecompressionError)


def _pool_bytes(data: bytes) -> int | None:
    """buffer 0's byte_size in the blob's descriptor (descriptor.md § 1.1), if it is there."""
    if len(data) < 32:
        return None
    at = 32 + 48 * struct.unpack_from("<H", data, 20)[0] + 85
    return int(_U64.unpack_from(data, at)[0]) if at + 8 <= len(data) else None


def _check_decode_into(data: bytes, strict: tuple[Any, hw.HurrayWireError | None]) -> None:
    """``decode_into`` (the pool landed in a caller's flat uint8 array) gives decode's verdict
    and arrays, and by default leaves the destination untouched on every refusal; with
    ``one_pass=True`` (digests checked while the pool is copied) the same verdict, and only
    the refusals found during the copy may leave bytes (docs/decisions.md)."""
    tensor, error = strict
    size = tensor.page_pool.nbytes if tensor is not None else _pool_bytes(data)
    if size is None or size > 1 << 20:
        return
    for one_pass in (False, True):
        out = np.full(size, 0xA5, np.uint8)

        def land(o: Any = out, p: bool = one_pass) -> Any:
            return hw.decode(data, into=hw.IntoArray(o, one_pass=p), threads=0)

        landed, landed_error = outcome(land)
        if tensor is not None:
            if landed_error is not None:
                raise AssertionError(f"decode_into refuses what decode accepts: {landed_error!r}")
            diff = tensor_difference(landed, tensor)
            if diff is not None:
                raise AssertionError(f"decode_into and decode differ in {diff}")
            continue
        if landed is not None:
            raise AssertionError(f"decode_into accepts what decode refuses: {error!r}")
        chunk_limit = (  # a later chunk's frame refused as it is decompressed (its window)
            isinstance(landed_error, hw.errors.LimitExceededError)
            and landed_error.section == "buffer[0]"
            and (landed_error.field or "").startswith("chunk ")
        )
        dirty_allowed = one_pass and (isinstance(landed_error, _DIRTY_REFUSALS) or chunk_limit)
        if not dirty_allowed and bool((out != 0xA5).any()):
            raise AssertionError(
                f"decode_into(one_pass={one_pass}) wrote into page_pool, then refused: "
                f"{landed_error!r}"
            )


def _check_decode_report(data: bytes, strict: tuple[Any, hw.HurrayWireError | None]) -> None:
    """``decode_report`` accepts what decode accepts, with no failed page and equal arrays;
    it hands out a blob decode refuses only with failed pages named, after a page-digest
    (or, with digests, a page-row checksum) refusal."""
    tensor, error = strict
    report, report_error = outcome(lambda: hw.decode_report(data, threads=0))
    if tensor is not None:
        if report is None or not report.ok:
            raise AssertionError(f"decode_report vs decode: {report_error!r}, {report!r}")
        diff = tensor_difference(report.tensor, tensor)
        if diff is not None:
            raise AssertionError(f"decode_report and decode differ in {diff}")
    elif report is not None and (
        report.ok or not isinstance(error, (hw.errors.PageDigestError, hw.errors.ChecksumError))
    ):
        raise AssertionError(f"decode_report hands out what decode refuses: {error!r}")


def _load_independent_reader() -> Any:
    try:
        sys.path.insert(0, str(ROOT / "tests"))
        import blob_reference  # tests/blob_reference.py: a reader written from the page alone
    except ImportError:
        return None
    finally:
        sys.path.remove(str(ROOT / "tests"))
    return blob_reference


_REFERENCE: list[Any] = []


def reference_reader() -> Any:
    """tests/blob_reference.py, loaded once (None when it is not there)."""
    if not _REFERENCE:
        _REFERENCE.append(_load_independent_reader())
    return _REFERENCE[0]


def _independent_reader(data: bytes, tensor: hw.BlockPagedTensor) -> None:
    """A blob hw.decode accepts is accepted, with the same bytes, by the reader in
    tests/blob_reference.py, which implements docs/wire-format.md without hurray_wire."""
    reader = reference_reader()
    if reader is None:
        return
    try:
        parsed = reader.read_blob(data)
    except Exception as exc:
        try:
            raise AssertionError(
                f"the independent reader refuses what decode accepts: {exc!r}"
            ) from exc
        except AssertionError as error:
            if not _empty_shuffled_section(data) or as_known(error) is None:
                raise
            return
    buffers = [b"".join(a.tobytes() for a in parts) for parts in tensor.buffer_arrays()]
    if buffers != [bytes(b) for b in parsed.buffers]:
        raise AssertionError("the independent reader reads other buffer bytes")
    lens = None if tensor.seq_lens is None else [int(v) for v in tensor.seq_lens]
    if lens != parsed.seq_lens:
        raise AssertionError("the independent reader reads other seq_lens")
    if list((parsed.metadata or {}).keys()) != list(tensor.metadata.keys()):
        raise AssertionError("the independent reader reads other metadata keys")


def _empty_shuffled_section(data: bytes) -> bool:
    """Whether the blob has a shuffle-zstd section of raw_size 0 (open finding F7)."""
    blob = parse_blob(data)
    return blob is not None and any(
        s.codec == codecs.CODEC_SHUFFLE_ZSTD and s.raw_size == 0 for s in blob.sections
    )


_CHUNK_TABLE_FIELDS = ("chunk_size", "chunk_count", "frame_sizes")


def _independent_refusal(data: bytes, error: hw.HurrayWireError | None) -> None:
    """A chunked section decode refuses (its table or one of its frames) is refused by the
    independent reader too. Only for ``DecompressionError``: the window limit
    (``LimitExceededError``) is a rule that reader does not implement."""
    if type(error) is not hw.errors.DecompressionError:
        return
    where = error.field or ""
    if where not in _CHUNK_TABLE_FIELDS and not where.startswith("chunk "):
        return
    reader = reference_reader()
    if reader is None:
        return
    try:
        reader.read_blob(data)
    except Exception:
        return
    raise AssertionError(f"decode refuses what the independent reader reads: {error!r}")


# -- structure-aware mutation -------------------------------------------------------------------
@dataclass
class Section:
    kind: int
    flags: int
    codec: int
    param: int
    index: int
    raw_size: int
    alignment: int
    payload: bytes
    reserved: bytes = bytes(4)
    checksum: int | None = None  # None: computed from checksum_type when built


@dataclass
class Blob:
    major: int
    minor: int
    flags: int
    checksum_type: int
    reserved0: int
    reserved1: bytes
    descriptor: bytes
    sections: list[Section] = field(default_factory=list)


def parse_blob(data: bytes) -> Blob | None:
    """The blob at the start of ``data`` as editable parts, or None if it cannot be framed."""
    if len(data) < HEADER_SIZE or data[:4] != MAGIC:
        return None
    _, major, minor, flags, _, _, count, ctype, res0, dlen, res1 = _HEADER.unpack_from(data)
    desc_start = HEADER_SIZE + ENTRY_SIZE * count
    if desc_start + dlen > len(data):
        return None
    sections = []
    for number in range(count):
        kind, sflags, codec, param, index, offset, stored, raw, _, align, res = _ENTRY.unpack_from(
            data, HEADER_SIZE + ENTRY_SIZE * number
        )
        payload = data[offset : offset + stored] if offset + stored <= len(data) else b""
        sections.append(Section(kind, sflags, codec, param, index, raw, align, payload, res))
    return Blob(
        major, minor, flags, ctype, res0, res1, data[desc_start : desc_start + dlen], sections
    )


def _align(value: int, alignment: int) -> int:
    if alignment <= 0 or alignment & (alignment - 1):
        return value
    return (value + alignment - 1) & ~(alignment - 1)


def build_blob(blob: Blob, max_size: int = 1 << 20) -> bytes:
    """Lay the sections out by the placement rules and fill in every derived field.

    A layout longer than ``max_size`` (a huge alignment) is cut there: a truncated blob.
    """
    count = len(blob.sections)
    header_length = HEADER_SIZE + ENTRY_SIZE * count + len(blob.descriptor)
    cursor = header_length + 8
    offsets = []
    for s in blob.sections:
        offset = _align(cursor, s.alignment)
        offsets.append(offset)
        cursor = offset + len(s.payload)
    total = _align(cursor, 64)
    body = bytearray(min(total, max(max_size, header_length + 8)))
    entries = []
    for s, offset in zip(blob.sections, offsets, strict=True):
        if offset + len(s.payload) <= len(body):
            body[offset : offset + len(s.payload)] = s.payload
        if s.checksum is not None:
            checksum = s.checksum
        elif blob.checksum_type == 1:
            checksum = xxhash.xxh3_64_intdigest(s.payload)
        else:
            checksum = 0
        entries.append(
            _ENTRY.pack(
                s.kind & 0xFF,
                s.flags & 0xFF,
                s.codec & 0xFF,
                s.param & 0xFF,
                s.index & 0xFFFFFFFF,
                offset,
                len(s.payload),
                s.raw_size & (2**64 - 1),
                checksum & (2**64 - 1),
                s.alignment & 0xFFFFFFFF,
                s.reserved,
            )
        )
    head = _HEADER.pack(
        MAGIC,
        blob.major & 0xFF,
        blob.minor & 0xFF,
        blob.flags & 0xFFFF,
        total,
        header_length & 0xFFFFFFFF,
        count & 0xFFFF,
        blob.checksum_type & 0xFF,
        blob.reserved0 & 0xFF,
        len(blob.descriptor) & 0xFFFFFFFF,
        blob.reserved1,
    )
    head += b"".join(entries) + blob.descriptor
    body[: len(head)] = head
    body[len(head) : len(head) + 8] = _U64.pack(xxhash.xxh3_64_intdigest(head))
    return bytes(body)


_SMALL = [0, 1, 2, 3, 4, 5, 7, 8, 15, 16, 31, 32, 63, 64, 65, 127, 128, 255, 256, 4095, 4096]


def interesting(rng: random.Random, width: int, current: int = 0) -> int:
    """A boundary value for a ``width``-byte unsigned field, or ``current`` nudged."""
    bits = 8 * width
    mask = (1 << bits) - 1
    if rng.random() < 0.3:
        return (current + rng.choice([-65, -64, -8, -2, -1, 1, 2, 8, 64, 65])) & mask
    edges = [(1 << bits) - 1, (1 << bits) - 2, 1 << (bits - 1), (1 << (bits - 1)) - 1]
    if bits > 32:
        edges += [1 << 32, (1 << 32) - 1, 1 << 31, 1 << 40, 1 << 62, (1 << 63) + 1]
    return rng.choice(_SMALL + edges) & mask


def byte_mutate(data: bytes, rng: random.Random, max_size: int = 1 << 20) -> bytes:
    """Plain byte-level mutations (a stand-in for libFuzzer's when atheris is absent)."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        if not buf or op == 0:
            buf[rng.randint(0, len(buf)) : rng.randint(0, len(buf))] = rng.randbytes(
                rng.randint(1, 8)
            )
        elif op == 1:
            at = rng.randrange(len(buf))
            buf[at] ^= 1 << rng.randrange(8)
        elif op == 2:
            buf[rng.randrange(len(buf))] = rng.choice([0, 1, 0x7F, 0x80, 0xFE, 0xFF])
        elif op == 3:
            width = rng.choice([2, 4, 8])
            if len(buf) >= width:
                at = rng.randrange(len(buf) - width + 1)
                current = int.from_bytes(buf[at : at + width], "little")
                value = interesting(rng, width, current)
                buf[at : at + width] = value.to_bytes(width, "little")
        elif op == 4:
            start = rng.randrange(len(buf))
            del buf[start : start + rng.randint(1, 16)]
        elif op == 5:
            start = rng.randrange(len(buf))
            chunk = buf[start : start + rng.randint(1, 32)]
            at = rng.randint(0, len(buf))
            buf[at:at] = chunk
        else:
            del buf[rng.randint(0, len(buf)) :]
    return bytes(buf[:max_size])


_IN_LIBFUZZER: list[bool] = []  # non-empty once atheris.Fuzz() runs: atheris.Mutate works only then


def libfuzzer_mutate(data: bytes, rng: random.Random, max_size: int) -> bytes:
    if _IN_LIBFUZZER and rng.random() < 0.7:
        return bytes(atheris.Mutate(data, max_size))
    return byte_mutate(data, rng, max_size)


#: Chunk sizes the mutator writes: mostly small (several chunks per section), sometimes
#: one chunk, the largest legal size, or any legal power of two.
_CHUNK_SIZES = [4096, 4096, 4096, 8192, 16384, 1 << 16, 1 << 20, codecs.CHUNK_SIZE_MAX]
_M32 = 0xFFFFFFFF


def _chunk_size_choice(rng: random.Random) -> int:
    if rng.random() < 0.1:
        return 1 << rng.randint(12, 30)
    return rng.choice(_CHUNK_SIZES)


def _zstd_frame(
    raw: bytes,
    width: int,
    rng: random.Random,
    content_size: bool | None = None,
    window_log: int | None = None,
) -> bytes:
    """One zstd frame of ``raw``, byte-shuffled first when ``width`` is 2, 4 or 8.

    ``content_size`` None: a random choice (mostly declared). ``window_log``: a frame of
    unknown content size whose window descriptor asks for ``2**window_log`` bytes (the frame
    is made with the smallest window, then its window descriptor byte is rewritten, which
    keeps it decodable without allocating the window here).
    """
    src = raw
    if width in codecs.SHUFFLE_WIDTHS:
        src = bytes(codecs.shuffle_bytes(np.frombuffer(raw, np.uint8), width))
    checksum = rng.random() < 0.3
    if window_log is not None:
        params = zstandard.ZstdCompressionParameters(
            compression_level=1, window_log=10, write_content_size=0, write_checksum=checksum
        )
        obj = zstandard.ZstdCompressor(compression_params=params).compressobj()
        frame = bytearray(obj.compress(src) + obj.flush())
        if frame[4] & 0x20 == 0:  # not single-segment: byte 5 is the window descriptor
            frame[5] = (min(max(window_log, 10), 41) - 10) << 3
        return bytes(frame)
    compressor = zstandard.ZstdCompressor(
        level=rng.choice([1, 1, 3, 19] if len(raw) <= 1 << 16 else [1, 3]),
        write_content_size=rng.random() < 0.8 if content_size is None else content_size,
        write_checksum=checksum,
    )
    return compressor.compress(src)


def join_chunks(
    chunk_size: int, count: int, sizes: list[int], frames: list[bytes], extra: bytes = b""
) -> bytes:
    """A chunked section's stored bytes from its table fields and frames (as given)."""
    table = struct.pack(f"<II{len(sizes)}I", chunk_size & _M32, count & _M32,
                        *(v & _M32 for v in sizes))  # fmt: skip
    return table + b"".join(frames) + extra


def split_chunks(payload: bytes) -> tuple[int, int, list[int], list[bytes]] | None:
    """(chunk_size, chunk_count, frame sizes, frames) of a chunked section, or None when
    its table does not fit; frames are cut by the sizes (the last ones maybe short)."""
    if len(payload) < 8:
        return None
    chunk_size, count = struct.unpack_from("<II", payload)
    start = 8 + 4 * count
    if start > len(payload):
        return None
    sizes = list(struct.unpack_from(f"<{count}I", payload, 8))
    frames = []
    for size in sizes:
        frames.append(payload[start : start + size])
        start += size
    return chunk_size, count, sizes, frames


def _chunked(raw: bytes, width: int, chunk_size: int, rng: random.Random) -> bytes:
    """Codec 3 stored bytes: the chunk table, then one frame per (shuffled) chunk; each
    frame picks its own level, content size and checksum."""
    frames = [
        _zstd_frame(raw[a : a + chunk_size], width, rng) for a in range(0, len(raw), chunk_size)
    ]
    return join_chunks(chunk_size, len(frames), [len(f) for f in frames], frames)


def _compress(
    raw: bytes, codec: int, param: int, rng: random.Random, chunk_size: int | None = None
) -> bytes:
    if codec == codecs.CODEC_CHUNKED:
        return _chunked(raw, param, chunk_size or _chunk_size_choice(rng), rng)
    return _zstd_frame(raw, param if codec == codecs.CODEC_SHUFFLE_ZSTD else 1, rng)


def _unframe(frame: bytes, size: int, width: int) -> bytes | None:
    """The raw bytes of one frame of ``size`` raw bytes, or None.

    python-zstandard allocates a frame's declared content size up front (``max_output_size``
    bounds only frames without one), so a frame declaring more than ``size`` is not read.
    """
    try:
        declared = zstandard.get_frame_parameters(frame).content_size
        if declared != zstandard.CONTENTSIZE_UNKNOWN and declared > size:
            return None
        raw = zstandard.ZstdDecompressor().decompress(frame, max_output_size=max(size, 1))
    except zstandard.ZstdError:
        return None
    if width in codecs.SHUFFLE_WIDTHS:
        raw = bytes(codecs.unshuffle_bytes(np.frombuffer(raw, np.uint8), width))
    return raw


def _chunk_lengths(chunk_size: int, raw_size: int) -> list[int] | None:
    """The raw length of each chunk, or None when the chunk size is not a legal one (or
    the raw size too large for the mutator)."""
    if raw_size > _MAX_RAW:
        return None
    if not codecs.CHUNK_SIZE_MIN <= chunk_size <= codecs.CHUNK_SIZE_MAX:
        return None
    if chunk_size & (chunk_size - 1):
        return None
    return [min(chunk_size, raw_size - a) for a in range(0, raw_size, chunk_size)]


def _decompress(section: Section) -> bytes | None:
    if section.codec == 0:
        return section.payload
    if section.raw_size > _MAX_RAW:
        return None
    if section.codec == codecs.CODEC_CHUNKED:
        parts = split_chunks(section.payload)
        if parts is None:
            return None
        lengths = _chunk_lengths(parts[0], section.raw_size)
        if lengths is None or len(lengths) != parts[1]:
            return None
        chunks = []
        for frame, length in zip(parts[3], lengths, strict=True):
            chunk = _unframe(frame, length, section.param)
            if chunk is None or len(chunk) != length:
                return None
            chunks.append(chunk)
        return b"".join(chunks)
    return _unframe(
        section.payload,
        section.raw_size,
        section.param if section.codec == codecs.CODEC_SHUFFLE_ZSTD else 1,
    )


def set_int(payload: bytes, rng: random.Random) -> bytes:
    width = rng.choice([4, 8])
    if len(payload) < width:
        return payload
    buf = bytearray(payload)
    at = rng.randrange(len(buf) // width) * width
    current = int.from_bytes(buf[at : at + width], "little")
    buf[at : at + width] = interesting(rng, width, current).to_bytes(width, "little")
    return bytes(buf)


def _descriptor_seeds() -> list[bytes]:
    return [p.read_bytes() for p in sorted(DESCRIPTOR_DIR.glob("*.bin"))]


_DESCRIPTORS: list[bytes] = []


def random_metadata(rng: random.Random) -> bytes:
    pool: list[tuple[str, Any]] = [
        ("model", "m" * rng.randint(0, 40)),
        ("hurray.k_scale", rng.choice([0.5, float("nan"), -0.0, 1e308])),
        ("n", rng.choice([0, -1, 2**63 - 1, -(2**63)])),
        ("u", hw.metadata.UInt64(rng.choice([0, 2**64 - 1]))),
        ("flag", rng.random() < 0.5),
        ("raw", rng.randbytes(rng.randint(0, 12))),
        ("ids", ["r-1", "r-2"][: rng.randint(1, 2)]),
        ("ints", [1, -2, 3][: rng.randint(1, 3)]),
        ("floats", [1.5, 2.5]),
        ("\u00e9\u00e8", "x"),
    ]
    chosen = rng.sample(pool, rng.randint(1, len(pool)))
    return encode_metadata(dict(chosen))


def sync_buffers(blob: Blob, rng: random.Random) -> None:
    """Resize the buffer sections to what the (mutated) descriptor says, if it decodes."""
    try:
        desc = hw.decode_descriptor(blob.descriptor)
    except hw.HurrayWireError:
        return
    sizes = [h.byte_size for h in desc.buffers]
    if sum(sizes) > _MAX_SYNC_BUFFER:
        return
    buffers = [s for s in blob.sections if s.kind == 1]
    others = [s for s in blob.sections if s.kind != 1]
    new = []
    for index, (size, handle) in enumerate(zip(sizes, desc.buffers, strict=True)):
        old = buffers[index] if index < len(buffers) else None
        raw = (_decompress(old) if old is not None else None) or b""
        raw = (raw + bytes(size))[:size]
        new.append(Section(1, 1, 0, 0, index, size, max(64, handle.alignment), raw))
    layout = desc.layout
    if rng.random() < 0.7 and len(new) >= 3:  # coherent index buffers
        itemsize = layout.index_dtype.itemsize
        logical = sizes[1] // itemsize
        cuts = sorted(rng.randint(0, logical) for _ in range(max(layout.num_seqs - 1, 0)))
        seq_ptr = [0, *cuts, logical] if layout.num_seqs else [0]
        if layout.num_pages:
            table = [rng.randrange(min(layout.num_pages, 1 << 32)) for _ in range(logical)]
        else:
            table = [0] * logical
        fmt = "<" + ("Q" if itemsize == 8 else "I")
        bt = b"".join(struct.pack(fmt, v) for v in table)
        sp = b"".join(struct.pack(fmt, v) for v in seq_ptr[: layout.num_seqs + 1])
        if len(bt) == sizes[1] and len(sp) == sizes[2]:
            new[1].payload, new[2].payload = bt, sp
            for s in others:
                if s.kind == 2:  # seq_lens that fit the pages (and maybe shape[0])
                    lens = []
                    for a, b in itertools.pairwise(seq_ptr):
                        pages = b - a
                        low = (pages - 1) * layout.page_size + 1 if pages else 0
                        lens.append(rng.randint(low, pages * layout.page_size) if pages else 0)
                    if lens and rng.random() < 0.7:
                        lens[-1] += desc.shape[0] - sum(lens)
                    s.payload = b"".join(_U64.pack(v & (2**64 - 1)) for v in lens)
                    s.raw_size, s.codec, s.param = len(s.payload), 0, 0
    blob.sections = new + others


def _mutate_blob(blob: Blob, rng: random.Random, max_size: int) -> None:
    sections = blob.sections
    op = rng.randrange(19)
    s = rng.choice(sections) if sections else None
    if op == 0 and s is not None:  # one entry field
        name, width = rng.choice(
            [
                ("kind", 1),
                ("flags", 1),
                ("codec", 1),
                ("param", 1),
                ("index", 4),
                ("raw_size", 8),
                ("alignment", 4),
                ("checksum", 8),
            ]
        )
        if name == "checksum":
            s.checksum = interesting(rng, 8)
        else:
            setattr(s, name, interesting(rng, width, getattr(s, name)))
    elif op == 1:  # one header field
        name, width = rng.choice(
            [("major", 1), ("minor", 1), ("flags", 2), ("checksum_type", 1), ("reserved0", 1)]
        )
        setattr(blob, name, interesting(rng, width, getattr(blob, name)))
        if rng.random() < 0.2:
            blob.reserved1 = rng.randbytes(4)
    elif op == 2 and s is not None:  # payload bytes
        s.payload = libfuzzer_mutate(s.payload, rng, max(len(s.payload) * 2, 64))
        if s.codec == 0 and rng.random() < 0.8:
            s.raw_size = len(s.payload)
    elif op == 3 and s is not None:  # one index / seq_lens / zero-point element
        raw = _decompress(s)
        if raw is not None:
            raw = set_int(raw, rng)
            if s.codec == 0:
                s.payload = raw
            else:
                chunk_size = split_chunks(s.payload) if s.codec == codecs.CODEC_CHUNKED else None
                s.payload = _compress(raw, s.codec, s.param, rng, chunk_size and chunk_size[0])
    elif op == 4 and s is not None:  # compress a section (maybe after mutating it)
        raw = _decompress(s)
        if raw is not None:
            if rng.random() < 0.3:
                raw = set_int(raw, rng)
            s.codec = rng.choice([1, 2, 3, 3])
            s.param = {1: 0, 2: rng.choice([2, 4, 8]), 3: rng.choice([1, 2, 4, 8])}[s.codec]
            s.payload = _compress(raw, s.codec, s.param, rng)
            s.raw_size = len(raw)
    elif op == 5 and s is not None:  # decompress a section
        raw = _decompress(s)
        if raw is not None:
            s.codec, s.param, s.payload, s.raw_size = 0, 0, raw, len(raw)
    elif op == 6:  # descriptor bytes
        blob.descriptor = libfuzzer_mutate(blob.descriptor, rng, len(blob.descriptor) + 64)
        if len(blob.descriptor) >= 10 and rng.random() < 0.8:
            d = bytearray(blob.descriptor)
            _U32.pack_into(d, 6, len(d))
            blob.descriptor = bytes(d)
        if rng.random() < 0.8:
            sync_buffers(blob, rng)
    elif op == 7:  # another descriptor, buffers resized to it
        if not _DESCRIPTORS:
            _DESCRIPTORS.extend(_descriptor_seeds())
        blob.descriptor = rng.choice(_DESCRIPTORS)
        sync_buffers(blob, rng)
    elif op == 8:  # same descriptor, coherent index buffers
        sync_buffers(blob, rng)
    elif op == 9:  # add a section
        kind = rng.choice([2, 3, 3, 4, 0x7F, 0xFF, 0, 1])
        if kind == 3:
            payload = random_metadata(rng)
        elif kind == 2:
            payload = b"".join(_U64.pack(rng.choice([0, 1, 3, 6, 2**64 - 1])) for _ in range(2))
        else:
            payload = rng.randbytes(rng.randint(0, 40))
        flags = 1 if kind in (1, 2) else rng.choice([0, 0, 1])
        new = Section(kind, flags, 0, 0, 0, len(payload), rng.choice([64, 64, 128, 4096]), payload)
        if kind == 3 and rng.random() < 0.3:
            new.codec = 1
            new.payload = _compress(payload, 1, 0, rng)
        sections.insert(rng.randint(0, len(sections)), new)
    elif op == 10 and s is not None:  # remove or duplicate a section
        if rng.random() < 0.5:
            sections.remove(s)
        else:
            sections.insert(rng.randint(0, len(sections)), replace(s))
    elif op == 11 and len(sections) >= 2:  # swap two sections
        i, j = rng.sample(range(len(sections)), 2)
        sections[i], sections[j] = sections[j], sections[i]
    elif op == 12 and s is not None:  # alignment
        s.alignment = rng.choice([0, 1, 32, 64, 128, 256, 4096, 1 << 20, 96, 2**31])
    elif op == 13:  # metadata payload
        metas = [x for x in sections if x.kind == 3]
        if metas:
            meta = metas[0]
            meta.payload = random_metadata(rng)
            if rng.random() < 0.5:
                meta.payload = byte_mutate(meta.payload, rng)
            meta.codec, meta.param, meta.raw_size = 0, 0, len(meta.payload)
    elif op in (14, 15):  # block-paged fields of the descriptor, handles repaired, resized
        blob.descriptor = mutate_descriptor_fields(blob.descriptor, rng)
        sync_buffers(blob, rng)
    elif op >= 16 and sections:  # a chunked section's table and frames
        chunked = [x for x in sections if x.codec == codecs.CODEC_CHUNKED]
        if chunked and rng.random() < 0.85:
            mutate_chunks(rng.choice(chunked), rng)
        else:  # chunk a section first, preferably the largest (the pool: several chunks)
            target = max(sections, key=lambda x: x.raw_size) if rng.random() < 0.6 else s
            if target is not None and rechunk(target, rng):
                mutate_chunks(target, rng)


def rechunk(s: Section, rng: random.Random, chunk_size: int | None = None) -> bool:
    """Store a section with codec 3 (a small chunk size, any width); False if it cannot be
    decompressed first."""
    raw = _decompress(s)
    if raw is None:
        return False
    s.codec, s.param = codecs.CODEC_CHUNKED, rng.choice([1, 2, 4, 8])
    size = chunk_size or (rng.choice([4096, 4096, 8192]) if rng.random() < 0.8 else None)
    s.payload = _compress(raw, s.codec, s.param, rng, size)
    s.raw_size = len(raw)
    return True


def _odd_frame(frame: bytes, rng: random.Random) -> bytes:
    """A frame slot that is not exactly one good zstd frame."""
    choice = rng.randrange(7)
    if choice == 0:  # a skippable frame, alone or before the frame
        skip = _U32.pack(0x184D2A50 + rng.randrange(16)) + _U32.pack(4) + rng.randbytes(4)
        return skip if rng.random() < 0.5 else skip + frame
    if choice == 1:  # bytes after the frame
        return frame + rng.choice([b"\0", rng.randbytes(rng.randint(1, 8)), frame[:4]])
    if choice == 2:  # two frames back to back
        return frame + frame
    if choice == 3:  # an empty frame (content size 0)
        return zstandard.ZstdCompressor(write_content_size=rng.random() < 0.5).compress(b"")
    if choice == 4:
        return b""
    if choice == 5 and len(frame) > 5 and frame[4] & 3 == 0:  # a dictionary id in the header
        at = 5 if frame[4] & 0x20 else 6  # after the window descriptor, if any
        return frame[:4] + bytes([frame[4] | 1]) + frame[5:at] + b"\x07" + frame[at:]
    return libfuzzer_mutate(frame, rng, len(frame) + 16)


def mutate_chunks(s: Section, rng: random.Random) -> None:
    """One edit of a chunked section's chunk table or frames (docs/wire-format.md § 6)."""
    parts = split_chunks(s.payload)
    if parts is None:  # the table does not fit: edit its header fields only
        head = bytearray(s.payload[:8].ljust(8, b"\0"))
        at = rng.choice([0, 4])
        current = _U32.unpack_from(head, at)[0]
        _U32.pack_into(head, at, interesting(rng, 4, current))
        s.payload = bytes(head) + s.payload[8:]
        return
    chunk_size, count, sizes, frames = parts
    # raw, when not None, is cut by a legal table into as many chunks as there are frames
    raw = _decompress(s) if s.codec == codecs.CODEC_CHUNKED else None
    chunks = []
    if raw is not None:
        chunks = [raw[a : a + chunk_size] for a in range(0, len(raw), chunk_size)]
    extra = b""
    i = rng.randrange(len(frames)) if frames else 0
    j = rng.randrange(len(frames)) if frames else 0
    op = rng.randrange(14)
    if op == 0:  # chunk_size: a boundary value, a neighbouring power of two, or any
        chunk_size = rng.choice(
            [
                interesting(rng, 4, chunk_size),
                chunk_size * 2,
                chunk_size // 2,
                1 << rng.randint(0, 31),
                codecs.CHUNK_SIZE_MIN - 1,
                codecs.CHUNK_SIZE_MIN + 1,
                codecs.CHUNK_SIZE_MAX,
                codecs.CHUNK_SIZE_MAX * 2,
                0,
            ]
        )
    elif op == 1:  # chunk_count alone, or with the table grown or shrunk to match
        new = rng.choice([interesting(rng, 4, count), count + 1, max(count - 1, 0), 0])
        if rng.random() < 0.5:
            while len(frames) > new:
                frames.pop()
                sizes.pop()
            while len(frames) < min(new, count + 4):
                frames.append(frames[j] if frames else b"")
                sizes.append(len(frames[-1]))
        count = new
    elif op == 2 and sizes:  # one frame size: a boundary value (the sum no longer matches)
        sizes[i] = interesting(rng, 4, sizes[i])
    elif op == 3 and len(sizes) >= 2:  # bytes moved between two frames: the sum matches
        k = rng.randrange(len(sizes) - 1)
        delta = rng.choice([1, -1, 2, -3, 4, sizes[k], -sizes[k + 1]])
        sizes[k] = (sizes[k] + delta) & _M32
        sizes[k + 1] = (sizes[k + 1] - delta) & _M32
    elif op == 4 and len(frames) >= 2:  # two frames swapped (sizes follow)
        frames[i], frames[j] = frames[j], frames[i]
        sizes[i], sizes[j] = len(frames[i]), len(frames[j])
    elif op == 5 and frames:  # a frame truncated
        frames[i] = frames[i][: rng.randrange(len(frames[i]) + 1)]
        sizes[i] = len(frames[i])
    elif op == 6 and frames:  # a frame duplicated over another (maybe of another length)
        if rng.random() < 0.5 and len(frames) >= 2:
            j = len(frames) - 1 if i != len(frames) - 1 else 0  # the short last chunk
        frames[j] = frames[i]
        sizes[j] = len(frames[j])
    elif op == 7 and chunks:  # a frame without a declared content size (maybe a big window)
        log = rng.choice([None, None, 22, 23, 24, 31]) if rng.random() < 0.4 else None
        frames[i] = _zstd_frame(chunks[i], s.param, rng, content_size=False, window_log=log)
        sizes[i] = len(frames[i])
    elif op == 8 and chunks:  # a frame of another chunk's length, or one byte off
        other = rng.choice(
            [
                chunks[j],
                chunks[i][:-1],
                chunks[i] + b"\0",
                chunks[i] + chunks[j][: rng.randint(1, 16)],
                chunks[i][: len(chunks[i]) // 2],
            ]
        )
        frames[i] = _zstd_frame(other, s.param, rng, content_size=rng.random() < 0.7)
        sizes[i] = len(frames[i])
    elif op == 9 and frames:  # a slot that is not exactly one good frame
        frames[i] = _odd_frame(frames[i], rng)
        sizes[i] = len(frames[i])
    elif op == 10:  # the section's raw size (the count or the last chunk's length is off)
        s.raw_size = rng.choice(
            [
                s.raw_size + 1,
                s.raw_size - 1,
                s.raw_size + chunk_size,
                s.raw_size - chunk_size,
                interesting(rng, 8, s.raw_size),
            ]
        ) & (2**64 - 1)
    elif op == 11:  # the shuffle width, frames unchanged
        s.param = rng.choice([0, 1, 2, 3, 4, 8, 16])
    elif op == 12:  # bytes after the last frame, maybe counted in its size
        extra = rng.randbytes(rng.randint(1, 8))
        if sizes and rng.random() < 0.5:
            sizes[-1] = (sizes[-1] + len(extra)) & _M32
    elif raw is not None:  # re-chunked: any legal chunk size and width, mixed frames
        rechunk(s, rng, _chunk_size_choice(rng))
        return
    s.payload = join_chunks(chunk_size, count, sizes, frames, extra)


#: (offset, width) of the block-paged descriptor fields (shared/spec/descriptor.md § 1.1):
#: type_tag, shape[0..2], page_size, num_pages, num_seqs, kv_role, layer_index, index type.
DESCRIPTOR_FIELDS = [(14, 1), (20, 8), (28, 8), (36, 8), (52, 4), (56, 8), (68, 4), (72, 1),
                     (73, 4), (77, 1)]  # fmt: skip


def repair_descriptor(descriptor: bytes) -> bytes:
    """Rewrite the buffer handles' byte_size to what the decoder expects, when it says so."""
    buf = bytearray(descriptor)
    for _ in range(8):
        try:
            hw.decode_descriptor(bytes(buf))
        except hw.HurrayWireError as exc:
            where, expected = exc.offset, exc.expected
            if (
                not (exc.field or "").endswith("byte_size")
                or not isinstance(expected, int)
                or where is None
                or not 0 <= where <= len(buf) - 8
            ):
                break
            _U64.pack_into(buf, where, expected & (2**64 - 1))
        else:
            break
    return bytes(buf)


def mutate_descriptor_fields(descriptor: bytes, rng: random.Random) -> bytes:
    """One to three block-paged fields set to boundary values, then the sizes repaired."""
    if len(descriptor) < 133 or descriptor[:4] != b"HRRY":
        return descriptor
    buf = bytearray(descriptor)
    for _ in range(rng.randint(1, 3)):
        offset, width = rng.choice(DESCRIPTOR_FIELDS)
        current = int.from_bytes(buf[offset : offset + width], "little")
        value = interesting(rng, width, current) if rng.random() < 0.8 else 0
        buf[offset : offset + width] = value.to_bytes(width, "little")
    return repair_descriptor(bytes(buf))


def mutate(data: bytes, max_size: int, seed: int) -> bytes:
    """The ``--fix-checksums`` custom mutator: structure-aware edits, then fixed checksums."""
    return guarded_mutate("fuzz_blob", MUTATOR_ERRORS, _mutate, fix_checksums, data, max_size, seed)


def guarded_mutate(
    tool: str,
    errors: list[str],
    inner: Callable[[bytes, int, int], bytes],
    fix: Callable[[bytes], bytes],
    data: bytes,
    max_size: int,
    seed: int,
) -> bytes:
    """``inner(data, max_size, seed)``; a mutator bug must not end the campaign, so it is
    said once, recorded in ``errors``, and a byte mutation (checksums fixed) is used."""
    try:
        return inner(data, max_size, seed)
    except Exception as exc:
        if not errors:
            print(f"{tool}: mutator error {exc!r}; byte mutation instead", file=sys.stderr)
        errors.append(repr(exc))
        return fix(byte_mutate(data, random.Random(seed), max_size))


MUTATOR_ERRORS: list[str] = []


def _mutate(data: bytes, max_size: int, seed: int) -> bytes:
    rng = random.Random(seed)
    blob = parse_blob(data) if rng.random() < 0.85 else None
    if blob is None:
        out = libfuzzer_mutate(data, rng, max_size)
        return fix_checksums(out)[:max_size]
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        _mutate_blob(blob, rng, max_size)
    if len(blob.descriptor) > 4096 or len(blob.sections) > 64:
        return data
    out = build_blob(blob, max_size)
    if rng.random() < 0.15:  # and now and then a plain byte mutation on top
        out = fix_checksums(libfuzzer_mutate(out, rng, max_size))
    if len(out) > max_size:
        return fix_checksums(libfuzzer_mutate(data, rng, max_size))[:max_size]
    return out


# -- seeds -------------------------------------------------------------------------------------
def generated_seeds() -> dict[str, bytes]:
    """Blobs of the descriptor variants the fixtures do not cover, from ``from_arrays``."""
    f = hw.BlockPagedTensor.from_arrays
    rng = np.random.default_rng(7)
    i8 = rng.integers(-5, 5, (3, 2, 2, 4)).astype(np.int8)
    cases: dict[str, Callable[[], hw.BlockPagedTensor]] = {
        "per_channel_axis1": lambda: f(
            i8,
            [0, 2],
            [0, 1, 2],
            quantization=hw.PerChannelAffine(1, scale_buffer_index=3, zero_point_buffer_index=4),
            scales=np.ones(2, np.float32),
            zero_points=np.zeros(2, np.int32),
        ),
        "per_channel_axis2_shared": lambda: f(
            i8,
            [0, 2],
            [0, 1, 2],
            seq_lens=[2, 1],
            quantization=hw.PerChannelAffine(2, scale_buffer_index=3, zero_point_buffer_index=3),
            scales=np.ones(4, np.float32),
            zero_points=np.arange(4, dtype=np.int32),
        ),
        "per_tensor": lambda: f(i8, [0, 2], [0, 1, 2], quantization=hw.PerTensorAffine(0.5, 3)),
        "int4_per_block_shared": lambda: f(
            np.zeros((3, 2, 2, 4), hw.int4.numpy_dtype),
            [0, 2, 1],
            [0, 1, 3],
            seq_lens=[2, 3],
            element_type=hw.int4,
            quantization=hw.PerBlockAffine(
                axis=0,
                block_size=2,
                scale_buffer_index=3,
                scale_type=hw.bfloat16,
                zero_point_buffer_index=3,
            ),
            scales=np.ones(6, hw.bfloat16.numpy_dtype),
            zero_points=np.zeros(6, np.int32),
        ),
        "uint2_layer_max": lambda: f(
            np.ones((3, 2, 2, 4), hw.uint2.numpy_dtype),
            [0, 2, 1],
            [0, 3],
            seq_lens=[5],
            element_type=hw.uint2,
            layer_index=0xFFFFFFFE,
        ),
        "float6": lambda: f(
            np.zeros((2, 4, 1, 3), hw.float6_e2m3.numpy_dtype),
            [0, 1],
            [0, 2],
            element_type=hw.float6_e2m3,
        ),
        "bool": lambda: f(np.ones((2, 1, 1, 5), bool), [0, 1], [0, 2], seq_lens=[2]),
        "complex128": lambda: f(np.ones((2, 1, 1, 2), np.complex128), [0, 1], [0, 2]),
        "u64_align256": lambda: f(
            np.ones((2, 4, 1, 8), np.float16),
            [0, 1, 1],
            [0, 2, 3],
            seq_lens=[5, 4],
            block_table_index_type="uint64",
            alignment=256,
        ),
        "fused_metadata": lambda: f(
            np.ones((2, 3, 1, 2), np.float32),
            [1],
            [0, 1],
            kv_role="fused",
            seq_lens=[2],
            metadata={
                "a": 1,
                "b": [1.5, 2.5],
                "c": b"x",
                "d": True,
                "e": hw.metadata.UInt64(2**64 - 1),
                "f": [hw.metadata.Int64(-1)],
                "g": "s",
                "h": [hw.metadata.UInt64(3)],
            },
        ),
        "empty_pool": lambda: f(np.zeros((0, 4, 2, 8), np.float16), [], [0], seq_lens=[]),
        "no_seqs_tokens": lambda: f(np.zeros((1, 4, 1, 8), np.float16), [], [0]),
    }
    out: dict[str, bytes] = {}
    for name, make in cases.items():
        tensor = make()
        out[f"gen-{name}.hrwb"] = bytes(hw.encode(tensor))
        compressed = hw.Compression(codecs.CODEC_SHUFFLE_ZSTD, min_size=0)
        out[f"gen-{name}-shuffle.hrwb"] = bytes(hw.encode(tensor, compression=compressed))
        out[f"gen-{name}-zstd-nock.hrwb"] = bytes(
            hw.encode(
                tensor, compression=hw.Compression(codecs.CODEC_ZSTD, min_size=0), checksum=False
            )
        )
        try:  # with a page_digests section (0x04), raw and chunked
            out[f"gen-{name}-digests.hrwb"] = bytes(hw.encode(tensor, page_digests=True))
            chunked = hw.Compression(codecs.CODEC_CHUNKED, min_size=0)
            digests = bytes(hw.encode(tensor, page_digests=True, compression=chunked))
            out[f"gen-{name}-digests-chunked.hrwb"] = digests
        except hw.HurrayWireError:  # pages that do not end on a byte boundary
            pass
    out.update(chunked_seeds())
    return out


def chunked_seeds() -> dict[str, bytes]:
    """Blobs whose pool (and, for the uint64 one, block_table) is a chunked-shuffle-zstd
    section of several 4 KiB chunks, one per shuffle width 1 / 2 / 4 / 8, the last chunk
    short for most; one with 8 KiB chunks, one of 100 chunks, one with the default 1 MiB
    chunk (one chunk)."""
    f = hw.BlockPagedTensor.from_arrays
    rng = np.random.default_rng(11)

    def pool(shape: int | tuple[int, ...], dtype: Any) -> Any:  # compressible, not constant
        return (np.round(rng.standard_normal(shape) * 16) / 16).astype(dtype)

    def sparse(shape: tuple[int, ...], dtype: Any) -> Any:  # a few values per 4 KiB
        out = np.zeros(shape, dtype)
        out.reshape(-1)[::509] = pool((out.size + 508) // 509, dtype)
        return out

    cases: dict[str, tuple[Callable[[], hw.BlockPagedTensor], int]] = {
        "w1_int8_quant": (  # 10,240 bytes: 4096 + 4096 + 2048
            lambda: f(
                rng.integers(-4, 4, (5, 16, 2, 64)).astype(np.int8),
                [0, 2, 4, 1],
                [0, 3, 4],
                seq_lens=[40, 10],
                quantization=hw.PerTensorAffine(0.25, 2),
            ),
            4096,
        ),
        "w2_f16_meta": (  # 12,800 bytes: 3 x 4096 + 512
            lambda: f(
                pool((5, 16, 2, 40), np.float16),
                [4, 3, 2, 1, 0],
                [0, 2, 5],
                seq_lens=[30, 40],
                metadata={"model": "chunked", "ids": ["r-1"]},
            ),
            4096,
        ),
        "w2_bf16_8k": (  # 24,576 bytes: 3 x 8192
            lambda: f(pool((6, 16, 2, 64), hw.bfloat16.numpy_dtype), [0, 1, 2, 3, 4, 5], [0, 6]),
            8192,
        ),
        "w4_f32": (  # 12,288 bytes: exactly 3 x 4096
            lambda: f(pool((3, 8, 2, 64), np.float32), [0, 1, 2], [0, 1, 3], seq_lens=[8, 14]),
            4096,
        ),
        "w8_f64_u64_table": (  # pool 9,216 bytes (4096 + 4096 + 1024); block_table 4,800
            lambda: f(
                pool((3, 8, 1, 48), np.float64),
                [k % 3 for k in range(600)],
                [0, 600],
                block_table_index_type="uint64",
            ),
            4096,
        ),
        "w2_f16_100_chunks": (  # 409,600 bytes, mostly zeros: a table of over 64 entries
            lambda: f(sparse((25, 16, 8, 64), np.float16), list(range(25)), [0, 25]),
            4096,
        ),
        "w2_f16_one_chunk": (  # the default chunk size: one chunk
            lambda: f(pool((4, 16, 2, 32), np.float16), [0, 1, 2, 3], [0, 4]),
            1 << 20,
        ),
    }
    out: dict[str, bytes] = {}
    for name, (make, chunk_size) in cases.items():
        tensor = make()
        spec = hw.Compression(codecs.CODEC_CHUNKED, min_size=0, chunk_size=chunk_size)
        out[f"gen-chunked-{name}.hrwb"] = bytes(hw.encode(tensor, compression=spec))
        out[f"gen-chunked-{name}-nock.hrwb"] = bytes(
            hw.encode(tensor, compression=spec, checksum=False)
        )
    return out


def seed_inputs() -> dict[str, bytes]:
    """Every seed: the fixture blobs and blob streams, and the generated blobs."""
    seeds = {
        f"{p.parent.name}-{p.name}": p.read_bytes()
        for d in SEED_DIRS
        for p in sorted(d.glob("*.hrw[bs]"))
    }
    for name, data in list(seeds.items()):
        if name.endswith(".hrws"):  # a stream: its blobs are seeds too
            for number, blob in enumerate(blobs_in_stream(data)):
                seeds[f"{name[:-5]}-blob{number}.hrwb"] = blob
    seeds.update(generated_seeds())
    return seeds


def blobs_in_stream(data: bytes) -> list[bytes]:
    """The blobs of a hurray-wire stream (records framed by their 16-byte prefix)."""
    blobs = []
    pos = 0
    while pos + 16 <= len(data) and data[pos : pos + 4] in (b"HRWS", MAGIC, b"HRWE"):
        total = _U64.unpack_from(data, pos + 8)[0]
        if total < 64 or pos + total > len(data):
            break
        if data[pos : pos + 4] == MAGIC:
            blobs.append(data[pos : pos + total])
        pos += total
    return blobs


def fix_mode(argv: list[str]) -> tuple[bool, list[str]]:
    """The harness's own flags, taken out of argv: (checksum fixing on?, the rest)."""
    fix = os.environ.get(FIX_ENV, "") not in ("", "0")
    if FIX_FLAG in argv:
        fix = True
    if REPORT_KNOWN_FLAG in argv:
        IGNORE_KNOWN[0] = False
    return fix, [a for a in argv if a not in (FIX_FLAG, REPORT_KNOWN_FLAG)]


def seeded_argv(
    argv: list[str], name: str, seed_dirs: list[Path], generated: Callable[[], dict[str, bytes]]
) -> list[str]:
    """Add the generated seeds, written to a folder (and a default corpus when no corpus
    dir was given).

    libFuzzer ends the process with exit(), so the directories are fixed, reused ones
    rather than temporary directories that nothing would remove.
    """
    positional = [a for a in argv[1:] if not a.startswith("-")]
    tmp = Path(tempfile.gettempdir())
    seeds = tmp / f"hurray-wire-fuzz-{name}-seeds"
    seeds.mkdir(parents=True, exist_ok=True)
    for seed_name, data in generated().items():
        (seeds / seed_name).write_bytes(data)
    if positional:
        if all(Path(p).is_dir() for p in positional):
            return [*argv, str(seeds)]
        return argv  # replaying files
    corpus = tmp / f"hurray-wire-fuzz-{name}-corpus"
    corpus.mkdir(exist_ok=True)
    for folder in [*seed_dirs, seeds]:
        for path in sorted(folder.iterdir()):
            if path.is_file():
                shutil.copy(path, corpus / f"{folder.name}-{path.name}")
    return [*argv, str(corpus)]


def main() -> None:
    fix, argv = fix_mode(sys.argv)
    argv = seeded_argv(argv, "blob", SEED_DIRS, generated_seeds)
    if fix:
        _IN_LIBFUZZER.append(True)
        atheris.Setup(argv, check_blob, custom_mutator=mutate)
    else:
        atheris.Setup(argv, check_blob)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
