"""Timing and memory probes for the resource issues of docs/security.md ("Known issues").

    python tools/probe_resources.py                 # every probe
    python tools/probe_resources.py sections walk   # some of them

Each probe builds its hostile input with the public encoders (and ``tools/fuzz_blob.py``'s
blob builder, which recomputes the checksums), feeds it to a public decoder and prints the
time, the peak or resident memory, and the verdict. The figures say whether an issue is
still there; they are not a benchmark (the machine is shared). Run it alone, under
``nice`` if others are working.

Probes:

* ``sections``: a blob whose header lists 4,096 / 16,384 / 65,535 section entries (the
  header checksum valid, so only the limit can refuse it), decoded with
  ``DecodeLimits(max_sections=16)``. The refusal should cost nothing; the time grows with
  the square of the count while the decoder builds the checksum mask of the whole table
  before it checks the limit.
* ``walk``: a zstd section (codec 1) whose frame holds N empty raw blocks and then the
  data: a valid frame that the decoder's Python block walk visits block by block
  (3 bytes each: 64 MiB is 22 M blocks).
* ``header-metadata``: a stream header with a 64 MiB KV metadata value, read by
  ``StreamReader`` and ``StreamFile`` with ``DecodeLimits(max_metadata_bytes=96)``: is the
  limit applied to the stream header's metadata?
* ``caches``: 32 blobs, each with its own 16 MiB descriptor (a minor-1 descriptor with
  unknown trailing bytes, which the format allows), decoded one after the other and
  dropped: what stays resident in the module caches (bounded by entry count, not bytes).
* ``bomb``: the decompression ratio of a chunked zstd section of zeros, to size
  ``max_decompressed_bytes`` (the default 16 GiB lets a blob of about 512 KiB make decode
  write 16 GiB).
* ``sigbus``: a ``StreamFile`` over a file that is truncated after it was mapped; reading a
  tensor then touches pages past the end of the file (a child process; SIGBUS is -7).
"""

from __future__ import annotations

import functools
import gc
import io
import os
import resource
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

import hurray_wire as hw
from hurray_wire import containers as hwc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_blob  # parse_blob / build_blob: blobs with every checksum recomputed


def _rss_mib() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _small_tensor(pool_bytes: int = 32) -> hw.BlockPagedTensor:
    pool = np.zeros((2, pool_bytes // 8, 1, 2), np.float16)
    return hw.BlockPagedTensor.from_arrays(pool, [0, 1], [0, 2])


def _timed(call: Callable[[], Any]) -> tuple[float, str, Any]:
    start = time.perf_counter()
    try:
        result = call()
        verdict = "accepted"
    except hw.HurrayWireError as exc:
        result, verdict = None, f"{type(exc).__name__}: {str(exc)[:90]}"
    return time.perf_counter() - start, verdict, result


# -- sections --------------------------------------------------------------------------------
def section_table_blob(count: int) -> bytes:
    """A blob whose header claims ``count`` sections, header checksum valid."""
    descriptor = hw.encode_descriptor(_small_tensor().descriptor)
    header_length = 32 + 48 * count + len(descriptor)
    total = -(-(header_length + 8) // 64) * 64
    head = bytearray(header_length)
    struct.pack_into(
        "<4sBBHQIHBBI4s", head, 0, b"HRWB", 1, 0, 0, total, header_length, count, 1, 0,
        len(descriptor), bytes(4),
    )  # fmt: skip
    head[32 + 48 * count :] = descriptor
    return (
        bytes(head)
        + struct.pack("<Q", xxhash.xxh3_64_intdigest(bytes(head)))
        + bytes(total - header_length - 8)
    )


def probe_sections() -> None:
    limits = hw.DecodeLimits(max_sections=16)
    for count in (1024, 4096, 16384, 65535):
        data = section_table_blob(count)
        seconds, verdict, _ = _timed(functools.partial(hw.decode, data, limits=limits))
        print(f"sections: {count:6} entries ({len(data) / 2**20:.1f} MiB), max_sections=16: "
              f"{seconds * 1000:9.1f} ms, {verdict}")  # fmt: skip


# -- walk ------------------------------------------------------------------------------------
def empty_block_frame(blocks: int, payload: bytes) -> bytes:
    """A valid zstd frame: ``blocks`` empty raw blocks, then ``payload`` as the last block."""
    fhd = 0xA0  # 4-byte frame content size, single segment, no checksum, no dictionary
    head = struct.pack("<IBI", 0xFD2FB528, fhd, len(payload))
    last = (len(payload) << 3) | 1
    return head + b"\x00\x00\x00" * blocks + last.to_bytes(3, "little") + payload


def walk_blob(blocks: int) -> bytes:
    tensor = _small_tensor()
    data = bytes(hw.encode(tensor, compression=hw.Compression(1, min_size=0)))
    blob = fuzz_blob.parse_blob(data)
    assert blob is not None and blob.sections[0].codec == 1
    pool = tensor.page_pool.tobytes()
    blob.sections[0].payload = empty_block_frame(blocks, pool)
    return fuzz_blob.build_blob(blob, max_size=1 << 31)


def probe_walk() -> None:
    import zstandard

    assert zstandard.ZstdDecompressor().decompress(empty_block_frame(5, b"ab")) == b"ab"
    for mib in (1, 8, 64):
        blocks = (mib << 20) // 3
        data = walk_blob(blocks)
        seconds, verdict, _ = _timed(functools.partial(hw.decode, data))
        print(f"walk: {mib:3} MiB zstd section, {blocks / 1e6:5.1f} M empty blocks: "
              f"{seconds:7.2f} s, {verdict}")  # fmt: skip


# -- header metadata -------------------------------------------------------------------------
def probe_header_metadata() -> None:
    size = 64 << 20
    header = hwc.StreamHeader(model="m", metadata={"big": b"\x00" * size})
    sink = io.BytesIO()
    with hwc.StreamWriter(sink, header) as writer:
        writer.write(_small_tensor(), compression=None)
    data = sink.getvalue()
    limits = hw.DecodeLimits(max_metadata_bytes=96)
    for label, call in (
        ("StreamReader", lambda: list(hwc.StreamReader(data, limits=limits))),
        ("StreamFile", lambda: hwc.StreamFile(data, limits=limits).header),
        ("decode_stream_header", lambda: hwc.decode_stream_header(data)),
    ):
        before = _rss_mib()
        seconds, verdict, result = _timed(call)
        grown = _rss_mib() - before
        print(f"header-metadata: {label} on a 64 MiB-metadata header, max_metadata_bytes=96: "
              f"{seconds * 1000:.0f} ms, +{grown:.0f} MiB RSS while held, {verdict}")  # fmt: skip
        del result
        gc.collect()


# -- caches ----------------------------------------------------------------------------------
def big_descriptor_blob(number: int, trailing: int = 16 << 20) -> bytes:
    tensor = _small_tensor()
    blob = fuzz_blob.parse_blob(bytes(hw.encode(tensor, compression=None)))
    assert blob is not None
    descriptor = bytearray(blob.descriptor)
    descriptor[5] = 1  # minor 1: unknown trailing bytes are allowed (and kept)
    extra = number.to_bytes(8, "little") + bytes(trailing - 8 - len(descriptor))
    descriptor += extra
    struct.pack_into("<I", descriptor, 6, len(descriptor))
    blob.descriptor = bytes(descriptor)
    return fuzz_blob.build_blob(blob, max_size=1 << 31)


def probe_caches(count: int = 32) -> None:
    gc.collect()
    before = _rss_mib()
    start = time.perf_counter()
    limits = hw.DecodeLimits()
    for number in range(count):
        data = big_descriptor_blob(number)
        assert len(hw.decode(data, limits=limits).descriptor.unknown_trailing) > 0
        del data
    gc.collect()
    after = _rss_mib()
    print(f"caches: {count} blobs with 16 MiB descriptors decoded and dropped in "
          f"{time.perf_counter() - start:.1f} s: resident +{after - before:.0f} MiB "
          f"({(after - before) / count:.0f} MiB per blob), peak {_peak_mib():.0f} MiB")  # fmt: skip
    # The cache that holds it: the default decoder's one plan cache.
    from hurray_wire.blob import DEFAULT_DECODER

    caches: tuple[tuple[str, Any], ...] = (
        ("the default Decoder's plan cache (plans, masks, descriptors)", DEFAULT_DECODER.plans),
    )
    for label, cache in caches:
        entries = len(cache)
        level = _rss_mib()
        cache.clear()
        gc.collect()
        print(f"caches:   clearing {label}, {entries} entries: -{level - _rss_mib():.0f} MiB")


# -- bomb ------------------------------------------------------------------------------------
def probe_bomb() -> None:
    raw = 256 << 20
    pool = np.zeros((raw // 4096, 16, 1, 128), np.float16)
    tensor = hw.BlockPagedTensor.from_arrays(pool, [0], [0, 1])
    for label, compression in (
        ("zstd (codec 1)", hw.Compression(1, min_size=0)),
        ("default (chunked shuffle zstd)", "default"),
    ):
        data = bytes(hw.encode(tensor, compression=compression))
        gc.collect()
        seconds, verdict, _ = _timed(functools.partial(hw.decode, data))
        ratio = raw / len(data)
        print(f"bomb: {label}: {raw >> 20} MiB of zeros in a {len(data) / 1024:.0f} KiB blob "
              f"(ratio {ratio:,.0f}:1; 16 GiB from a blob of {(16 << 30) / ratio / 1024:.0f} KiB): "
              f"decode {seconds:.2f} s, {verdict}")  # fmt: skip
    limited = hw.DecodeLimits(max_decompressed_bytes=64 << 20)
    seconds, verdict, _ = _timed(lambda: hw.decode(data, limits=limited))
    print(f"bomb: the same with max_decompressed_bytes=64 MiB: {seconds * 1000:.1f} ms, {verdict}")


# -- sigbus ----------------------------------------------------------------------------------
_SIGBUS_CHILD = textwrap.dedent(
    """
    import os, sys, numpy as np, hurray_wire as hw
    from hurray_wire import containers as hwc
    path = sys.argv[1]
    pool = np.ones((64, 16, 1, 128), np.float16)
    tensor = hw.BlockPagedTensor.from_arrays(pool, list(range(64)), [0, 64])
    with hwc.StreamWriter(path) as writer:
        writer.write(tensor, compression=None)
    with hwc.StreamFile(path) as stream_file:
        os.truncate(path, 4096)  # another process cuts the file after it was mapped
        try:
            t = stream_file.tensor(None, "key")
            print("read", float(t.page_pool.sum()))
        except hw.HurrayWireError as exc:
            print("refused:", type(exc).__name__, exc)
    """
)


def probe_sigbus() -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "cut.hrws")
        done = subprocess.run(
            [sys.executable, "-c", _SIGBUS_CHILD, path], capture_output=True, text=True
        )
    outcome = {-7: "killed by SIGBUS"}.get(done.returncode, f"exit {done.returncode}")
    print(
        f"sigbus: StreamFile over a file truncated after mapping: {outcome}; "
        f"{(done.stdout.strip() or done.stderr.strip().splitlines()[-1:] or [''])[0][:120]}"
    )


PROBES = {
    "sections": probe_sections,
    "walk": probe_walk,
    "header-metadata": probe_header_metadata,
    "caches": probe_caches,
    "bomb": probe_bomb,
    "sigbus": probe_sigbus,
}


def main(argv: list[str]) -> int:
    unknown = [name for name in argv if name not in PROBES]
    if unknown:
        print(f"usage: probe_resources.py [{' | '.join(PROBES)}]...", file=sys.stderr)
        return 2
    for name in argv or list(PROBES):
        PROBES[name]()
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
