"""decode_into: the page pool lands in the caller's array, verified in the same pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire.blob import copying
from hurray_wire.errors import ArgumentTypeError, ChecksumError, HurrayWireError
from hurray_wire.integrity import EnginePoolStore, MemoryPageStore, store_pages
from tests import blob_reference as ref

PAGE = (16, 4, 32)  # 4 KiB of float16 per page


def _tensor(pages: int = 64, seed: int = 0, **kw: Any) -> hw.BlockPagedTensor:
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 1 << 16, (pages, *PAGE), np.uint16).view(np.float16)
    table = rng.permutation(pages).astype(np.uint32)
    return hw.BlockPagedTensor.from_arrays(
        pool, table, [0, pages // 3, pages], kv_role="value", layer_index=3, **kw
    )


def _same(a: hw.BlockPagedTensor, b: hw.BlockPagedTensor) -> None:
    assert a.page_pool.dtype == b.page_pool.dtype and a.page_pool.shape == b.page_pool.shape
    assert a.page_pool.tobytes() == b.page_pool.tobytes()
    assert np.array_equal(a.block_table, b.block_table)
    assert np.array_equal(a.seq_ptr, b.seq_ptr)
    assert (a.layer_index, a.kv_role) == (b.layer_index, b.kv_role)


def _pool_offset(blob: bytes, t: hw.BlockPagedTensor) -> int:
    at = blob.find(t.page_pool.tobytes()[:4096])
    assert at > 0
    return at


@pytest.mark.parametrize("parallel", [False, True])
def test_lands_in_the_engine_array_verified(
    parallel: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(copying, "PARALLEL_HASH", parallel)
    monkeypatch.setattr(copying, "COPY_CHUNK", 1 << 14)
    monkeypatch.setattr(copying, "PARALLEL_CHUNK", 1 << 14)
    t = _tensor()
    blob = bytes(hw.encode(t))
    engine = np.full(t.page_pool.shape, np.float16(7), np.float16)
    out = hw.decode(blob, into=hw.IntoArray(engine))
    _same(out, t)
    assert out.page_pool is engine  # the engine's own array object
    assert not np.shares_memory(out.block_table, engine)


def test_a_byte_array_is_viewed_with_the_blob_dtype_and_shape() -> None:
    t = _tensor()
    engine = np.zeros(t.page_pool.nbytes, np.uint8)
    out = hw.decode(hw.encode(t), into=hw.IntoArray(engine))
    _same(out, t)
    assert np.shares_memory(out.page_pool, engine)
    assert engine.tobytes() == t.page_pool.tobytes()


@pytest.mark.parametrize("parallel", [False, True])
def test_a_corrupted_pool_byte_is_refused(parallel: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(copying, "PARALLEL_HASH", parallel)
    monkeypatch.setattr(copying, "PARALLEL_CHUNK", 1 << 14)
    t = _tensor()
    blob = bytearray(hw.encode(t))
    at = _pool_offset(bytes(blob), t) + 100_000
    blob[at] ^= 0x01
    before = bytes(blob)
    with pytest.raises(ChecksumError) as info:
        hw.decode(blob, into=hw.IntoArray(np.empty_like(t.page_pool)))
    assert info.value.section == "buffer[0]"
    assert bytes(blob) == before  # the input is never written
    # verify=False accepts it, as decode(verify=False) does, and lands the bytes as sent
    engine = np.empty_like(t.page_pool)
    hw.decode(blob, into=hw.IntoArray(engine), verify=False)
    assert (
        engine.view(np.uint8).reshape(-1)[at - _pool_offset(before, t)]
        != (t.page_pool.view(np.uint8).reshape(-1)[at - _pool_offset(before, t)])
    )


def test_a_corrupted_small_section_is_refused() -> None:
    t = _tensor(metadata={"note": "hello world"})
    blob = bytearray(hw.encode(t))
    at = bytes(blob).find(b"hello world")
    blob[at] ^= 0x20  # still valid text: only the checksum can tell
    with pytest.raises(ChecksumError) as info:
        hw.decode(blob, into=hw.IntoArray(np.empty_like(t.page_pool)))
    assert info.value.section == "metadata[0]"


def test_without_checksums_it_copies() -> None:
    t = _tensor()
    engine = np.empty_like(t.page_pool)
    _same(hw.decode(hw.encode(t, checksum=False), into=hw.IntoArray(engine)), t)


def test_a_compressed_pool_is_decompressed_into_the_array() -> None:
    t = _tensor()
    blob = bytearray(hw.encode(t, compression="zstd:1"))
    engine = np.empty_like(t.page_pool)
    _same(hw.decode(blob, into=hw.IntoArray(engine)), t)
    blob[len(blob) // 2] ^= 0xFF
    with pytest.raises(HurrayWireError):
        hw.decode(blob, into=hw.IntoArray(np.empty_like(t.page_pool)))


def test_page_digests_and_delta_blobs_take_the_page_checks() -> None:
    t = _tensor(pages=8)
    blob = bytearray(hw.encode(t, page_digests=True))
    _same(hw.decode(blob, into=hw.IntoArray(np.empty_like(t.page_pool))), t)
    blob[_pool_offset(bytes(blob), t) + 5] ^= 0x01
    with pytest.raises(ChecksumError) as expected:
        hw.decode(blob)
    with pytest.raises(ChecksumError) as info:  # the same refusal as decode's
        hw.decode(blob, into=hw.IntoArray(np.empty_like(t.page_pool)))
    assert str(info.value) == str(expected.value)
    report = hw.decode_report(blob)
    assert report.pages.tolist() == [0]  # decode_report says which page
    store = MemoryPageStore(1 << 20)
    store_pages(store, t, [0, 1, 2, 3, 4])
    delta = hw.encode(t, known_pages=store.digests(), page_digests=True)
    assert len(delta) < len(blob) // 2
    _same(hw.decode(delta, into=hw.IntoArray(np.empty_like(t.page_pool)), page_store=store), t)


@pytest.mark.parametrize(
    "engine, found",
    [
        (np.empty((63, *PAGE), np.float16), "bytes"),
        (np.empty((64, *PAGE), np.float32), "bytes"),
        (bytearray(64 * 4096 * 2), "bytearray"),
        ([0] * 10, "list"),
        (np.empty((64, *PAGE), object), "object"),
        (np.empty((64, 32, 4, 16), np.float16)[:, ::2], "contiguous False"),
    ],
)
def test_bad_engine_arrays_are_typed_errors(engine: Any, found: str) -> None:
    t = _tensor()
    blob = hw.encode(t)
    with pytest.raises(ArgumentTypeError) as info:
        hw.decode(blob, into=hw.IntoArray(engine))
    assert info.value.field == "page_pool"
    assert found in str(info.value)


def test_a_read_only_engine_array_is_refused() -> None:
    t = _tensor()
    engine = np.empty_like(t.page_pool)
    engine.flags.writeable = False
    with pytest.raises(ArgumentTypeError, match="writable"):
        hw.decode(hw.encode(t), into=hw.IntoArray(engine))


def test_decode_errors_are_decodes() -> None:
    t = _tensor()
    blob = bytearray(hw.encode(t))
    with pytest.raises(HurrayWireError):
        hw.decode(blob[:100], into=hw.IntoArray(np.empty_like(t.page_pool)))
    with pytest.raises(ArgumentTypeError):
        hw.decode(blob, into=hw.IntoArray(np.empty_like(t.page_pool)), verify=1)  # type: ignore[arg-type]


def test_stream_file_lands_a_layer_in_the_engine(tmp_path: Path) -> None:
    tensors = [_tensor(seed=k) for k in range(3)]
    tensors = [
        hw.BlockPagedTensor.from_arrays(
            x.page_pool, x.block_table, x.seq_ptr, kv_role="key", layer_index=k
        )
        for k, x in enumerate(tensors)
    ]
    path = tmp_path / "cache.hrws"
    with hw.StreamWriter(path, hw.StreamHeader(num_layers=3)) as writer:
        for x in tensors:
            writer.write(x)
    engine = np.empty_like(tensors[0].page_pool)
    with hw.StreamFile(path) as f:
        got = f.tensor(1, "key", into=hw.IntoArray(engine))
        assert got.page_pool is engine
        _same(got, tensors[1])
        for entry, x in zip(f.entries, tensors, strict=True):
            _same(f.read(entry, into=hw.IntoArray(engine)), x)
        with pytest.raises(ArgumentTypeError):
            f.tensor(2, "key", into=hw.IntoArray(np.empty(3, np.uint8)))


def _no_blob_side_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail if the pool is digested where it sits in the blob (the first of two passes)
    or decoded into a new pool and then copied."""
    from hurray_wire.blob import pages

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a second pass over the pool")

    monkeypatch.setattr(pages, "digests_and_checksum", refuse)
    monkeypatch.setattr(hw.blob.landing.arrays, "copy_and_hash", refuse)


@pytest.mark.parametrize("digests", [True, False])
@pytest.mark.parametrize(
    "stored", [(), (0, 1, 2, 3, 4), tuple(range(0, 600, 7)), tuple(range(600))]
)
def test_paged_blobs_land_in_one_pass(
    digests: bool, stored: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Page digests and page refs: the rows are copied, hashed and digested chunk by chunk
    (600 pages of 4 KiB: three chunks), the referenced pages filled from the store; the
    result is decode's, and no pass reads the pool before the copy."""
    if not digests and not stored:
        pytest.skip("no page sections: the plain landing")
    t = _tensor(pages=600)
    store = MemoryPageStore(1 << 24)
    store_pages(store, t, list(stored))
    blob = bytes(hw.encode(t, known_pages=store.digests() if stored else None,
                           page_digests=digests))  # fmt: skip
    expected = hw.decode(blob, page_store=store)
    _no_blob_side_pass(monkeypatch)
    engine = np.full(t.page_pool.shape, np.float16(7), np.float16)
    out = hw.decode(blob, into=hw.IntoArray(engine, one_pass=True), page_store=store)
    _same(out, t)
    _same(out, expected)
    assert out.page_pool is engine


def _flip(blob: bytes, at: int) -> bytes:
    changed = bytearray(blob)
    changed[at] ^= 0x01
    return bytes(changed)


@pytest.mark.parametrize("one_pass", [False, True])
@pytest.mark.parametrize("damage", ["pool byte", "digest", "store miss", "no store"])
def test_paged_landing_refuses_as_decode_does(damage: str, one_pass: bool) -> None:
    """Every refusal of a paged blob is decode's (same type and message) and leaves the
    engine array untouched; with ``one_pass=True`` one found while the pool lands (a pool
    checksum, a page digest, a store miss) leaves the rows copied so far."""
    t = _tensor(pages=600)
    store = MemoryPageStore(1 << 24)
    store_pages(store, t, [1, 2, 3])
    blob = bytes(hw.encode(t, known_pages=store.digests(), page_digests=True))
    sent = blob.find(t.page_pool[0].tobytes())  # page 0 is sent, the first row
    assert sent > 0
    given: MemoryPageStore | None = store
    if damage == "pool byte":
        blob = _flip(blob, sent + 9)
    elif damage == "digest":  # the last page's digest changed, the checksums kept valid
        number = next(k for k in range(16) if ref.entry(blob, k)["kind"] == 0x04)
        last = ref.entry(blob, number)["stored_size"] - 1
        top = blob[ref.entry(blob, number)["offset"] + last]
        blob = ref.patch_payload(blob, number, last, bytes([top ^ 1]))
    elif damage == "store miss":
        given = MemoryPageStore(1 << 24)
        store_pages(given, t, [1, 2])
    else:
        given = None
    with pytest.raises(HurrayWireError) as expected:
        hw.decode(blob, page_store=given)
    engine = np.full(t.page_pool.shape, np.float16(7), np.float16)
    with pytest.raises(HurrayWireError) as info:
        hw.decode(blob, into=hw.IntoArray(engine, one_pass=one_pass), page_store=given)
    assert type(info.value) is type(expected.value)
    assert str(info.value) == str(expected.value)
    untouched = bool((engine == np.float16(7)).all())
    assert untouched == (not one_pass or damage == "no store")


@pytest.mark.parametrize("stored", [(), (1, 2)])
def test_a_packed_paged_pool_lands_in_one_pass(
    stored: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """int4 pages of whole bytes with page digests (and refs): no padding bits, so the
    one-pass landing takes them too; the engine array is uint8 of the pool's bytes."""
    from hurray_wire import dtypes

    rng = np.random.default_rng(3)
    codes = rng.integers(0, 16, 4 * 16 * 2 * 8, np.uint8)
    pool = codes.view(dtypes.int4.numpy_dtype).reshape(4, 16, 2, 8)
    t = hw.BlockPagedTensor.from_arrays(pool, [0, 1, 2, 3], [0, 4], kv_role="key", layer_index=1)
    store = MemoryPageStore(1 << 20)
    store_pages(store, t, list(stored))
    blob = bytes(hw.encode(t, page_digests=True, known_pages=store.digests() if stored else None))
    expected = hw.decode(blob, page_store=store)
    _no_blob_side_pass(monkeypatch)
    engine = np.full(expected.page_pool.nbytes, 0xAA, np.uint8)
    out = hw.decode(blob, into=hw.IntoArray(engine, one_pass=True), page_store=store)
    assert out.page_pool.tobytes() == expected.page_pool.tobytes()
    assert np.shares_memory(out.page_pool, engine)


# -- one intake of engine arrays (issue 31): a torch tensor wherever an array is taken -----
def test_a_torch_tensor_is_taken_wherever_an_array_is() -> None:
    """``decode(into=IntoArray(t))``, ``IntoPages(t, ids)`` and ``into_vllm`` share the
    intake (``_interop.engine_array``): a CPU torch tensor is written in place, shared."""
    torch = pytest.importorskip("torch")
    t = _tensor(pages=4)
    blob = hw.encode(t)
    whole = torch.zeros(t.page_pool.shape, dtype=torch.float16)
    _same(hw.decode(blob, into=hw.IntoArray(whole)), t)
    assert whole.numpy().tobytes() == t.page_pool.tobytes()  # bit patterns: NaNs included
    engine = torch.zeros((9, *t.page_pool.shape[1:]), dtype=torch.float16)
    got = hw.decode(blob, into=hw.IntoPages(engine, [8, 1, 5, 3]))
    assert engine.numpy()[[8, 1, 5, 3]].tobytes() == t.page_pool.tobytes()
    assert np.shares_memory(got.page_pool, engine.numpy())


def test_every_intake_refuses_a_read_only_or_foreign_array_alike() -> None:
    """The same error type and field wherever an engine array enters (the array's own name:
    ``page_pool`` for a decode target, ``kv_cache`` for ``into_vllm``)."""
    t = _tensor(pages=4)
    engine = np.zeros_like(t.page_pool)
    engine.flags.writeable = False
    refusals = []
    for land in (
        lambda: hw.IntoArray(engine),
        lambda: hw.IntoPages(engine, [0, 1, 2, 3]),
        lambda: EnginePoolStore(engine),
        lambda: hw.into_vllm(t, engine, [[1]], backend="FLASH_ATTN"),
    ):  # fmt: skip
        with pytest.raises(ArgumentTypeError, match="writable") as info:
            land()
        refusals.append(info.value.field)
    assert refusals == ["page_pool", "page_pool", "page_pool", "kv_cache"]
    with pytest.raises(ArgumentTypeError) as caught:
        hw.decode(hw.encode(t), into=engine.copy())  # an array is not a target: say so
    assert caught.value.field == "into"
