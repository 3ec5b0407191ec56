"""Property tests of the blob over small random valid tensors and random options.

* encode -> decode is bit-exact (every buffer compared as bytes, so NaN payloads, -0.0 and
  sub-byte codes count), the independent reader (``blob_reference``) reads the same
  buffers, and uncompressed blobs are byte-identical to the independent writer's;
* any mutation of a checksummed blob (bit flip, byte overwrite, insert, delete, truncate,
  appended bytes) decodes to an identical tensor or raises ``HurrayWireError``;
* mutations that keep the header checksum valid (a header/entry/descriptor field
  overwritten with an edge value, then re-hashed), and any mutation decoded with
  ``verify=False``, raise ``HurrayWireError`` or give a valid tensor -- never anything else.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

import hurray_wire as hw
from hurray_wire import dtypes
from tests import blob_reference as ref

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
U32_MAX = 0xFFFFFFFF

TYPES = [t for t in dtypes.ELEMENT_TYPES if t.name != "float128"]
AFFINE = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32,
          dtypes.int4, dtypes.uint4, dtypes.int2, dtypes.uint2]  # fmt: skip
PER_BLOCK = [dtypes.int8, dtypes.uint8, dtypes.int4, dtypes.uint4, dtypes.int2, dtypes.uint2]
SCALE_TYPES = [dtypes.float16, dtypes.bfloat16, dtypes.float32]
COMPRESSIONS: list[Any] = [
    None,
    "zstd",
    "shuffle-zstd",
    "default",
    hw.Compression(1, level=3, min_size=0),
    hw.Compression(2, level=1, min_size=0),
]

metadata_values = st.one_of(
    st.text(max_size=8),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.booleans(),
    st.binary(max_size=8),
    st.lists(st.integers(0, 100), min_size=1, max_size=3),
)


def _array(draw: Any, etype: hw.ElementType, count: int) -> np.ndarray:
    """``count`` elements of ``etype`` with random bit patterns."""
    if etype.is_packed:
        raw = draw(st.binary(min_size=count, max_size=count))
        codes: np.ndarray = np.frombuffer(raw, np.uint8) & np.uint8((1 << etype.bit_width) - 1)
        return codes.view(etype.numpy_dtype)
    size = count * etype.numpy_dtype.itemsize
    return np.frombuffer(draw(st.binary(min_size=size, max_size=size)), etype.numpy_dtype)


@st.composite
def tensors(draw: Any) -> hw.BlockPagedTensor:
    scheme = draw(st.sampled_from(["none", "none", "per_tensor", "per_channel", "per_block"]))
    if scheme == "none":
        etype = draw(st.sampled_from(TYPES))
    else:
        etype = draw(st.sampled_from(PER_BLOCK if scheme == "per_block" else AFFINE))
    page_size = draw(st.sampled_from([2, 4]) if scheme == "per_block" else st.integers(1, 4))
    num_pages = draw(st.integers(0, 4))
    heads = draw(st.integers(1, 2))
    dim = draw(st.integers(1, 4))
    num_seqs = draw(st.integers(0, 3))
    block_table: list[int] = []
    seq_ptr = [0]
    lens = []
    for _ in range(num_seqs):
        count = draw(st.integers(0, 3)) if num_pages else 0
        block_table += draw(st.lists(st.integers(0, num_pages - 1), min_size=count,
                                     max_size=count)) if count else []  # fmt: skip
        seq_ptr.append(len(block_table))
        lens.append(draw(st.integers((count - 1) * page_size + 1, count * page_size))
                    if count else 0)  # fmt: skip
    shape = (num_pages, page_size, heads, dim)
    pool = _array(draw, etype, int(np.prod(shape))).reshape(shape)
    quant: Any = None
    scales = zero_points = None
    if scheme == "per_tensor":
        quant = hw.PerTensorAffine(draw(st.sampled_from([0.5, 1.0, 3.25])),
                                   draw(st.integers(0, 1)))  # fmt: skip
    elif scheme in ("per_channel", "per_block"):
        symmetric = draw(st.booleans())
        shared = not symmetric and draw(st.booleans())
        zp_index = None if symmetric else (3 if shared else 4)
        if scheme == "per_channel":
            axis = draw(st.sampled_from([1, 2]))
            quant = hw.PerChannelAffine(axis, 3, zp_index)
            entries, scale_type = (heads, dim)[axis - 1], dtypes.float32
        else:
            scale_type = draw(st.sampled_from(SCALE_TYPES))
            quant = hw.PerBlockAffine(0, page_size, 3, scale_type, zp_index)
            entries = num_pages * page_size
        scales = _array(draw, scale_type, entries)
        if zp_index is not None:
            zero_points = _array(draw, dtypes.int32, entries)
    metadata = draw(st.one_of(st.none(), st.dictionaries(st.text(min_size=1, max_size=6),
                                                         metadata_values, max_size=3)))  # fmt: skip
    layer = draw(st.one_of(st.none(), st.integers(0, U32_MAX - 1)))
    return hw.BlockPagedTensor.from_arrays(
        pool,
        np.array(block_table, np.uint64),
        np.array(seq_ptr, np.uint64),
        seq_lens=lens if draw(st.booleans()) else None,
        kv_role=draw(st.sampled_from(["key", "value", "fused"])),
        layer_index=layer,
        quantization=quant,
        scales=scales,
        zero_points=zero_points,
        block_table_index_type=draw(st.sampled_from(["uint32", "uint64"])),
        metadata=metadata,
        alignment=draw(st.sampled_from([64, 64, 128, 4096])),
    )


def buffers_of(tensor: hw.BlockPagedTensor) -> list[bytes]:
    return [b"".join(p.tobytes() for p in parts) for parts in tensor.buffer_arrays()]


def assert_same(a: hw.BlockPagedTensor, b: hw.BlockPagedTensor) -> None:
    assert a.descriptor == b.descriptor
    assert hw.encode_descriptor(a.descriptor) == hw.encode_descriptor(b.descriptor)
    assert buffers_of(a) == buffers_of(b)
    for name in ("page_pool", "block_table", "seq_ptr", "scales", "zero_points", "seq_lens"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and x.shape == y.shape, name
            assert x.view(np.uint8).tobytes() == y.view(np.uint8).tobytes(), name
    assert a.metadata == b.metadata
    assert a.unpacked_page_pool().view(np.uint8).tobytes() == (
        b.unpacked_page_pool().view(np.uint8).tobytes()
    )


options = st.tuples(st.sampled_from(COMPRESSIONS), st.booleans())


@SETTINGS
@given(tensors(), options)
def test_round_trip_is_bit_exact(tensor: hw.BlockPagedTensor, opts: tuple[Any, bool]) -> None:
    compression, checksum = opts
    blob = bytes(hw.encode(tensor, compression=compression, checksum=checksum))
    assert len(blob) % 64 == 0 and hw.blob_length(blob) == len(blob)
    assert b"".join(hw.encode_parts(tensor, compression=compression, checksum=checksum)) == blob
    decoded = hw.decode(blob)
    assert_same(decoded, tensor)
    assert_same(hw.decode(bytearray(blob), verify=False), tensor)
    parsed = ref.read_blob(blob)
    assert parsed.buffers == buffers_of(tensor)
    assert parsed.seq_lens == (None if tensor.seq_lens is None else tensor.seq_lens.tolist())
    if compression is None:
        assert blob == ref.write_tensor_blob(
            hw.encode_descriptor(tensor.descriptor),
            buffers_of(tensor),
            [h.alignment for h in tensor.descriptor.buffers],
            seq_lens=parsed.seq_lens,
            metadata=tensor.metadata or None,
            checksum=checksum,
        )
    for seq in range(tensor.num_seqs):
        assert decoded.gather_sequence(seq).tobytes() == tensor.gather_sequence(seq).tobytes()


mutations = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 2**20), st.integers(0, 7)),
    st.tuples(st.just("set"), st.integers(0, 2**20), st.integers(0, 255)),
    st.tuples(st.just("insert"), st.integers(0, 2**20), st.integers(0, 255)),
    st.tuples(st.just("delete"), st.integers(0, 2**20), st.integers(1, 64)),
    st.tuples(st.just("truncate"), st.integers(0, 2**20), st.just(0)),
    st.tuples(st.just("append"), st.integers(1, 200), st.integers(0, 255)),
)


def mutate(blob: bytes, op: tuple[str, int, int]) -> bytes:
    kind, position, value = op
    data = bytearray(blob)
    if not data:
        return bytes([value]) * position if kind == "append" else b""
    at = position % len(data)
    if kind == "flip":
        data[at] ^= 1 << value
    elif kind == "set":
        data[at] = value
    elif kind == "insert":
        data.insert(at, value)
    elif kind == "delete":
        del data[at : at + value]
    elif kind == "truncate":
        del data[at:]
    else:
        data += bytes([value]) * position
    return bytes(data)


@SETTINGS
@given(tensors(), st.sampled_from(COMPRESSIONS), st.lists(mutations, min_size=1, max_size=3))
def test_mutations_decode_identically_or_raise(
    tensor: hw.BlockPagedTensor, compression: Any, ops: list[tuple[str, int, int]]
) -> None:
    blob = bytes(hw.encode(tensor, compression=compression))
    mutated = blob
    for op in ops:
        mutated = mutate(mutated, op)
    try:
        decoded = hw.decode(mutated)
    except hw.HurrayWireError:
        return
    assert_same(decoded, tensor)
    assert mutated[: len(blob)] == blob  # only bytes after total_length can be harmless


EDGES = {
    "B": (0, 1, 2, 3, 0x7F, 0x80, 0xFF),
    "H": (0, 1, 3, 0x8000, 0xFFFF),
    "I": (0, 1, 3, 32, 63, 64, 65, 4096, 0x7FFFFFFF, U32_MAX),
    "Q": (0, 1, 63, 64, 65, 2**32, 2**63, 2**64 - 64, 2**64 - 1),
}
FIELDS = [(name, off, fmt) for name, (off, fmt) in ref.HEADER_FIELDS.items() if fmt != "4s"]
ENTRY_FIELDS = [(name, off, fmt) for name, (off, fmt) in ref.ENTRY_FIELDS.items() if fmt != "4s"]


@st.composite
def field_edits(draw: Any, blob: bytes) -> tuple[int, str, int]:
    """(absolute offset, struct format, value): a header, entry or descriptor field."""
    count = struct.unpack_from("<H", blob, 20)[0]
    where = draw(st.sampled_from(["header", "entry", "descriptor"]))
    if where == "header":
        _, off, fmt = draw(st.sampled_from(FIELDS))
    elif where == "entry":
        _, rel, fmt = draw(st.sampled_from(ENTRY_FIELDS))
        off = ref.entry_offset(draw(st.integers(0, count - 1))) + rel
    else:
        length = ref.header_length_of(blob) - ref.entry_offset(count)
        fmt = draw(st.sampled_from("BHIQ"))
        off = ref.entry_offset(count) + draw(st.integers(0, length - struct.calcsize(fmt)))
    return off, fmt, draw(st.sampled_from(EDGES[fmt]))


@SETTINGS
@given(tensors(), st.sampled_from([None, "default"]), st.data())
def test_rehashed_field_edits_never_escape(
    tensor: hw.BlockPagedTensor, compression: Any, data: Any
) -> None:
    blob = bytes(hw.encode(tensor, compression=compression))
    mutated = bytearray(blob)
    for _ in range(data.draw(st.integers(1, 2))):
        off, fmt, value = data.draw(field_edits(blob))
        struct.pack_into("<" + fmt, mutated, off, value)
    header_length = ref.header_length_of(mutated)
    if header_length + 8 <= len(mutated):
        mutated = bytearray(ref.rehash_header(mutated))
    for verify in (True, False):
        try:
            decoded = hw.decode(bytes(mutated), verify=verify)
        except hw.HurrayWireError:
            continue
        # accepted: then it is a valid tensor that re-encodes and decodes
        decoded.metadata = {}
        hw.decode(hw.encode(decoded))


@SETTINGS
@given(tensors(), st.sampled_from(COMPRESSIONS), st.lists(mutations, min_size=1, max_size=4))
def test_unverified_mutations_never_escape(
    tensor: hw.BlockPagedTensor, compression: Any, ops: list[tuple[str, int, int]]
) -> None:
    blob = bytes(hw.encode(tensor, compression=compression, checksum=False))
    mutated = blob
    for op in ops:
        mutated = mutate(mutated, op)
    try:
        decoded = hw.decode(mutated, verify=False)
    except hw.HurrayWireError:
        return
    decoded.metadata = {}  # a mutated metadata section may hold an empty array: not writable
    hw.decode(hw.encode(decoded))
