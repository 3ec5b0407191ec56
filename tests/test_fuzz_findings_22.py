"""A finding of the issue-22 campaign (docs/fuzzing.md, F8): with ``verify=False`` the
decoder skipped the page-digests section entirely, so a section of an unsupported version
was accepted (the harness saw ``verify=True`` and ``verify=False`` refuse one blob for
different reasons). ``verify=False`` skips only the comparison of pages with digests."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire.errors import InvalidIntegrityRecordError
from hurray_wire.integrity import (
    MemoryPageStore,
    encode_digest_section,
    page_digests,
    store_pages,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import fuzz_blob


@pytest.mark.parametrize("verify", [True, False])
def test_a_page_digests_section_of_another_version_is_refused(verify: bool) -> None:
    tensor = hw.BlockPagedTensor.from_arrays(np.ones((4, 4, 2, 8), np.float16), [0, 1, 2], [0, 3])
    blob = bytearray(hw.encode(tensor, page_digests=True))
    at = bytes(blob).index(encode_digest_section(page_digests(tensor)))
    blob[at] = 68  # the section's version
    data = fuzz_blob.fix_checksums(bytes(blob))
    with pytest.raises(InvalidIntegrityRecordError, match="version") as info:
        hw.decode(data, verify=verify)
    assert info.value.field == "version"


def test_verify_false_still_skips_the_page_comparison() -> None:
    tensor = hw.BlockPagedTensor.from_arrays(np.ones((4, 4, 2, 8), np.float16), [0, 1, 2], [0, 3])
    blob = bytearray(hw.encode(tensor, page_digests=True))
    blob[bytes(blob).index(bytes(tensor.page_pool[0].tobytes()[:16]))] ^= 1  # a page byte
    data = fuzz_blob.fix_checksums(bytes(blob))
    with pytest.raises(hw.HurrayWireError):
        hw.decode(data)
    assert hw.decode(data, verify=False).page_pool.shape == (4, 4, 2, 8)


# -- F9: the independent reader did not know the page sections (0x04, 0x05) -----------------
# tests/blob_reference.py skipped page_digests as an unknown optional section, so it read a
# blob whose chunked page_digests section has chunk_size 2**31 while decode refused it: the
# blob harness reported "decode refuses what the independent reader reads". The reader now
# implements kinds 4 and 5 from docs/wire-format.md § 4 and docs/integrity.md § 2, 4, 6.

F9_BLOB = Path(__file__).resolve().parent / "fuzz_findings" / "f9-page-digests-chunk-size-2g.hrwb"


def test_f9_both_readers_refuse_the_chunk_size_and_the_harness_passes() -> None:
    from tests import blob_reference as ref

    data = F9_BLOB.read_bytes()
    with pytest.raises(hw.errors.DecompressionError) as info:
        hw.decode(data)
    assert (info.value.section, info.value.field) == ("page_digests[0]", "chunk_size")
    with pytest.raises(ref.ReferenceError, match="chunk_size"):
        ref.read_blob(data)
    fuzz_blob.check_blob(data)  # raised AssertionError before the reader knew kind 4


def _blob_tensors() -> dict[str, hw.BlockPagedTensor]:
    from tests.test_integrity_blob import TENSORS

    names = ["float16", "int4", "bool", "float6_e2m3", "per_block_sym", "per_block_asym"]
    return {name: TENSORS[name]() for name in [*names, "per_block_shared_buffer"]}


@pytest.mark.parametrize("name", sorted(_blob_tensors()))
def test_f9_the_reference_reads_page_digests_as_decode_does(name: str) -> None:
    from tests import blob_reference as ref

    tensor = _blob_tensors()[name]
    blob = bytes(hw.encode(tensor, page_digests=True, compression=None))
    parsed = ref.read_blob(blob)
    assert parsed.page_digests == page_digests(tensor).tolist()
    assert parsed.buffers == [b"".join(p.tobytes() for p in b) for b in tensor.buffer_arrays()]
    # one byte of page 1 changed, checksums recomputed: only the page digest can tell
    bad = bytearray(blob)
    page_nbytes = parsed.fields.page_nbytes
    assert page_nbytes is not None
    bad[ref.entry(blob, 0)["offset"] + page_nbytes] ^= 0x10
    data = fuzz_blob.fix_checksums(bytes(bad))
    with pytest.raises(hw.HurrayWireError):
        hw.decode(data)
    with pytest.raises(ref.ReferenceError, match="page 1: digest mismatch"):
        ref.read_blob(data)
    ref.read_blob(data, verify=False)  # verify=False skips only the comparison, as decode


@pytest.mark.parametrize("with_digests", [False, True])
@pytest.mark.parametrize("name", sorted(_blob_tensors()))
def test_f9_the_reference_rebuilds_a_delta_blob_from_a_page_store(
    name: str, with_digests: bool
) -> None:
    from tests import blob_reference as ref

    tensor = _blob_tensors()[name]
    digests = page_digests(tensor)
    known = np.sort(digests[[0, 3]])
    blob = bytes(hw.encode(tensor, known_pages=known, page_digests=with_digests))
    store = MemoryPageStore(1 << 24)
    store_pages(store, tensor, range(tensor.layout.num_pages))
    records = {int(d): store.get(int(d)) for d in known}
    with pytest.raises(ref.ReferenceError, match="needs a page store"):
        ref.read_blob(blob)
    parsed = ref.read_blob(blob, page_store=records)
    decoded = hw.decode(blob, page_store=store)
    assert parsed.buffers == [b"".join(p.tobytes() for p in b) for b in decoded.buffer_arrays()]
    assert parsed.buffers == [b"".join(p.tobytes() for p in b) for b in tensor.buffer_arrays()]
    stale = dict(records)
    stale[int(known[0])] = bytes(len(records[int(known[0])] or b""))  # a record of zeros
    with pytest.raises(ref.ReferenceError, match="no intact record"):
        ref.read_blob(blob, page_store=stale)


@pytest.mark.parametrize(("kind", "flags"), [(4, 1), (5, 0)])
def test_f9_the_required_flag_of_the_page_sections(kind: int, flags: int) -> None:
    """page_digests must not be REQUIRED, page_refs must be: both readers refuse otherwise."""
    from tests import blob_reference as ref

    tensor = _blob_tensors()["float16"]
    known = np.sort(page_digests(tensor)[[0]])
    blob = bytes(hw.encode(tensor, known_pages=known, page_digests=True))
    count = struct.unpack_from("<H", blob, 20)[0]
    number = [ref.entry(blob, n)["kind"] for n in range(count)].index(kind)
    data = ref.patch_entry(blob, number, "section_flags", flags)
    store = MemoryPageStore(1 << 24)
    store_pages(store, tensor, range(tensor.layout.num_pages))
    with pytest.raises(hw.HurrayWireError):
        hw.decode(data, page_store=store)
    with pytest.raises(ref.ReferenceError, match="REQUIRED"):
        ref.read_blob(data, page_store={int(d): store.get(int(d)) for d in known})


# -- F10: decode_into refused the untyped form of a uint8 pool ------------------------------
# decode_into / check_landing take "the pool's dtype and shape, or uint8 of its byte size",
# but for a pool whose NumPy dtype is itself uint8 (element type uint8) only the typed shape
# was accepted: a flat uint8 array of the right size was refused with an ArgumentTypeError
# whose message contradicted itself ("expected uint8 [4, 4, 1, 5] (80 bytes), or uint8 of
# its bytes, found uint8 [80] (80 bytes)"). Found by the blob harness's new decode_into
# check on its seeds. int4 and uint2 pools (int8 / uint8 elements in NumPy) are controls.


def _uint8_pools() -> dict[str, hw.BlockPagedTensor]:
    f = hw.BlockPagedTensor.from_arrays
    pool = np.arange(4 * 4 * 1 * 8, dtype=np.uint8).reshape(4, 4, 1, 8)
    return {
        "uint8": f(pool, [0, 2], [0, 2], seq_lens=[7]),
        "int4": f((pool % 8).astype(hw.int4.numpy_dtype), [1, 3], [0, 2], element_type=hw.int4),
        "uint2": f((pool % 4).astype(hw.uint2.numpy_dtype), [0], [0, 1], element_type=hw.uint2),
    }


@pytest.mark.parametrize("digests", [False, True])
@pytest.mark.parametrize("name", sorted(_uint8_pools()))
def test_f10_decode_into_takes_flat_bytes_of_a_uint8_pool(name: str, digests: bool) -> None:
    tensor = _uint8_pools()[name]
    blob = bytes(hw.encode(tensor, page_digests=digests))
    expected = hw.decode(blob)
    flat = np.full(expected.page_pool.nbytes, 0xA5, np.uint8)
    landed = hw.decode(blob, into=hw.IntoArray(flat))
    assert fuzz_blob.tensor_difference(landed, expected) is None
    assert np.shares_memory(landed.page_pool, flat)
    typed = np.empty_like(expected.page_pool)
    assert hw.decode(blob, into=hw.IntoArray(typed)).page_pool is typed
    for wrong in (np.empty(flat.size + 1, np.uint8), np.empty(flat.size, np.int8)):
        with pytest.raises(hw.errors.ArgumentTypeError, match="page_pool"):
            hw.decode(blob, into=hw.IntoArray(wrong))


# -- F11: a puller's first_page past the prompt's tokens crashed the prefill server ----------
# TransferStore.take accepted any first_page in 0..len(block_ids); with a partial last block
# (20 tokens in two 16-token blocks) first_page 2 leaves -12 tokens, and serve_one raised a
# foreign OverflowError building seq_lens, which TransferServer's thread does not catch (it
# catches OSError and our errors): one control line ended the prefill worker's listener.
# Found by tools/fuzz_vllm.py (plain mode) after about 60 s.


@pytest.mark.parametrize(("first", "served"), [(0, True), (1, True), (2, False), (3, False)])
def test_f11_first_page_is_bounded_by_the_tokens(first: int, served: bool) -> None:
    import json
    import socket

    import fuzz_vllm

    from hurray_wire.vllm import transfer as vt

    store = fuzz_vllm._store()  # 20 tokens, block ids [5, 9] of 16 tokens
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(json.dumps({**fuzz_vllm.ASK, "first_page": first}).encode() + b"\n")
        sent = vt.serve_one(store, ours)
        ours.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := theirs.recv(1 << 16):
            reply += chunk
    line = json.loads(reply.split(b"\n", 1)[0])
    assert (sent > 0) == served and line["ok"] is served
    if not served:
        assert line["reason"] == "block_ids" and "first_page out of range" in line["message"]
        assert store.take(fuzz_vllm.ASK)[1] == 0  # a refused ask leaves the transfer servable


F12_BLOB = Path(__file__).resolve().parent / "fuzz_findings" / "f12-page-rows-of-2-70-bytes.hrwb"


def test_f12_page_sections_of_pages_no_row_can_hold_are_refused() -> None:
    """F12 (the third round, blob harness with checksums fixed): a pool of 0 pages of 2**70
    bytes each (num_heads 2**64 - 8) with a page-digests section. ``decode`` reshaped the
    empty pool into rows of a page's bytes before the pool's own geometry check and raised
    NumPy's ValueError; the section table now refuses page records over 2**63 - 1 bytes,
    as the pool's check refuses the same geometry without page sections."""
    data = F12_BLOB.read_bytes()
    with pytest.raises(hw.errors.SectionError) as info:
        hw.decode(data)
    assert (info.value.section, info.value.field) == ("page_digests[0]", "kind")
    assert "2**63 - 1 bytes" in str(info.value)
    fuzz_blob.check_blob(data)  # raised AssertionError (a foreign ValueError) before
