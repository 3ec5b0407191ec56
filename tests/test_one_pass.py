"""``decode_into(one_pass=True)``: one pass over the pool for every kind of blob (issue 20).

One pass is shown without a clock: the pool's bytes never pass through a pool-sized
intermediate (tracemalloc sees every NumPy and bytes allocation), and the one codec call
that decodes a compressed pool writes into the destination itself (or, with page refs,
into the sent rows' scratch that is then scattered), counted by a wrapper around the
decoder's codec entry. The safe default is the control: it decompresses into scratch and
copies, and the same measurements see it. The hostile cases give ``one_pass=True`` the
verdict of the safe route (error type and message) and leave the documented destination.
"""

from __future__ import annotations

import io
import struct
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire import dtypes
from hurray_wire.blob import landing, peek_descriptor, pipeline
from hurray_wire.containers import StreamFile
from hurray_wire.errors import (
    ChecksumError,
    DecompressionError,
    HurrayWireError,
    IndexBufferError,
    PaddingError,
    PageDigestError,
    PageStoreMissError,
)
from hurray_wire.integrity import MemoryPageStore, PageRecords, store_pages
from hurray_wire.parallel import usable_cores
from tests import blob_reference as ref

PAGES, PAGE = 256, (16, 8, 64)  # 16 KiB float16 pages: a 4 MiB pool
RAW_BELOW = 1 << 20  # the pools are compressed, the small sections stay raw
ZSTD = hw.Compression(1, min_size=RAW_BELOW)
SHUFFLE = hw.Compression(2, min_size=RAW_BELOW)
CHUNK = 1 << 18
CHUNKED = hw.Compression(3, min_size=RAW_BELOW, chunk_size=CHUNK)
PAGE_DIGESTS = 0x04  # the page-digests section kind (docs/integrity.md)


def _f16(smooth: bool = True) -> hw.BlockPagedTensor:
    rng = np.random.default_rng(3)
    if smooth:  # compressible, every page different
        ramp = np.linspace(0, 1, PAGE[-1], dtype=np.float16) + np.arange(PAGES)[:, None, None, None]
        pool = np.broadcast_to(ramp.astype(np.float16), (PAGES, *PAGE)).copy()
    else:
        pool = rng.standard_normal((PAGES, *PAGE)).astype(np.float16)
    return hw.BlockPagedTensor.from_arrays(pool, np.arange(PAGES), [0, 40, PAGES], kv_role="key")


def _int8_scales() -> hw.BlockPagedTensor:
    rng = np.random.default_rng(4)
    pool = rng.integers(-8, 8, (PAGES, *PAGE), np.int8)
    q = hw.PerBlockAffine.symmetric(axis=0, block_size=PAGE[0], scale_buffer_index=3,
                                    scale_type=hw.float32)  # fmt: skip
    return hw.BlockPagedTensor.from_arrays(
        pool, np.arange(PAGES), [0, PAGES], quantization=q,
        scales=rng.random(PAGES * PAGE[0], np.float32),
    )  # fmt: skip


def _int4(pages: int = 16385) -> hw.BlockPagedTensor:
    """An odd number of 255-code pages (a 2 MiB pool): the last byte's high nibble is
    padding."""
    codes = (np.arange(pages * 255) // 7 % 4).astype(np.uint8).view(dtypes.int4.numpy_dtype)
    return hw.BlockPagedTensor.from_arrays(
        codes.reshape(pages, 1, 1, 255), np.arange(pages), [0, pages], kv_role="key"
    )


def _store_for(t: hw.BlockPagedTensor) -> MemoryPageStore:
    store = MemoryPageStore(1 << 24)
    store_pages(store, t, list(range(0, t.layout.num_pages, 4)))
    return store


@dataclass(frozen=True)
class Kind:
    """A kind of blob; ``scratch``: bytes one_pass may allocate besides small bookkeeping
    (the sent rows of a compressed pool with page refs, which are scattered to page ids;
    a byte-shuffled single frame, whose last byte plane arrives last, is unshuffled from
    one pool-sized scratch: the format's, and why the chunked codec exists)."""

    name: str
    make: Callable[[], hw.BlockPagedTensor]
    compression: hw.Compression | None = None
    digests: bool = False
    refs: bool = False
    scratch: str = "none"  # "none", "sent rows", "chunks", "codec"


KINDS = [
    Kind("raw", lambda: _f16(False)),
    Kind("raw, page digests", lambda: _f16(False), digests=True),
    Kind("raw, page digests + refs", lambda: _f16(False), digests=True, refs=True),
    Kind("raw, page refs without digests", lambda: _f16(False), refs=True),
    Kind("raw int8, per-block scales + page digests", _int8_scales, digests=True),
    Kind("raw int4", _int4),
    Kind("zstd", _f16, ZSTD),
    Kind("chunked-shuffle-zstd", _f16, CHUNKED, scratch="chunks"),
    Kind("shuffle-zstd (one frame)", _f16, SHUFFLE, scratch="codec"),
    Kind("zstd, page digests", _f16, ZSTD, digests=True),
    Kind("zstd, page digests + refs", _f16, ZSTD, digests=True, refs=True, scratch="sent rows"),
    Kind("zstd, page refs without digests", _f16, ZSTD, refs=True, scratch="sent rows"),
    Kind("zstd int8, per-block scales + page digests", _int8_scales, ZSTD, digests=True),
    Kind("zstd int4", _int4, ZSTD),
    Kind("chunked int4", _int4, CHUNKED),
]


def _blob(kind: Kind) -> tuple[bytes, MemoryPageStore | None, int]:
    """The blob, the receiver's page store, and the stored codec of its pool."""
    t = kind.make()
    store = _store_for(t) if kind.refs else None
    known = None if store is None else store.digests()
    blob = bytes(hw.encode(t, compression=kind.compression, page_digests=kind.digests,
                           known_pages=known))  # fmt: skip
    return blob, store, ref.entry(blob, 0)["codec"]


def _engine(blob: bytes, fill: int = 0x5A) -> np.ndarray[Any, Any]:
    """Untyped engine memory of the pool's byte size, every byte ``fill``."""
    return np.full(peek_descriptor(blob).buffers[0].byte_size, fill, np.uint8)


def _land(
    blob: bytes, store: Any, one_pass: bool, monkeypatch: pytest.MonkeyPatch
) -> tuple[np.ndarray[Any, Any], int, list[tuple[int, bool]]]:
    """Land ``blob`` (warm), then again under tracemalloc with the decoder's codec entry
    wrapped: (destination, peak bytes allocated, (raw_size, into caller's out) per
    decode_section call)."""
    engine = _engine(blob)
    hw.decode(blob, into=hw.IntoArray(engine, one_pass=one_pass), page_store=store)  # plans, memo
    calls: list[tuple[int, bool]] = []
    real = pipeline.decode_section  # type: ignore[attr-defined]

    def tracked(codec: int, param: int, stored: Any, raw_size: int, threads: int,
                out: Any = None, progress: Any = None) -> Any:  # fmt: skip
        calls.append((raw_size, out is not None))
        return real(codec, param, stored, raw_size, threads, out, progress)

    monkeypatch.setattr(pipeline, "decode_section", tracked)
    engine[...] = 0
    tracemalloc.start()
    try:
        hw.decode(blob, into=hw.IntoArray(engine, one_pass=one_pass), page_store=store)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        monkeypatch.undo()
    return engine, peak, calls


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_one_pass_lands_every_kind_without_a_pool_sized_intermediate(
    kind: Kind, monkeypatch: pytest.MonkeyPatch
) -> None:
    blob, store, codec = _blob(kind)
    assert (codec != 0) == (kind.compression is not None), "the pool is stored as intended"
    want = hw.decode(blob, page_store=store).page_pool.reshape(-1).view(np.uint8)
    size = want.size
    engine, peak, calls = _land(blob, store, True, monkeypatch)
    assert engine.tobytes() == want.tobytes()
    pool_calls = [c for c in calls if c[0] == ref.entry(blob, 0)["raw_size"]]  # buffer 0
    allowed = size // 8  # bookkeeping: digests, chunk tables, the other sections
    if codec == 0:
        assert not pool_calls
    else:  # decoded exactly once: into the destination, or the sent rows' scratch
        assert pool_calls == [(pool_calls[0][0], True)], calls
    if kind.scratch == "sent rows":
        allowed += pool_calls[0][0]
    if kind.scratch == "chunks":  # a shuffled chunk is unshuffled from its scratch
        allowed += usable_cores() * CHUNK  # (one at once per thread)
    if kind.scratch == "codec":
        assert peak >= size  # the byte planes' scratch: see Kind
    else:
        assert peak < allowed, (peak, size)
    # The control: the safe default verifies (or decompresses into scratch), then copies.
    safe, safe_peak, safe_calls = _land(blob, store, False, monkeypatch)
    assert safe.tobytes() == want.tobytes()
    if codec != 0:
        assert (size, False) in safe_calls or kind.refs
        assert safe_peak >= size // 2


def _with_pool(blob: bytes, raw: bytes) -> bytes:
    """``blob`` rewritten by the reference writer with buffer 0 holding ``raw``, stored
    with the codec it had: every checksum valid."""
    count = ref.HEADER.unpack_from(blob)[6]
    dlen = ref.HEADER.unpack_from(blob)[9]
    at = ref.HEADER_SIZE + ref.ENTRY_SIZE * count
    sections = []
    for k in range(count):
        e = ref.entry(blob, k)
        stored = blob[e["offset"] : e["offset"] + e["stored_size"]]
        if k == 0:
            stored = ref.compress(raw, e["codec"], e["codec_param"], 1)
        sections.append(ref.Section(
            e["kind"], stored, raw_size=e["raw_size"], index=e["index"], flags=e["section_flags"],
            codec=e["codec"], codec_param=e["codec_param"], alignment=e["alignment"],
        ))  # fmt: skip
    return ref.write_blob(blob[at : at + dlen], sections)


def _padding_bits(compression: hw.Compression | None) -> Callable[[], bytes]:
    def make() -> bytes:
        blob = bytes(hw.encode(_int4(), compression=compression))
        raw = hw.decode(blob).page_pool.tobytes()
        return _with_pool(blob, raw[:-1] + bytes([raw[-1] | 0xF0]))

    return make


def _corrupt_frame() -> bytes:
    blob = bytes(hw.encode(_f16(), compression=ZSTD))
    end = ref.entry(blob, 0)["stored_size"] - 20  # its last block; the checksum kept valid
    return ref.patch_payload(blob, 0, end, bytes(8))


def _bad_digest(compression: hw.Compression | None) -> Callable[[], bytes]:
    def make() -> bytes:
        blob = bytes(hw.encode(_f16(), compression=compression, page_digests=True))
        count = ref.HEADER.unpack_from(blob)[6]
        number = next(k for k in range(count) if ref.entry(blob, k)["kind"] == PAGE_DIGESTS)
        last = ref.entry(blob, number)["stored_size"] - 1  # the last page's digest
        byte = blob[ref.entry(blob, number)["offset"] + last]
        return ref.patch_payload(blob, number, last, bytes([byte ^ 1]))

    return make


def _flipped(compression: hw.Compression | None, make: Callable[[], Any]) -> Callable[[], bytes]:
    def flip() -> bytes:
        blob = bytearray(hw.encode(make(), compression=compression))
        blob[ref.entry(bytes(blob), 0)["offset"] + 7] ^= 1  # its checksum left as it was
        return bytes(blob)

    return flip


def _broken_table(compression: hw.Compression | None) -> Callable[[], bytes]:
    def make() -> bytes:  # the block table names a page past the pool
        blob = bytes(hw.encode(_int4(), compression=compression))
        assert ref.entry(blob, 1)["codec"] == 0  # buffer 1: the block table
        return ref.patch_payload(blob, 1, 0, struct.pack("<I", 1 << 30))

    return make


def _store_miss() -> bytes:
    t = _f16()
    return bytes(hw.encode(t, compression=ZSTD, known_pages=_store_for(t).digests()))


@dataclass(frozen=True)
class Hostile:
    """A refused blob; ``lands``: one_pass=True refuses it only after the pool landed
    (what the destination then holds: "pool", the refused pool's bytes as stored;
    "written", some of them; "untouched")."""

    name: str
    blob: Callable[[], bytes]
    error: type[HurrayWireError]
    lands: str
    store: bool = False


HOSTILE = [
    Hostile("int4 padding bits, raw", _padding_bits(None), PaddingError, "untouched"),
    Hostile("int4 padding bits, zstd", _padding_bits(ZSTD), PaddingError, "pool"),
    Hostile("int4 padding bits, chunked", _padding_bits(CHUNKED), PaddingError, "pool"),
    Hostile("corrupt zstd, checksum valid", _corrupt_frame, DecompressionError, "written"),
    Hostile("a wrong page digest, raw", _bad_digest(None), PageDigestError, "pool"),
    Hostile("a wrong page digest, zstd", _bad_digest(ZSTD), PageDigestError, "pool"),
    Hostile("a flipped pool byte, raw", _flipped(None, _f16), ChecksumError, "pool"),
    Hostile("a flipped pool byte, zstd", _flipped(ZSTD, _f16), ChecksumError, "untouched"),
    Hostile("a flipped int4 byte, zstd", _flipped(ZSTD, _int4), ChecksumError, "untouched"),
    Hostile("int4 block table, zstd pool", _broken_table(ZSTD), IndexBufferError, "untouched"),
    Hostile("a page the store lacks, zstd", _store_miss, PageStoreMissError, "written", True),
]


def _decode_into(blob: bytes, engine: Any, store: Any, one_pass: bool) -> None:
    hw.decode(blob, into=hw.IntoArray(engine, one_pass=one_pass), page_store=store)


def _stream_file(blob: bytes, engine: Any, store: Any, one_pass: bool) -> None:
    sink = io.BytesIO()
    hw.StreamWriter(sink, hw.StreamHeader(), index=False).abort()  # the stream header
    with StreamFile(sink.getvalue() + blob, page_store=store) as f:
        f.read(f.entries[0], into=hw.IntoArray(engine, one_pass=one_pass))


def _unplaced(error: HurrayWireError) -> dict[str, Any]:
    """What an error says but where in a stream it was (a stream reader adds that)."""
    stream = ("blob", "blob_offset", "file_offset", "layer", "role")
    return {k: v for k, v in error.details().items() if k not in stream}


@pytest.mark.parametrize("land", [_decode_into, _stream_file])
@pytest.mark.parametrize("case", HOSTILE, ids=lambda c: c.name)
def test_one_pass_gives_the_safe_verdict_and_the_documented_destination(
    case: Hostile, land: Callable[[bytes, Any, Any, bool], None]
) -> None:
    blob = case.blob()
    store = MemoryPageStore(1 << 20) if case.store else None
    errors, states = [], []
    for one_pass in (False, True):
        engine = _engine(blob)
        before = engine.tobytes()
        with pytest.raises(HurrayWireError) as info:
            land(blob, engine, store, one_pass)
        errors.append(info.value)
        states.append(engine.tobytes())
        assert type(info.value) is case.error, info.value
        if not one_pass:
            assert states[0] == before  # the default: untouched on every refusal
        elif case.lands == "untouched":
            assert states[1] == before
        else:
            assert states[1] != before
    with pytest.raises(case.error) as plain:
        hw.decode(blob, page_store=store)
    assert str(errors[0]) == str(errors[1])
    assert _unplaced(errors[0]) == _unplaced(errors[1]) == _unplaced(plain.value)
    if case.lands == "pool":  # the refused bytes, exactly as the blob carries them
        e = ref.entry(blob, 0)
        stored = blob[e["offset"] : e["offset"] + e["stored_size"]]
        raw = hw.codecs.decompress(e["codec"], e["codec_param"], stored, e["raw_size"])
        assert states[1] == raw.tobytes()


@pytest.mark.parametrize(
    ("compression", "refs", "while_decoding"),
    [(None, False, False), (None, True, False), (ZSTD, False, True), (ZSTD, True, True),
     (CHUNKED, False, True), (SHUFFLE, False, False)],
    ids=["raw", "raw, refs", "zstd", "zstd, refs", "chunked", "shuffle-zstd (one frame)"],
)  # fmt: skip
def test_pages_are_digested_a_chunk_at_a_time_as_they_land(
    compression: hw.Compression | None, refs: bool, while_decoding: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Each page is digested once, in chunks of at most ~1 MiB of rows however far a
    threaded decompression's final prefix jumps; a compressed pool's chunks while its frame
    is still being decoded (each in cache as it comes), but for one byte-shuffled frame,
    whose planes end together."""
    t = _f16()
    store = _store_for(t) if refs else None
    blob = bytes(hw.encode(t, compression=compression, page_digests=True,
                           known_pages=None if store is None else store.digests()))  # fmt: skip
    log: list[tuple[int, bool]] = []
    decoding = [False]
    real = pipeline.decode_section  # type: ignore[attr-defined]

    def tracked(*args: Any) -> Any:
        decoding[0] = True
        try:
            return real(*args)
        finally:
            decoding[0] = False

    class Records(PageRecords):
        def digests(self) -> Any:
            log.append((int(self.pool.shape[0]), decoding[0]))
            return super().digests()

    monkeypatch.setattr(pipeline, "decode_section", tracked)
    monkeypatch.setattr(landing.arrays, "PageRecords", Records)
    engine = _engine(blob)
    hw.decode(blob, into=hw.IntoArray(engine, one_pass=True), page_store=store)
    assert engine.tobytes() == t.page_pool.tobytes()
    sent = PAGES - (len(store.digests()) if store is not None else 0)
    assert sum(n for n, _ in log) == sent  # every sent page once
    rows = (1 << 20) // (2 * int(np.prod(PAGE)))  # rows of 1 MiB
    if while_decoding:
        assert len(log) > 2 and all(during for _, during in log), log
        assert max(n for n, _ in log) <= max(rows, CHUNK // (2 * int(np.prod(PAGE)))), log
    elif compression is None:
        assert len(log) > 2 and max(n for n, _ in log) <= rows, log
    else:  # all of the pool when the frame's last plane is in, still ~1 MiB at a time
        assert [n for n, _ in log] == [rows] * (sent // rows), log


def test_a_final_prefix_that_jumps_is_still_digested_a_chunk_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Threads may finish a pool's first chunk last, so its final prefix jumps from nothing
    to all of it at once (here forced): the rows are still digested ~1 MiB at a time."""
    t = _f16()
    blob = bytes(hw.encode(t, compression=CHUNKED, page_digests=True))
    real = pipeline.decode_section  # type: ignore[attr-defined]

    def one_jump(*args: Any) -> Any:
        *head, progress = args
        result = real(*head, lambda n: None)  # type: ignore[call-arg]
        progress(args[3])  # raw_size: everything final at once
        return result

    log: list[int] = []

    class Records(PageRecords):
        def digests(self) -> Any:
            log.append(int(self.pool.shape[0]))
            return super().digests()

    monkeypatch.setattr(pipeline, "decode_section", one_jump)
    monkeypatch.setattr(landing.arrays, "PageRecords", Records)
    engine = _engine(blob)
    hw.decode(blob, into=hw.IntoArray(engine, one_pass=True))
    assert engine.tobytes() == t.page_pool.tobytes()
    rows = (1 << 20) // (2 * int(np.prod(PAGE)))
    assert log == [rows] * (PAGES // rows), log


@pytest.mark.parametrize(
    "compression", [ZSTD, SHUFFLE, CHUNKED, hw.Compression(3, min_size=0, chunk_size=1 << 20)],
    ids=["zstd", "shuffle-zstd", "chunked, 16 chunks", "chunked, 4 chunks"],
)  # fmt: skip
@pytest.mark.parametrize("threads", [0, -1])
def test_decode_section_reports_only_final_prefixes(
    compression: hw.Compression, threads: int
) -> None:
    """``progress(n)`` comes with ``n`` ascending, the output's first ``n`` bytes already
    final when it comes (whatever order the chunks finish in), and ``n`` = raw size last;
    a codec that cannot tell reports once, at the end."""
    raw = _f16().page_pool.reshape(-1).view(np.uint8)
    codec, param, stored = hw.codecs.compress(raw, compression, 2)
    assert codec == compression.codec
    out = np.zeros_like(raw)
    seen: list[int] = []

    def progress(n: int) -> None:
        assert n > (seen[-1] if seen else 0)
        assert out[:n].tobytes() == raw[:n].tobytes()  # final when reported
        seen.append(n)

    src = np.frombuffer(stored, np.uint8)
    pipeline.decode_section(codec, param, src, raw.size, threads, out, progress)  # type: ignore[attr-defined]
    assert seen[-1] == raw.size and out.tobytes() == raw.tobytes()
    if codec == SHUFFLE.codec:  # the planes end together
        assert seen == [raw.size]
    elif codec == ZSTD.codec or threads == 0:  # 1 MiB steps of a frame; chunk by chunk
        step = compression.chunk_size if codec == CHUNKED.codec else 1 << 20
        assert seen == list(range(step, raw.size + 1, step))


def test_a_codec_that_cannot_tell_reports_its_output_at_the_end() -> None:
    raw = np.arange(1000, dtype=np.uint8)
    out, seen = np.zeros_like(raw), list[int]()
    pipeline.decode_section(0, 0, raw, raw.size, 0, out, seen.append)  # type: ignore[attr-defined]
    assert seen == [raw.size] and out.tobytes() == raw.tobytes()
