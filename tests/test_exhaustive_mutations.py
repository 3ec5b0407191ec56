"""Every single-byte change and every truncation of one small input of each container kind.

For a blob (raw, and compressed with the default chunked-shuffle-zstd codec), a blob stream
(stream header, two blobs, end record with its index), a ``.hrry`` file and a reference
stream, each made by the public encoders, every byte position gets four changes (xor 0x01,
xor 0x80, 0x00, 0xFF; a change that leaves the byte as it was is skipped) and every proper
prefix is read. Each changed input is either

* refused with a ``HurrayWireError`` (never any other exception), or
* accepted: then the position must lie in one of the ranges the kind documents in
  ``UNDETECTED`` below: bytes no checksum covers, whose changes a reader cannot tell from
  a different valid input. The test fails on an accepted change anywhere else, and on a
  documented range that no longer lets any change through (so the list stays exact).

Truncations must be refused, except where a kind documents that a prefix is itself a
valid input (a reference stream cut at a record boundary is a shorter stream: the format
has no end marker).

What is documented, and why (docs/security.md § "What decode does not guarantee"):

* blobs, raw or compressed, with checksums: nothing. The header checksum covers the header
  and the section table, each section's xxh3_64 covers its stored bytes, padding must be
  zero, and a truncation cuts a section or the header.
* the blob stream: nothing. The stream header and the end record carry xxh3_64 checksums
  and the blobs theirs; the end record's index must agree with the blobs.
* ``.hrry``: the descriptors and the data buffers (no checksum covers them: the only
  CRC-32C of the format is over the index), and the KV metadata section (not covered
  either). A change there that still validates is a different valid file.
* the reference stream: every descriptor and every buffer (the format has no checksum at
  all); a cut at a record boundary.

``survey()`` returns the figures (positions tried, refused, accepted and where); run this
file as a script to print them.
"""

from __future__ import annotations

import io
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire import containers as hwc

CHANGES: tuple[Callable[[int], int], ...] = (
    lambda b: b ^ 0x01,
    lambda b: b ^ 0x80,
    lambda b: 0x00,
    lambda b: 0xFF,
)


def _tensor(layer: int, role: str) -> hw.BlockPagedTensor:
    pool = (np.arange(2 * 2 * 1 * 4, dtype=np.float32) + layer).reshape(2, 2, 1, 4)
    return hw.BlockPagedTensor.from_arrays(
        pool.astype(np.float16),
        [1, 0],
        [0, 2],
        seq_lens=[3],
        kv_role=role,
        layer_index=layer,
        metadata={"m": layer},
    )


def _fingerprint(tensor: hw.BlockPagedTensor) -> tuple[Any, ...]:
    """Everything a reader returns for a tensor, as bytes."""
    arrays = [tensor.page_pool, tensor.block_table, tensor.seq_ptr, tensor.scales]
    arrays.append(tensor.zero_points)
    seq_lens = None if tensor.seq_lens is None else np.asarray(tensor.seq_lens).tobytes()
    metadata = hw.metadata.encode_metadata(tensor.metadata) if tensor.metadata else b""
    return (
        hw.encode_descriptor(tensor.descriptor),
        tuple(None if a is None else (a.dtype.str, a.shape, a.tobytes()) for a in arrays),
        seq_lens,
        metadata,
    )


# -- the readers: bytes -> a comparable result (or our error) ---------------------------------
def read_blob(data: bytes) -> Any:
    return _fingerprint(hw.decode(data))


class Incomplete(hw.HurrayWireError):
    """The reader accepted the bytes as a stream but says it is not complete (no end record):
    how a caller learns of a cut that leaves a valid shorter stream (the empty prefix, a
    valid headerless stream of no blob). Counted as detected."""


def read_blob_stream(data: bytes) -> Any:
    reader = hwc.StreamReader(data)
    tensors = [_fingerprint(t) for t in reader]
    if not reader.complete:
        raise Incomplete("StreamReader.complete is False")
    with hwc.StreamFile(data) as stream_file:
        again = [_fingerprint(t) for t in stream_file]
        if again != tensors or not stream_file.complete:
            raise AssertionError("StreamFile and StreamReader disagree")
    return reader.header, tensors


def read_hrry(data: bytes) -> Any:
    with hwc.HrryFile.from_buffer(data) as hrry:
        return (
            hrry.names,
            hw.metadata.encode_metadata(hrry.user_metadata) if hrry.user_metadata else b"",
            [_fingerprint(hrry.tensor(name)) for name in hrry.names],
        )


def read_reference(data: bytes) -> Any:
    tensors = [_fingerprint(t) for t in hwc.read_stream(data)]
    again = [_fingerprint(t) for t in hwc.read_stream(io.BytesIO(data))]
    if again != tensors:
        raise AssertionError("read_stream from bytes and from a file object disagree")
    return tensors


# -- the small inputs, from the public encoders ----------------------------------------------
def blob_raw() -> bytes:
    return bytes(hw.encode(_tensor(3, "key"), compression=None))


def blob_compressed() -> bytes:
    """A pool of 2 KiB that compresses (the encoder stores a section raw when compression
    does not pay, as it would for the 32-byte pool of ``_tensor``)."""
    pool = np.tile(np.arange(64, dtype=np.float16), 16).reshape(2, 8, 1, 64)
    tensor = hw.BlockPagedTensor.from_arrays(
        pool, [1, 0], [0, 2], seq_lens=[9], kv_role="key", layer_index=3, metadata={"m": 3}
    )
    data = bytes(hw.encode(tensor, compression=hw.Compression(3, min_size=0)))
    assert data[32 + 2] == 3, "the pool section is chunked-shuffle-zstd"
    return data


def blob_stream() -> bytes:
    sink = io.BytesIO()
    header = hwc.StreamHeader(model="m", num_layers=1, kv_roles=("key", "value"))
    with hwc.StreamWriter(sink, header) as writer:
        writer.write(_tensor(0, "key"), compression=None)
        writer.write(_tensor(0, "value"), compression=None)
    return sink.getvalue()


def hrry_file() -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "small.hrry"
        hwc.write_file(path, {"k0": _tensor(0, "key")}, {"model": "m"})
        return path.read_bytes()


def reference_stream() -> bytes:
    sink = io.BytesIO()
    hwc.write_stream(sink, [_tensor(0, "key"), _tensor(0, "value")])
    return sink.getvalue()


# -- the documented undetected ranges --------------------------------------------------------
Ranges = list[tuple[str, int, int]]  # (what, start, end): bytes [start, end)


def _no_ranges(data: bytes) -> Ranges:
    return []


def _hrry_ranges(data: bytes) -> Ranges:
    ranges: Ranges = []
    with hwc.HrryFile.from_buffer(data) as hrry:
        for name in hrry.names:
            entry = hrry.entry(name)
            start = entry.descriptor_offset
            ranges.append(
                (f"descriptor of {name!r} (no checksum)", start, start + entry.descriptor_length)
            )
            for number, (at, size) in enumerate(hrry.buffer_spans(name)):
                ranges.append((f"buffer {number} of {name!r} (no checksum)", at, at + size))
    index_offset, index_length, kv_offset, kv_length = _trailer(data)
    if kv_length:
        ranges.append(("KV metadata section (no checksum)", kv_offset, kv_offset + kv_length))
    ranges += [
        ("header version_minor (any 1.x minor reads)", 9, 10),
        # HAS_KV_METADATA (0x01): the trailer locates the KV section; SORTED_INDEX (0x02):
        # an index of one entry is sorted (only --all-values sets it).
        ("header file_flags bits 0x01 and 0x02 (informational here)", 12, 13),
        ("header tensor_count_hint (a hint, never used)", 28, 36),
    ]
    # Everything that is none of header, descriptors, buffers, KV section, index, trailer is
    # alignment padding, which the reference reader (and this one) never reads.
    parts = sorted(
        [(0, 64), (index_offset, index_offset + index_length), (len(data) - 40, len(data))]
        + [(start, end) for what, start, end in ranges if "no checksum" in what]
    )
    pos = 0
    for start, end in parts:
        if start > pos:
            ranges.append(("alignment padding (never read)", pos, start))
        pos = max(pos, end)
    return ranges


def _trailer(data: bytes) -> tuple[int, int, int, int]:
    """index_offset, index_length, kv_offset, kv_length of a .hrry trailer (containers.md § B.6)."""
    fields = [int.from_bytes(data[at : at + 8], "little") for at in range(-40, -8, 8)]
    return fields[0], fields[1], fields[2], fields[3] & 0xFFFF_FFFF


def _reference_ranges(data: bytes) -> Ranges:
    ranges: Ranges = []
    pos = 0
    for number, tensor in enumerate(hwc.read_stream(data)):
        length = tensor.descriptor.descriptor_length + sum(
            h.byte_size for h in tensor.descriptor.buffers
        )
        ranges.append((f"record {number}: descriptor and buffers (no checksum)", pos, pos + length))
        pos += length
    return ranges


def _reference_boundaries(data: bytes) -> set[int]:
    cuts = {0}
    pos = 0
    for tensor in hwc.read_stream(data):
        pos += tensor.descriptor.descriptor_length + sum(
            h.byte_size for h in tensor.descriptor.buffers
        )
        cuts.add(pos)
    return cuts


@dataclass
class Kind:
    make: Callable[[], bytes]
    read: Callable[[bytes], Any]
    undetected: Callable[[bytes], Ranges]
    valid_prefixes: Callable[[bytes], set[int]] = lambda data: set()
    every_value: bool = False  # all 255 other byte values, not just CHANGES


KINDS = {
    "blob raw": Kind(blob_raw, read_blob, _no_ranges, every_value=True),
    "blob compressed": Kind(blob_compressed, read_blob, _no_ranges, every_value=True),
    "blob stream": Kind(blob_stream, read_blob_stream, _no_ranges),
    ".hrry": Kind(hrry_file, read_hrry, _hrry_ranges),
    "reference stream": Kind(
        reference_stream, read_reference, _reference_ranges, _reference_boundaries, True
    ),
}


@dataclass
class Survey:
    size: int
    changes: int = 0
    refused: int = 0
    accepted_same: list[tuple[int, int]] = field(default_factory=list)
    accepted_different: list[tuple[int, int]] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)  # accepted changes in no documented range
    ranges_hit: dict[str, int] = field(default_factory=dict)
    truncations: int = 0
    truncations_accepted: list[int] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)  # exceptions that are not ours


def _outcome(read: Callable[[bytes], Any], data: bytes) -> tuple[Any, BaseException | None]:
    try:
        return read(data), None
    except hw.HurrayWireError as exc:
        return None, exc
    except Exception as exc:  # a finding: reported, not raised, so the survey completes
        return None, exc


def _constant(value: int) -> Callable[[int], int]:
    return lambda b: value


ALL_VALUES = tuple(_constant(v) for v in range(256))


def survey(name: str, every_value: bool | None = None) -> Survey:
    """The survey of one kind; ``every_value`` overrides the kind's choice of changes."""
    kind = KINDS[name]
    changes = ALL_VALUES if (kind.every_value if every_value is None else every_value) else CHANGES
    data = kind.make()
    expected = kind.read(data)
    ranges = kind.undetected(data)
    result = Survey(len(data), ranges_hit=dict.fromkeys((what for what, _, _ in ranges), 0))
    for position in range(len(data)):
        for change in changes:
            value = change(data[position])
            if value == data[position]:
                continue
            result.changes += 1
            mutated = bytearray(data)
            mutated[position] = value
            got, error = _outcome(kind.read, bytes(mutated))
            if error is not None:
                if not isinstance(error, hw.HurrayWireError):
                    result.foreign.append(f"byte {position} -> 0x{value:02x}: {error!r}")
                result.refused += 1
                continue
            (result.accepted_same if got == expected else result.accepted_different).append(
                (position, value)
            )
            where = [what for what, start, end in ranges if start <= position < end]
            if not where:
                result.outside.append(f"byte {position} -> 0x{value:02x}")
            for what in where:
                result.ranges_hit[what] += 1
    allowed = kind.valid_prefixes(data)
    for length in range(len(data)):
        result.truncations += 1
        _, error = _outcome(kind.read, data[:length])
        if error is None:
            if length not in allowed:
                result.truncations_accepted.append(length)
        elif not isinstance(error, hw.HurrayWireError):
            result.foreign.append(f"prefix of {length} bytes: {error!r}")
    return result


@pytest.mark.parametrize("name", list(KINDS))
def test_every_single_byte_change_and_truncation(name: str) -> None:
    result = survey(name)
    assert result.foreign == [], result.foreign[:10]
    assert result.outside == [], f"accepted outside the documented ranges: {result.outside[:20]}"
    assert result.truncations_accepted == [], result.truncations_accepted
    # "never read" claims are exact: every change there must go through. (A "no checksum"
    # range may be fully protected by validation, as a two-element seq_ptr is.)
    unused = [w for w, hits in result.ranges_hit.items() if hits == 0 and "no checksum" not in w]
    assert unused == [], f"documented ranges that let nothing through: {unused}"
    assert (
        result.refused + len(result.accepted_same) + len(result.accepted_different)
        == result.changes
    )


def main() -> None:
    """Print the survey of every kind (``--all-values``: 255 changes per byte for all)."""
    every = True if "--all-values" in sys.argv else None
    for name in KINDS:
        r = survey(name, every)
        print(
            f"{name}: {r.size} bytes, {r.changes} changes, {r.refused} refused, "
            f"{len(r.accepted_same)} accepted unchanged, {len(r.accepted_different)} accepted "
            f"changed; outside ranges {len(r.outside)}; truncations {r.truncations}, accepted "
            f"{r.truncations_accepted}; foreign {len(r.foreign)}"
        )
        for what, hits in r.ranges_hit.items():
            print(f"    {what}: {hits} accepted")
        for line in (r.outside + r.foreign)[:10]:
            print("    !", line)


if __name__ == "__main__":
    main()
