"""The reference containers (containers.md Parts A and B) against the golden fixtures.

Streams: every record decodes to the manifest's descriptor, buffer hashes and lookups, and
re-encodes to the same bytes; a stream may end only at a record boundary. Files: both
layer0 files read back as their manifest says, ``write_file`` reproduces ``layer0_kv.hrry``
byte for byte, ``basic.hrry`` lists its dense tensors and refuses their data, and hostile
files (truncated, corrupted header / trailer / index / descriptors) raise only container
errors. seq_lens and tensor metadata survive a ``.hrry`` round trip; reading one tensor
never touches another's bytes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import io
import socket
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import hurray_wire as hw
from hurray_wire import containers as ref
from hurray_wire.crc32c import crc32c
from hurray_wire.errors import (
    ArgumentTypeError,
    ContainerTruncatedError,
    IndexBufferError,
    InvalidContainerError,
    InvalidDescriptorError,
    InvalidMetadataError,
    InvalidTensorError,
    UnsupportedLayoutError,
)
from hurray_wire.metadata import UInt64
from hurray_wire.model.descriptor import BufferHandle, TensorDescriptor
from hurray_wire.wire.containers import HrryHeader, HrryIndex, HrryTrailer, KvSection
from tests.conftest import BLOCK_PAGED, REFERENCE, load_manifest

BP = load_manifest(BLOCK_PAGED)
REF = load_manifest(REFERENCE)
STREAMS = {case["name"]: case for case in BP["streams"]}
FILES = {Path(case["file"]).name: case for case in BP["files"]}
LAYER0 = BLOCK_PAGED / "files" / "layer0_kv.hrry"
LAYER0_KVFLAG = BLOCK_PAGED / "files" / "layer0_kv_kvflag.hrry"
BASIC = REFERENCE / "files" / "basic.hrry"
MULTI = BLOCK_PAGED / "streams" / "multi_record.hrrs"
CONTAINER_ERRORS = (InvalidContainerError, ContainerTruncatedError)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _buffer_bytes(tensor: hw.BlockPagedTensor) -> list[bytes]:
    return [b"".join(bytes(a) for a in arrays) for arrays in tensor.buffer_arrays()]


def _record_cases(case: dict[str, Any]) -> list[dict[str, Any]]:
    if "records" in case:
        return list(case["records"])
    return [r for name in case["records_from"] for r in STREAMS[Path(name).stem]["records"]]


def _page_slot(tensor: hw.BlockPagedTensor, seq: int, token: int) -> int:
    page_size = tensor.layout.page_size
    logical = int(tensor.seq_ptr[seq]) + token // page_size
    return int(tensor.block_table[logical]) * page_size + token % page_size


def _check_record(tensor: hw.BlockPagedTensor, record: dict[str, Any]) -> None:
    assert hw.encode_descriptor(tensor.descriptor).hex() == record["descriptor_hex"]
    assert tensor.seq_lens is None and tensor.metadata == {}  # a record cannot carry them
    for raw, expected in zip(_buffer_bytes(tensor), record["buffers"], strict=True):
        assert len(raw) == expected["byte_size"]
        assert _sha(raw) == expected["sha256"]
    params = record["params"]
    assert tensor.block_table.tolist() == params["block_table"]
    assert tensor.seq_ptr.tolist() == params["seq_ptr"]
    heads, dim = tensor.shape[1], tensor.shape[2]
    flat = tensor.page_pool.reshape(-1)
    for lookup in record["lookups"]:
        slot = _page_slot(tensor, lookup["seq"], lookup["token"])
        assert slot == lookup["page_slot"]
        index = slot * heads * dim + lookup["head"] * dim + lookup["dim"]
        assert index == lookup["flat_index"]
        if "dequantized" in lookup:  # x = scale[slot] * (q - zero_point[slot])
            assert tensor.scales is not None and tensor.zero_points is not None
            q = int(flat[index])
            scale = float(tensor.scales[slot])
            zero_point = int(tensor.zero_points[slot])
            assert (q, scale, zero_point) == (lookup["q"], lookup["scale"], lookup["zero_point"])
            assert scale * (q - zero_point) == lookup["dequantized"]
        else:
            assert float(flat[index]) == lookup["value"]
            if "bits_hex" in lookup:
                bits = int(flat[index : index + 1].view(np.uint16)[0])
                assert f"{bits:04x}" == lookup["bits_hex"]


# -- streams: golden bytes -------------------------------------------------------------------
@pytest.mark.parametrize("case", BP["streams"], ids=lambda case: case["name"])
@pytest.mark.parametrize("as_file", [False, True], ids=["bytes", "file"])
def test_stream_records_match_the_manifest(case: dict[str, Any], as_file: bool) -> None:
    data = (BLOCK_PAGED / case["file"]).read_bytes()
    assert len(data) == case["total_bytes"] and _sha(data) == case["sha256"]
    tensors = list(ref.read_stream(io.BytesIO(data) if as_file else data))
    records = _record_cases(case)
    assert len(tensors) == case["record_count"] == len(records)
    for tensor, record in zip(tensors, records, strict=True):
        _check_record(tensor, record)


@pytest.mark.parametrize("case", BP["streams"], ids=lambda case: case["name"])
def test_stream_reencodes_byte_for_byte(case: dict[str, Any]) -> None:
    data = (BLOCK_PAGED / case["file"]).read_bytes()
    sink = io.BytesIO()
    written = ref.write_stream(sink, ref.read_stream(data))
    assert sink.getvalue() == data and written == len(data)


def test_multi_record_is_the_four_streams_back_to_back() -> None:
    case = STREAMS["multi_record"]
    tensors = list(ref.read_stream(MULTI.read_bytes()))
    assert len(tensors) == 4
    singles = b"".join((BLOCK_PAGED / name).read_bytes() for name in case["records_from"])
    assert MULTI.read_bytes() == singles
    assert [t.kv_role for t in tensors] == ["key", "value", "key", "key"]
    assert tensors[2].quantization is not None and tensors[3].num_seqs == 0


def test_stream_from_bytes_is_zero_copy_and_read_only() -> None:
    data = MULTI.read_bytes()
    tensor = next(ref.read_stream(data))
    assert not tensor.page_pool.flags.writeable
    assert np.shares_memory(tensor.page_pool, np.frombuffer(data, np.uint8))


def test_single_tensor_and_partial_writes() -> None:
    """A bare tensor is one record; a sink that takes a few bytes per call still gets all."""
    tensors = list(ref.read_stream(MULTI.read_bytes()))

    class Dribble(io.RawIOBase):
        def __init__(self) -> None:
            self.data = bytearray()

        def writable(self) -> bool:
            return True

        def write(self, piece: Any) -> int:
            chunk = bytes(memoryview(piece)[:7])
            self.data += chunk
            return len(chunk)

    sink = Dribble()
    assert ref.write_stream(sink, tensors[0]) == STREAMS["spec_example_f16_key_l3"]["total_bytes"]
    assert (
        bytes(sink.data) == (BLOCK_PAGED / STREAMS["spec_example_f16_key_l3"]["file"]).read_bytes()
    )


def test_stream_over_a_socket() -> None:
    data = MULTI.read_bytes()
    left, right = socket.socketpair()
    with left, right:
        assert ref.write_stream(left, ref.read_stream(data)) == len(data)
        left.shutdown(socket.SHUT_WR)
        tensors = list(ref.read_stream(right))  # recv_into, one record at a time
    sink = io.BytesIO()
    ref.write_stream(sink, tensors)
    assert sink.getvalue() == data


# -- streams: truncation and bad records -----------------------------------------------------
def _boundaries() -> list[int]:
    ends = [0]
    for name in STREAMS["multi_record"]["records_from"]:
        ends.append(ends[-1] + (BLOCK_PAGED / name).stat().st_size)
    return ends


@pytest.mark.parametrize("as_file", [False, True], ids=["bytes", "file"])
def test_stream_truncated_at_every_length(as_file: bool) -> None:
    data = MULTI.read_bytes()
    ends = _boundaries()
    for length in range(len(data) + 1):
        cut = data[:length]
        source: Any = io.BytesIO(cut) if as_file else cut
        if length in ends:
            assert len(list(ref.read_stream(source))) == ends.index(length)
            continue
        record = max(i for i, end in enumerate(ends) if end < length)
        with pytest.raises(ContainerTruncatedError) as info:
            list(ref.read_stream(source))
        assert info.value.section == f"record {record}"
        assert info.value.offset == length


class _Tiny(io.RawIOBase):
    """A source that returns at most 3 bytes per read (short reads are not EOF)."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, out: Any) -> int:
        chunk = self._data.read(min(3, len(out)))
        memoryview(out)[: len(chunk)] = chunk
        return len(chunk)


def test_short_reads_are_not_end_of_stream() -> None:
    data = MULTI.read_bytes()
    assert len(list(ref.read_stream(_Tiny(data)))) == 4
    with pytest.raises(ContainerTruncatedError):
        list(ref.read_stream(_Tiny(data[:-1])))


def test_stream_limits() -> None:
    data = MULTI.read_bytes()
    with pytest.raises(InvalidContainerError, match="descriptor_length above the limit"):
        list(ref.read_stream(data, max_descriptor_length=132))
    with pytest.raises(InvalidContainerError, match="above the limit") as info:
        list(ref.read_stream(data, max_buffer_size=639))
    assert info.value.field == "buffers[0].byte_size"
    at = info.value.offset  # the handle's byte_size in the stream, as stored
    assert at is not None and int.from_bytes(data[at : at + 8], "little") > 639
    assert len(list(ref.read_stream(data, max_buffer_size=640))) == 4
    with pytest.raises(ArgumentTypeError):
        ref.read_stream(data, max_descriptor_length=10)
    with pytest.raises(ArgumentTypeError):
        ref.read_stream(data, max_buffer_size=-1)
    with pytest.raises(ArgumentTypeError):
        ref.read_stream(12345)


def test_huge_declared_buffer_on_a_short_stream_allocates_little() -> None:
    layout = hw.BlockPagedLayout(4, 2**36, 0, 1, "key", None, "uint64")
    descriptor = TensorDescriptor.block_paged(layout, (4, 8, 128), "float16", num_logical_pages=1)
    assert descriptor.buffers[0].byte_size == 2**49
    data = hw.encode_descriptor(descriptor) + bytes(100)
    with pytest.raises(ContainerTruncatedError) as info:
        list(ref.read_stream(io.BytesIO(data)))
    assert info.value.field == "buffers[0]" and info.value.offset == len(data)
    with pytest.raises(ContainerTruncatedError):
        list(ref.read_stream(data))


def test_bad_descriptor_in_a_stream() -> None:
    data = bytearray(MULTI.read_bytes())
    second = _boundaries()[1]
    data[second] = ord("X")  # record 1's magic
    tensors = ref.read_stream(bytes(data))
    next(tensors)
    with pytest.raises(InvalidContainerError) as info:
        next(tensors)
    assert info.value.section == "record 1" and info.value.offset == second
    assert isinstance(info.value.__cause__, InvalidDescriptorError)


@pytest.mark.parametrize("as_file", [False, True], ids=["bytes", "file"])
def test_bad_index_buffer_in_a_stream(as_file: bool) -> None:
    """The blob decoder's index rules apply: a block_table entry outside the pool."""
    case = STREAMS["spec_example_f16_key_l3"]
    data = bytearray((BLOCK_PAGED / case["file"]).read_bytes())
    table_at = case["records"][0]["buffers"][1]["offset_in_record"]
    data[table_at : table_at + 4] = struct.pack("<I", 5)  # num_pages is 5
    source: Any = io.BytesIO(bytes(data)) if as_file else bytes(data)
    with pytest.raises(InvalidContainerError) as info:
        list(ref.read_stream(source))
    assert isinstance(info.value.__cause__, IndexBufferError)
    assert info.value.section == "record 0"


def test_other_layouts_in_a_stream_are_unsupported() -> None:
    data = (REFERENCE / "descriptors" / "row_major_f32_3x4.bin").read_bytes() + bytes(48)
    with pytest.raises(UnsupportedLayoutError) as info:
        list(ref.read_stream(data))
    assert info.value.section == "record 0"


def _with_sync_mode(tensor: hw.BlockPagedTensor, sync_mode: int) -> hw.BlockPagedTensor:
    handles = tuple(
        BufferHandle(h.byte_size, h.alignment, device_tag=1, sync_mode=sync_mode)
        for h in tensor.descriptor.buffers
    )
    descriptor = dataclasses.replace(tensor.descriptor, buffers=handles)
    return hw.BlockPagedTensor._trusted(
        descriptor, tensor.page_pool, tensor.block_table, tensor.seq_ptr
    )


def test_cross_machine_requires_producer_synced_buffers() -> None:
    tensor = next(ref.read_stream(MULTI.read_bytes()))
    event = _with_sync_mode(tensor, 1)
    sink = io.BytesIO()
    with pytest.raises(InvalidContainerError, match="sync_mode"):
        ref.write_stream(sink, [event], cross_machine=True)
    ref.write_stream(sink, [event])
    assert len(list(ref.read_stream(sink.getvalue()))) == 1
    with pytest.raises(InvalidContainerError, match="sync_mode"):
        list(ref.read_stream(sink.getvalue(), cross_machine=True))
    assert ref.write_stream(io.BytesIO(), [_with_sync_mode(tensor, 0)], cross_machine=True) > 0


def test_writer_checks_buffer_lengths() -> None:
    tensor = next(ref.read_stream(MULTI.read_bytes()))
    broken = hw.BlockPagedTensor._trusted(
        tensor.descriptor, tensor.page_pool, tensor.block_table[:-1], tensor.seq_ptr
    )
    with pytest.raises(InvalidTensorError):
        ref.write_stream(io.BytesIO(), [broken])
    with pytest.raises(ArgumentTypeError):
        ref.write_stream(io.BytesIO(), [b"not a tensor"])  # type: ignore[list-item]
    with pytest.raises(ArgumentTypeError):
        ref.write_stream(object(), [tensor])


# -- files: golden bytes ---------------------------------------------------------------------
def _kv_from_manifest(entries: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for entry in entries:
        value = entry["value"]
        if entry["kind"] == "uint64":
            value = UInt64(value)
        elif entry["kind"] == "array" and entry["elem_kind"] == "uint64":
            value = [UInt64(v) for v in value]
        out[entry["key"]] = value
    return out


@pytest.mark.parametrize("name", sorted(FILES))
def test_layer0_files_match_the_manifest(name: str) -> None:
    case = FILES[name]
    path = BLOCK_PAGED / case["file"]
    data = path.read_bytes()
    assert len(data) == case["total_bytes"] and _sha(data) == case["sha256"]
    with ref.HrryFile(path) as hrry:
        assert hrry.header.file_flags == case["file_flags"]
        assert hrry.header.data_buffer_alignment == case["data_buffer_alignment"]
        assert hrry.header.first_descriptor_offset == case["first_descriptor_offset"]
        assert hrry.header.tensor_count_hint == case["tensor_count_hint"]
        assert dataclasses.asdict(hrry.trailer) == case["trailer"]
        assert [dataclasses.asdict(e) for e in hrry.entries] == case["index"]
        assert hrry.names == tuple(t["name"] for t in case["tensors"])
        expected_kv = _kv_from_manifest(case["kv"])
        assert hrry.metadata == expected_kv == hrry.user_metadata
        assert [type(v) for v in hrry.metadata.values()] == [type(v) for v in expected_kv.values()]
        for expected in case["tensors"]:
            tensor = hrry.tensor(expected["name"])
            assert hw.encode_descriptor(tensor.descriptor).hex() == expected["descriptor_hex"]
            assert [_sha(b) for b in _buffer_bytes(tensor)] == expected["buffer_sha256"]
            assert tensor.block_table.tolist() == expected["params"]["block_table"]
            assert tensor.seq_ptr.tolist() == expected["params"]["seq_ptr"]
            assert tensor.seq_lens is None  # the golden file has no hurray.seq_lens.* keys
    assert ref.read_file_metadata(path) == expected_kv


def test_write_file_reproduces_layer0_kv_byte_for_byte(tmp_path: Path) -> None:
    golden = LAYER0.read_bytes()
    for source in (LAYER0, LAYER0_KVFLAG):  # the flag variant reads the same and writes 0x04
        tensors = ref.read_file(source)
        out = tmp_path / "out.hrry"
        assert ref.write_file(out, tensors, ref.read_file_metadata(source)) == len(golden)
        assert out.read_bytes() == golden
    kvflag = LAYER0_KVFLAG.read_bytes()
    assert [i for i, (a, b) in enumerate(zip(golden, kvflag, strict=True)) if a != b] == [12]


def test_write_file_from_fresh_arrays(tmp_path: Path) -> None:
    """Tensors rebuilt with from_arrays (not decoded) write the same file."""
    case = FILES["layer0_kv.hrry"]
    decoded = ref.read_file(LAYER0)
    rebuilt = {}
    for expected in case["tensors"]:
        p = expected["params"]
        rebuilt[expected["name"]] = hw.BlockPagedTensor.from_arrays(
            np.array(decoded[expected["name"]].page_pool),
            p["block_table"],
            p["seq_ptr"],
            total_tokens=p["total_tokens"],
            kv_role=p["kv_role"],
            layer_index=p["layer_index"],
        )
    out = tmp_path / "rebuilt.hrry"
    ref.write_file(out, rebuilt, _kv_from_manifest(case["kv"]))
    assert out.read_bytes() == LAYER0.read_bytes()


def test_written_file_parses_with_the_construct_structs(tmp_path: Path) -> None:
    out = tmp_path / "s.hrry"
    tensors = ref.read_file(LAYER0)
    ref.write_file(out, dict(reversed(tensors.items())), {"a": 1}, sorted_index=True)
    data = out.read_bytes()
    header = HrryHeader.parse(data[:64])
    assert header.file_flags == 0x06 and header.data_buffer_alignment == 4096
    trailer = HrryTrailer.parse(data[-40:])
    index_bytes = data[trailer.index_offset : trailer.index_offset + trailer.index_length]
    assert trailer.index_offset + trailer.index_length == len(data) - 40
    assert crc32c(index_bytes) == trailer.index_crc32c
    index = HrryIndex.parse(index_bytes)
    assert [e.name for e in index.entries] == sorted(e.name for e in index.entries)
    # Sorted index, but tensors stay in write order (value first here).
    by_name = {e.name.decode(): e for e in index.entries}
    assert by_name["kv_cache.layer0.value"].descriptor_offset == 64
    kv = KvSection.parse(data[trailer.kv_offset : trailer.kv_offset + trailer.kv_length])
    assert kv.kv_count == 1
    with ref.HrryFile(out) as hrry:
        assert hrry.names == ("kv_cache.layer0.key", "kv_cache.layer0.value")
        assert hrry.header.sorted_index


def test_write_file_is_deterministic_and_places_buffers(tmp_path: Path) -> None:
    """Quantized (5 buffers) and empty-batch tensors, alignment 8192: § B.3 placement."""
    tensors = list(ref.read_stream(MULTI.read_bytes()))
    named = {"quant": tensors[2], "empty": tensors[3], "key": tensors[0]}
    a, b = tmp_path / "a.hrry", tmp_path / "b.hrry"
    ref.write_file(a, named, data_buffer_alignment=8192)
    ref.write_file(b, named, data_buffer_alignment=8192)
    assert a.read_bytes() == b.read_bytes()
    data = a.read_bytes()
    assert HrryTrailer.parse(data[-40:]).kv_offset == 0  # no KV entries: no section
    with ref.HrryFile(a) as hrry:
        spans = hrry.buffer_spans("quant")
        assert [s for _, s in spans] == [96, 12, 12, 24, 48]
        assert all(offset % 8192 == 0 for offset, _ in spans)
        entry = hrry.entry("quant")
        assert entry.data_length == spans[-1][0] + 48 - entry.data_offset  # no tail padding
        empty = hrry.entry("empty")
        assert empty.data_offset % 8192 == 0 and empty.data_length == 4
        assert hrry.entry("key").descriptor_offset == _align8(empty.data_offset + 4)
        for name, tensor in named.items():
            assert _buffer_bytes(hrry.tensor(name)) == _buffer_bytes(tensor)


def _align8(value: int) -> int:
    return (value + 7) // 8 * 8


def test_write_file_argument_checks(tmp_path: Path) -> None:
    tensors = ref.read_file(LAYER0)
    out = tmp_path / "x.hrry"
    for alignment in (2048, 3000, 4 << 20, True):
        with pytest.raises(InvalidContainerError):
            ref.write_file(out, tensors, data_buffer_alignment=alignment)
    with pytest.raises(InvalidContainerError):
        ref.write_file(out, {"": next(iter(tensors.values()))})
    with pytest.raises(ArgumentTypeError):
        ref.write_file(out, [next(iter(tensors.values()))])  # type: ignore[arg-type]
    with pytest.raises(InvalidMetadataError):
        ref.write_file(out, tensors, {"hurray.seq_lens.x": [UInt64(1)]})
    assert not out.exists()  # nothing is written before everything is encoded


def test_empty_file(tmp_path: Path) -> None:
    out = tmp_path / "empty.hrry"
    assert ref.write_file(out, {}) == 64 + 8 + 40
    assert ref.read_file(out) == {}
    assert ref.read_file_metadata(out) == {}


# -- basic.hrry: a reference file of dense tensors -------------------------------------------
def test_basic_hrry_lists_dense_tensors_and_refuses_their_data() -> None:
    case = REF["files"][0]
    with ref.HrryFile(BASIC) as hrry:
        assert hrry.names == ("weights", "bias")
        assert [
            (e.descriptor_offset, e.descriptor_length, e.data_offset, e.data_length)
            for e in hrry.entries
        ] == [(64, 61, 4096, 16), (4112, 53, 8192, 3)]
        assert hrry.metadata == {"producer": "hurray-conformance", "tensor_count": 2}
        for expected in case["tensors"]:
            header = hrry.descriptor_header(expected["name"])
            assert list(header.shape) == expected["shape"]
            assert header.element_type is not None
            assert header.element_type.name == expected["element_type"]
            assert header.buffer_byte_sizes == (expected["data_bytes"],)
            with pytest.raises(UnsupportedLayoutError):
                hrry.tensor(expected["name"])
            with pytest.raises(UnsupportedLayoutError):
                hrry.descriptor(expected["name"])
    with pytest.raises(UnsupportedLayoutError):
        ref.read_file(BASIC)
    assert ref.read_file(BASIC, names=[]) == {}
    assert ref.read_file_metadata(BASIC)["tensor_count"] == 2


# -- zero copy and laziness ------------------------------------------------------------------
def test_read_file_arrays_are_read_only_views_that_outlive_the_reader() -> None:
    with ref.HrryFile(LAYER0) as hrry:
        tensor = hrry.tensor("kv_cache.layer0.key")
        expected = _buffer_bytes(tensor)
    gc.collect()
    assert not tensor.page_pool.flags.writeable and not tensor.block_table.flags.writeable
    assert _buffer_bytes(tensor) == expected  # the map is still alive
    with pytest.raises(ValueError, match="closed"):
        hrry.tensor("kv_cache.layer0.key")
    tensors = ref.read_file(LAYER0)
    gc.collect()
    assert float(tensors["kv_cache.layer0.value"].page_pool.astype(np.float64).sum()) != 0


def _many_tensors(count: int) -> dict[str, hw.BlockPagedTensor]:
    out = {}
    for i in range(count):
        pool = np.full((3, 4, 2, 4), i, np.float16)
        out[f"layer{i}.key"] = hw.BlockPagedTensor.from_arrays(
            pool, [2, 0, 2], [0, 2, 3], seq_lens=[5, 2], layer_index=i
        )
    return out


def test_one_tensor_is_read_without_touching_the_others(tmp_path: Path) -> None:
    """Every other tensor's descriptor and data are garbage: tensor 17 still reads."""
    path = tmp_path / "many.hrry"
    ref.write_file(path, _many_tensors(20))
    data = bytearray(path.read_bytes())
    with ref.HrryFile(path) as hrry:
        entries = hrry.entries
    for entry in entries:
        if entry.name != "layer17.key":
            for start, stop in (
                (entry.descriptor_offset, entry.descriptor_offset + entry.descriptor_length),
                (entry.data_offset, entry.data_offset + entry.data_length),
            ):
                data[start:stop] = b"\xa5" * (stop - start)
    path.write_bytes(bytes(data))
    with ref.HrryFile(path) as hrry:
        tensor = hrry.tensor("layer17.key")
        assert tensor.layer_index == 17 and float(tensor.page_pool[0, 0, 0, 0]) == 17.0
        assert tensor.seq_lens is not None and tensor.seq_lens.tolist() == [5, 2]
        with pytest.raises(InvalidContainerError):
            hrry.tensor("layer3.key")
        with pytest.raises(InvalidContainerError):
            hrry.descriptor("layer3.key")


# -- seq_lens and tensor metadata through .hrry KV metadata ----------------------------------
def test_seq_lens_and_tensor_metadata_round_trip(tmp_path: Path) -> None:
    tensors = _many_tensors(2)
    tensors["layer0.key"].metadata.update({"k_scale": 0.5, "engine": "vllm", "n": UInt64(7)})
    path = tmp_path / "meta.hrry"
    ref.write_file(path, tensors, {"producer": "test"})
    with ref.HrryFile(path) as hrry:
        assert hrry.user_metadata == {"producer": "test"}
        assert list(hrry.metadata) == [
            "producer",
            "hurray.seq_lens.layer0.key",
            "hurray.metadata.layer0.key",
            "hurray.seq_lens.layer1.key",
        ]
        assert hrry.metadata["hurray.seq_lens.layer0.key"] == [5, 2]
        lens = hrry.metadata["hurray.seq_lens.layer1.key"]
        assert isinstance(lens, list) and all(isinstance(v, UInt64) for v in lens)
    back = ref.read_file(path)
    for name, tensor in tensors.items():
        back_lens, sent_lens = back[name].seq_lens, tensor.seq_lens
        assert back_lens is not None and sent_lens is not None
        assert back_lens.tolist() == sent_lens.tolist()
        assert back[name].metadata == tensor.metadata
        assert _buffer_bytes(back[name]) == _buffer_bytes(tensor)
    assert type(back["layer0.key"].metadata["n"]) is UInt64
    assert back["layer1.key"].gather_sequence(0).shape == (5, 2, 4)


def test_stream_drops_seq_lens_and_metadata() -> None:
    tensor = _many_tensors(1)["layer0.key"]
    tensor.metadata["x"] = 1
    sink = io.BytesIO()
    ref.write_stream(sink, [tensor])
    (back,) = ref.read_stream(sink.getvalue())
    assert back.seq_lens is None and back.metadata == {}
    assert hw.encode_descriptor(back.descriptor) == hw.encode_descriptor(tensor.descriptor)


def _rewrite_kv(path: Path, entries: dict[str, Any], out: Path) -> None:
    tensors = ref.read_file(path)
    for tensor in tensors.values():
        tensor.seq_lens = None
        tensor.metadata = {}
    # Reserved keys cannot be passed to write_file: patch them in through a renamed key.
    renamed = {k.replace("hurray.", "hurrax.", 1): v for k, v in entries.items()}
    ref.write_file(out, tensors, renamed)
    data = out.read_bytes().replace(b"hurrax.", b"hurray.")
    trailer = HrryTrailer.parse(data[-40:])
    assert trailer.kv_length  # the index is unchanged, so its CRC still holds
    out.write_bytes(data)


@pytest.mark.parametrize(
    "value",
    [[UInt64(5), UInt64(3)], [UInt64(5)], [5, 2], "5,2", [UInt64(4), UInt64(3)]],
    ids=["wrong-sum", "wrong-count", "int64-array", "string", "wrong-pages"],
)
def test_invalid_seq_lens_in_metadata(tmp_path: Path, value: Any) -> None:
    path = tmp_path / "one.hrry"
    ref.write_file(path, _many_tensors(1))
    bad = tmp_path / "bad.hrry"
    _rewrite_kv(path, {"hurray.seq_lens.layer0.key": value}, bad)
    with ref.HrryFile(bad) as hrry:
        with pytest.raises(InvalidContainerError) as info:
            hrry.tensor("layer0.key")
        assert info.value.section == "kv_metadata"


@pytest.mark.parametrize("value", [b"\x01\x00\x00\x00", 7], ids=["bad-section", "not-bytes"])
def test_invalid_tensor_metadata(tmp_path: Path, value: Any) -> None:
    path = tmp_path / "one.hrry"
    ref.write_file(path, _many_tensors(1))
    bad = tmp_path / "bad.hrry"
    _rewrite_kv(path, {"hurray.metadata.layer0.key": value}, bad)
    with ref.HrryFile(bad) as hrry, pytest.raises(InvalidContainerError):
        hrry.tensor("layer0.key")


def test_empty_batch_seq_lens_are_not_stored(tmp_path: Path) -> None:
    """An empty batch has no lengths; the reference writer refuses empty arrays."""
    empty = hw.BlockPagedTensor.from_arrays(
        np.zeros((0, 4, 2, 8), np.float16), [], [0], seq_lens=[]
    )
    path = tmp_path / "e.hrry"
    ref.write_file(path, {"e": empty})
    assert ref.read_file_metadata(path) == {}
    assert ref.read_file(path)["e"].seq_lens is None


# -- hostile files ---------------------------------------------------------------------------
def _exercise(data: bytes) -> None:
    """Open an image and read everything in it, the way a dump tool would."""
    with ref.HrryFile.from_buffer(data) as hrry:
        _ = hrry.metadata
        for name in hrry.names:
            hrry.descriptor_header(name)
            hrry.tensor(name)


def _expect_container_error(data: bytes, match: str | None = None) -> None:
    with pytest.raises(CONTAINER_ERRORS, match=match):
        _exercise(data)


def test_golden_images_exercise_cleanly() -> None:
    _exercise(LAYER0.read_bytes())
    _exercise(LAYER0_KVFLAG.read_bytes())


def test_file_truncated_at_every_length(tmp_path: Path) -> None:
    data = LAYER0.read_bytes()
    for length in range(len(data)):
        _expect_container_error(data[:length])
    path = tmp_path / "t.hrry"
    for length in (0, 1, 63, 103, 104, 4096, len(data) - 41, len(data) - 1):
        path.write_bytes(data[:length])
        with pytest.raises(CONTAINER_ERRORS):
            ref.read_file(path)


def _patch(data: bytes, offset: int, fmt: str, value: Any) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


_TRAILER_AT = 24908 - 40


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "match"),
    [
        (0, "<B", ord("X"), "file magic"),
        (8, "<B", 0, "major"),
        (8, "<B", 2, "major"),
        (10, "<B", 1, "reserved header"),
        (63, "<B", 1, "reserved header"),
        (12, "<I", 0x0C, "reserved file_flags"),
        (16, "<I", 2048, "data_buffer_alignment"),
        (16, "<I", 4097, "data_buffer_alignment"),
        (16, "<I", 4 << 20, "data_buffer_alignment"),
        (20, "<Q", 56, "first_descriptor_offset"),
        (20, "<Q", 68, "first_descriptor_offset"),
        (20, "<Q", 1 << 60, "first_descriptor_offset"),
        (20, "<Q", 128, "descriptor_offset"),
        (_TRAILER_AT + 36, "<B", ord("X"), "trailer magic"),
        (_TRAILER_AT + 32, "<B", 1, "reserved trailer"),
        (_TRAILER_AT, "<Q", 1 << 63, "index outside"),
        (_TRAILER_AT, "<Q", 8, "index outside"),
        (_TRAILER_AT + 8, "<Q", 117, "index outside"),
        (_TRAILER_AT + 8, "<Q", 4, "index outside"),
        (_TRAILER_AT + 8, "<Q", 115, "CRC"),
        (_TRAILER_AT + 16, "<Q", 0, "both be 0"),
        (_TRAILER_AT + 24, "<I", 0, "both be 0"),
        (_TRAILER_AT + 16, "<Q", 1 << 62, "KV section outside"),
        (_TRAILER_AT + 24, "<I", 0xFFFF_FFFF, "KV section outside"),
        (_TRAILER_AT + 24, "<I", 152, "kv_metadata"),
        (_TRAILER_AT + 28, "<I", 0, "CRC"),
        (24592, "<I", 7, "kv_metadata"),  # kv_count
    ],
)
def test_corrupted_header_and_trailer(offset: int, fmt: str, value: Any, match: str) -> None:
    _expect_container_error(_patch(LAYER0.read_bytes(), offset, fmt, value), match)


def test_crc_mismatch_and_crc_flag() -> None:
    data = LAYER0.read_bytes()
    flipped = bytearray(data)
    flipped[24752 + 30] ^= 0x01  # inside the index
    with pytest.raises(InvalidContainerError, match="CRC-32C mismatch") as info:
        ref.HrryFile.from_buffer(bytes(flipped))
    assert info.value.field == "index_crc32c"
    no_flag = _patch(data, 12, "<I", 0)  # flag clear, CRC field still set: refused ([A21])
    _expect_container_error(no_flag, "must be 0 when HAS_INDEX_CRC32C is clear")
    accepted = _patch(no_flag, _TRAILER_AT + 28, "<I", 0)
    _exercise(accepted)
    _exercise(_patch(data, 12, "<I", 0x05))  # HAS_KV_METADATA set: accepted ([A17])


def _with_index(data: bytes, index: bytes) -> bytes:
    """The file with its index bytes replaced (same place) and trailer / CRC updated."""
    trailer = HrryTrailer.parse(data[-40:])
    start = trailer.index_offset
    body = data[:start] + index
    return body + bytes(
        HrryTrailer.build(
            {
                "index_offset": start,
                "index_length": len(index),
                "kv_offset": trailer.kv_offset,
                "kv_length": trailer.kv_length,
                "index_crc32c": crc32c(index),
            }
        )
    )


def _index_of(data: bytes) -> Any:
    trailer = HrryTrailer.parse(data[-40:])
    return HrryIndex.parse(data[trailer.index_offset : trailer.index_offset + trailer.index_length])


def _patched_index(field: str, value: Any, entry: int = 0) -> bytes:
    data = LAYER0.read_bytes()
    index = _index_of(data)
    index.entries[entry][field] = value
    return _with_index(data, HrryIndex.build(index))


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("flags", 1, "flags must be 0"),
        ("descriptor_length", 134, "differs from the descriptor's own"),
        ("descriptor_length", 132, "differs from the descriptor's own"),
        ("descriptor_length", 10, "out of range"),
        ("descriptor_length", 0xFFFF_FFFF, "out of range"),
        ("descriptor_offset", 68, "8-aligned"),
        ("descriptor_offset", 0, "8-aligned"),
        ("descriptor_offset", 72, "bad magic"),
        ("descriptor_offset", 1 << 62, "past the file body"),
        ("data_offset", 4096 + 64, "data_buffer_alignment"),
        ("data_offset", 8192, "descriptor_length|block_table|seq_ptr"),  # reads padding/garbage
        ("data_offset", 1 << 40, "past the file body"),
        ("data_length", 8205, "data_length"),
        ("data_length", 216, "data_length"),
        ("name", b"kv_cache.layer0.value", "duplicate"),
        ("name", b"\xff\xfe", "UTF-8"),
    ],
)
def test_corrupted_index_entries(field: str, value: Any, match: str) -> None:
    _expect_container_error(_patched_index(field, value), match)


def test_corrupted_index_structure() -> None:
    data = LAYER0.read_bytes()
    index = HrryIndex.build(_index_of(data))
    _expect_container_error(_with_index(data, index + b"\0"), "left over")
    _expect_container_error(_with_index(data, index[:-1]), "ends inside an entry")
    _expect_container_error(_with_index(data, struct.pack("<Q", 3) + index[8:]), "inside an entry")
    _expect_container_error(_with_index(data, struct.pack("<Q", 4) + index[8:]), "entry_count")
    _expect_container_error(
        _with_index(data, struct.pack("<Q", 1 << 63) + index[8:]), "entry_count"
    )
    empty_name = bytearray(index)
    struct.pack_into("<H", empty_name, 8, 0)
    _expect_container_error(_with_index(data, bytes(empty_name)), "empty tensor name")
    unsorted = _patch(_with_index(data, bytes(reversed_index(data))), 12, "<I", 0x06)
    _expect_container_error(unsorted, "not sorted")
    _exercise(_patch(_with_index(data, index), 12, "<I", 0x06))  # really sorted: fine


def reversed_index(data: bytes) -> bytes:
    index = _index_of(data)
    index.entries = list(reversed(index.entries))
    return bytes(HrryIndex.build(index))


def test_corrupted_tensor_data_is_a_container_error() -> None:
    data = bytearray(LAYER0.read_bytes())
    data[4096 + 4096 : 4096 + 4096 + 4] = struct.pack("<I", 9)  # block_table[0] of the key
    with ref.HrryFile.from_buffer(bytes(data)) as hrry:
        with pytest.raises(InvalidContainerError) as info:
            hrry.tensor("kv_cache.layer0.key")
        assert isinstance(info.value.__cause__, IndexBufferError)
        hrry.tensor("kv_cache.layer0.value")


def _interesting_offsets() -> list[int]:
    """Every byte that is not zero padding between regions in layer0_kv.hrry."""
    ranges = [(0, 64), (64, 197), (4096, 4288), (8192, 8204), (12288, 12300)]
    ranges += [(12304, 12437), (16384, 16576), (20480, 20492), (24576, 24588)]
    ranges += [(24592, 24745), (24752, 24908)]
    return [i for start, stop in ranges for i in range(start, stop)]


def test_every_single_byte_corruption_raises_only_container_errors() -> None:
    data = LAYER0.read_bytes()
    for offset in _interesting_offsets():
        for new in {0x00, 0xFF, data[offset] ^ 0x01, data[offset] ^ 0x80}:
            if new == data[offset]:
                continue
            corrupted = bytearray(data)
            corrupted[offset] = new
            try:
                _exercise(bytes(corrupted))
            except (*CONTAINER_ERRORS, UnsupportedLayoutError):
                pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    edits=st.lists(st.tuples(st.integers(0, 24907), st.integers(0, 255)), min_size=1, max_size=8),
    cut=st.integers(0, 24908),
)
def test_fuzzed_files_raise_only_container_errors(edits: list[tuple[int, int]], cut: int) -> None:
    data = bytearray(LAYER0.read_bytes())
    for offset, value in edits:
        data[offset] = value
    try:
        _exercise(bytes(data[: max(cut, 104)]))
    except (*CONTAINER_ERRORS, UnsupportedLayoutError):
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.integers(0, 2140))
def test_fuzzed_streams_raise_only_container_errors(noise: bytes, at: int) -> None:
    data = MULTI.read_bytes()
    spliced = data[:at] + noise + data[at + len(noise) :]
    try:
        list(ref.read_stream(spliced))
    except (*CONTAINER_ERRORS, UnsupportedLayoutError):
        pass


def test_rewriting_the_file_being_read_keeps_its_arrays_valid(tmp_path: Path) -> None:
    """write_file renames a new image into place: the old map (and its arrays) survive."""
    path = tmp_path / "same.hrry"
    path.write_bytes(LAYER0.read_bytes())
    tensors = ref.read_file(path)
    before = {name: _buffer_bytes(t) for name, t in tensors.items()}
    ref.write_file(path, {"only": tensors["kv_cache.layer0.value"]})
    assert {name: _buffer_bytes(t) for name, t in tensors.items()} == before
    assert list(ref.read_file(path)) == ["only"]
    assert [p.name for p in tmp_path.iterdir()] == ["same.hrry"]


def test_data_must_follow_its_descriptor() -> None:
    _expect_container_error(_patched_index("data_offset", 0), "follow its descriptor")


def _empty_batch_with_huge_heads() -> bytes:
    """The empty-batch record with num_heads = head_dim = 2**40: a valid descriptor whose
    (empty) pool NumPy cannot shape."""
    record = bytearray((BLOCK_PAGED / STREAMS["empty_batch_f16"]["file"]).read_bytes())
    struct.pack_into("<QQ", record, 28, 2**40, 2**40)
    return bytes(record)


def test_unshapeable_empty_pool_is_a_container_error(tmp_path: Path) -> None:
    record = _empty_batch_with_huge_heads()
    hw.decode_descriptor(record)  # the descriptor itself is valid
    for source in (record, io.BytesIO(record)):
        with pytest.raises(InvalidContainerError, match=r"exceed 2\*\*63 bytes"):
            list(ref.read_stream(source))


# -- regressions of bugs found in other modules -------------------------------------------------
def test_blob_decode_of_unshapeable_empty_pool_raises_a_hurray_error() -> None:
    descriptor = hw.decode_descriptor(_empty_batch_with_huge_heads())
    tensor = hw.BlockPagedTensor._trusted(
        descriptor, np.zeros(0, np.float16), np.zeros(0, "<u4"), np.zeros(1, "<u4")
    )
    blob = bytes(hw.encode(tensor))
    with contextlib.suppress(hw.HurrayWireError):
        hw.decode(blob)


def test_check_seq_lens_detects_a_sum_that_wraps() -> None:
    from hurray_wire.tensor import check_seq_lens

    page_size = 2**32 - 1
    lens = np.array([2**63, 2**63], "<u8")  # each needs 2**31 + 1 pages of 2**32 - 1
    seq_ptr = np.array([0, 2**31 + 1, 2**32 + 2], "<u8")
    with pytest.raises(IndexBufferError):
        check_seq_lens(lens, seq_ptr, page_size, 0)  # sum is 2**64, not 0


def test_hrry_descriptor_length_limit() -> None:
    with (
        ref.HrryFile(LAYER0, max_descriptor_length=132) as hrry,
        pytest.raises(InvalidContainerError, match="descriptor_length out of range"),
    ):
        hrry.descriptor("kv_cache.layer0.key")
    with pytest.raises(ArgumentTypeError):
        ref.HrryFile(LAYER0, max_descriptor_length=19)
