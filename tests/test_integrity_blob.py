"""Issue 14 in the blob: page-digests (0x04) and page-refs (0x05) sections, decode_report,
the page store on decode, the engine fingerprint check."""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire import dtypes, errors as hwe
from hurray_wire.blob import decode, decode_report, encode, encode_into, encode_parts
from hurray_wire.blob.pages import DecodeReport
from hurray_wire.integrity import (
    EngineFingerprint,
    MemoryPageStore,
    PageStore,
    encode_digest_section,
    encode_page_refs,
    fingerprint_to_metadata,
    page_digests,
    plan_delta,
    store_pages,
)
from tests import blob_reference as ref
from tests.conftest import random_pool

ALL_TYPES = [t for t in dtypes.ELEMENT_TYPES if t.name != "float128"]
KIND_DIGESTS, KIND_REFS = 0x04, 0x05


def spec_tensor(pool: Any = None, **kw: Any) -> hw.BlockPagedTensor:
    """5 pages of 4 tokens; sequences [0, 1] and [0, 3]: page 0 is a shared prefix; page 2
    and page 4 are unreferenced... page 4 is in neither."""
    if pool is None:
        pool = np.arange(5 * 4 * 2 * 8, dtype=np.float16).reshape(5, 4, 2, 8)
    return hw.BlockPagedTensor.from_arrays(pool, [0, 1, 0, 3], [0, 2, 4], **kw)


def quantized(asym: bool = True, shared: bool = False, seed: int = 3) -> hw.BlockPagedTensor:
    rng = np.random.default_rng(seed)
    pool = rng.integers(-128, 127, (5, 4, 2, 8), dtype=np.int8)
    zp = (3 if shared else 4) if asym else None
    q = hw.PerBlockAffine(0, 4, 3, hw.float32, zp)
    extra: dict[str, Any] = {"scales": rng.uniform(0.1, 1, 20).astype(np.float32)}
    if asym:
        extra["zero_points"] = rng.integers(-5, 5, 20).astype(np.int32)
    return spec_tensor(pool, quantization=q, **extra)


def same(a: hw.BlockPagedTensor, b: hw.BlockPagedTensor) -> None:
    assert a.descriptor == b.descriptor
    for x, y in zip(a.buffer_arrays(), b.buffer_arrays(), strict=True):
        assert b"".join(p.tobytes() for p in x) == b"".join(p.tobytes() for p in y)
    assert a.metadata == b.metadata


def kinds(blob: Any) -> list[int]:
    count = struct.unpack_from("<H", blob, 20)[0]
    return [ref.entry(bytes(blob), n)["kind"] for n in range(count)]


def number_of(blob: Any, kind: int) -> int:
    return kinds(blob).index(kind)


def full_store(t: hw.BlockPagedTensor) -> MemoryPageStore:
    store = MemoryPageStore(1 << 24)
    store_pages(store, t, range(t.layout.num_pages))
    return store


TENSORS: dict[str, Callable[[], hw.BlockPagedTensor]] = {
    **{t.name: functools.partial(lambda e: spec_tensor(random_pool(e)), t) for t in ALL_TYPES},
    "per_block_sym": lambda: quantized(False),
    "per_block_asym": lambda: quantized(True),
    "per_block_shared_buffer": lambda: quantized(True, shared=True),
}


# -- page digests ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TENSORS))
def test_digests_round_trip_every_type(name: str) -> None:
    t = TENSORS[name]()
    blob = bytes(encode(t, page_digests=True))
    assert kinds(blob)[-1] == KIND_DIGESTS
    n = number_of(blob, KIND_DIGESTS)
    e = ref.entry(blob, n)
    assert e["section_flags"] == 0  # optional: an older reader skips it
    assert blob[e["offset"] : e["offset"] + e["stored_size"]] == encode_digest_section(
        page_digests(t)
    )
    same(decode(blob), t)
    report = decode_report(blob)
    assert report.ok and report.has_digests and report.positions == ()
    assert b"".join(encode_parts(t, page_digests=True)) == blob
    out = bytearray(len(blob))
    assert encode_into(t, out, page_digests=True) == len(blob) and bytes(out) == blob


def test_without_the_options_blobs_are_unchanged() -> None:
    t = quantized()
    plain = bytes(encode(t))
    assert bytes(encode(t, page_digests=False, known_pages=None)) == plain
    assert KIND_DIGESTS not in kinds(plain) and KIND_REFS not in kinds(plain)


def test_large_tensor_digests_through_the_copy_path() -> None:
    pool = random_pool(dtypes.float16, (64, 16, 8, 64))  # 16 MiB: chunked copy + hash
    t = hw.BlockPagedTensor.from_arrays(pool, list(range(64)), [0, 32, 64])
    blob = encode(t, page_digests=True)
    assert bytes(blob) == b"".join(encode_parts(t, page_digests=True))
    same(decode(blob), t)


def _corrupt_pool(blob: bytes, page: int, t: hw.BlockPagedTensor, *, keep_checksum: bool) -> bytes:
    page_nbytes = t.page_pool.nbytes // t.layout.num_pages
    e = ref.entry(blob, 0)
    at = page * page_nbytes + 3
    flipped = bytes([blob[e["offset"] + at] ^ 0x40])
    if keep_checksum:
        return ref.patch_payload(blob, 0, at, flipped)
    out = bytearray(blob)
    out[e["offset"] + at] ^= 0x40
    return bytes(out)


def test_corrupt_page_raises_with_pages_and_positions() -> None:
    t = spec_tensor()
    blob = bytes(encode(t, page_digests=True))
    # The section checksum is the whole-blob guard: decode stops there.
    with pytest.raises(hwe.ChecksumError):
        decode(_corrupt_pool(blob, 0, t, keep_checksum=False))
    # Damage the checksum pass cannot see (the sender's memory changed after digesting):
    bad = _corrupt_pool(blob, 0, t, keep_checksum=True)
    with pytest.raises(hwe.PageDigestError) as info:
        decode(bad)
    assert info.value.pages == (0,)
    assert info.value.positions == ((0, 0), (1, 0))  # the shared prefix, in both sequences
    assert decode(bad, verify=False).page_pool.shape == t.page_pool.shape


@pytest.mark.parametrize("keep_checksum", [False, True])
def test_report_names_the_corrupt_page_positions(keep_checksum: bool) -> None:
    t = spec_tensor()
    blob = bytes(encode(t, page_digests=True))
    report = decode_report(_corrupt_pool(blob, 0, t, keep_checksum=keep_checksum))
    assert report.pages.tolist() == [0] and report.digest_mismatch.tolist() == [0]
    assert report.positions == ((0, 0), (1, 0))
    assert np.array_equal(report.tensor.page_pool[1:], t.page_pool[1:])
    report = decode_report(_corrupt_pool(blob, 3, t, keep_checksum=keep_checksum))
    assert report.pages.tolist() == [3] and report.positions == ((1, 1),)
    report = decode_report(_corrupt_pool(blob, 4, t, keep_checksum=keep_checksum))
    assert report.pages.tolist() == [4] and report.positions == ()  # unreferenced page


def test_report_without_digests_still_raises_on_checksum() -> None:
    t = spec_tensor()
    blob = bytes(encode(t))
    with pytest.raises(hwe.ChecksumError):
        decode_report(_corrupt_pool(blob, 0, t, keep_checksum=False))


def test_report_other_sections_checksums_still_raise() -> None:
    t = spec_tensor(metadata={"a": 1})
    blob = bytes(encode(t, page_digests=True))
    n = kinds(blob).index(0x03)
    out = bytearray(blob)
    out[ref.entry(blob, n)["offset"] + 2] ^= 1
    with pytest.raises(hwe.ChecksumError) as info:
        decode_report(bytes(out))
    assert info.value.section == "metadata[0]"
    out = bytearray(blob)  # the block table is not covered by page digests
    out[ref.entry(blob, 1)["offset"]] ^= 1
    with pytest.raises(hwe.ChecksumError):
        decode_report(bytes(out))


def test_report_tolerated_checksum_that_no_digest_explains_raises() -> None:
    t = spec_tensor()
    blob = bytes(encode(t, page_digests=True))
    e = ref.entry(blob, 0)
    bad = ref.patch_entry(blob, 0, "checksum", e["checksum"] ^ 1)
    with pytest.raises(hwe.ChecksumError, match="no page digest"):
        decode_report(bad)


def test_corrupt_slot_scale_is_its_page() -> None:
    t = quantized()
    blob = bytes(encode(t, page_digests=True))
    n = 3  # the scales buffer: slots 8..11 belong to page 2... slot 13 to page 3
    out = bytearray(blob)
    out[ref.entry(blob, n)["offset"] + 13 * 4] ^= 0x01
    report = decode_report(bytes(out))
    assert report.pages.tolist() == [3] and report.positions == ((1, 1),)


# -- delta: page refs and the store ---------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TENSORS))
def test_delta_round_trip_every_type(name: str) -> None:
    t = TENSORS[name]()
    store = full_store(t)
    known = page_digests(t)[[0, 2, 3]]
    known.sort()
    blob = bytes(encode(t, known_pages=known))
    assert kinds(blob)[-1] == KIND_REFS
    e = ref.entry(blob, number_of(blob, KIND_REFS))
    assert e["section_flags"] == 1  # REQUIRED
    plan = plan_delta(t, known)
    assert blob[e["offset"] : e["offset"] + e["stored_size"]] == encode_page_refs(plan.refs)
    page_nbytes = t.page_pool.nbytes // 5
    assert ref.entry(blob, 0)["raw_size"] == plan.sent_pages.size * page_nbytes
    got = decode(blob, page_store=store)
    same(got, t)
    assert got.page_pool.flags.writeable  # a new array, rebuilt from sent pages + store
    with_digests = bytes(encode(t, known_pages=known, page_digests=True))
    same(decode(with_digests, page_store=store), t)
    assert decode_report(with_digests, page_store=store).ok
    assert b"".join(encode_parts(t, known_pages=known, page_digests=True)) == with_digests


def test_delta_with_compression() -> None:
    t = quantized()
    known = np.sort(page_digests(t)[[1, 4]])
    blob = encode(t, known_pages=known, compression="zstd:3")
    same(decode(blob, page_store=full_store(t)), t)


def test_delta_all_and_no_pages_known() -> None:
    t = spec_tensor()
    store = full_store(t)
    everything = bytes(encode(t, known_pages=store.digests()))
    assert ref.entry(everything, 0)["raw_size"] == 0
    same(decode(everything, page_store=store), t)
    nothing = bytes(encode(t, known_pages=np.zeros(0, np.uint64)))
    same(decode(nothing, page_store=MemoryPageStore(0)), t)


def test_refs_blob_without_a_store_is_refused() -> None:
    t = spec_tensor()
    blob = encode(t, known_pages=np.sort(page_digests(t)[[0, 1]]))
    for call in (decode, decode_report):
        with pytest.raises(hwe.PageStoreMissError, match="no page_store") as info:
            call(blob)
        assert info.value.field == "page_store" and info.value.pages == (0, 1)


def test_missing_store_page_refused_or_reported() -> None:
    t = spec_tensor()
    digests = page_digests(t)
    blob = encode(t, known_pages=np.sort(digests[[0, 3]]))
    store = MemoryPageStore(1 << 20)
    store_pages(store, t, [3])  # page 0 was evicted since the receiver said it held it
    with pytest.raises(hwe.PageStoreMissError) as info:
        decode(blob, page_store=store)
    assert info.value.pages == (0,) and info.value.positions == ((0, 0), (1, 0))
    report = decode_report(blob, page_store=store)
    assert report.missing.tolist() == [0] and report.pages.tolist() == [0]
    assert report.positions == ((0, 0), (1, 0))
    assert np.array_equal(report.tensor.page_pool[3], t.page_pool[3])
    assert not report.tensor.page_pool[0].any()  # never silently reused: left zero


class StaleStore(PageStore):
    """A store that hands out wrong bytes under a digest (rot, or a buggy cache)."""

    def __init__(self, inner: MemoryPageStore, stale: int) -> None:
        self.inner, self.stale = inner, stale

    def get(self, digest: int) -> bytes | None:
        found = self.inner.get(digest)
        if found is not None and digest == self.stale:
            return bytes([found[0] ^ 1]) + found[1:]
        return found

    def put(self, digest: int, page_bytes: object) -> None:
        self.inner.put(digest, page_bytes)

    def __contains__(self, digest: object) -> bool:
        return digest in self.inner

    def digests(self) -> np.ndarray:
        return self.inner.digests()


def test_stale_store_page_is_refused() -> None:
    t = quantized()
    digests = page_digests(t)
    store = StaleStore(full_store(t), int(digests[3]))
    blob = encode(t, known_pages=np.sort(digests[[0, 3]]))
    with pytest.raises(hwe.PageDigestError) as info:
        decode(blob, page_store=store)
    assert not isinstance(info.value, hwe.PageStoreMissError)
    assert info.value.pages == (3,) and info.value.positions == ((1, 1),)
    report = decode_report(blob, page_store=store)
    assert report.corrupt.tolist() == [3] and report.positions == ((1, 1),)


def test_delta_with_digests_reports_a_corrupt_sent_page() -> None:
    t = spec_tensor()
    digests = page_digests(t)
    blob = bytes(encode(t, known_pages=np.sort(digests[[0, 1, 2]]), page_digests=True))
    # sent pages are 3 and 4: row 0 of the short pool is page 3
    bad = ref.patch_payload(blob, 0, 5, bytes([blob[ref.entry(blob, 0)["offset"] + 5] ^ 1]))
    report = decode_report(bad, page_store=full_store(t))
    assert report.pages.tolist() == [3] and report.positions == ((1, 1),)
    with pytest.raises(hwe.PageDigestError):
        decode(bad, page_store=full_store(t))


def test_page_store_argument_type() -> None:
    with pytest.raises(hwe.ArgumentTypeError, match="page_store"):
        decode(encode(spec_tensor()), page_store={})  # type: ignore[arg-type]


# -- hostile page sections ------------------------------------------------------------------


def _delta_blob() -> bytes:
    t = spec_tensor()
    return bytes(encode(t, known_pages=np.sort(page_digests(t)[[1, 3]]), page_digests=True))


def test_refs_section_not_flagged_required() -> None:
    blob = _delta_blob()
    bad = ref.patch_entry(blob, number_of(blob, KIND_REFS), "section_flags", 0)
    with pytest.raises(hwe.SectionError, match="required") as info:
        decode(bad, page_store=full_store(spec_tensor()))
    assert info.value.field == "section_flags"


def test_digests_section_flagged_required() -> None:
    blob = _delta_blob()
    bad = ref.patch_entry(blob, number_of(blob, KIND_DIGESTS), "section_flags", 1)
    with pytest.raises(hwe.SectionError, match="not be flagged"):
        decode(bad, page_store=full_store(spec_tensor()))


@pytest.mark.parametrize("kind", [KIND_DIGESTS, KIND_REFS])
@pytest.mark.parametrize("delta", [-8, -1, 8, 16])
def test_page_section_wrong_raw_size(kind: int, delta: int) -> None:
    blob = _delta_blob()
    n = number_of(blob, kind)
    e = ref.entry(blob, n)
    bad = ref.patch_entry(blob, n, "raw_size", e["raw_size"] + delta)
    with pytest.raises(hwe.SectionError) as info:
        decode(bad, page_store=full_store(spec_tensor()))
    assert info.value.field == "raw_size"


def test_full_size_pool_with_refs_is_refused() -> None:
    blob = _delta_blob()
    bad = ref.patch_entry(blob, 0, "raw_size", spec_tensor().page_pool.nbytes)
    with pytest.raises(hwe.SectionError, match="page_refs") as info:
        decode(bad, page_store=full_store(spec_tensor()))
    assert info.value.section == "buffer[0]"


@pytest.mark.parametrize(
    ("position", "data", "match"),
    [
        (4, struct.pack("<I", 3), "trailing|ends inside"),  # wrong count in the payload
        (4, struct.pack("<I", 1), "trailing|ends inside"),
        (8, struct.pack("<QQ", 3, 1), "strictly increasing"),  # unsorted ids
        (8, struct.pack("<QQ", 1, 1), "strictly increasing"),  # duplicate ids
        (16, struct.pack("<Q", 5), "out of range"),  # a ref beyond num_pages
        (0, b"\x02", "version"),
        (1, b"\x07", "algorithm"),
        (2, b"\x01", "reserved"),
    ],
)
def test_hostile_refs_payload(position: int, data: bytes, match: str) -> None:
    blob = _delta_blob()
    bad = ref.patch_payload(blob, number_of(blob, KIND_REFS), position, data)
    with pytest.raises(hwe.InvalidIntegrityRecordError, match=match) as info:
        decode(bad, page_store=full_store(spec_tensor()))
    assert info.value.section == "page_refs" and info.value.offset is not None


@pytest.mark.parametrize(
    ("position", "data", "match"),
    [(4, struct.pack("<I", 4), "num_pages"), (0, b"\x09", "version"), (1, b"\x02", "algorithm")],
)
def test_hostile_digests_payload(position: int, data: bytes, match: str) -> None:
    blob = _delta_blob()
    bad = ref.patch_payload(blob, number_of(blob, KIND_DIGESTS), position, data)
    with pytest.raises(hwe.InvalidIntegrityRecordError, match=match):
        decode(bad, page_store=full_store(spec_tensor()))


def test_duplicate_page_section() -> None:
    t = spec_tensor()
    sections = [
        ref.section(1, t.page_pool.tobytes()),
        ref.section(1, t.block_table.tobytes(), index=1),
        ref.section(1, t.seq_ptr.tobytes(), index=2),
        ref.section(KIND_DIGESTS, encode_digest_section(page_digests(t))),
        ref.section(KIND_DIGESTS, encode_digest_section(page_digests(t))),
    ]
    for s in sections[:3]:
        s.flags = 1
    for s in sections[3:]:
        s.flags = 0
    blob = ref.write_blob(hw.encode_descriptor(t.descriptor), sections)
    with pytest.raises(hwe.SectionError, match="duplicated"):
        decode(blob)
    same(decode(ref.write_blob(hw.encode_descriptor(t.descriptor), sections[:4])), t)


def test_page_sections_need_byte_aligned_pages() -> None:
    pool = random_pool(dtypes.int4, (5, 1, 1, 3))  # 3 nibbles per page
    t = hw.BlockPagedTensor.from_arrays(pool, [0, 1], [0, 2])
    with pytest.raises(hwe.InvalidIntegrityRecordError, match="byte boundary"):
        encode(t, page_digests=True)
    digests = ref.section(KIND_DIGESTS, encode_digest_section(np.zeros(5, np.uint64)))
    digests.flags = 0
    base = [
        ref.section(1, t.page_pool.tobytes()),
        ref.section(1, t.block_table.tobytes(), index=1),
        ref.section(1, t.seq_ptr.tobytes(), index=2),
    ]
    for s in base:
        s.flags = 1
    blob = ref.write_blob(hw.encode_descriptor(t.descriptor), [*base, digests])
    with pytest.raises(hwe.SectionError, match="byte boundary"):
        decode(blob)


# -- engine fingerprint ---------------------------------------------------------------------

FP = EngineFingerprint("llama-3-8b", "vllm", "0.9.1", "NHD", "float16", 16, 0, 2)


def test_fingerprint_match_and_mismatch_refused() -> None:
    t = spec_tensor(metadata=fingerprint_to_metadata(FP))
    blob = encode(t)
    assert decode(blob, expect_fingerprint=FP).metadata == t.metadata
    other_rank = EngineFingerprint("llama-3-8b", "vllm", "0.9.1", "NHD", "float16", 16, 1, 2)
    decode(blob, expect_fingerprint=other_rank)  # tp_rank is not compared
    theirs = EngineFingerprint("llama-3-70b", "vllm", "0.9.1", "NHD", "float16", 32, 0, 4)
    with pytest.raises(hwe.IncompatibleFingerprintError) as info:
        decode(blob, expect_fingerprint=theirs)
    assert set(info.value.differences) == {"model_id", "block_size", "tp_size"}
    for name in ("model_id", "block_size", "tp_size"):
        assert name in str(info.value)


def test_missing_fingerprint_refused_when_one_is_expected() -> None:
    blob = encode(spec_tensor())
    decode(blob)
    with pytest.raises(hwe.IncompatibleFingerprintError, match="no engine fingerprint"):
        decode(blob, expect_fingerprint=FP)
    with pytest.raises(hwe.IncompatibleFingerprintError):
        decode_report(blob, expect_fingerprint=FP)


def test_fingerprint_refused_before_the_store_is_consulted() -> None:
    t = spec_tensor(metadata=fingerprint_to_metadata(FP))
    blob = encode(t, known_pages=page_digests(t)[[0]])
    theirs = EngineFingerprint("other", "vllm", "0.9.1", "NHD", "float16", 16, 0, 2)
    with pytest.raises(hwe.IncompatibleFingerprintError):
        decode(blob, expect_fingerprint=theirs)  # no store: the fingerprint speaks first


def test_malformed_fingerprint_entry_refused_on_from_arrays_and_decode() -> None:
    bad = {"hurray.engine_fingerprint": b"HWFP garbage"}
    with pytest.raises(hwe.InvalidMetadataError, match="fingerprint"):
        spec_tensor(metadata=bad)
    t = spec_tensor()
    t.metadata = dict(bad)  # past from_arrays: what a foreign writer could send
    with pytest.raises(hwe.InvalidMetadataError) as info:
        decode(encode(t))
    assert info.value.section == "metadata"


def test_expect_fingerprint_argument_type() -> None:
    with pytest.raises(hwe.ArgumentTypeError, match="expect_fingerprint"):
        decode(encode(spec_tensor()), expect_fingerprint="fp")  # type: ignore[arg-type]


def test_store_get_many_is_get_in_order_and_counts_as_a_use() -> None:
    t = spec_tensor()
    store = full_store(t)
    d = page_digests(t).tolist()
    missing = (max(d) + 1) % (1 << 64)
    assert store.get_many([d[1], missing, d[0]]) == [store.get(d[1]), None, store.get(d[0])]
    store.get_many([d[2]])
    assert store.lru_order()[-1] == d[2]
    with pytest.raises(hwe.ArgumentTypeError):
        store.get_many([-1])
    with pytest.raises(hwe.ArgumentTypeError):
        store.get_many([True])


@pytest.mark.parametrize("name", ["float16", "per_block_shared_buffer"])
def test_every_flipped_byte_of_a_delta_blob_is_a_typed_error_or_harmless(name: str) -> None:
    """Hostile input: no flipped bit in a delta + digests blob escapes as anything but a
    HurrayWireError, and whatever decodes in report mode says which pages it cannot vouch
    for (a flip in a page the digests cover is reported, never silently returned)."""
    t = TENSORS[name]()
    store = full_store(t)
    blob = bytes(encode(t, known_pages=np.sort(page_digests(t)[[1, 3]]), page_digests=True))
    for at in range(len(blob)):
        bad = bytearray(blob)
        bad[at] ^= 0x10
        for call in (decode, decode_report):
            try:
                got = call(bytes(bad), page_store=store)
            except hwe.HurrayWireError:
                continue
            if isinstance(got, DecodeReport):
                if not got.ok:
                    continue
                tensor = got.tensor
            else:
                tensor = got
            assert isinstance(tensor, hw.BlockPagedTensor)
            same(tensor, t)  # decoded with no error and no report: it must be unchanged


def test_digests_and_pool_checksum_in_one_pass() -> None:
    import xxhash

    from hurray_wire.integrity import digests_and_checksum, page_records

    for t in (quantized(), spec_tensor(random_pool(dtypes.float16, (70, 16, 8, 64)))):
        digests, checksum = digests_and_checksum(page_records(t))
        assert digests.tolist() == page_digests(t).tolist()
        assert checksum == xxhash.xxh3_64_intdigest(t.page_pool.tobytes())
    empty = hw.BlockPagedTensor.from_arrays(np.zeros((0, 4, 2, 8), np.float16), [], [0])
    digests, checksum = digests_and_checksum(page_records(empty))
    assert digests.size == 0 and checksum == xxhash.xxh3_64_intdigest(b"")


def test_a_reader_that_knows_neither_kind() -> None:
    """tests/blob_reference.py reads blobs as a 1.0 reader that predates kinds 4 and 5: it
    skips the optional page_digests section and gets the same buffers, and it refuses a
    delta blob (its short pool, or the REQUIRED page_refs) instead of misreading it."""
    t = quantized()
    parsed = ref.read_blob(bytes(encode(t, page_digests=True)), legacy=True)
    assert parsed.buffers == [b"".join(p.tobytes() for p in b) for b in t.buffer_arrays()]
    delta = bytes(encode(t, known_pages=np.sort(page_digests(t)[[0]])))
    with pytest.raises(ref.ReferenceError, match=r"REQUIRED|raw_size"):  # either refuses
        ref.read_blob(delta, legacy=True)
