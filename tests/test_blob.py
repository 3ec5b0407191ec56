"""The blob (docs/wire-format.md): round trips, zero copy, an independent implementation,
every reader rule of § 8 with a crafted violation, corruption and truncation everywhere.

Crafted blobs come from ``tests/blob_reference.py`` (written from the page alone), whose
writer can break one rule at a time and re-computes the header checksum, so that each test
reaches the check it is about.
"""

from __future__ import annotations

import contextlib
import mmap
import struct
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard

import hurray_wire as hw
from hurray_wire import codecs, dtypes, errors as hwe, metadata as hwm
from tests import blob_reference as ref
from tests.conftest import random_pool

ROOT = Path(__file__).resolve().parent.parent
RNG_SEED = 20240601

# -- builders ---------------------------------------------------------------------------------

PACKED = [t for t in dtypes.ELEMENT_TYPES if t.is_packed]
ALL_TYPES = [t for t in dtypes.ELEMENT_TYPES if t.name != "float128"]
COMPRESSIONS: list[Any] = [
    None,
    "zstd",
    "shuffle-zstd",
    "default",
    "zstd:9",
    "shuffle-zstd:3",
    hw.Compression(hw.Compression.parse("zstd").codec, level=2, min_size=0),  # type: ignore[union-attr]
    "chunked-shuffle-zstd:3",
    hw.Compression(codecs.CODEC_CHUNKED, min_size=0, chunk_size=4096, threads=2),
    hw.Compression(hw.Compression.parse("shuffle-zstd").codec, min_size=0),  # type: ignore[union-attr]
]


def spec_pool() -> np.ndarray:
    return np.arange(5 * 4 * 2 * 8, dtype=np.float16).reshape(5, 4, 2, 8)


def spec_tensor(**kwargs: Any) -> hw.BlockPagedTensor:
    """The spec example: float16 [9, 2, 8], page_size 4, 5 pages, block_table [0, 1, 0]."""
    options: dict[str, Any] = {"seq_lens": [6, 3], "layer_index": 3}
    options.update(kwargs)
    return hw.BlockPagedTensor.from_arrays(spec_pool(), [0, 1, 0], [0, 2, 3], **options)


def typed_tensor(etype: hw.ElementType, *, seq_lens: bool = True, **kw: Any) -> hw.BlockPagedTensor:
    pool = random_pool(etype, (5, 4, 2, 3), seed=etype.tag)
    return hw.BlockPagedTensor.from_arrays(
        pool, [0, 1, 0], [0, 2, 3], seq_lens=[6, 3] if seq_lens else None, **kw
    )


def buffers_of(tensor: hw.BlockPagedTensor) -> list[bytes]:
    return [b"".join(p.tobytes() for p in parts) for parts in tensor.buffer_arrays()]


def ref_sections(tensor: hw.BlockPagedTensor) -> list[ref.Section]:
    """The sections of ``tensor`` as the independent writer lays them out (no compression)."""
    sections = [
        ref.section(ref.KIND_BUFFER, raw, index=i, alignment=max(64, handle.alignment))
        for i, (raw, handle) in enumerate(
            zip(buffers_of(tensor), tensor.descriptor.buffers, strict=True)
        )
    ]
    if tensor.seq_lens is not None:
        sections.append(ref.section(ref.KIND_SEQ_LENS, tensor.seq_lens.astype("<u8").tobytes()))
    if tensor.metadata:
        sections.append(ref.section(ref.KIND_METADATA, ref.encode_metadata(tensor.metadata)))
    return sections


def ref_blob(tensor: hw.BlockPagedTensor, **kw: Any) -> bytes:
    return ref.write_tensor_blob(
        hw.encode_descriptor(tensor.descriptor),
        buffers_of(tensor),
        [h.alignment for h in tensor.descriptor.buffers],
        seq_lens=None if tensor.seq_lens is None else tensor.seq_lens.tolist(),
        metadata=tensor.metadata or None,
        **kw,
    )


def assert_same_tensor(a: hw.BlockPagedTensor, b: hw.BlockPagedTensor) -> None:
    """Bit-exact equality of descriptor, every buffer, seq_lens and metadata."""
    assert a.descriptor == b.descriptor
    assert hw.encode_descriptor(a.descriptor) == hw.encode_descriptor(b.descriptor)
    assert a.page_pool.dtype == b.page_pool.dtype
    assert a.page_pool.shape == b.page_pool.shape
    assert buffers_of(a) == buffers_of(b)
    assert a.block_table.dtype == b.block_table.dtype
    assert a.seq_ptr.dtype == b.seq_ptr.dtype
    for name in ("scales", "zero_points", "seq_lens"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype, name
            assert x.view(np.uint8).tobytes() == y.view(np.uint8).tobytes(), name
    assert a.metadata == b.metadata


def rejects(
    blob: Any,
    exc_type: type[BaseException] = hw.HurrayWireError,
    *,
    section: str | None = None,
    offset: int | None = None,
    field: str | None = None,
    **decode_kw: Any,
) -> hw.HurrayWireError:
    with pytest.raises(exc_type) as info:
        hw.decode(blob, **decode_kw)
    exc = info.value
    assert isinstance(exc, hw.HurrayWireError)
    text = str(exc)
    if section is not None:
        assert exc.section is not None and section in exc.section, (exc.section, text)
        assert section in text
    if offset is not None:
        assert exc.offset == offset, (exc.offset, text)
        assert str(offset) in text
    if field is not None:
        assert exc.field == field, (exc.field, text)
    return exc


_COLD = iter(range(10**6, 10**7))


def cold_limits() -> hw.DecodeLimits:
    """Limits no other decode used: the decoder memoises per (header, limits)."""
    return hw.DecodeLimits(max_metadata_bytes=next(_COLD))


# -- § 9 worked example -----------------------------------------------------------------------


def test_worked_example_true_layout() -> None:
    """The spec example with seq_lens, uncompressed: the byte layout the rules of § 2 give."""
    tensor = spec_tensor()
    blob = bytes(hw.encode(tensor))
    magic, major, minor, flags, total, header_length, count, ctype, r0, dlen, r1 = (
        ref.HEADER.unpack_from(blob)
    )
    assert (magic, major, minor, flags, ctype, r0, r1) == (b"HRWB", 1, 0, 0, 1, 0, bytes(4))
    assert (header_length, count, dlen) == (357, 4, 133)
    descriptor = (
        ROOT / "fixtures/conformance/block_paged/descriptors/bp_spec_example_f16_key_l3.bin"
    ).read_bytes()
    assert blob[224:357] == descriptor
    layout = [
        (e["kind"], e["index"], e["offset"], e["stored_size"])
        for e in (ref.entry(blob, i) for i in range(count))
    ]
    assert layout == [(1, 0, 384, 640), (1, 1, 1024, 12), (1, 2, 1088, 12), (2, 0, 1152, 16)]
    assert blob[365:384] == bytes(19)
    assert blob[1168:] == bytes(1216 - 1168)
    assert total == len(blob) == 1216


FIXTURE_BLOBS = sorted((ROOT / "fixtures" / "blobs").glob("*.hrwb"))


def test_worked_example_fixture_is_our_encoding() -> None:
    fixture = (ROOT / "fixtures/blobs/spec_example_f16_key_l3.hrwb").read_bytes()
    pool = np.frombuffer(fixture, np.float16, 5 * 4 * 2 * 8, 384).reshape(5, 4, 2, 8)
    tensor = hw.BlockPagedTensor.from_arrays(pool, [0, 1, 0], [0, 2, 3], seq_lens=[6, 3],
                                             layer_index=3)  # fmt: skip
    assert bytes(hw.encode(tensor)) == fixture == ref_blob(tensor)


@pytest.mark.parametrize("path", FIXTURE_BLOBS, ids=lambda p: p.stem)
def test_fixture_blobs_read_alike(path: Path) -> None:
    """Each golden blob: both readers agree, and re-encoding reproduces it where the
    options are known (uncompressed blobs are reproduced by the independent writer too)."""
    blob = path.read_bytes()
    decoded = hw.decode(blob)
    parsed = ref.read_blob(blob)
    assert parsed.buffers == buffers_of(decoded)
    assert parsed.descriptor == hw.encode_descriptor(decoded.descriptor)
    assert parsed.seq_lens == (None if decoded.seq_lens is None else decoded.seq_lens.tolist())
    assert (parsed.metadata or {}) == decoded.metadata
    if all(s.codec == ref.CODEC_RAW for s in parsed.sections):
        checksum = parsed.checksum_type == ref.CHECKSUM_XXH3
        assert bytes(hw.encode(decoded, checksum=checksum)) == blob
        assert ref_blob(decoded, checksum=checksum) == blob


# -- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", COMPRESSIONS, ids=str)
@pytest.mark.parametrize("etype", ALL_TYPES, ids=lambda t: t.name)
def test_round_trip_every_dtype(etype: hw.ElementType, compression: Any) -> None:
    for with_lens in (True, False):
        tensor = typed_tensor(etype, seq_lens=with_lens)
        blob = hw.encode(tensor, compression=compression)
        decoded = hw.decode(blob)
        assert_same_tensor(decoded, tensor)
        original = random_pool(etype, (5, 4, 2, 3), seed=etype.tag)
        unpacked = decoded.unpacked_page_pool()
        assert unpacked.dtype == original.dtype
        assert unpacked.view(np.uint8).tobytes() == original.view(np.uint8).tobytes()
        parsed = ref.read_blob(blob)  # the independent reader agrees
        assert parsed.buffers == buffers_of(tensor)
        assert parsed.seq_lens == ([6, 3] if with_lens else None)


def _quantized_cases() -> list[tuple[str, Any, hw.ElementType, Any, Any]]:
    n_slots = 5 * 4
    cases: list[tuple[str, Any, hw.ElementType, Any, Any]] = [
        ("per_tensor_sym", hw.PerTensorAffine.symmetric(0.25), dtypes.int8, None, None),
        ("per_tensor_asym", hw.PerTensorAffine.asymmetric(0.5, 7), dtypes.uint8, None, None),
    ]
    for axis, n in ((1, 2), (2, 8)):
        scales = np.linspace(0.5, 2.0, n, dtype=np.float32)
        zps = np.arange(n, dtype=np.int32) - 3
        cases += [
            (f"per_channel_ax{axis}_sym", hw.PerChannelAffine.symmetric(axis, 3), dtypes.int8,
             scales, None),
            (f"per_channel_ax{axis}_asym", hw.PerChannelAffine.asymmetric(axis, 3, 4),
             dtypes.int8, scales, zps),
            (f"per_channel_ax{axis}_shared", hw.PerChannelAffine.asymmetric(axis, 3, 3),
             dtypes.uint8, scales, zps),
        ]  # fmt: skip
    for storage in (dtypes.int8, dtypes.uint8, dtypes.int4):
        for scale_type in (dtypes.float16, dtypes.bfloat16, dtypes.float32):
            scales = np.linspace(0.125, 4.0, n_slots).astype(scale_type.numpy_dtype)
            zps = (np.arange(n_slots, dtype=np.int32) % 5) - 2
            name = f"per_block_{storage.name}_{scale_type.name}"
            cases += [
                (name + "_sym", hw.PerBlockAffine.symmetric(0, 4, 3, scale_type), storage,
                 scales, None),
                (name + "_asym", hw.PerBlockAffine.asymmetric(0, 4, 3, 4, scale_type), storage,
                 scales, zps),
                (name + "_shared", hw.PerBlockAffine.asymmetric(0, 4, 3, 3, scale_type),
                 storage, scales, zps),
            ]  # fmt: skip
    return cases


QUANTIZED = _quantized_cases()


@pytest.mark.parametrize(("name", "quant", "storage", "scales", "zps"), QUANTIZED,
                         ids=[c[0] for c in QUANTIZED])  # fmt: skip
def test_round_trip_quantized(name: str, quant: Any, storage: Any, scales: Any, zps: Any) -> None:
    pool = random_pool(storage, (5, 4, 2, 8), seed=len(name))
    tensor = hw.BlockPagedTensor.from_arrays(
        pool, [0, 1, 0], [0, 2, 3], seq_lens=[6, 3], quantization=quant,
        scales=scales, zero_points=zps,
    )  # fmt: skip
    if "shared" in name:
        assert len(tensor.descriptor.buffers) == 4
    for compression in (None, "zstd", "shuffle-zstd", COMPRESSIONS[-1]):
        blob = hw.encode(tensor, compression=compression)
        decoded = hw.decode(blob)
        assert_same_tensor(decoded, tensor)
        assert decoded.quantization == quant
        if scales is not None:
            assert decoded.scales is not None
            assert decoded.scales.tobytes() == np.asarray(scales).tobytes()
        if zps is not None:
            assert decoded.zero_points is not None
            assert decoded.zero_points.tobytes() == np.asarray(zps).tobytes()
        assert ref.read_blob(blob).buffers == buffers_of(tensor)
    assert bytes(hw.encode(tensor)) == ref_blob(tensor)


@pytest.mark.parametrize("num_pages", [0, 3])
@pytest.mark.parametrize("with_lens", [True, False])
@pytest.mark.parametrize("compression", [None, "default", COMPRESSIONS[-1]], ids=str)
def test_round_trip_empty_batch(num_pages: int, with_lens: bool, compression: Any) -> None:
    pool = random_pool(dtypes.bfloat16, (num_pages, 4, 2, 8))
    tensor = hw.BlockPagedTensor.from_arrays(
        pool, [], [0], seq_lens=[] if with_lens else None, kv_role="value"
    )
    assert tensor.shape == (0, 2, 8) and tensor.num_seqs == 0
    blob = hw.encode(tensor, compression=compression)
    decoded = hw.decode(blob)
    assert_same_tensor(decoded, tensor)
    assert decoded.block_table.size == 0 and decoded.seq_ptr.tolist() == [0]
    parsed = ref.read_blob(blob)
    assert parsed.buffers[1] == b"" and parsed.seq_ptr == [0]
    assert parsed.seq_lens == ([] if with_lens else None)
    if compression is None:
        assert bytes(blob) == ref_blob(tensor)


@pytest.mark.parametrize("compression", [None, "default"])
def test_prefix_sharing_and_partial_pages(compression: Any) -> None:
    # sequences share pages 2 and 0; lengths 7, 6 and 1 leave partial last pages
    pool = random_pool(dtypes.float16, (6, 3, 2, 4), seed=4)
    tensor = hw.BlockPagedTensor.from_arrays(
        pool, [2, 0, 5, 2, 0, 4], [0, 3, 5, 6], seq_lens=[7, 6, 1]
    )
    decoded = hw.decode(hw.encode(tensor, compression=compression))
    assert_same_tensor(decoded, tensor)
    s0, s1, s2 = (decoded.gather_sequence(s) for s in range(3))
    assert s0.shape == (7, 2, 4) and s1.shape == (6, 2, 4) and s2.shape == (1, 2, 4)
    assert s0[:6].tobytes() == s1.tobytes()  # the shared prefix: pages 2, 0
    assert s2.tobytes() == pool[4, :1].tobytes()
    for s in range(3):
        assert decoded.gather_sequence(s).tobytes() == tensor.gather_sequence(s).tobytes()


def test_round_trip_without_seq_lens_uses_page_capacity() -> None:
    tensor = spec_tensor(seq_lens=None)
    assert tensor.shape == (12, 2, 8)
    decoded = hw.decode(hw.encode(tensor))
    assert decoded.seq_lens is None
    assert decoded.gather_sequence(0).shape == (8, 2, 8)


@pytest.mark.parametrize("compression", [None, "default"])
def test_round_trip_uint64_indices_and_options(compression: Any) -> None:
    tensor = spec_tensor(
        block_table_index_type="uint64", kv_role="fused", layer_index=0xFFFFFFFE, alignment=4096
    )
    assert tensor.block_table.dtype == np.dtype("<u8")
    blob = hw.encode(tensor, compression=compression)
    decoded = hw.decode(blob)
    assert_same_tensor(decoded, tensor)
    assert decoded.layer_index == 0xFFFFFFFE and decoded.kv_role == "fused"
    for number in range(3):
        assert ref.entry(bytes(blob), number)["offset"] % 4096 == 0
        assert ref.entry(bytes(blob), number)["alignment"] == 4096
    if compression is None:
        assert bytes(blob) == ref_blob(tensor)


def test_layer_index_none_round_trips() -> None:
    decoded = hw.decode(hw.encode(spec_tensor(layer_index=None, kv_role="value")))
    assert decoded.layer_index is None and decoded.kv_role == "value"


def test_metadata_round_trip() -> None:
    metadata = {
        "model": "llama-3-8b",
        "request_ids": ["r1", "r2"],
        "k_scale": 0.0125,
        "v_scale": float("inf"),
        "step": -42,
        "big": 2**64 - 1,
        "forced_u64": hwm.UInt64(5),
        "flag": True,
        "blob": b"\x00\xff",
        "positions": [1, 2, 3],
        "weights": [0.5, -0.5],
        "ünïcødé": "ключ",
    }
    tensor = spec_tensor(metadata=metadata)
    for compression in (None, "default"):
        decoded = hw.decode(hw.encode(tensor, compression=compression))
        assert decoded.metadata == metadata
        assert isinstance(decoded.metadata["forced_u64"], hwm.UInt64)
        assert type(decoded.metadata["flag"]) is bool
    plain = {k: v for k, v in metadata.items() if k != "forced_u64"}
    parsed = ref.read_blob(hw.encode(spec_tensor(metadata=plain)))
    assert parsed.metadata == plain


def test_no_checksum_blob() -> None:
    tensor = spec_tensor(metadata={"a": 1})
    blob = bytes(hw.encode(tensor, checksum=False))
    assert blob[22] == 0
    assert all(ref.entry(blob, i)["checksum"] == 0 for i in range(5))
    assert_same_tensor(hw.decode(blob), tensor)
    assert blob == ref_blob(tensor, checksum=False)


def test_encode_returns_bytes_like() -> None:
    blob = hw.encode(spec_tensor())
    view = memoryview(blob)
    assert view.nbytes == len(bytes(blob)) and view.nbytes % 64 == 0
    assert bytes(blob)[:4] == b"HRWB"


# -- determinism and the independent implementation -------------------------------------------


def _independent_cases() -> list[tuple[str, Callable[[], hw.BlockPagedTensor]]]:
    return [
        ("spec", spec_tensor),
        ("spec_no_lens", lambda: spec_tensor(seq_lens=None)),
        ("spec_metadata", lambda: spec_tensor(metadata={"m": "x", "n": [1.5, 2.5], "b": b"z"})),
        ("uint64", lambda: spec_tensor(block_table_index_type="uint64")),
        ("align4096", lambda: spec_tensor(alignment=4096)),
        ("bool", lambda: typed_tensor(dtypes.bool_)),
        ("float6", lambda: typed_tensor(dtypes.float6_e3m2)),
        ("complex128", lambda: typed_tensor(dtypes.complex128, seq_lens=False)),
        (
            "empty",
            lambda: hw.BlockPagedTensor.from_arrays(
                np.zeros((0, 2, 1, 8), np.float32), [], [0], seq_lens=[]
            ),
        ),
    ]


@pytest.mark.parametrize(("name", "make"), _independent_cases(), ids=lambda x: x)
def test_independent_writer_matches_encode(
    name: str, make: Callable[[], hw.BlockPagedTensor]
) -> None:
    tensor = make()
    ours = bytes(hw.encode(tensor))
    assert ours == bytes(hw.encode(make())), "encoding is deterministic"
    assert ours == ref_blob(tensor)
    assert bytes(hw.encode(tensor, checksum=False)) == ref_blob(tensor, checksum=False)
    parsed = ref.read_blob(ours)
    assert parsed.buffers == buffers_of(tensor)
    assert parsed.descriptor == hw.encode_descriptor(tensor.descriptor)


@pytest.mark.parametrize(
    "codecs",
    [
        [(ref.CODEC_ZSTD, 0)] * 3,
        [(ref.CODEC_SHUFFLE_ZSTD, 2), (ref.CODEC_SHUFFLE_ZSTD, 4), (ref.CODEC_SHUFFLE_ZSTD, 4)],
        [(ref.CODEC_SHUFFLE_ZSTD, 8), (ref.CODEC_ZSTD, 0), (ref.CODEC_RAW, 0)],
        [(ref.CODEC_SHUFFLE_ZSTD, 4), (ref.CODEC_SHUFFLE_ZSTD, 8), (ref.CODEC_SHUFFLE_ZSTD, 2)],
    ],
)
@pytest.mark.parametrize("level", [1, 19])
def test_decode_accepts_independent_compressed_blobs(codecs: Any, level: int) -> None:
    """Shuffle widths other than the element size are legal too: the width is in the entry."""
    tensor = spec_tensor(metadata={"k": "v"})
    blob = ref_blob(tensor, codecs=codecs, level=level)
    assert_same_tensor(hw.decode(blob), tensor)
    assert ref.read_blob(blob).buffers == buffers_of(tensor)


def test_encode_encode_into_encode_parts_agree() -> None:
    tensor = spec_tensor(metadata={"x": 1})
    for compression in (None, "default", COMPRESSIONS[-1]):
        blob = bytes(hw.encode(tensor, compression=compression))
        parts = hw.encode_parts(tensor, compression=compression)
        assert all(isinstance(p, memoryview) for p in parts)
        assert b"".join(parts) == blob
        out = bytearray(len(blob) + 100)
        assert hw.encode_into(tensor, out, compression=compression) == len(blob)
        assert bytes(out[: len(blob)]) == blob


def test_encode_parts_share_the_tensor_arrays() -> None:
    pool = spec_pool()  # compressible, so that the compressed case below is compressed
    tensor = hw.BlockPagedTensor.from_arrays(pool, [0, 1, 0], [0, 2, 3], seq_lens=[6, 3])
    parts = hw.encode_parts(tensor)

    def sharing(array: np.ndarray) -> list[memoryview]:
        return [p for p in parts if np.shares_memory(np.frombuffer(p, np.uint8), array)]

    assert np.shares_memory(tensor.page_pool, pool)  # from_arrays shares, too
    (piece,) = sharing(pool)
    assert piece.nbytes == pool.nbytes
    assert len(sharing(tensor.block_table)) == 1
    assert len(sharing(tensor.seq_ptr)) == 1
    compressed = hw.encode_parts(tensor, compression=COMPRESSIONS[-1])
    assert not any(np.shares_memory(np.frombuffer(p, np.uint8), pool) for p in compressed)


def test_encode_parts_share_quantization_arrays() -> None:
    scales = np.full(20, 0.5, np.float32)
    zps = np.zeros(20, np.int32)
    tensor = hw.BlockPagedTensor.from_arrays(
        random_pool(dtypes.int8, (5, 4, 2, 8)), [0, 1, 0], [0, 2, 3],
        quantization=hw.PerBlockAffine.asymmetric(0, 4, 3, 4, dtypes.float32),
        scales=scales, zero_points=zps,
    )  # fmt: skip
    parts = hw.encode_parts(tensor)
    for array in (scales, zps):
        assert any(np.shares_memory(np.frombuffer(p, np.uint8), array) for p in parts)


def test_encode_into_errors() -> None:
    tensor = spec_tensor()
    size = len(hw.encode(tensor))
    with pytest.raises(hw.HurrayWireError):
        hw.encode_into(tensor, bytearray(size - 1))
    with pytest.raises(hw.HurrayWireError):
        hw.encode_into(tensor, np.zeros(size - 64, np.uint8))
    with pytest.raises(hw.HurrayWireError):
        hw.encode_into(tensor, bytes(size))
    with pytest.raises(hw.HurrayWireError):
        hw.encode_into(tensor, memoryview(bytearray(size)).toreadonly())
    readonly = np.zeros(size, np.uint8)
    readonly.flags.writeable = False
    with pytest.raises(hw.HurrayWireError):
        hw.encode_into(tensor, readonly)
    with pytest.raises(hw.HurrayWireError):
        hw.encode_into(tensor, "not a buffer")
    assert not readonly.any()
    # a view at an offset inside a larger buffer: only the view is written
    big = bytearray(size + 128)
    assert hw.encode_into(tensor, memoryview(big)[64:]) == size
    assert big[:64] == bytes(64) and big[64 + size :] == bytes(64)
    assert_same_tensor(hw.decode(memoryview(big)[64:]), tensor)


def test_encode_rejects_bad_arguments() -> None:
    for function in (hw.encode_parts, lambda t, **kw: hw.encode_into(t, bytearray(4096), **kw)):
        with pytest.raises(hw.errors.ArgumentTypeError):
            function("tensor")  # type: ignore[arg-type]  # a str, on purpose
    for bad in ("lz4", "zstd:99", 3):
        with pytest.raises(hw.HurrayWireError):
            hw.encode(spec_tensor(), compression=bad)  # type: ignore[arg-type]  # on purpose


def test_encode_rejects_non_tensors() -> None:
    """Regression: encode read tensor.nbytes before its type check (AttributeError)."""
    with pytest.raises(hw.errors.ArgumentTypeError):
        hw.encode("tensor")  # type: ignore[arg-type]


def _snapshot(tensor: hw.BlockPagedTensor) -> list[tuple[bytes, bool]]:
    arrays = [tensor.page_pool, tensor.block_table, tensor.seq_ptr, tensor.scales,
              tensor.zero_points, tensor.seq_lens]  # fmt: skip
    return [(b"", False) if a is None else (a.tobytes(), a.flags.writeable) for a in arrays]


def test_encode_and_decode_never_modify_arrays() -> None:
    scales = np.full(20, 0.5, np.float16)
    tensor = hw.BlockPagedTensor.from_arrays(
        random_pool(dtypes.uint8, (5, 4, 2, 8)), [0, 1, 0], [0, 2, 3], seq_lens=[6, 3],
        quantization=hw.PerBlockAffine.symmetric(0, 4, 3, dtypes.float16), scales=scales,
        metadata={"a": 1},
    )  # fmt: skip
    before = _snapshot(tensor)
    meta = dict(tensor.metadata)
    for compression in (None, "default", COMPRESSIONS[-1]):
        blob = bytearray(hw.encode(tensor, compression=compression))
        hw.encode_parts(tensor, compression=compression)
        hw.encode_into(tensor, bytearray(len(blob)), compression=compression)
        copy = bytes(blob)
        decoded = hw.decode(blob)
        assert bytes(blob) == copy, "decode does not write to its input"
        assert_same_tensor(decoded, tensor)
    assert _snapshot(tensor) == before
    assert tensor.metadata == meta


# -- zero copy --------------------------------------------------------------------------------


def _views(decoded: hw.BlockPagedTensor) -> list[np.ndarray]:
    arrays = [decoded.page_pool, decoded.block_table, decoded.seq_ptr, decoded.seq_lens,
              decoded.scales, decoded.zero_points]  # fmt: skip
    return [a for a in arrays if a is not None and a.size]


def _quant_tensor() -> hw.BlockPagedTensor:
    return hw.BlockPagedTensor.from_arrays(
        random_pool(dtypes.int8, (5, 4, 2, 8)), [0, 1, 0], [0, 2, 3], seq_lens=[6, 3],
        quantization=hw.PerBlockAffine.asymmetric(0, 4, 3, 4, dtypes.bfloat16),
        scales=np.ones(20, dtypes.bfloat16.numpy_dtype), zero_points=np.zeros(20, np.int32),
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "memoryview_rw", "numpy"])
def test_zero_copy_views(kind: str) -> None:
    tensor = _quant_tensor()
    blob = bytes(hw.encode(tensor))
    data: Any = {
        "bytes": blob,
        "bytearray": bytearray(blob),
        "memoryview": memoryview(blob),
        "memoryview_rw": memoryview(bytearray(blob)),
        "numpy": np.frombuffer(bytearray(blob), np.uint8),
    }[kind]
    writable = kind in ("bytearray", "memoryview_rw", "numpy")
    decoded = hw.decode(data)
    assert_same_tensor(decoded, tensor)
    backing = np.frombuffer(data, np.uint8)
    views = _views(decoded)
    assert len(views) == 6
    for array in views:
        assert np.shares_memory(array, backing)
        assert array.flags.writeable == writable


@pytest.mark.parametrize("start", [1, 3, 64, 100])
def test_decode_at_offset_inside_larger_buffer(start: int) -> None:
    tensor = _quant_tensor()
    blob = bytes(hw.encode(tensor))
    big = bytearray(b"\xaa" * start + blob + b"\x55" * 77)
    decoded = hw.decode(memoryview(big)[start:])
    assert_same_tensor(decoded, tensor)
    for array in _views(decoded):
        assert np.shares_memory(array, np.frombuffer(big, np.uint8))
        assert array.flags.writeable
    readonly = bytes(big)
    decoded = hw.decode(memoryview(readonly)[start : start + len(blob)])
    assert_same_tensor(decoded, tensor)
    assert not decoded.page_pool.flags.writeable


def test_decode_from_mmap(tmp_path: Path) -> None:
    tensor = _quant_tensor()
    blob = bytes(hw.encode(tensor))
    path = tmp_path / "blob.bin"
    path.write_bytes(b"\x01" * 192 + blob)
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as m:
        view = memoryview(m)
        decoded = hw.decode(view[192:])
        assert_same_tensor(decoded, tensor)
        for array in _views(decoded):
            assert not array.flags.writeable
            assert np.shares_memory(array, np.frombuffer(m, np.uint8))
        del decoded, array
        view.release()
    with open(path, "r+b") as writable, mmap.mmap(writable.fileno(), 0) as m:
        view = memoryview(m)
        decoded = hw.decode(view[192:])
        assert decoded.page_pool.flags.writeable
        assert_same_tensor(decoded, tensor)
        del decoded
        view.release()


def test_compressed_sections_are_new_arrays() -> None:
    tensor = spec_tensor()
    blob = bytes(hw.encode(tensor, compression=COMPRESSIONS[-1]))
    assert ref.entry(blob, 0)["codec"] == ref.CODEC_SHUFFLE_ZSTD
    decoded = hw.decode(blob)
    assert not np.shares_memory(decoded.page_pool, np.frombuffer(blob, np.uint8))
    assert_same_tensor(decoded, tensor)


def test_concatenated_blobs_decode_one_by_one() -> None:
    tensors = [
        spec_tensor(),
        _quant_tensor(),
        typed_tensor(dtypes.int4, seq_lens=False),
        hw.BlockPagedTensor.from_arrays(np.zeros((0, 1, 1, 1), np.float32), [], [0]),
    ]
    blobs = [
        bytes(hw.encode(t, compression=c))
        for t, c in zip(tensors, [None, "default"] * 2, strict=True)
    ]
    stream = memoryview(b"".join(blobs))
    position = 0
    for tensor, blob in zip(tensors, blobs, strict=True):
        length = hw.blob_length(stream[position:])
        assert length == len(blob) and length % 64 == 0
        assert hw.blob_length(stream[position : position + 16]) == length
        assert_same_tensor(hw.decode(stream[position:]), tensor)
        position += length
    assert position == len(stream)


def test_blob_length_errors() -> None:
    blob = bytes(hw.encode(spec_tensor()))
    with pytest.raises(hwe.BlobTruncatedError):
        hw.blob_length(blob[:15])
    with pytest.raises(hw.errors.InvalidBlobError):
        hw.blob_length(b"HRRY" + blob[4:])
    with pytest.raises(hw.errors.InvalidBlobError):
        hw.blob_length(ref.patch_header(blob, "version_major", 2))
    with pytest.raises(hw.errors.InvalidBlobError):
        hw.blob_length(ref.patch_header(blob, "total_length", 100))


# -- corruption and truncation ----------------------------------------------------------------


CHUNKED_4K = hw.Compression(codecs.CODEC_CHUNKED, min_size=0, chunk_size=4096)


def _chunked_tensor() -> hw.BlockPagedTensor:
    """A float16 pool of 9 KiB: three chunks of 4 KiB."""
    values = np.sin(np.arange(9 * 1024 // 2, dtype=np.float32) / 7).astype(np.float16)
    pool = values.reshape(18, 4, 2, 32)
    return hw.BlockPagedTensor.from_arrays(pool, [0, 5, 17], [0, 2, 3], seq_lens=[8, 4])


def _small_blobs() -> list[tuple[str, bytes]]:
    meta = {"model": "m", "ids": [1, 2]}
    return [
        ("plain", bytes(hw.encode(spec_tensor(metadata=meta)))),
        ("compressed", bytes(hw.encode(spec_tensor(metadata=meta), compression=COMPRESSIONS[-1]))),
        ("chunked", bytes(hw.encode(_chunked_tensor(), compression=CHUNKED_4K))),
        ("quantized", bytes(hw.encode(_quant_tensor()))),
        ("empty", bytes(hw.encode(hw.BlockPagedTensor.from_arrays(
            np.zeros((1, 2, 1, 4), np.int8), [], [0], seq_lens=[])))),
    ]  # fmt: skip


@pytest.mark.parametrize(("name", "blob"), _small_blobs(), ids=lambda x: x if len(x) < 20 else "")
def test_every_single_bit_flip_is_caught(name: str, blob: bytes) -> None:
    hw.decode(blob)
    missed = []
    foreign = []
    unplaced = []
    for position in range(len(blob)):
        for bit in range(8):
            mutated = bytearray(blob)
            mutated[position] ^= 1 << bit
            try:
                hw.decode(bytes(mutated))
            except hw.HurrayWireError as exc:
                if exc.section is None and exc.offset is None:
                    unplaced.append((position, bit, str(exc)))
            except Exception as exc:
                foreign.append((position, bit, repr(exc)))
            else:
                missed.append((position, bit))
    assert not foreign, foreign[:5]
    assert not missed, missed[:5]
    assert not unplaced, unplaced[:5]


@pytest.mark.parametrize(("name", "blob"), _small_blobs(), ids=lambda x: x if len(x) < 20 else "")
def test_every_truncation_is_caught(name: str, blob: bytes) -> None:
    for length in range(len(blob)):
        for data in (blob[:length], bytearray(blob[:length])):
            with pytest.raises(hwe.BlobTruncatedError):
                hw.decode(data)
        with pytest.raises(ref.ReferenceError):
            ref.read_blob(blob[:length])
    assert hw.decode(blob + b"\x00" * 7) is not None  # bytes after total_length: not ours


@pytest.mark.parametrize("chunked", [False, True])
def test_bit_flips_without_verify_never_escape(chunked: bool) -> None:
    """verify=False skips section checksums: flips may decode, but never crash."""
    if chunked:
        blob = bytes(hw.encode(_chunked_tensor(), compression=CHUNKED_4K))
        assert ref.entry(blob, 0)["codec"] == ref.CODEC_CHUNKED
    else:
        blob = bytes(hw.encode(spec_tensor(metadata={"a": "b"})))
    for position in range(len(blob)):
        mutated = bytearray(blob)
        mutated[position] ^= 0x10
        with contextlib.suppress(hw.HurrayWireError):
            hw.decode(bytes(mutated), verify=False)


# -- crafted violations of § 8 ----------------------------------------------------------------

BASE = spec_tensor(metadata={"model": "m"})
BASE_BLOB = bytes(hw.encode(BASE))
DESC = hw.encode_descriptor(BASE.descriptor)
HEADER_LENGTH = 32 + 48 * 5 + len(DESC)  # 405
DESC_START = 32 + 48 * 5


def craft(*, edit: Callable[[list[ref.Section]], None] | None = None, **knobs: Any) -> bytes:
    sections = ref_sections(BASE)
    if edit is not None:
        edit(sections)
    return ref.write_blob(knobs.pop("descriptor", DESC), sections, **knobs)


def test_crafted_baseline_is_our_encoding() -> None:
    assert craft() == BASE_BLOB
    assert_same_tensor(hw.decode(craft()), BASE)


def test_bad_magic() -> None:
    rejects(ref.patch_header(BASE_BLOB, "magic", b"HRWC"), hw.errors.InvalidBlobError,
            section="header", offset=0, field="magic")  # fmt: skip
    rejects(b"HRRY" + BASE_BLOB[4:], hw.errors.InvalidBlobError, offset=0)
    rejects(b"\x00" * 64, hw.errors.InvalidBlobError, offset=0)


@pytest.mark.parametrize("major", [0, 2, 255])
def test_major_version(major: int) -> None:
    rejects(ref.patch_header(BASE_BLOB, "version_major", major), hw.errors.InvalidBlobError,
            section="header", offset=4, field="version_major")  # fmt: skip


@pytest.mark.parametrize("minor", [1, 255])
def test_any_minor_version_is_accepted(minor: int) -> None:
    assert_same_tensor(hw.decode(ref.patch_header(BASE_BLOB, "version_minor", minor)), BASE)
    assert ref.read_blob(ref.patch_header(BASE_BLOB, "version_minor", minor)).version_minor


@pytest.mark.parametrize("flags", [1, 0x8000])
def test_header_flags(flags: int) -> None:
    rejects(ref.patch_header(BASE_BLOB, "header_flags", flags), hw.errors.InvalidBlobError,
            section="header", offset=6, field="header_flags")  # fmt: skip


def test_header_reserved_bytes() -> None:
    rejects(ref.patch_header(BASE_BLOB, "reserved23", 1), hw.errors.InvalidBlobError,
            section="header", offset=23)  # fmt: skip
    for value in (b"\x01\x00\x00\x00", b"\x00\x00\x00\x80"):
        rejects(ref.patch_header(BASE_BLOB, "reserved28", value), hw.errors.InvalidBlobError,
                section="header", offset=28)  # fmt: skip


@pytest.mark.parametrize("ctype", [2, 255])
def test_checksum_type(ctype: int) -> None:
    rejects(craft(checksum_type=ctype), hw.errors.InvalidBlobError,
            section="header", offset=22, field="checksum_type")  # fmt: skip


@pytest.mark.parametrize("delta", [-1, 1, 32, 63])
def test_total_length_not_multiple_of_64(delta: int) -> None:
    blob = ref.patch_header(BASE_BLOB, "total_length", len(BASE_BLOB) + delta)
    rejects(blob + bytes(64), hw.errors.InvalidBlobError, section="header", offset=8,
            field="total_length")  # fmt: skip


@pytest.mark.parametrize("total", [0, 32])
def test_total_length_too_small(total: int) -> None:
    rejects(ref.patch_header(BASE_BLOB, "total_length", total), hw.errors.InvalidBlobError,
            section="header", offset=8)  # fmt: skip


def test_total_length_beyond_input() -> None:
    blob = ref.patch_header(BASE_BLOB, "total_length", len(BASE_BLOB) + 64)
    rejects(blob, hwe.BlobTruncatedError, section="header")
    rejects(ref.patch_header(BASE_BLOB, "total_length", 2**64 - 64), hwe.BlobTruncatedError)


def test_total_length_cuts_the_last_section() -> None:
    blob = ref.patch_header(BASE_BLOB, "total_length", len(BASE_BLOB) - 64)
    exc = rejects(blob, hw.errors.InvalidBlobError, section="metadata")
    assert exc.offset == ref.entry_offset(4) + 16


@pytest.mark.parametrize("delta", [-1, 1, -48, 48, 96])
def test_header_length_mismatch(delta: int) -> None:
    # the header checksum is re-computed where the wrong header_length puts it
    blob = ref.patch_header(BASE_BLOB, "header_length", HEADER_LENGTH + delta)
    rejects(blob, hw.errors.InvalidBlobError, section="header", offset=16, field="header_length")


@pytest.mark.parametrize("header_length", [2**32 - 1, len(BASE_BLOB) - 7])
def test_header_length_beyond_total_length(header_length: int) -> None:
    blob = ref.patch_header(BASE_BLOB, "header_length", header_length, rehash=False)
    rejects(blob, hw.errors.InvalidBlobError, section="header", offset=16, field="header_length")


def test_header_length_checked_before_the_checksum() -> None:
    """Regression (§ 8 order): a wrong header_length was reported as a checksum error at
    the offset it claimed."""
    blob = ref.patch_header(BASE_BLOB, "header_length", HEADER_LENGTH + 1, rehash=False)
    rejects(blob, hw.errors.InvalidBlobError, section="header", offset=16, field="header_length")


def test_section_count_and_descriptor_length_against_header_length() -> None:
    rejects(craft(section_count=4), hw.errors.InvalidBlobError, section="header", offset=16)
    rejects(craft(section_count=6), hw.errors.InvalidBlobError, section="header", offset=16)
    rejects(craft(descriptor_length=len(DESC) + 1), hw.errors.InvalidBlobError, offset=16)


def test_header_checksum() -> None:
    for position in (HEADER_LENGTH, HEADER_LENGTH + 7):
        mutated = bytearray(BASE_BLOB)
        mutated[position] ^= 0x80
        rejects(bytes(mutated), hw.errors.ChecksumError, section="header", offset=HEADER_LENGTH)
    rejects(craft(header_checksum=0), hw.errors.ChecksumError, offset=HEADER_LENGTH)
    # a field edit without re-hashing is caught by the checksum
    rejects(ref.patch_entry(BASE_BLOB, 0, "raw_size", 64, rehash=False), hw.errors.ChecksumError)
    rejects(ref.patch_header(BASE_BLOB, "version_minor", 1, rehash=False), hw.errors.ChecksumError)


def test_descriptor_length_mismatch() -> None:
    # the header says 8 more bytes than the descriptor's own descriptor_length
    exc = rejects(
        craft(descriptor=DESC + bytes(8)), hw.errors.InvalidBlobError, section="descriptor"
    )
    assert exc.offset is not None and exc.offset >= 32 + 48 * 5
    # the descriptor says more than the header gives it
    longer = bytearray(DESC)
    struct.pack_into("<I", longer, 6, len(DESC) + 8)
    rejects(craft(descriptor=bytes(longer)), hw.errors.InvalidDescriptorError, section="descriptor")
    shorter = bytearray(DESC)
    struct.pack_into("<I", shorter, 6, len(DESC) - 1)
    rejects(craft(descriptor=bytes(shorter)), hw.HurrayWireError, section="descriptor")


@pytest.mark.parametrize(
    ("position", "value"),
    [(0, b"X"), (15, b"\x01"), (16, b"\x04"), (44, b"\x01"), (52, b"\x00\x00\x00\x00"),
     (64, b"\x01"), (72, b"\x03"), (77, b"\x02"), (80, b"\x01"), (84, b"\x02"), (93, b"\x03")],
)  # fmt: skip
def test_descriptor_rules_reached_through_the_blob(position: int, value: bytes) -> None:
    desc = bytearray(DESC)
    desc[position : position + len(value)] = value
    exc = rejects(craft(descriptor=bytes(desc)), hw.HurrayWireError, section="descriptor")
    assert exc.offset is None or exc.offset >= DESC_START
    assert isinstance(exc, (hw.errors.InvalidDescriptorError, hw.errors.UnsupportedLayoutError,
                            hw.errors.InvalidBlobError))  # fmt: skip


def test_quantization_buffer_size_in_descriptor() -> None:
    tensor = _quant_tensor()
    desc = bytearray(hw.encode_descriptor(tensor.descriptor))
    struct.pack_into("<Q", desc, 85 + 16 * 3, 20 * 2 + 2)  # scales: 20 bf16 + 2 bytes
    sections = ref_sections(tensor)
    sections[3] = ref.section(ref.KIND_BUFFER, sections[3].stored + b"\0\0", index=3)
    rejects(ref.write_blob(bytes(desc), sections), hw.errors.InvalidDescriptorError,
            section="descriptor")  # fmt: skip


def _set(number: int, **changes: Any) -> Callable[[list[ref.Section]], None]:
    def edit(sections: list[ref.Section]) -> None:
        for key, value in changes.items():
            setattr(sections[number], key, value)

    return edit


@pytest.mark.parametrize("alignment", [32, 1, 0, 96, 65, 2**20 + 64])
@pytest.mark.parametrize("number", [0, 2, 3])
def test_section_alignment(alignment: int, number: int) -> None:
    blob = craft(edit=_set(number, alignment=alignment))
    rejects(blob, hwe.SectionError, offset=ref.entry_offset(number) + 40, field="alignment")


def test_section_alignment_below_the_handles() -> None:
    tensor = spec_tensor(alignment=4096)
    sections = ref_sections(tensor)
    sections[1].alignment = 64
    blob = ref.write_blob(hw.encode_descriptor(tensor.descriptor), sections)
    rejects(blob, hwe.SectionError, section="buffer[1]", offset=ref.entry_offset(1) + 40)
    sections[1].alignment = 8192  # larger than the handle's: fine
    assert_same_tensor(
        hw.decode(ref.write_blob(hw.encode_descriptor(tensor.descriptor), sections)), tensor
    )


@pytest.mark.parametrize("number", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("extra", [1, 64, 128])
def test_misplaced_offset(number: int, extra: int) -> None:
    """Extra padding before a section (even zero bytes, even keeping alignment)."""
    blob = craft(edit=_set(number, extra_padding=extra))
    rejects(blob, hwe.SectionError, offset=ref.entry_offset(number) + 8, field="offset")


def test_offset_moved_backwards_and_overlapping() -> None:
    # buffer[1] at buffer[0]'s offset: the two overlap
    blob = craft(edit=_set(1, offset=384))
    rejects(blob, hwe.SectionError, section="buffer[1]", offset=ref.entry_offset(1) + 8)
    # the first section on top of the header checksum
    blob = craft(edit=_set(0, offset=HEADER_LENGTH))
    rejects(blob, hwe.SectionError, section="buffer[0]", offset=ref.entry_offset(0) + 8)
    # seq_lens overlapping the end of seq_ptr
    seq_ptr_at = ref.entry(BASE_BLOB, 2)["offset"]
    rejects(craft(edit=_set(3, offset=seq_ptr_at + 8, alignment=8 * 8)), hwe.SectionError)


def test_section_beyond_total_length() -> None:
    blob = ref.patch_entry(BASE_BLOB, 4, "stored_size", 2**20)
    rejects(blob, hwe.BlobTruncatedError, section="metadata", offset=ref.entry_offset(4) + 16)
    blob = ref.patch_entry(BASE_BLOB, 4, "stored_size", 2**64 - 1)
    rejects(blob, hw.errors.InvalidBlobError, section="metadata")
    blob = ref.patch_entry(BASE_BLOB, 4, "offset", 2**64 - 64)
    rejects(blob, hw.errors.InvalidBlobError, section="metadata")


def _previous_end(number: int) -> int:
    if number == 0:
        return HEADER_LENGTH + 8
    e = ref.entry(BASE_BLOB, number - 1)
    return int(e["offset"] + e["stored_size"])


NAMES = ["buffer[0]", "buffer[1]", "buffer[2]", "seq_lens", "metadata"]


@pytest.mark.parametrize("number", [0, 2, 3, 4])  # buffer[1] follows buffer[0] without padding
@pytest.mark.parametrize("fill", [0x01, 0x80])
def test_non_zero_padding_before_a_section(number: int, fill: int) -> None:
    assert ref.entry(BASE_BLOB, number)["offset"] > _previous_end(number)
    blob = craft(edit=_set(number, padding_fill=fill))
    rejects(blob, hwe.PaddingError, section=NAMES[number], offset=_previous_end(number))


@pytest.mark.parametrize("number", [0, 2, 3, 4])
def test_non_zero_padding_single_byte(number: int) -> None:
    start, stop = _previous_end(number), ref.entry(BASE_BLOB, number)["offset"]
    for position in (start, (start + stop) // 2, stop - 1):
        mutated = bytearray(BASE_BLOB)
        mutated[position] = 0x40
        rejects(bytes(mutated), hwe.PaddingError, section=NAMES[number], offset=position)


def test_non_zero_trailing_padding() -> None:
    last = ref.entry(BASE_BLOB, 4)
    end = last["offset"] + last["stored_size"]
    rejects(craft(trailing_fill=0x20), hwe.PaddingError, section="trailing", offset=end)
    mutated = bytearray(BASE_BLOB)
    mutated[-1] = 1
    rejects(bytes(mutated), hwe.PaddingError, section="trailing", offset=len(BASE_BLOB) - 1)


def test_extra_trailing_block_is_refused() -> None:
    blob = craft(extra_trailing=64)
    with pytest.raises(ref.ReferenceError):
        ref.read_blob(blob)
    rejects(blob, hw.errors.InvalidBlobError, section="header", limits=cold_limits())


def _swap(i: int, j: int) -> Callable[[list[ref.Section]], None]:
    def edit(sections: list[ref.Section]) -> None:
        sections[i], sections[j] = sections[j], sections[i]

    return edit


def test_buffer_sections_out_of_order() -> None:
    rejects(craft(edit=_swap(1, 2)), hwe.SectionError, section="buffer[2]", field="index",
            offset=ref.entry_offset(1) + 4)  # fmt: skip
    rejects(craft(edit=_swap(0, 3)), hwe.SectionError)  # seq_lens before the buffers
    rejects(craft(edit=_swap(2, 4)), hwe.SectionError)  # metadata between buffers


def test_buffer_section_missing() -> None:
    def drop(number: int) -> Callable[[list[ref.Section]], None]:
        def edit(sections: list[ref.Section]) -> None:
            sections.pop(number)

        return edit

    rejects(craft(edit=drop(2)), hwe.SectionError)  # seq_ptr missing
    rejects(craft(edit=drop(0)), hwe.SectionError, field="index")

    def only_buffers_two(sections: list[ref.Section]) -> None:
        del sections[2:]

    exc = rejects(craft(edit=only_buffers_two), hwe.SectionError)
    assert "buffer" in str(exc)


def test_buffer_section_duplicated() -> None:
    def dup(sections: list[ref.Section]) -> None:
        sections.insert(2, ref.section(ref.KIND_BUFFER, sections[1].stored, index=1))

    rejects(craft(edit=dup), hwe.SectionError, section="buffer[1]", offset=ref.entry_offset(2) + 4)

    def dup_last(sections: list[ref.Section]) -> None:
        sections.insert(3, ref.section(ref.KIND_BUFFER, sections[2].stored, index=2))

    rejects(craft(edit=dup_last), hwe.SectionError, section="buffer[2]")

    def beyond(sections: list[ref.Section]) -> None:
        sections.insert(3, ref.section(ref.KIND_BUFFER, b"", index=3))

    rejects(craft(edit=beyond), hwe.SectionError, section="buffer[3]")


@pytest.mark.parametrize("number", [0, 1, 2])
def test_raw_size_against_descriptor(number: int) -> None:
    def grow(sections: list[ref.Section]) -> None:
        s = sections[number]
        sections[number] = ref.section(ref.KIND_BUFFER, s.stored + bytes(4), index=number)

    rejects(craft(edit=grow), hwe.SectionError, section=f"buffer[{number}]",
            offset=ref.entry_offset(number) + 24, field="raw_size")  # fmt: skip
    blob = ref.patch_entry(BASE_BLOB, number, "raw_size", len(buffers_of(BASE)[number]) - 4)
    rejects(blob, hwe.SectionError, offset=ref.entry_offset(number) + 24)


def test_raw_section_stored_differs_from_raw() -> None:
    stored = buffers_of(BASE)[1] + bytes(4)
    blob = craft(edit=_set(1, stored=stored, raw_size=12))
    rejects(blob, hwe.SectionError, section="buffer[1]", offset=ref.entry_offset(1) + 16)
    meta = ref.entry(BASE_BLOB, 4)
    blob = ref.patch_entry(BASE_BLOB, 4, "raw_size", meta["raw_size"] + 1)
    rejects(blob, hwe.SectionError, section="metadata")


def test_raw_section_with_codec_param() -> None:
    rejects(craft(edit=_set(0, codec_param=2)), hwe.SectionError, section="buffer[0]")


@pytest.mark.parametrize("codec", [4, 7, 255])
@pytest.mark.parametrize("number", [0, 4])
def test_unknown_codec(codec: int, number: int) -> None:
    rejects(craft(edit=_set(number, codec=codec)), hwe.SectionError,
            offset=ref.entry_offset(number) + 2, field="codec")  # fmt: skip


def _compressed(number: int, codec: int, width: int,
                stored: bytes | None = None) -> Callable[[list[ref.Section]], None]:  # fmt: skip
    """Buffer ``number`` stored with ``codec`` / ``width`` (``stored`` forces the bytes)."""

    def edit(sections: list[ref.Section]) -> None:
        raw = buffers_of(BASE)[number]
        data = ref.compress(raw, codec, width) if stored is None else stored
        sections[number] = ref.Section(ref.KIND_BUFFER, data, raw_size=len(raw), index=number,
                                       codec=codec, codec_param=width)  # fmt: skip

    return edit


@pytest.mark.parametrize("width", [0, 1, 3, 5, 16, 255])
def test_shuffle_width(width: int) -> None:
    pool = buffers_of(BASE)[0]
    stored = ref.compress(pool, ref.CODEC_ZSTD)
    blob = craft(edit=_compressed(0, ref.CODEC_SHUFFLE_ZSTD, width, stored=stored))
    exc = rejects(blob, hw.errors.InvalidBlobError, section="buffer[0]")
    assert isinstance(exc, (hwe.DecompressionError, hwe.SectionError))
    assert exc.field == "codec_param" or "width" in str(exc)


def test_zstd_with_codec_param() -> None:
    blob = craft(edit=_compressed(0, ref.CODEC_ZSTD, 2))
    rejects(blob, hw.errors.InvalidBlobError, section="buffer[0]")


@pytest.mark.parametrize("required", [True, False])
@pytest.mark.parametrize("position", ["end", "after_buffers"])
def test_unknown_section_kind(required: bool, position: str) -> None:
    def add(sections: list[ref.Section]) -> None:
        s = ref.section(0x40, b"future extension", alignment=128)
        s.flags = ref.REQUIRED if required else 0
        sections.insert(len(sections) if position == "end" else 3, s)

    blob = craft(edit=add)
    if required:
        rejects(blob, hwe.SectionError, section="0x40", field="kind")
        with pytest.raises(ref.ReferenceError):
            ref.read_blob(blob)
    else:
        assert_same_tensor(hw.decode(blob), BASE)
        assert ref.read_blob(blob).buffers == buffers_of(BASE)


def test_unknown_section_is_still_checked() -> None:
    x40 = b"x" * 40
    number = 5
    rejects(craft(edit=_unknown(x40, checksum=1)), hw.errors.ChecksumError, section="0x41")
    rejects(craft(edit=_unknown(x40, padding_fill=1)), hwe.PaddingError, section="0x41")
    rejects(craft(edit=_unknown(x40, extra_padding=64)), hwe.SectionError,
            offset=ref.entry_offset(number) + 8)  # fmt: skip
    rejects(
        craft(edit=_unknown(x40, alignment=32)),
        hwe.SectionError,
        offset=ref.entry_offset(number) + 40,
    )
    rejects(craft(edit=_unknown(x40, reserved=b"\0\0\0\1")), hwe.SectionError)
    rejects(craft(edit=_unknown(x40, flags=0x02)), hwe.SectionError)
    rejects(craft(edit=_unknown(x40, codec=9)), hwe.SectionError)
    rejects(craft(edit=_unknown(x40, raw_size=41)), hwe.SectionError)
    # compressed unknown sections are skipped without decompressing them
    blob = craft(edit=_unknown(x40, stored=ref.compress(b"y" * 1000, ref.CODEC_ZSTD), raw_size=1000,
                          codec=ref.CODEC_ZSTD))  # fmt: skip
    assert_same_tensor(hw.decode(blob), BASE)


def _unknown(payload: bytes = b"y" * 100, **changes: Any) -> Callable[[list[ref.Section]], None]:
    """Append an optional section of unknown kind 0x41 holding ``payload``, then ``changes``."""

    def edit(sections: list[ref.Section]) -> None:
        s = ref.section(0x41, payload)
        s.flags = 0
        for key, value in changes.items():
            setattr(s, key, value)
        sections.append(s)

    return edit


@pytest.mark.parametrize(("codec", "param"), [(ref.CODEC_ZSTD, 7), (ref.CODEC_SHUFFLE_ZSTD, 3)])
def test_unknown_section_codec_param_is_checked(codec: int, param: int) -> None:
    stored = ref.compress(b"y" * 100, ref.CODEC_ZSTD)
    blob = craft(edit=_unknown(stored=stored, raw_size=100, codec=codec, codec_param=param))
    with pytest.raises(ref.ReferenceError):
        ref.read_blob(blob)
    rejects(blob, hw.errors.InvalidBlobError, section="0x41", limits=cold_limits())


def test_unknown_section_index_is_checked() -> None:
    blob = craft(edit=_unknown(index=5))
    with pytest.raises(ref.ReferenceError):
        ref.read_blob(blob)
    rejects(blob, hwe.SectionError, section="0x41", offset=ref.entry_offset(5) + 4,
            limits=cold_limits())  # fmt: skip


def test_kind_zero_is_invalid() -> None:
    def add(sections: list[ref.Section]) -> None:
        s = ref.section(0, b"zero")
        s.flags = 0
        sections.append(s)

    rejects(craft(edit=add), hwe.SectionError, offset=ref.entry_offset(5))


@pytest.mark.parametrize("flags", [0x02, 0x80, 0xFF])
def test_section_flag_bits(flags: int) -> None:
    rejects(craft(edit=_set(0, flags=flags)), hwe.SectionError, offset=ref.entry_offset(0))


@pytest.mark.parametrize("reserved", [b"\x01\0\0\0", b"\0\0\0\xff"])
@pytest.mark.parametrize("number", [0, 3])
def test_section_reserved_bytes(reserved: bytes, number: int) -> None:
    rejects(craft(edit=_set(number, reserved=reserved)), hwe.SectionError,
            offset=ref.entry_offset(number))  # fmt: skip


def test_extension_sections_duplicated_or_indexed() -> None:
    lens = BASE.seq_lens.astype("<u8").tobytes()  # type: ignore[union-attr]

    def dup_lens(sections: list[ref.Section]) -> None:
        sections.append(ref.section(ref.KIND_SEQ_LENS, lens))

    rejects(craft(edit=dup_lens), hwe.SectionError, section="seq_lens",
            offset=ref.entry_offset(5) + 4)  # fmt: skip

    def dup_meta(sections: list[ref.Section]) -> None:
        sections.append(ref.section(ref.KIND_METADATA, ref.encode_metadata({"other": 1})))

    rejects(craft(edit=dup_meta), hwe.SectionError, section="metadata")
    rejects(craft(edit=_set(3, index=1)), hwe.SectionError, section="seq_lens", field="index")
    rejects(craft(edit=_set(4, index=7)), hwe.SectionError, section="metadata", field="index")


def _with_lens(values: list[int], *, raw: bytes | None = None) -> bytes:
    data = struct.pack(f"<{len(values)}Q", *values) if raw is None else raw
    return craft(edit=_set(3, stored=data, raw_size=len(data)))


def test_seq_lens_wrong_length() -> None:
    rejects(_with_lens([6, 3, 0]), hwe.SectionError, section="seq_lens",
            offset=ref.entry_offset(3) + 24, field="raw_size")  # fmt: skip
    rejects(_with_lens([9]), hwe.SectionError, section="seq_lens")
    rejects(_with_lens([], raw=b""), hwe.SectionError, section="seq_lens")
    rejects(_with_lens([], raw=bytes(20)), hwe.SectionError, section="seq_lens")


@pytest.mark.parametrize("values", [[6, 2], [7, 3], [5, 3], [2**63, 2**63 + 9], [2**64 - 1, 10]])
def test_seq_lens_wrong_sum(values: list[int]) -> None:
    rejects(_with_lens(values), hw.errors.IndexBufferError, section="seq_lens", field="seq_lens")


@pytest.mark.parametrize("values", [[4, 5], [9, 0], [0, 9], [8, 1]])
def test_seq_lens_wrong_page_counts(values: list[int]) -> None:
    # block table pages: sequence 0 has 2 pages (5..8 tokens), sequence 1 has 1 (1..4)
    if values == [8, 1]:
        decoded = hw.decode(_with_lens(values))  # 8 tokens fill two pages exactly: valid
        assert decoded.seq_lens is not None and decoded.seq_lens.tolist() == [8, 1]
        return
    exc = rejects(_with_lens(values), hw.errors.IndexBufferError, section="seq_lens")
    assert "page" in str(exc)


def test_seq_lens_section_compressed() -> None:
    data = BASE.seq_lens.astype("<u8").tobytes()  # type: ignore[union-attr]

    def compressed(sections: list[ref.Section]) -> None:
        sections[3] = ref.section(ref.KIND_SEQ_LENS, data, codec=ref.CODEC_ZSTD)

    assert_same_tensor(hw.decode(craft(edit=compressed)), BASE)


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\x01\x00\x00",
        b"\x01\x00\x00\x00",  # one entry announced, none there
        b"\x02\x00\x00\x00" + b"\x01\x00a\x02" + bytes(8),  # second entry missing
        b"\x01\x00\x00\x00\x00\x00\x02" + bytes(8),  # empty key
        b"\x01\x00\x00\x00\x01\x00a\x09" + bytes(8),  # unknown value tag
        b"\x01\x00\x00\x00\x01\x00a\x05\x02",  # bool 2
        b"\x01\x00\x00\x00\x01\x00a\x01\xff\xff\xff\xff",  # string longer than the section
        b"\x02\x00\x00\x00" + (b"\x01\x00a\x05\x01") * 2,  # duplicated key
        b"\x01\x00\x00\x00\x01\x00\xff\x05\x01",  # key not UTF-8
        b"\x01\x00\x00\x00\x01\x00a\x07\x08\x01\x00\x00\x00",  # bad array element tag
        b"\x01\x00\x00\x00\x01\x00a\x07\x02\xff\xff\xff\xff",  # array count beyond the section
        b"\x00\x00\x00\x00\x00",  # a byte after the last entry
        b"\xff\xff\xff\xff",
    ],
)
def test_metadata_garbage(payload: bytes) -> None:
    blob = craft(edit=_set(4, stored=payload, raw_size=len(payload)))
    rejects(blob, hw.errors.InvalidMetadataError, section="metadata")


def test_metadata_limit() -> None:
    rejects(BASE_BLOB, hw.errors.LimitExceededError, section="metadata",
            limits=hw.DecodeLimits(max_metadata_bytes=4))  # fmt: skip


@pytest.mark.parametrize("number", [0, 1, 2, 3, 4])
def test_section_checksum_mismatch(number: int) -> None:
    e = ref.entry(BASE_BLOB, number)
    name = ["buffer[0]", "buffer[1]", "buffer[2]", "seq_lens", "metadata"][number]
    for position in (0, e["stored_size"] - 1):
        mutated = bytearray(BASE_BLOB)
        mutated[e["offset"] + position] ^= 0x04
        rejects(bytes(mutated), hw.errors.ChecksumError, section=name, offset=e["offset"])
    wrong = ref.patch_entry(BASE_BLOB, number, "checksum", e["checksum"] ^ 1)
    rejects(wrong, hw.errors.ChecksumError, section=name, offset=e["offset"])
    assert_same_tensor(hw.decode(wrong, verify=False), BASE)  # verify=False skips it


def test_verify_false_skips_section_checksums_only() -> None:
    e = ref.entry(BASE_BLOB, 0)
    mutated = bytearray(BASE_BLOB)
    mutated[e["offset"]] ^= 0xFF  # page_pool element 0
    decoded = hw.decode(bytes(mutated), verify=False)
    assert decoded.page_pool.reshape(-1).view(np.uint8)[0] == BASE_BLOB[e["offset"]] ^ 0xFF
    # the header checksum, padding and index invariants are still checked
    header = bytearray(BASE_BLOB)
    header[HEADER_LENGTH] ^= 1
    rejects(bytes(header), hw.errors.ChecksumError, verify=False)
    padding = bytearray(BASE_BLOB)
    padding[HEADER_LENGTH + 8] = 1
    rejects(bytes(padding), hwe.PaddingError, verify=False)
    seq_ptr = bytearray(BASE_BLOB)
    seq_ptr[ref.entry(BASE_BLOB, 2)["offset"]] = 1
    rejects(bytes(seq_ptr), hw.errors.IndexBufferError, verify=False)


@pytest.mark.parametrize("number", [0, 3, 4])
def test_checksum_set_with_checksum_type_zero(number: int) -> None:
    blob = ref_blob(BASE, checksum=False)
    bad = ref.patch_entry(blob, number, "checksum", 1)
    rejects(bad, hwe.SectionError, offset=ref.entry_offset(number) + 32, field="checksum",
            limits=cold_limits())  # fmt: skip
    with pytest.raises(ref.ReferenceError):
        ref.read_blob(bad)


def test_checksum_set_with_checksum_type_zero_after_a_valid_decode() -> None:
    """Regression: the memoised plan (keyed without the checksum fields) skipped this rule
    once the valid checksum_type-0 blob had been decoded."""
    limits = cold_limits()
    blob = ref_blob(BASE, checksum=False)
    hw.decode(blob, limits=limits)
    rejects(ref.patch_entry(blob, 0, "checksum", 1), hwe.SectionError, limits=limits)


def test_checksum_type_zero_passes_payload_edits() -> None:
    """With checksum_type 0 only structure is checked: the page's stated trade-off."""
    blob = bytearray(ref_blob(BASE, checksum=False))
    blob[ref.entry(bytes(blob), 0)["offset"]] ^= 1
    assert hw.decode(bytes(blob)).page_pool.reshape(-1)[0] != BASE.page_pool.reshape(-1)[0]


def _zstd_no_size(data: bytes) -> bytes:
    return bytes(zstandard.ZstdCompressor(write_content_size=False).compress(data))


@pytest.mark.parametrize(
    "stored",
    [
        pytest.param(lambda pool: ref.compress(pool[:-1], ref.CODEC_ZSTD), id="fewer_declared"),
        pytest.param(lambda pool: ref.compress(pool + b"\0", ref.CODEC_ZSTD), id="more_declared"),
        pytest.param(lambda pool: _zstd_no_size(pool[:-1]), id="fewer_undeclared"),
        pytest.param(lambda pool: _zstd_no_size(pool + b"\0"), id="more_undeclared"),
        pytest.param(lambda pool: ref.compress(pool, ref.CODEC_ZSTD) * 2, id="two_frames"),
        pytest.param(lambda pool: ref.compress(pool, ref.CODEC_ZSTD) + b"\0", id="trailing"),
        pytest.param(lambda pool: ref.compress(pool, ref.CODEC_ZSTD)[:-3], id="cut_frame"),
        pytest.param(lambda pool: b"not a zstd frame at all", id="not_zstd"),
        pytest.param(lambda pool: b"", id="empty"),
        pytest.param(lambda pool: b"\x28\xb5\x2f\xfd", id="magic_only"),
    ],
)
@pytest.mark.parametrize("codec", [ref.CODEC_ZSTD, ref.CODEC_SHUFFLE_ZSTD])
def test_zstd_section_of_the_wrong_size(stored: Callable[[bytes], bytes], codec: int) -> None:
    pool = buffers_of(BASE)[0]
    blob = craft(edit=_compressed(0, codec, 2 if codec == 2 else 0, stored=stored(pool)))
    rejects(blob, hwe.DecompressionError, section="buffer[0]")
    with pytest.raises(ref.ReferenceError):
        ref.read_blob(blob)


def test_zstd_frame_corrupt_with_valid_checksum() -> None:
    stored = bytearray(ref.compress(buffers_of(BASE)[0], ref.CODEC_ZSTD))
    stored[len(stored) // 2] ^= 0xFF
    blob = craft(edit=_compressed(0, ref.CODEC_ZSTD, 0, stored=bytes(stored)))
    try:
        decoded = hw.decode(blob)
    except hw.HurrayWireError as exc:
        assert exc.section == "buffer[0]"
    else:  # a flipped literal may still decode to 640 bytes: then the content differs
        assert decoded.page_pool.tobytes() != BASE.page_pool.tobytes()


# -- limits and bombs -------------------------------------------------------------------------


def _bomb_frame(declared: int) -> bytes:
    """A 16-byte zstd frame that declares ``declared`` content bytes (one RLE block)."""
    block = (1 | 1 << 1 | (1 << 17) << 3).to_bytes(3, "little")  # last, RLE, 128 KiB
    return b"\x28\xb5\x2f\xfd" + bytes([0xE0]) + struct.pack("<Q", declared) + block + b"\x00"


def _bomb_blob(declared: int) -> bytes:
    # float16, page_size 1, 1 head, head_dim 8: 16 bytes per page, 2^36 pages = 2^40 bytes
    layout = hw.BlockPagedLayout(1, declared // 16, 0, 0, block_table_index_type="uint64")
    descriptor = hw.TensorDescriptor.block_paged(layout, (0, 1, 8), "float16", num_logical_pages=0)
    assert descriptor.buffers[0].byte_size == declared
    sections = [
        ref.Section(ref.KIND_BUFFER, _bomb_frame(declared), raw_size=declared,
                    codec=ref.CODEC_ZSTD),
        ref.section(ref.KIND_BUFFER, b"", index=1),
        ref.section(ref.KIND_BUFFER, bytes(8), index=2),
    ]  # fmt: skip
    return ref.write_blob(hw.encode_descriptor(descriptor), sections)


@pytest.mark.parametrize(
    "limits", [None, hw.DecodeLimits(max_decompressed_bytes=1 << 30)], ids=["default", "1GiB"]
)
def test_decompression_bomb_refused_without_allocating(limits: Any) -> None:
    blob = _bomb_blob(1 << 40)
    assert len(blob) < 1024
    tracemalloc.start()
    try:
        with pytest.raises((hw.errors.LimitExceededError, hwe.DecompressionError)) as info:
            hw.decode(blob, limits=limits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20
    assert info.value.section == "buffer[0]"


def test_bomb_within_limit_still_refused_by_size() -> None:
    """A frame that declares its (allowed) raw size but holds far fewer bytes."""
    blob = _bomb_blob(1 << 24)
    rejects(blob, hwe.DecompressionError, section="buffer[0]")
    rejects(
        blob, hw.errors.LimitExceededError, limits=hw.DecodeLimits(max_decompressed_bytes=1 << 20)
    )


def test_unknown_size_frame_with_a_huge_window() -> None:
    frame = b"\x28\xb5\x2f\xfd\x00\xa8" + (1 | 1 << 1 | 640 << 3).to_bytes(3, "little") + b"\0"
    blob = craft(edit=_compressed(0, ref.CODEC_ZSTD, 0, stored=frame))
    tracemalloc.start()
    try:
        with pytest.raises((hw.errors.LimitExceededError, hwe.DecompressionError)):
            hw.decode(blob)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


def test_limits_on_sections_and_descriptor() -> None:
    rejects(BASE_BLOB, hw.errors.LimitExceededError, section="header", offset=20,
            limits=hw.DecodeLimits(max_sections=4))  # fmt: skip
    rejects(BASE_BLOB, hw.errors.LimitExceededError, section="header", offset=24,
            limits=hw.DecodeLimits(max_descriptor_length=100))  # fmt: skip
    assert_same_tensor(hw.decode(BASE_BLOB, limits=hw.DecodeLimits(max_sections=5)), BASE)
    compressed = bytes(hw.encode(BASE, compression=COMPRESSIONS[-1]))
    rejects(compressed, hw.errors.LimitExceededError,
            limits=hw.DecodeLimits(max_decompressed_bytes=100))  # fmt: skip
    hw.decode(compressed, limits=hw.DecodeLimits(max_decompressed_bytes=640))


def test_section_count_at_u16_max_is_refused_cheaply() -> None:
    blob = ref.patch_header(BASE_BLOB, "section_count", 0xFFFF)
    rejects(blob, hw.errors.InvalidBlobError, section="header")


# -- index invariants inside the buffers ------------------------------------------------------


def _indices(block_table: list[int], seq_ptr: list[int], *, width: int = 4) -> bytes:
    base = spec_tensor(seq_lens=None, block_table_index_type="uint32" if width == 4 else "uint64")
    sections = ref_sections(base)
    fmt = "<{}" + ("I" if width == 4 else "Q")
    bt = struct.pack(fmt.format(len(block_table)), *block_table)
    sp = struct.pack(fmt.format(len(seq_ptr)), *seq_ptr)
    sections[1] = ref.section(ref.KIND_BUFFER, bt, index=1)
    sections[2] = ref.section(ref.KIND_BUFFER, sp, index=2)
    return ref.write_blob(hw.encode_descriptor(base.descriptor), sections)


@pytest.mark.parametrize("width", [4, 8])
@pytest.mark.parametrize(
    ("block_table", "seq_ptr", "section"),
    [
        ([0, 1, 0], [1, 2, 3], "buffer[2]"),  # seq_ptr[0] != 0
        ([0, 1, 0], [0, 3, 2], "buffer[2]"),  # decreasing
        ([0, 1, 0], [0, 4, 3], "buffer[2]"),  # decreasing, last right
        ([0, 1, 0], [0, 1, 2], "buffer[2]"),  # last != len(block_table)
        ([0, 1, 0], [2, 2, 2], "buffer[2]"),
        ([0, 5, 0], [0, 2, 3], "buffer[1]"),  # page id == num_pages
        ([0, 1, 2**31], [0, 2, 3], "buffer[1]"),
        ([0xFFFFFFFF, 1, 0], [0, 2, 3], "buffer[1]"),
    ],
)
def test_index_invariants(block_table: list[int], seq_ptr: list[int], section: str,
                          width: int) -> None:  # fmt: skip
    exc = rejects(_indices(block_table, seq_ptr, width=width), hw.errors.IndexBufferError,
                  section=section)  # fmt: skip
    assert exc.field in ("seq_ptr", "block_table")
    assert exc.expected is not None or exc.found is not None
    with pytest.raises(ref.ReferenceError):
        ref.read_blob(_indices(block_table, seq_ptr, width=width))


def test_index_invariants_valid_variants() -> None:
    hw.decode(_indices([4, 4, 4], [0, 2, 3]))  # repeated page ids are legal
    hw.decode(_indices([0, 1, 0], [0, 3, 3]))  # an empty sequence


def test_index_invariant_errors_name_the_offset() -> None:
    blob = _indices([0, 5, 0], [0, 2, 3])
    exc = rejects(blob, hw.errors.IndexBufferError, section="buffer[1]")
    assert exc.offset == ref.entry(blob, 1)["offset"] + 4


@pytest.mark.parametrize("values", [[6, 2], [4, 5]])
def test_seq_lens_errors_name_the_offset(values: list[int]) -> None:
    blob = _with_lens(values)
    exc = rejects(blob, hw.errors.IndexBufferError, section="seq_lens")
    e = ref.entry(blob, 3)
    assert exc.offset is not None
    assert e["offset"] <= exc.offset < e["offset"] + e["stored_size"]


def test_decompression_errors_name_the_offset() -> None:
    pool = buffers_of(BASE)[0]
    for stored in (ref.compress(pool[:-1], ref.CODEC_ZSTD), _zstd_no_size(pool[:-1]),
                   b"not a zstd frame at all"):  # fmt: skip
        blob = craft(edit=_compressed(0, ref.CODEC_ZSTD, 0, stored=stored))
        exc = rejects(blob, hwe.DecompressionError, section="buffer[0]")
        e = ref.entry(blob, 0)
        assert exc.offset is not None
        assert e["offset"] <= exc.offset <= e["offset"] + e["stored_size"]


def test_metadata_error_offset_is_a_blob_offset() -> None:
    payload = b"\x01\x00\x00\x00\x01\x00a\x09" + bytes(8)
    blob = craft(edit=_set(4, stored=payload, raw_size=len(payload)))
    exc = rejects(blob, hw.errors.InvalidMetadataError, section="metadata")
    assert exc.offset == ref.entry(blob, 4)["offset"] + 7


# -- bad arguments ----------------------------------------------------------------------------


def test_decode_argument_types() -> None:
    for bad in ("HRWB", None, 12, [1, 2, 3]):
        with pytest.raises(hw.HurrayWireError):
            hw.decode(bad)
    strided = memoryview(bytearray(BASE_BLOB) * 2)[::2]
    with pytest.raises(hw.HurrayWireError):
        hw.decode(strided)
