"""Issue 11, API edges: every bad argument or input is a typed error naming what is wrong.

Each test is one item of the issue: an argument that used to escape as a foreign exception
(``TypeError`` from a comparison), an input accepted that should not be (an unknown reserved
metadata key, set padding bits), or a rule that was undecided (an empty stream, which arrays
of a decoded tensor are writeable).
"""

from __future__ import annotations

import io
import struct
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash

import hurray_wire as hw
from hurray_wire.blob.envelope import AT, CHECKSUM, ENTRY_AT, HEADER, entry_at
from hurray_wire.containers import StreamFile, StreamReader, read_file, write_file
from hurray_wire.errors import (
    ArgumentTypeError,
    HurrayWireError,
    IndexBufferError,
    InvalidContainerError,
    InvalidMetadataError,
    PaddingError,
    StreamTruncatedError,
)
from hurray_wire.fingerprint import EngineFingerprint, fingerprint_to_metadata
from hurray_wire.kv_scale import RESERVED_TENSOR_KEYS
from hurray_wire.model import packing
from hurray_wire.wire.integrity import FINGERPRINT_METADATA_KEY


def small(**kw: Any) -> hw.BlockPagedTensor:
    pool = np.arange(3 * 4 * 2 * 8, dtype=np.float16).reshape(3, 4, 2, 8)
    return hw.BlockPagedTensor.from_arrays(pool, [0, 2, 1], [0, 2, 3], seq_lens=[6, 3], **kw)


# -- sequence indices ------------------------------------------------------------------------
@pytest.mark.parametrize("seq", ["0", 0.0, True, np.bool_(False), None, [0]])
@pytest.mark.parametrize("method", ["gather_sequence", "sequence_pages", "sequence"])
def test_sequence_index_must_be_an_int(method: str, seq: object) -> None:
    with pytest.raises(ArgumentTypeError, match="seq") as info:
        getattr(small(), method)(seq)
    assert info.value.field == "seq"


@pytest.mark.parametrize("seq_ids", ["0", [True], [0.0], 0, [[0]]])
def test_select_ids_must_be_ints(seq_ids: object) -> None:
    with pytest.raises(HurrayWireError, match="seq_ids"):
        small().select(seq_ids)


def test_sequence_index_numpy_int_and_range() -> None:
    t = small()
    assert t.gather_sequence(np.int64(1)).shape == (3, 2, 8)
    assert list(t.sequence_pages(np.uint32(0))) == [0, 2]
    with pytest.raises(hw.errors.InvalidTensorError, match="out of range"):
        t.gather_sequence(2)
    with pytest.raises(hw.errors.InvalidTensorError, match="out of range"):
        t.sequence_pages(-1)


# -- reserved metadata keys ------------------------------------------------------------------
def test_unknown_reserved_key_refused_by_from_arrays() -> None:
    with pytest.raises(InvalidMetadataError, match="reserved") as info:
        small(metadata={"hurray.foo": 1})
    assert info.value.field == "hurray.foo"


def test_known_reserved_keys_accepted() -> None:
    assert {"hurray.k_scale", "hurray.v_scale", FINGERPRINT_METADATA_KEY} == RESERVED_TENSOR_KEYS
    fp = EngineFingerprint("m", "vllm", "0.9", "NHD", "float16", 16, 0, 1)
    meta = {"hurray.k_scale": 0.5, **fingerprint_to_metadata(fp), "hurrayfoo": 1}
    t = small(metadata=meta)
    assert hw.decode(hw.encode(t)).metadata == t.metadata


def test_k_scale_value_is_validated() -> None:
    with pytest.raises(InvalidMetadataError, match="float"):
        small(metadata={"hurray.k_scale": "abc"})


def _renamed_blob(metadata: dict[str, Any]) -> bytes:
    """A valid blob whose ``hurrax.`` keys are then renamed ``hurray.`` in place (same
    length, no checksums): how a hostile peer sends what the encoder would refuse."""
    data = bytes(hw.encode(small(metadata=metadata), checksum=False))
    assert data.count(b"hurrax.") == len(metadata)
    return data.replace(b"hurrax.", b"hurray.")


def test_unknown_reserved_key_refused_on_decode() -> None:
    with pytest.raises(InvalidMetadataError, match="reserved") as info:
        hw.decode(_renamed_blob({"hurrax.foo": 1}))
    assert info.value.section == "metadata" and info.value.field == "hurray.foo"
    with pytest.raises(InvalidMetadataError, match="float") as info:
        hw.decode(_renamed_blob({"hurrax.k_scale": "abc"}))
    assert info.value.field == "hurray.k_scale"


def test_reserved_key_refused_from_hrry(tmp_path: Path) -> None:
    path = tmp_path / "t.hrry"
    write_file(path, {"t": small(metadata={"hurrax.foo": 1})})
    # the tensor metadata is a nested KV section; rename the key inside it (same length)
    data = path.read_bytes()
    assert data.count(b"hurrax.foo") == 1
    path.write_bytes(data.replace(b"hurrax.foo", b"hurray.foo"))
    with pytest.raises(InvalidContainerError, match="reserved"):
        read_file(path)


# -- index arrays and the pool ---------------------------------------------------------------
def test_float_block_table_is_a_dtype_problem() -> None:
    pool = np.zeros((2, 4, 1, 8), np.float16)
    with pytest.raises(IndexBufferError, match=r"must hold integers.*float64") as info:
        hw.BlockPagedTensor.from_arrays(pool, [0.0, 1.0], [0, 2])
    assert info.value.field == "block_table"
    with pytest.raises(IndexBufferError, match=r"must hold integers.*float32"):
        hw.BlockPagedTensor.from_arrays(pool, np.array([0, 1], np.float32), [0, 2])
    with pytest.raises(IndexBufferError, match="must hold integers"):
        hw.BlockPagedTensor.from_arrays(pool, [0, 1.5], [0, 2])
    # ints mixing small values with ones above int64 still work (NumPy guesses float64)
    with pytest.raises(IndexBufferError, match="position 1 does not fit"):
        hw.BlockPagedTensor.from_arrays(pool, [0, 2**64], [0, 2])


def test_nested_list_pool_needs_an_element_type() -> None:
    nested = np.zeros((2, 4, 1, 8)).tolist()
    with pytest.raises(ArgumentTypeError, match="element_type") as info:
        hw.BlockPagedTensor.from_arrays(nested, [0, 1], [0, 2])
    assert info.value.field == "page_pool"
    t = hw.BlockPagedTensor.from_arrays(nested, [0, 1], [0, 2], element_type="float16")
    assert t.page_pool.dtype == np.float16
    with pytest.raises(hw.errors.InvalidTensorError, match="page_pool"):
        hw.BlockPagedTensor.from_arrays([[["x"]]], [0], [0, 1], element_type="float16")


# -- .hrry names -----------------------------------------------------------------------------
def test_read_file_names_must_not_be_a_str(tmp_path: Path) -> None:
    path = tmp_path / "t.hrry"
    write_file(path, {"layer0": small()})
    with pytest.raises(ArgumentTypeError, match="names") as info:
        read_file(path, names="layer0")
    assert info.value.field == "names"
    with pytest.raises(ArgumentTypeError, match="str"):
        read_file(path, names=[b"layer0"])  # type: ignore[list-item]
    assert list(read_file(path, names=("layer0",))) == ["layer0"]
    assert list(read_file(path, names=iter(["layer0"]))) == ["layer0"]


# -- empty streams ---------------------------------------------------------------------------
@pytest.mark.parametrize("source", ["bytes", "bytesio", "path"])
def test_empty_input_is_not_a_stream(source: str, tmp_path: Path) -> None:
    path = tmp_path / "empty.hrws"
    path.write_bytes(b"")
    given: Any = {"bytes": b"", "bytesio": io.BytesIO(b""), "path": path}[source]
    reader = StreamReader(given)
    with pytest.raises(StreamTruncatedError, match="empty input") as info:
        list(reader)
    assert info.value.offset == 0
    with pytest.raises(StreamTruncatedError, match="empty input") as info:  # at open (issue 23)
        StreamFile(b"" if source != "path" else path)
    assert info.value.offset == 0


# -- writeability ----------------------------------------------------------------------------
def _arrays(t: hw.BlockPagedTensor) -> list[np.ndarray]:
    return [a for a in (t.page_pool, t.block_table, t.seq_ptr, t.seq_lens) if a is not None]


@pytest.mark.parametrize("compression", [None, "zstd", "shuffle-zstd"])
def test_decoded_arrays_read_only_exactly_when_the_input_is(compression: str | None) -> None:
    big = np.zeros((64, 16, 2, 64), np.float16)  # compressible: every section compressed
    t = hw.BlockPagedTensor.from_arrays(big, np.arange(64) % 64, [0, 32, 64], seq_lens=[512, 512])
    blob = bytes(hw.encode(t, compression=compression))
    assert not any(a.flags.writeable for a in _arrays(hw.decode(blob)))
    assert not any(a.flags.writeable for a in _arrays(hw.decode(memoryview(blob))))
    assert all(a.flags.writeable for a in _arrays(hw.decode(bytearray(blob))))


def test_hrry_arrays_read_only(tmp_path: Path) -> None:
    path = tmp_path / "t.hrry"
    write_file(path, {"t": small()})
    got = read_file(path)["t"]
    assert not any(a.flags.writeable for a in _arrays(got))


# -- padding bits of packed pools ------------------------------------------------------------
@pytest.mark.parametrize(
    "name", ["bool", "int4", "int2", "float4_e2m1", "float6_e3m2", "float6_e2m3"]
)
@pytest.mark.parametrize("count", [1, 3, 5, 7])
def test_set_padding_bits_refused(name: str, count: int) -> None:
    etype = hw.dtypes.element_type_of(name)
    pool = np.zeros((1, count, 1, 1), etype.numpy_dtype)
    t = hw.BlockPagedTensor.from_arrays(pool, [0], [0, 1])
    used = etype.byte_size(count)
    padding_bits = used * 8 - count * etype.bit_width
    blob = bytearray(hw.encode(t, checksum=False))
    hw.decode(bytes(blob))
    start = struct.unpack_from("<Q", blob, entry_at(0) + ENTRY_AT["offset"])[0]  # buffer 0
    if padding_bits == 0:
        assert packing.first_padding_bit_byte(t.page_pool, etype, count) is None
        return
    blob[start + used - 1] |= 0x80  # the top bit of the last byte is always padding here
    with pytest.raises(PaddingError, match="padding bits") as info:
        hw.decode(bytes(blob))
    assert info.value.section == "buffer[0]"
    assert info.value.offset is not None and info.value.offset >= start


def test_padding_bit_position_is_exact() -> None:
    fp6 = hw.dtypes.element_type_of("float6_e3m2")
    data = np.zeros(3, np.uint8)
    data[1] = 0x10  # bit 12: element 2's low bit, padding once only 2 elements are stored
    assert packing.first_padding_bit_byte(data, fp6, 2) == 1
    assert packing.first_padding_bit_byte(data, fp6, 3) is None
    int4 = hw.dtypes.element_type_of("int4")
    assert packing.first_padding_bit_byte(np.array([0x0F, 0x10], np.uint8), int4, 3) == 1
    assert packing.first_padding_bit_byte(np.array([0x0F, 0x01], np.uint8), int4, 3) is None
    # bytes beyond the elements count as padding too
    assert packing.first_padding_bit_byte(np.array([0x01, 0, 2], np.uint8), int4, 2) == 2


# -- argument regressions --------------------------------------------------------------------
def test_limits_must_be_decode_limits() -> None:
    with pytest.raises(ArgumentTypeError, match="limits"):
        hw.decode(hw.encode(small()), limits={"max_decompressed_bytes": 1})  # type: ignore[arg-type]


def test_checksum_must_be_a_bool() -> None:
    with pytest.raises(ArgumentTypeError, match="checksum"):
        hw.encode(small(), checksum="no")  # type: ignore[arg-type]


# -- concurrency and the decoder's memo ------------------------------------------------------
def _tensors() -> list[hw.BlockPagedTensor]:
    rng = np.random.default_rng(7)
    out = []
    for layer in range(4):
        pool = rng.integers(0, 1 << 16, (8, 4, 2, 16), dtype=np.uint16).view(np.float16)
        out.append(
            hw.BlockPagedTensor.from_arrays(
                pool, rng.permutation(8), [0, 3, 8], layer_index=layer, seq_lens=[10, 17]
            )
        )
    return out


def _same(a: hw.BlockPagedTensor, b: hw.BlockPagedTensor) -> bool:
    return (
        a.descriptor == b.descriptor
        and np.array_equal(a.page_pool.view(np.uint16), b.page_pool.view(np.uint16))
        and np.array_equal(a.block_table, b.block_table)
        and np.array_equal(a.seq_ptr, b.seq_ptr)
        and a.metadata == b.metadata
    )


def test_threads_decoding_while_another_encodes_agree() -> None:
    tensors = _tensors()
    blobs = [bytes(hw.encode(t, compression=c)) for t in tensors for c in (None, "zstd")]
    expected = [hw.decode(b) for b in blobs]
    errors: list[BaseException] = []
    stop = threading.Event()

    def decoder(seed: int) -> None:
        order = np.random.default_rng(seed).integers(0, len(blobs), 60)
        try:
            for i in order:
                if not _same(hw.decode(blobs[i], threads=1), expected[i]):
                    errors.append(AssertionError(f"blob {i} decoded differently"))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def encoder() -> None:
        while not stop.is_set():
            for t in tensors:
                hw.encode(t, compression="zstd")

    background = threading.Thread(target=encoder)
    background.start()
    workers = [threading.Thread(target=decoder, args=(n,)) for n in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    stop.set()
    background.join()
    assert not errors, errors[:3]


def _with_header_flags(blob: bytearray, flags: int) -> None:
    """Set header_flags (reserved: must be 0) and fix the header checksum over it."""
    blob[AT["header_flags"]] = flags
    length = HEADER.struct.unpack_from(blob, 0)[HEADER.names.index("header_length")]
    CHECKSUM.struct.pack_into(blob, length, xxhash.xxh3_64_intdigest(bytes(blob[:length])))


def test_memo_verdict_follows_the_bytes_not_the_buffer() -> None:
    """The same bytearray, valid, then with a bad header field under a fixed checksum: the
    second decode must not reuse the first verdict."""
    tensor = _tensors()[0]
    blob = bytearray(hw.encode(tensor))
    assert _same(hw.decode(blob), tensor)
    _with_header_flags(blob, 1)
    with pytest.raises(hw.errors.InvalidBlobError, match="reserved header flag"):
        hw.decode(blob)
    _with_header_flags(blob, 0)
    assert _same(hw.decode(blob), tensor)


def test_a_buffer_flipped_under_the_decoder_gives_a_tensor_or_a_typed_error() -> None:
    tensor = _tensors()[1]
    good = bytearray(hw.encode(tensor))
    bad = bytearray(good)
    _with_header_flags(bad, 1)
    live = bytearray(good)
    length = len(good)
    stop = threading.Event()

    def flipper() -> None:
        images = (bytes(good), bytes(bad))
        n = 0
        while not stop.is_set():
            live[:length] = images[n % 2]  # not atomic: the reader may see a mixture
            if n % 3 == 0:  # and a reserved byte of the fixed header, unchecksummed
                live[AT["header_flags"] + 1] ^= 0x01
            n += 1

    thread = threading.Thread(target=flipper)
    thread.start()
    outcomes = {"tensor": 0, "error": 0}
    try:
        for _ in range(3000):
            try:
                got = hw.decode(live)
                if got.descriptor != tensor.descriptor:
                    raise AssertionError("a tensor decoded from bytes that were never valid")
                outcomes["tensor"] += 1
            except HurrayWireError:
                outcomes["error"] += 1
    finally:
        stop.set()
        thread.join()
    assert sum(outcomes.values()) == 3000 and outcomes["error"]
