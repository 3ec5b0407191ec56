"""Every route into memory runs the same checks in the same order (issues 20, 31).

Each hostile blob goes through every route that can carry it: ``decode``, ``decode`` into
an engine array (``IntoArray``) and at page ids (``IntoPages``), ``StreamReader`` (plain and
``into=InPlace``), ``StreamFile.read(into=)`` (array and page ids), ``decode`` in place
(``InPlace``), the connector's vLLM landing (``checked_write``) and the NIXL receiver
(``expect`` into ``IntoArray``, ``IntoPages`` and ``InPlace``). Every route
must refuse it with the same error (type, field and section; for NIXL a ``TransportError``
whose cause is that error), a blob with two defects with the same one first, and a
destination the route copies into must be untouched, the pool's own checks included (its
section checksum, page digests, the page store's pages, decompression: docs/decisions.md
"Nothing lands before every check"). Only ``one_pass=True``, an explicit opt-in, may leave
refused bytes: for NIXL's ``IntoArray(..., one_pass=True)`` exactly the raw pool the peer
sent, READ into the engine's memory before any check (the default READs it into the
receiver's staging ring).
"""

from __future__ import annotations

import contextlib
import io
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire import dtypes
from hurray_wire.blob import peek_descriptor
from hurray_wire.containers import StreamFile, StreamReader
from hurray_wire.errors import (
    ArgumentTypeError,
    ChecksumError,
    DecompressionError,
    HurrayWireError,
    IncompatibleFingerprintError,
    IndexBufferError,
    InvalidStreamError,
    PaddingError,
    PageDigestError,
    PageStoreMissError,
)
from hurray_wire.integrity import (
    EngineFingerprint,
    EnginePoolStore,
    MemoryPageStore,
    fingerprint_to_metadata,
    store_pages,
)
from tests import blob_reference as ref

FP = EngineFingerprint("m", "vllm", "0.9", "NHD", "float16", 16, 0, 1)
OTHER = EngineFingerprint("m", "vllm", "1.0", "NHD", "float16", 16, 0, 1)
PAGE = (4, 2, 8)
PAGES = 6
ENGINE_PAGES = 16
SENTINEL = 0x5A
PAGE_DIGESTS = 0x04  # the page-digests section's kind (docs/integrity.md)
ZSTD_ALL = hw.Compression(1, min_size=0)  # zstd (codec 1) for sections of any size


def _f16(layer: int = 1, *, metadata: Any = None, smooth: bool = False) -> hw.BlockPagedTensor:
    rng = np.random.default_rng(layer)
    pool = rng.standard_normal((PAGES, *PAGE)).astype(np.float16)
    if smooth:  # compressible: zstd stores the pool compressed
        pool = np.repeat(pool[:, :1], PAGE[0], axis=1).round(1)
    return hw.BlockPagedTensor.from_arrays(
        pool, [3, 0, 5, 1, 2, 4], [0, 2, 6], seq_lens=[7, 13], kv_role="key",
        layer_index=layer, metadata=metadata,
    )  # fmt: skip


def _int4() -> hw.BlockPagedTensor:
    codes = np.arange(9, dtype=np.uint8) % 16  # 9 nibbles: the last byte's high half pads
    pool = codes.view(dtypes.int4.numpy_dtype).reshape(3, 1, 1, 3)
    return hw.BlockPagedTensor.from_arrays(pool, [0, 1, 2], [0, 3], kv_role="key", layer_index=1)


def _section_number(blob: bytes, kind: int) -> int:
    """The table position of the first section of ``kind`` (read as the reference does)."""
    offset, fmt = ref.HEADER_FIELDS["section_count"]
    (count,) = struct.unpack_from("<" + fmt, blob, offset)
    return next(k for k in range(count) if ref.entry(blob, k)["kind"] == kind)


def _padding_bits() -> bytes:
    blob = bytes(hw.encode(_int4()))
    last = ref.entry(blob, 0)["stored_size"] - 1
    byte = blob[ref.entry(blob, 0)["offset"] + last]
    return ref.patch_payload(blob, 0, last, bytes([byte | 0xF0]))  # checksums kept valid


def _flipped_pool_byte(metadata: Any = None) -> bytes:
    blob = bytearray(hw.encode(_f16(metadata=metadata)))
    blob[ref.entry(bytes(blob), 0)["offset"] + 5] ^= 1  # buffer[0], its checksum left
    return bytes(blob)


def _corrupt_frame() -> bytes:
    blob = bytes(hw.encode(_f16(smooth=True), compression=ZSTD_ALL))
    e = ref.entry(blob, 0)
    assert e["codec"] == 1  # stored as one zstd frame
    middle = e["stored_size"] // 2
    return ref.patch_payload(blob, 0, middle, bytes(8))  # section checksum kept valid


def _store_miss() -> bytes:
    t = _f16()
    store = MemoryPageStore(1 << 20)
    store_pages(store, t, [0, 1])
    return bytes(hw.encode(t, known_pages=store.digests()))  # the receiver's store is empty


def _bad_digest() -> bytes:
    blob = bytes(hw.encode(_f16(), page_digests=True))
    number = _section_number(blob, PAGE_DIGESTS)
    e = ref.entry(blob, number)
    last = e["stored_size"] - 1  # the top byte of the last page's digest
    return ref.patch_payload(blob, number, last, bytes([blob[e["offset"] + last] ^ 1]))


@dataclass(frozen=True)
class Case:
    name: str
    blob: Callable[[], bytes]
    error: type[HurrayWireError]
    fingerprint: EngineFingerprint | None = None  # the receiver's expected fingerprint
    header: hw.StreamHeader | None = None  # the stream routes' header
    in_place: bool = True  # an in-place route can carry it (unpacked element types only)
    clean: Callable[[], hw.BlockPagedTensor] = lambda: _f16()  # what the NIXL sender offers
    store: bool = False  # the copying routes get an empty page store
    pages: bool = True  # the page-id routes can carry it (an engine pool of whole pages)


CASES = [
    Case(
        "int4 padding bits set",
        _padding_bits,
        PaddingError,
        in_place=False,
        clean=_int4,
        pages=False,
    ),
    Case("a wrong page digest", _bad_digest, PageDigestError),
    Case("a flipped pool byte", _flipped_pool_byte, ChecksumError),
    Case("a corrupt zstd pool, checksum valid", _corrupt_frame, DecompressionError),
    Case("a page the store lacks", _store_miss, PageStoreMissError, in_place=False, store=True),
    Case(
        "another engine fingerprint",
        lambda: bytes(hw.encode(_f16(metadata=fingerprint_to_metadata(OTHER)))),
        IncompatibleFingerprintError,
        fingerprint=FP,
        header=hw.StreamHeader(fingerprint=FP),
        clean=lambda: _f16(metadata=fingerprint_to_metadata(OTHER)),
    ),
    Case(  # a compressed pool is decompressed into the destination only after every check
        "another engine fingerprint, compressed",
        lambda: bytes(
            hw.encode(
                _f16(metadata=fingerprint_to_metadata(OTHER), smooth=True), compression=ZSTD_ALL
            )
        ),
        IncompatibleFingerprintError,
        fingerprint=FP,
        header=hw.StreamHeader(fingerprint=FP),
        clean=lambda: _f16(metadata=fingerprint_to_metadata(OTHER), smooth=True),
    ),
    Case(  # two defects: every route names the same one first (the pool's checksum is
        # checked before the metadata holding the fingerprint is read)
        "a flipped pool byte and another engine fingerprint",
        lambda: _flipped_pool_byte(metadata=fingerprint_to_metadata(OTHER)),
        ChecksumError,
        fingerprint=FP,
        header=hw.StreamHeader(fingerprint=FP),
        clean=lambda: _f16(metadata=fingerprint_to_metadata(OTHER)),
    ),
]


def _cause(exc: BaseException) -> BaseException:
    """The route-independent cause: a transport error's cause, else the error itself."""
    if isinstance(exc, hw.errors.TransportError) and exc.__cause__ is not None:
        return exc.__cause__
    return exc


def _has_digests(blob: bytes) -> bool:
    try:
        _section_number(blob, PAGE_DIGESTS)
    except StopIteration:
        return False
    return True


def _engine_like(blob: bytes) -> np.ndarray[Any, Any]:
    """An engine array of the blob's pool dtype and shape, every byte SENTINEL."""
    d = peek_descriptor(blob)
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    if d.element_type.is_packed:
        shape, dtype = (d.buffers[0].byte_size,), np.dtype(np.uint8)
    else:
        shape = (d.layout.num_pages, d.layout.page_size, *d.shape[1:])
        dtype = d.element_type.numpy_dtype
    size = int(np.prod(shape)) * dtype.itemsize
    return np.full(size, SENTINEL, np.uint8).view(dtype).reshape(shape)


def _sentinel(shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    return np.full((*shape[:-1], 2 * shape[-1]), SENTINEL, np.uint8).view(np.float16)


def _stream(case: Case, blob: bytes) -> bytes:
    """A stream of ``blob`` after the case's stream header (no end record)."""
    sink = io.BytesIO()
    writer = hw.StreamWriter(sink, case.header or hw.StreamHeader(), index=False)
    head = sink.getvalue()
    writer.abort()
    return head + blob


def _pool_store() -> tuple[EnginePoolStore, np.ndarray[Any, Any]]:
    engine = _sentinel((ENGINE_PAGES, *PAGE))
    return EnginePoolStore(engine), engine


def _store(case: Case) -> MemoryPageStore | None:
    return MemoryPageStore(1 << 20) if case.store else None


# -- the routes: each returns the error raised and whether its destination is untouched --
def route_decode(case: Case, blob: bytes) -> tuple[BaseException, bool]:
    with pytest.raises(HurrayWireError) as info:
        hw.decode(blob, expect_fingerprint=case.fingerprint, page_store=_store(case))
    return info.value, True


def route_stream_reader(case: Case, blob: bytes) -> tuple[BaseException, bool]:
    with pytest.raises(HurrayWireError) as info:
        list(StreamReader(_stream(case, blob), expect_fingerprint=case.fingerprint,
                          page_store=_store(case)))  # fmt: skip
    return info.value, True


def route_reader_in_place(case: Case, blob: bytes) -> tuple[BaseException, bool]:
    store, engine = _pool_store()
    before = engine.copy()
    target = hw.InPlace(store, np.arange(ENGINE_PAGES - PAGES, ENGINE_PAGES))
    with pytest.raises(HurrayWireError) as info:
        list(StreamReader(_stream(case, blob), expect_fingerprint=case.fingerprint,
                          into=lambda d, n: target))  # fmt: skip
    return info.value, engine.tobytes() == before.tobytes()


def route_decode_in_place(case: Case, blob: bytes) -> tuple[BaseException, bool]:
    store, engine = _pool_store()
    before = engine.copy()
    with pytest.raises(HurrayWireError) as info:
        hw.decode(
            blob, into=hw.InPlace(store, np.arange(PAGES)), expect_fingerprint=case.fingerprint
        )
    return info.value, engine.tobytes() == before.tobytes()


def _engine_pool(blob: bytes) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """An engine pool of ENGINE_PAGES pages of the blob's page form (every byte SENTINEL)
    and the distinct, unordered page ids the blob's pages land on."""
    like = _engine_like(blob)
    page = like[:1].view(np.uint8).shape  # one page as bytes
    pool = np.full((ENGINE_PAGES, *page[1:]), SENTINEL, np.uint8)
    ids = np.arange(like.shape[0])[::-1] * 2 + 1  # every other page, descending
    return pool.view(like.dtype), ids


def _into_array(blob: bytes) -> tuple[Any, np.ndarray[Any, Any]]:
    engine = _engine_like(blob)
    return hw.IntoArray(engine), engine


def _into_pages(blob: bytes) -> tuple[Any, np.ndarray[Any, Any]]:
    engine, ids = _engine_pool(blob)
    return hw.IntoPages(engine, ids), engine


def _decode_route(make: Callable[[bytes], tuple[Any, Any]]) -> Callable[..., Any]:
    def route(case: Case, blob: bytes) -> tuple[BaseException, bool]:
        target, engine = make(blob)
        before = engine.copy()
        with pytest.raises(HurrayWireError) as info:
            hw.decode(blob, into=target, expect_fingerprint=case.fingerprint,
                      page_store=_store(case))  # fmt: skip
        return info.value, engine.tobytes() == before.tobytes()

    return route


def _stream_file_route(make: Callable[[bytes], tuple[Any, Any]]) -> Callable[..., Any]:
    def route(case: Case, blob: bytes) -> tuple[BaseException, bool]:
        target, engine = make(blob)
        before = engine.copy()
        with (
            pytest.raises(HurrayWireError) as info,
            StreamFile(
                _stream(case, blob), expect_fingerprint=case.fingerprint, page_store=_store(case)
            ) as f,
        ):
            f.read(f.entries[0], into=target)
        return info.value, engine.tobytes() == before.tobytes()

    return route


route_decode_into = _decode_route(_into_array)
route_decode_into_pages = _decode_route(_into_pages)
route_stream_file = _stream_file_route(_into_array)
route_stream_file_pages = _stream_file_route(_into_pages)


def _vllm_cache() -> np.ndarray[Any, Any]:
    """A FLASH_ATTN layer cache as vLLM lays it out ([blocks, H, block_size, 2 * D], memory
    in LBNHC order: create_kv_cache_views' strides), 16-token blocks, every byte SENTINEL."""
    memory = np.full((4, 16, PAGE[1], 4 * PAGE[2]), SENTINEL, np.uint8).view(np.float16)
    cache: np.ndarray[Any, Any] = memory.transpose(0, 2, 1, 3)
    return cache


def _vllm_land(case: Case, blob: bytes, cache: np.ndarray[Any, Any]) -> None:
    """The connector's landing of one layer: the blob decoded (its pages in the engine's
    16-token blocks, key and value alike), then every check of every layer before the
    write (``backends.land_layers`` over ``into_vllm``'s ``checked_write``)."""
    from hurray_wire.adapters.vllm_landing import checked_write
    from hurray_wire.transforms.repage import repage

    key = repage(hw.decode(blob, expect_fingerprint=case.fingerprint, page_store=_store(case)), 16)
    value = hw.BlockPagedTensor.from_arrays(
        key.page_pool, key.block_table, key.seq_ptr, seq_lens=key.seq_lens, kv_role="value",
        layer_index=key.layer_index,
    )  # fmt: skip
    checked_write((key, value), cache, [[1], [2]], backend="FLASH_ATTN")()


def route_vllm_landing(case: Case, blob: bytes) -> tuple[BaseException, bool]:
    cache = _vllm_cache()
    before = cache.copy()
    with pytest.raises(HurrayWireError) as info:
        _vllm_land(case, blob, cache)
    return info.value, cache.tobytes() == before.tobytes()


def test_the_vllm_route_lands_a_valid_blob() -> None:
    """The control of ``route_vllm_landing``: a valid blob lands, in blocks 1 and 2 only."""
    cache = _vllm_cache()
    before = cache.copy()
    _vllm_land(Case("valid", lambda: b"", HurrayWireError), bytes(hw.encode(_f16())), cache)
    changed = (cache != before).reshape(cache.shape[0], -1).any(axis=1)
    assert changed.tolist() == [False, True, True, False]


ROUTES = {
    "decode": route_decode,
    "decode into an array": route_decode_into,
    "decode at page ids": route_decode_into_pages,
    "StreamReader": route_stream_reader,
    "StreamFile into an array": route_stream_file,
    "StreamFile at page ids": route_stream_file_pages,
    "the vLLM landing": route_vllm_landing,
}
IN_PLACE_ROUTES = {
    "StreamReader in place": route_reader_in_place,
    "decode in place": route_decode_in_place,
}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_route_gives_the_same_verdict_and_leaves_the_destination(case: Case) -> None:
    blob = case.blob()
    verdicts = {}
    routes = {n: r for n, r in ROUTES.items() if case.pages or "page ids" not in n}
    for name, route in {**routes, **(IN_PLACE_ROUTES if case.in_place else {})}.items():
        error, untouched = route(case, blob)
        cause = _cause(error)
        assert isinstance(cause, case.error), (name, error)
        assert isinstance(cause, HurrayWireError)
        verdicts[name] = (type(cause), cause.field, cause.section)
        assert untouched, f"{name} wrote its destination before refusing"
    assert len(set(verdicts.values())) == 1, verdicts


def test_the_stream_header_is_checked_before_an_in_place_write() -> None:
    """StreamReader(into=InPlace) checked the stream header after writing the free pages."""
    blob = bytes(hw.encode(_f16(layer=5)))
    case = Case("layer outside num_layers", lambda: blob, InvalidStreamError,
                header=hw.StreamHeader(num_layers=2))  # fmt: skip
    for route in (route_stream_reader, route_reader_in_place, route_stream_file):
        error, untouched = route(case, blob)
        assert isinstance(error, InvalidStreamError) and untouched, route.__name__


# -- what the engine array must be ---------------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [
        lambda shape: np.zeros(shape, dtypes.bfloat16.numpy_dtype),  # same bytes, other values
        lambda shape: np.zeros(int(np.prod(shape)) // 2, np.float32),  # same bytes, half long
        lambda shape: np.zeros((shape[0] * 2, *shape[1:]), np.float16)[: shape[0]].copy()[:, :2],
        lambda shape: np.zeros(shape, np.int16),
    ],
    ids=["bfloat16", "float32 half length", "other page shape", "int16"],
)
def test_landing_refuses_an_array_of_another_type_or_shape(make: Any) -> None:
    t = _f16()
    blob = bytes(hw.encode(t))
    engine = make(t.page_pool.shape)
    before = engine.tobytes()
    with pytest.raises(ArgumentTypeError) as info:
        hw.decode(blob, into=hw.IntoArray(engine))
    assert info.value.field == "page_pool" and engine.tobytes() == before
    with (
        StreamFile(_stream(Case("", lambda: blob, HurrayWireError), blob)) as f,
        pytest.raises(ArgumentTypeError),
    ):
        f.read(f.entries[0], into=hw.IntoArray(engine))
    assert engine.tobytes() == before


def test_landing_takes_the_pool_dtype_and_shape_or_its_bytes() -> None:
    t = _f16()
    blob = bytes(hw.encode(t))
    for engine in (np.empty_like(t.page_pool), np.empty(t.page_pool.nbytes, np.uint8)):
        got = hw.decode(blob, into=hw.IntoArray(engine))
        assert got.page_pool.tobytes() == t.page_pool.tobytes()
        assert np.shares_memory(got.page_pool, engine)


def test_decode_into_refuses_a_destination_overlapping_its_input() -> None:
    t = _f16()
    buffer = bytearray(hw.encode(t)) + bytearray(t.page_pool.nbytes)
    before = bytes(buffer)
    whole = np.frombuffer(buffer, np.uint8)
    at = bytes(buffer).find(t.page_pool.tobytes())
    for start in (at, at + 64, 0):
        engine = whole[start : start + t.page_pool.nbytes]
        with pytest.raises(ArgumentTypeError, match="overlaps"):
            hw.decode(memoryview(buffer), into=hw.IntoArray(engine))
        assert bytes(buffer) == before
    # the spare bytes after the blob do not overlap it
    tail = whole[len(before) - t.page_pool.nbytes :]
    assert hw.decode(
        memoryview(buffer)[: len(before) - t.page_pool.nbytes], into=hw.IntoArray(tail)
    )


@pytest.mark.parametrize(
    "edit",
    [
        lambda t: t.block_table.__setitem__(0, PAGES),  # a page id outside the pool
        lambda t: t.seq_ptr.__setitem__(1, 5),  # seq_lens now disagree
        lambda t: t.seq_lens.__setitem__(0, 8),  # sum(seq_lens) != total_tokens
    ],
    ids=["block_table", "seq_ptr", "seq_lens"],
)
def test_encode_refuses_index_arrays_changed_after_from_arrays(edit: Any) -> None:
    rng = np.random.default_rng(0)
    pool = rng.standard_normal((PAGES, *PAGE)).astype(np.float16)
    table = np.array([3, 0, 5, 1, 2, 4], np.uint32)
    starts = np.array([0, 2, 6], np.uint32)
    lens = np.array([7, 13], np.uint64)
    t = hw.BlockPagedTensor.from_arrays(pool, table, starts, seq_lens=lens)
    assert np.shares_memory(t.block_table, table)  # shared, as documented
    edit(t)
    for encode in (
        lambda: hw.encode(t),
        lambda: hw.encode(t, compression=ZSTD_ALL),
        lambda: hw.encode_parts(t),
        lambda: hw.encode_into(t, bytearray(1 << 16)),
    ):
        with pytest.raises(IndexBufferError):
            encode()


# -- NIXL ----------------------------------------------------------------------------------
def _nixl() -> Any:
    try:
        from hurray_wire.transport import nixl
    except hw.errors.TransportError as exc:
        pytest.skip(f"NIXL cannot load here: {exc}")
    return nixl


def _serve(
    nixl: Any, blob: bytes, tensor: hw.BlockPagedTensor, expect: Callable[[Any], None],
    fingerprint: EngineFingerprint | None, monkeypatch: pytest.MonkeyPatch,
) -> BaseException:  # fmt: skip
    """Publish ``tensor`` (staged) with its bytes replaced by ``blob``; the refusal."""
    from hurray_wire.transport import nixl_sender

    def planned(_: Any, *args: Any) -> tuple[int, Callable[[Any], int]]:  # the staged path
        def write(view: Any) -> int:
            np.frombuffer(view, np.uint8)[: len(blob)] = np.frombuffer(blob, np.uint8)
            return len(blob)

        return len(blob), write

    monkeypatch.setattr(nixl_sender, "planned_into", planned)
    s = nixl.NixlSender("landing-sender", ucx_error_handling_mode="none", arena_bytes=1 << 20)
    r = nixl.NixlReceiver("landing-receiver", ucx_error_handling_mode="none",
                          arena_bytes=1 << 20, expect_fingerprint=fingerprint)  # fmt: skip
    try:
        expect(r)
        s.add_peer(r.metadata())
        r.add_peer(s.metadata())
        digests = _has_digests(blob)
        s.publish(tensor, mode="staged", page_digests=digests)

        def drive() -> None:
            with contextlib.suppress(hw.errors.TransportError):
                s.wait(deadline=10)

        thread = threading.Thread(target=drive)
        thread.start()
        try:
            with pytest.raises(hw.errors.TransportError) as info:
                list(r.receive(1, deadline=10))
        finally:
            thread.join()
        return info.value
    finally:
        s.close()
        r.close()


def _expected_state(blob: bytes, engine: np.ndarray[Any, Any], ids: Any, before: bytes) -> bytes:
    """What ``one_pass=True`` leaves on a refusal: NIXL READ a raw pool straight into the
    engine's pages, so they hold the bytes the peer sent; a compressed pool is not split
    (decompressed from the landing region after every check): untouched."""
    e = ref.entry(blob, 0)
    if e["codec"] != 0:
        return before
    sent = np.frombuffer(blob, np.uint8)[e["offset"] : e["offset"] + e["stored_size"]]
    after = np.frombuffer(bytearray(before), np.uint8)
    if ids is None:
        after[...] = sent
    else:
        rows = after.reshape(engine.shape[0], -1)
        rows[ids] = sent.reshape(len(ids), -1)
    return after.tobytes()


HOW = ["array", "page_ids", "in_place", "array one_pass", "page_ids one_pass"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("how", HOW)
def test_nixl_routes_give_the_same_verdict(
    case: Case, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every NIXL landing refuses each hostile blob with the cause ``decode`` gives; the
    engine's memory is untouched unless ``one_pass=True``, where it holds exactly the
    bytes the peer sent (its raw pool) and nothing else changed."""
    nixl = _nixl()
    blob = case.blob()
    tensor = case.clean()
    if how == "in_place" and not case.in_place:
        pytest.skip("in place takes unpacked element types only")
    if case.store:
        pytest.skip("the NIXL sender offers whole pools (delta blobs: test_integrity_delta)")
    if how.startswith("page_ids") and tensor.element_type.is_packed:
        pytest.skip("page ids take an engine pool of whole pages")
    one_pass = how.endswith("one_pass")
    engine = _engine_like(blob)
    store = None
    ids = None
    if how.startswith("page_ids") or how == "in_place":
        store, engine = _pool_store()
        ids = np.arange(PAGES) + 3 if how.startswith("page_ids") else None
    before = engine.tobytes()

    def expect(r: Any) -> None:
        r.register(engine)
        if how == "in_place":
            assert store is not None  # made above for in_place
            r.expect(tensor.layer_index, tensor.kv_role, hw.InPlace(store, np.arange(PAGES)))
        else:
            into = (
                hw.IntoArray(engine, one_pass=one_pass)
                if ids is None
                else hw.IntoPages(engine, ids, one_pass=one_pass)
            )
            r.expect(tensor.layer_index, tensor.kv_role, into)

    error = _serve(nixl, blob, tensor, expect, case.fingerprint, monkeypatch)
    assert isinstance(_cause(error), case.error), error
    expected = _expected_state(blob, engine, ids, before) if one_pass else before
    assert engine.tobytes() == expected


def test_nixl_in_place_checks_the_offered_layer_before_writing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """expect(InPlace) wrote the free pages, then found the blob was another layer's."""
    nixl = _nixl()
    offered = _f16(layer=1)
    blob = bytes(hw.encode(_f16(layer=2)))  # same layout, another layer
    store, engine = _pool_store()
    before = engine.tobytes()

    def expect(r: Any) -> None:
        r.expect(1, "key", hw.InPlace(store, np.arange(PAGES)))

    error = _serve(nixl, blob, offered, expect, None, monkeypatch)
    assert "not the one offered" in str(error)
    assert engine.tobytes() == before


def _another_layer() -> tuple[bytes, Any]:
    return bytes(hw.encode(_f16(layer=2))), _engine_like(bytes(hw.encode(_f16())))


def _another_dtype() -> tuple[bytes, Any]:
    return bytes(hw.encode(_f16())), np.full((PAGES, *PAGE), 7, dtypes.bfloat16.numpy_dtype)


def _half_length() -> tuple[bytes, Any]:  # same bytes, float32 of half the length
    return bytes(hw.encode(_f16())), np.full(PAGES * int(np.prod(PAGE)) // 2, 7, np.float32)


def _short() -> tuple[bytes, Any]:  # one page short: refused at the offer, before any READ
    return bytes(hw.encode(_f16())), np.full((PAGES - 1, *PAGE), 7, np.float16)


MISFITS = {
    "another layer than offered": (_another_layer, "not the one offered"),
    "bfloat16 into float16": (_another_dtype, "page pool type"),
    "float32 of half the length": (_half_length, "page pool type"),
    "an array one page short": (_short, "differs from the engine's array"),
}


@pytest.mark.parametrize("name", list(MISFITS))
@pytest.mark.parametrize("one_pass", [False, True], ids=["staged", "one_pass"])
def test_nixl_landing_refuses_a_misfit(
    name: str, one_pass: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blob of another layer, an engine array of another dtype or length: refused by
    default before the engine array is written; with one_pass the READ came first, so the
    array holds the sent pool (except a size the offer already shows wrong: untouched)."""
    nixl = _nixl()
    make, message = MISFITS[name]
    blob, engine = make()
    before = engine.tobytes()

    def expect(r: Any) -> None:
        r.register(engine)
        r.expect(1, "key", hw.IntoArray(engine, one_pass=one_pass))

    error = _serve(nixl, blob, _f16(), expect, None, monkeypatch)
    assert message in str(error), error
    landed = one_pass and name != "an array one page short"
    assert engine.tobytes() == (_expected_state(blob, engine, None, before) if landed else before)


def test_nixl_expect_refuses_overlapping_destinations() -> None:
    """Two expected blobs on the same bytes, or a page_pool in the receiver's own memory
    (a yielded tensor's view of its landing region): refused when expect() is called."""
    nixl = _nixl()
    r = nixl.NixlReceiver("overlap-receiver", ucx_error_handling_mode="none", arena_bytes=1 << 20)
    try:
        engine = np.zeros((ENGINE_PAGES, *PAGE), np.float16)
        r.expect(0, "key", hw.IntoArray(engine[:PAGES]))
        with pytest.raises(ArgumentTypeError, match="overlaps") as info:
            r.expect(0, "value", hw.IntoArray(engine[PAGES - 1 : 2 * PAGES - 1]))
        assert info.value.field == "page_pool"
        r.expect(1, "key", hw.IntoPages(engine, [PAGES, PAGES + 2]))  # other pages: fine
        with pytest.raises(ArgumentTypeError, match="overlaps"):
            r.expect(1, "value", hw.IntoPages(engine, [PAGES + 3, PAGES + 2]))
        r.expect(0, "key", hw.IntoArray(engine[:PAGES]))  # the same blob again replaces its landing
        own = r._arena.buf[: engine[:PAGES].nbytes].view(np.float16).reshape(PAGES, *PAGE)
        with pytest.raises(ArgumentTypeError, match="overlaps"):
            r.expect(2, "key", hw.IntoArray(own))
    finally:
        r.close()


@pytest.mark.parametrize("make", [_bad_digest, _flipped_pool_byte])
def test_one_pass_is_an_opt_in_that_may_leave_refused_bytes(make: Any) -> None:
    """``one_pass=True`` checks the pool while it lands: the same verdict, but the
    destination then holds the refused bytes (the default leaves it untouched, above)."""
    blob = make()
    expected = type(_cause(route_decode(CASES[0], blob)[0]))
    lands: list[Callable[[Any], Any]] = [
        lambda e: hw.decode(blob, into=hw.IntoArray(e, one_pass=True)),
        lambda e: StreamFile(_stream(CASES[0], blob)).tensor(
            1, "key", into=hw.IntoArray(e, one_pass=True)
        ),
    ]
    for land in lands:
        engine = _engine_like(blob)
        before = engine.tobytes()
        with pytest.raises(expected):
            land(engine)
        assert engine.tobytes() != before
    with pytest.raises(ArgumentTypeError, match="one_pass"):
        hw.decode(blob, into=hw.IntoArray(_engine_like(blob), one_pass=1))  # type: ignore[arg-type]


def test_one_pass_decompresses_the_pool_into_the_destination() -> None:
    """One pass: the pool is decompressed into the engine's array, never into a new 4 MiB
    array that is then copied (NumPy reports its allocations to tracemalloc)."""
    import tracemalloc

    pool = np.zeros((256, 16, 8, 64), np.float16)
    pool[:, 0] = 1.5
    t = hw.BlockPagedTensor.from_arrays(pool, np.arange(256), [0, 256])
    blob = bytes(hw.encode(t, compression=ZSTD_ALL))
    assert len(blob) < pool.nbytes // 8  # stored compressed
    engine = np.empty_like(pool)
    hw.decode(blob, into=hw.IntoArray(engine, one_pass=True))  # warm: plans and memo
    tracemalloc.start()
    try:
        got = hw.decode(blob, into=hw.IntoArray(engine, one_pass=True))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got.page_pool is engine and engine.tobytes() == pool.tobytes()
    assert peak < pool.nbytes // 4, peak
