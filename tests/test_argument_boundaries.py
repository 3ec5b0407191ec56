"""Issue 22: arguments that raised a foreign exception or hung. Each row is a call, the
typed error it must raise, and the field the error names (the value is in the message)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import xxhash

import hurray_wire as hw
from hurray_wire.errors import (
    ArgumentTypeError,
    InvalidIntegrityRecordError,
    InvalidTensorError,
    InvalidTransferRecordError,
    LimitExceededError,
)
from hurray_wire.integrity import (
    EngineFingerprint,
    EnginePoolStore,
    MemoryPageStore,
    PageRefs,
    check_compatible,
    page_digests,
    store_pages,
)
from hurray_wire.transforms.compact import compact, prefix_sharing
from hurray_wire.transforms.heads import split_heads
from hurray_wire.transforms.repage import repage
from hurray_wire.transforms.select import dequantize, select, sequences
from hurray_wire.transport import records
from hurray_wire.transport.records import (
    MAX_REASON_BYTES,
    TransferRecord,
    decode_record,
    encode_record,
)
from hurray_wire.wire.transfer import FAST_TRANSFER_RECORD, FAST_TRANSFER_SEGMENT

POOL = np.arange(5 * 4 * 2 * 8, dtype=np.float16).reshape(5, 4, 2, 8)
T = hw.BlockPagedTensor.from_arrays(POOL, np.array([0, 1, 2]), np.array([0, 3]))
EMPTY = hw.BlockPagedTensor.from_arrays(
    np.zeros((5, 4, 0, 8), np.float16), np.array([0, 1, 2]), np.array([0, 3])
)
FP = EngineFingerprint("m", "vllm", "0.9", "NHD", "float16", 16, 0, 1)
REFS = PageRefs(np.array([3]), np.array([1], np.uint64))

CASES: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    ("repage 2**40", lambda: repage(T, 2**40), InvalidTensorError, "page_size"),
    ("repage 2**20", lambda: repage(T, 2**20), InvalidTensorError, "page_size"),
    ("split_heads 2**40", lambda: split_heads(T, 2**40), InvalidTensorError, "n"),
    ("compact str", lambda: compact("x"), ArgumentTypeError, "tensor"),  # type: ignore[type-var]
    ("prefix_sharing str", lambda: prefix_sharing("x"), ArgumentTypeError, "tensor"),  # type: ignore[arg-type]
    ("repage str", lambda: repage("x", 4), ArgumentTypeError, "tensor"),  # type: ignore[type-var]
    ("split_heads str", lambda: split_heads("x", 2), ArgumentTypeError, "tensor"),
    ("dequantize str", lambda: dequantize("x"), ArgumentTypeError, "tensor"),  # type: ignore[arg-type]
    ("select str", lambda: select("x", [0]), ArgumentTypeError, "tensor"),  # type: ignore[type-var]
    ("sequences str", lambda: sequences("x"), ArgumentTypeError, "tensor"),  # type: ignore[arg-type]
    ("check_compatible ignore=5", lambda: check_compatible(FP, FP, ignore=5),  # type: ignore[arg-type]
     ArgumentTypeError, "ignore"),
    ("check_compatible ignore=str", lambda: check_compatible(FP, FP, ignore="tp_rank"),  # type: ignore[arg-type]
     ArgumentTypeError, "ignore"),
    ("get_many None", lambda: MemoryPageStore(1 << 20).get_many(None),  # type: ignore[arg-type]
     ArgumentTypeError, "digests"),
    ("engine get_many None", lambda: EnginePoolStore(POOL.copy()).get_many(None),  # type: ignore[arg-type]
     ArgumentTypeError, "digests"),
    ("store_pages str id", lambda: store_pages(MemoryPageStore(1 << 20), T, pages=["a"]),  # type: ignore[list-item]
     ArgumentTypeError, "pages[0]"),
    ("store_pages float id", lambda: store_pages(MemoryPageStore(1 << 20), T, pages=[1.5]),  # type: ignore[list-item]
     ArgumentTypeError, "pages[0]"),
    ("store_pages bool id", lambda: store_pages(MemoryPageStore(1 << 20), T, pages=[True]),
     ArgumentTypeError, "pages[0]"),
    ("store_pages int", lambda: store_pages(MemoryPageStore(1 << 20), T, pages=3),  # type: ignore[arg-type]
     ArgumentTypeError, "pages"),
    ("sent_pages 0", lambda: REFS.sent_pages(0), InvalidIntegrityRecordError, "num_pages"),
    ("sent_pages 3", lambda: REFS.sent_pages(3), InvalidIntegrityRecordError, "num_pages"),
    ("sent_pages 2**40", lambda: REFS.sent_pages(2**40), LimitExceededError, "num_pages"),
    ("reason surrogate", lambda: encode_record(TransferRecord("abort", 1, reason="\ud800")),
     InvalidTransferRecordError, "reason"),
    ("ready=1", lambda: TransferRecord("offer", 1, ready=1), ArgumentTypeError, "ready"),  # type: ignore[arg-type]
    ("reason of 2-byte chars", lambda: TransferRecord("abort", 1, reason="é" * 513),
     InvalidTransferRecordError, "tail_length"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "error", "field"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_bad_argument_is_a_typed_error(
    call: Callable[[], Any], error: type[Exception], field: str
) -> None:
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, hw.HurrayWireError)
    assert info.value.field == field


def test_the_bounds_still_admit_the_edge() -> None:
    assert repage(T, 1 << 16).layout.page_size == 1 << 16
    assert len(split_heads(T, 2)) == 2
    assert REFS.sent_pages(4).tolist() == [0, 1, 2]
    assert len(TransferRecord("abort", 1, reason="é" * 512).reason.encode()) == MAX_REASON_BYTES
    assert len(TransferRecord("abort", 1, reason="x" * MAX_REASON_BYTES).reason) == 1024
    check_compatible(FP, FP, ignore=("tp_rank", "extras"))
    assert MemoryPageStore(1 << 20).get_many(np.array([1, 2], np.uint64)) == [None, None]  # type: ignore[arg-type]


def test_reason_too_long_counts_bytes() -> None:
    with pytest.raises(InvalidTransferRecordError, match="1026 bytes"):
        TransferRecord("abort", 1, reason="é" * 513)


def test_repage_of_zero_width_pages() -> None:
    out = repage(EMPTY, 8)
    assert out.layout.page_size == 8 and out.page_pool.shape[2] == 0
    assert out.shape[0] == EMPTY.shape[0]  # total_tokens


def test_store_pages_takes_numpy_ids_and_never_truncates_floats() -> None:
    store = MemoryPageStore(1 << 20)
    got = store_pages(store, T, pages=np.array([2, 0]))
    assert got.tolist() == page_digests(T)[[0, 2]].tolist()


def test_a_record_with_too_many_segments_is_refused_before_any_segment_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    count = 65535
    good = encode_record(TransferRecord("abort", 7, reason="x"))
    fixed = bytearray(good[: FAST_TRANSFER_RECORD.size])
    at = FAST_TRANSFER_RECORD.offsets["segment_count"]
    length_at = FAST_TRANSFER_RECORD.offsets["record_length"]
    reason_at = FAST_TRANSFER_RECORD.offsets["tail_length"]
    struct.pack_into("<H", fixed, at, count)
    struct.pack_into("<H", fixed, reason_at, 0)
    body = bytes(fixed) + bytes(FAST_TRANSFER_SEGMENT.size * count)
    struct.pack_into("<I", fixed, length_at, len(body) + 8)
    body = bytes(fixed) + bytes(FAST_TRANSFER_SEGMENT.size * count)
    data = body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body))
    built: list[int] = []
    real = records.Segment

    def counting(*args: Any) -> records.Segment:
        built.append(1)
        return real(*args)

    monkeypatch.setattr(records, "Segment", counting)
    with pytest.raises(InvalidTransferRecordError) as info:
        decode_record(data)
    assert info.value.field == "segment_count" and built == []


def test_an_intact_second_holder_serves_a_digest_whose_first_holder_is_stale() -> None:
    rng = np.random.default_rng(5)
    engine = rng.standard_normal((8, 4, 2, 8)).astype(np.float16)
    engine[5] = engine[2]  # pages 2 and 5 hold the same bytes: two holders of one digest
    store = EnginePoolStore(engine)
    store.index([2, 5])
    digest = int(page_digests(hw.BlockPagedTensor.from_arrays(
        engine, np.array([2]), np.array([0, 1])))[2])  # fmt: skip
    engine[2] += 1  # the engine overwrote page 2 without forget: stale
    assert store.pages_for(np.array([digest], np.uint64)).tolist() == [5]
    got = store.get(digest)
    assert got is not None and bytes(got) == engine[5].tobytes()
    # the in-place delta decode takes the intact holder instead of refusing
    tensor = hw.BlockPagedTensor.from_arrays(engine[5:6].copy(), np.array([0]), np.array([0, 1]))
    blob = hw.encode(tensor, known_pages=np.array([digest], np.uint64))
    out = hw.decode(blob, into=hw.InPlace(store, [0, 1]))
    assert out.block_table.tolist() == [5]
    assert np.array_equal(out.page_pool[out.block_table[0]], engine[5])


def test_a_bad_flag_names_its_own_value() -> None:
    # Before: "field ready: ready must be a bool (found False)", the write flag's value.
    with pytest.raises(ArgumentTypeError, match=r"field ready: .*\(found 1\)"):
        TransferRecord("offer", 1, ready=1)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match=r"field write: .*\(found 'yes'\)"):
        TransferRecord("offer", 1, write="yes")  # type: ignore[arg-type]
