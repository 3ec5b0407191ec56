"""Fuzzing in CI without atheris: the harnesses' targets on seeded mutations, and one test
per fuzzing finding (docs/fuzzing.md).

The targets are the functions the atheris harnesses run, imported from
``tools/fuzz_blob.py`` and ``tools/fuzz_containers.py`` (both import without atheris):
``check_blob`` and ``check_containers`` raise ``AssertionError`` on a property violation and
let through any exception that is not a ``HurrayWireError``. Every mutation here is derived
from a fixed seed, so a failure reproduces exactly; the failing input is in the assertion
message as hex.
"""

from __future__ import annotations

import io
import random
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard

import hurray_wire as hw
from hurray_wire import containers as reference, errors as hwe
from tests.work import python_lines, refused_within

TOOLS = Path(__file__).resolve().parent.parent / "tools"
sys.path.insert(0, str(TOOLS))

import fuzz_blob  # noqa: E402
import fuzz_containers  # noqa: E402

ROOT = TOOLS.parent


def _replay(
    target: Callable[[bytes], None],
    seeds: list[bytes],
    mutator: Callable[[bytes, random.Random], bytes],
    runs: int,
    seed: int,
) -> None:
    rng = random.Random(seed)
    for _ in range(runs):
        data = rng.choice(seeds)
        for _ in range(rng.randint(1, 3)):
            data = mutator(data, rng)
        try:
            target(data)
        except Exception as exc:
            raise AssertionError(f"{exc!r} on input {data.hex()}") from exc


def _structured(module: object) -> Callable[[bytes, random.Random], bytes]:
    mutate = module.mutate  # type: ignore[attr-defined]
    return lambda data, rng: mutate(data, 1 << 19, rng.getrandbits(32))


def _bytes_only(data: bytes, rng: random.Random) -> bytes:
    return fuzz_blob.byte_mutate(data, rng, 1 << 19)


@pytest.fixture(scope="module")
def blob_seeds() -> list[bytes]:
    return list(fuzz_blob.seed_inputs().values())


@pytest.fixture(scope="module")
def container_seeds() -> list[bytes]:
    return list(fuzz_containers.seed_inputs().values())


# -- smoke: the harness targets on seeds and seeded mutations ---------------------------------
def test_blob_seeds_pass_the_target(blob_seeds: list[bytes]) -> None:
    assert len(blob_seeds) > 40
    for data in blob_seeds:
        fuzz_blob.check_blob(data)


def test_container_seeds_pass_the_target(container_seeds: list[bytes]) -> None:
    assert len(container_seeds) > 15
    for data in container_seeds:
        fuzz_containers.check_containers(data)


@pytest.mark.parametrize("seed", [1, 2])
def test_blob_structured_mutations(blob_seeds: list[bytes], seed: int) -> None:
    _replay(fuzz_blob.check_blob, blob_seeds, _structured(fuzz_blob), 400, seed)
    assert fuzz_blob.MUTATOR_ERRORS == []


def test_blob_byte_mutations(blob_seeds: list[bytes]) -> None:
    _replay(fuzz_blob.check_blob, blob_seeds, _bytes_only, 500, 3)


@pytest.mark.parametrize("seed", [1, 2])
def test_container_structured_mutations(container_seeds: list[bytes], seed: int) -> None:
    _replay(
        fuzz_containers.check_containers, container_seeds, _structured(fuzz_containers), 400, seed
    )
    assert fuzz_containers.MUTATOR_ERRORS == []
    assert fuzz_blob.MUTATOR_ERRORS == []


def test_container_byte_mutations(container_seeds: list[bytes]) -> None:
    _replay(fuzz_containers.check_containers, container_seeds, _bytes_only, 500, 4)


# -- the harnesses' own tools ----------------------------------------------------------------
@pytest.mark.parametrize("path", sorted((ROOT / "fixtures" / "blobs").glob("*.hrwb")), ids=str)
def test_parse_then_build_reproduces_every_fixture_blob(path: Path) -> None:
    data = path.read_bytes()
    blob = fuzz_blob.parse_blob(data)
    assert blob is not None
    assert fuzz_blob.build_blob(blob) == data


def test_fix_checksums_makes_a_changed_blob_decode() -> None:
    data = bytearray((ROOT / "fixtures" / "blobs" / "spec_example_f16_key_l3.hrwb").read_bytes())
    data[384:386] = b"\x00\x3c"  # page_pool[0, 0, 0, 0] = 1.0
    with pytest.raises(hw.errors.ChecksumError):
        hw.decode(bytes(data))
    fixed = fuzz_blob.fix_checksums(bytes(data))
    assert hw.decode(fixed).page_pool[0, 0, 0, 0] == 1.0
    data[22] = 7  # checksum_type: first the header checksum catches it, then the field check
    with pytest.raises(hw.errors.ChecksumError):
        hw.decode(bytes(data))
    with pytest.raises(hw.errors.InvalidBlobError, match="checksum_type"):
        hw.decode(fuzz_blob.fix_checksums(bytes(data)))
    assert fuzz_blob.fix_checksums(fixed) == fixed


def test_chunked_seeds_have_sections_of_several_chunks() -> None:
    widths, counts = set(), set()
    for name, data in fuzz_blob.chunked_seeds().items():
        blob = fuzz_blob.parse_blob(data)
        assert blob is not None
        pool = blob.sections[0]
        assert pool.codec == hw.codecs.CODEC_CHUNKED, name
        parts = fuzz_blob.split_chunks(pool.payload)
        assert parts is not None
        assert parts[1] == -(-pool.raw_size // parts[0])
        assert parts[1] >= 3 or "one_chunk" in name
        widths.add(pool.param)
        counts.add(parts[1])
        tensor = hw.decode(data)
        assert fuzz_blob._decompress(pool) == tensor.page_pool.tobytes()
    assert widths == {1, 2, 4, 8}
    assert max(counts) > 64  # decode reads tables of more than 64 entries another way


def test_the_mutator_writes_decodable_chunked_sections() -> None:
    """_rechunk with any legal chunk size and width gives a blob decode reads back equal."""
    rng = random.Random(5)
    data = fuzz_blob.chunked_seeds()["gen-chunked-w2_f16_meta.hrwb"]
    want = hw.decode(data)
    for chunk_size in (4096, 8192, 1 << 16, 1 << 30):
        blob = fuzz_blob.parse_blob(data)
        assert blob is not None
        assert fuzz_blob.rechunk(blob.sections[0], rng, chunk_size)
        got = hw.decode(fuzz_blob.build_blob(blob))
        assert fuzz_blob.tensor_difference(want, got) is None


def test_chunk_table_mutations() -> None:
    """Every chunk-table edit on every chunked seed, through the target."""
    seeds = list(fuzz_blob.chunked_seeds().values())
    rng = random.Random(6)
    for _ in range(300):
        blob = fuzz_blob.parse_blob(rng.choice(seeds))
        assert blob is not None
        fuzz_blob.mutate_chunks(rng.choice(blob.sections[:1]), rng)
        data = fuzz_blob.build_blob(blob)
        try:
            fuzz_blob.check_blob(data)
        except Exception as exc:
            raise AssertionError(f"{exc!r} on input {data.hex()}") from exc


def test_fix_hrry_crc_makes_a_changed_index_read() -> None:
    data = bytearray((ROOT / "fixtures/conformance/block_paged/files/layer0_kv.hrry").read_bytes())
    names = reference.HrryFile.from_buffer(bytes(data)).names
    at = bytes(data).rindex(names[0].encode())  # the name in the index, near the end
    data[at] ^= 0x01
    with pytest.raises(hw.errors.InvalidContainerError, match="CRC-32C"):
        reference.HrryFile.from_buffer(bytes(data))
    renamed = reference.HrryFile.from_buffer(fuzz_containers.fix_checksums(bytes(data)))
    assert renamed.names[0] != names[0]
    assert renamed.names[1:] == names[1:]


def test_fix_stream_checksums_makes_a_changed_stream_read() -> None:
    seeds = fuzz_containers.generated_seeds()
    data = bytearray(seeds["gen-stream-full-index1.hrws"])
    at = bytes(data).index(b"seed-model")
    data[at] = ord("S")
    with pytest.raises(hw.HurrayWireError):
        list(hw.containers.StreamReader(io.BytesIO(bytes(data))))
    fixed = fuzz_containers.fix_checksums(bytes(data))
    reader = hw.containers.StreamReader(io.BytesIO(fixed))
    assert len(list(reader)) == 3
    assert reader.header is not None and reader.header.model == "Seed-model"


# -- findings ----------------------------------------------------------------------------------
# F1 (fixed in ede8fce, "assemble: any pool shape NumPy cannot represent raises
# InvalidTensorError"; these were xfail-strict tests until then).
# A block-paged pool with a zero dimension whose other dimensions multiply past 2**63:
# uint8, shape [1, 0, 2**62] (num_heads 0), page_size 1, num_pages 2, one sequence of one
# page (block_table [0], seq_ptr [0, 1]). Every buffer size is consistent (page_pool is 0
# bytes), so the descriptor is valid. tensor.assemble only checked that ONE page stays under
# 2**63 bytes (it is 0 bytes here); NumPy's reshape to [2, 1, 0, 2**62] then raised a bare
# ValueError ("array is too big"). assemble is shared by every decoder: hw.decode,
# reference.read_stream (bytes and file-like), HrryFile.tensor, StreamReader, and the CLI,
# which printed a traceback instead of exiting 1.
F1_DESCRIPTOR = bytes.fromhex(
    "4852525901008500000000000000110a03000000010000000000000000000000"
    "0000000000000000000000400000000000000000010000000200000000000000"
    "000000000100000000ffffffff00000000000000030000000000000000400000"
    "0000000000040000000000000040000000000000000800000000000000400000"
    "0000000000"
)
F1_BLOCK_TABLE = bytes.fromhex("00000000")
F1_SEQ_PTR = bytes.fromhex("0000000001000000")
F1_RECORD = F1_DESCRIPTOR + F1_BLOCK_TABLE + F1_SEQ_PTR  # one reference stream record
F1_BLOB = (
    bytes.fromhex(
        "4852574201000000c00100000000000035010000030000008500000000000000"
        "0101000000000000400100000000000000000000000000000000000000000000"
        "0000000000000000400000000000000001010000010000004001000000000000"
        "0400000000000000040000000000000000000000000000004000000000000000"
        "0101000002000000800100000000000008000000000000000800000000000000"
        "000000000000000040000000000000004852525901008500000000000000110a"
        "0300000001000000000000000000000000000000000000000000004000000000"
        "00000000010000000200000000000000000000000100000000ffffffff000000"
        "0000000003000000000000000040000000000000000400000000000000400000"
        "000000000008000000000000004000000000000000c52cf1fd42e8271b000000"
        "00000000"
    )  # header, 3 entries, descriptor, header checksum, page_pool (0 bytes), block_table
    + bytes(60)
    + F1_SEQ_PTR
    + bytes(56)
)
F1_HRRY = (
    bytes.fromhex(
        "4852525946494c450100000004000000001000004000000000000000ffffffff"
        "ffffffff00000000000000000000000000000000000000000000000000000000"
    )  # file header: flags HAS_INDEX_CRC32C, data_buffer_alignment 4096
    + F1_DESCRIPTOR
    + bytes(4096 - 64 - len(F1_DESCRIPTOR))
    + F1_BLOCK_TABLE  # page_pool (0 bytes) and block_table at 4096
    + bytes(4092)
    + F1_SEQ_PTR  # seq_ptr at 8192
    + bytes.fromhex(
        "0100000000000000010074400000000000000085000000001000000000000008"
        "100000000000000000000008200000000000002b000000000000000000000000"
        "00000000000000c9d552080000000048525259"
    )  # index (one entry, "t") and trailer
)

# F1, second form: a dimension of 2**63 or more with another dimension 0 (uint8, shape
# [1, 2**63, 0], page_size 1, num_pages 1): one page is 0 bytes again, and NumPy refused the
# reshape with ValueError("Maximum allowed dimension exceeded").
F1_HUGE_DIM_RECORD = bytes.fromhex(
    "4852525901008500000000000000110a03000000010000000000000000000000"
    "0000008000000000000000000000000000000000010000000100000000000000"
    "000000000100000000ffffffff00000000000000030000000000000000400000"
    "0000000000040000000000000040000000000000000800000000000000400000"
    "0000000000"
) + bytes.fromhex("000000000000000001000000")


def test_f1_dimension_of_2_63_reference_stream() -> None:
    assert hw.decode_descriptor(F1_HUGE_DIM_RECORD).shape == (1, 2**63, 0)
    with pytest.raises(hw.HurrayWireError):
        list(reference.read_stream(F1_HUGE_DIM_RECORD))


def test_f1_blob_decode() -> None:
    with pytest.raises(hw.errors.InvalidTensorError):
        hw.decode(F1_BLOB)


def test_f1_reference_stream_from_bytes() -> None:
    with pytest.raises(hw.HurrayWireError):
        list(reference.read_stream(F1_RECORD))


def test_f1_reference_stream_from_file_like() -> None:
    with pytest.raises(hw.HurrayWireError):
        list(reference.read_stream(io.BytesIO(F1_RECORD)))


def test_f1_hrry_tensor() -> None:
    hrry = reference.HrryFile.from_buffer(F1_HRRY)
    assert hrry.names == ("t",)
    with pytest.raises(hw.HurrayWireError):
        hrry.tensor("t")


def test_f1_stream_reader() -> None:
    with pytest.raises(hw.HurrayWireError):
        list(hw.containers.StreamReader(io.BytesIO(F1_BLOB)))


def test_f1_cli_validate_exits_1(tmp_path: Path) -> None:
    from hurray_wire import cli

    for name, data in (("f1.hrwb", F1_BLOB), ("f1.hrrs", F1_RECORD), ("f1.hrry", F1_HRRY)):
        path = tmp_path / name
        path.write_bytes(data)
        assert cli.main(["validate", str(path)]) == 1


def test_f1_inputs_are_well_formed_up_to_the_bug() -> None:
    """The F1 bytes reach the reshape: every check before it passes."""
    descriptor = hw.decode_descriptor(F1_DESCRIPTOR)
    assert descriptor.shape == (1, 0, 2**62)
    assert [h.byte_size for h in descriptor.buffers] == [0, 4, 8]
    assert fuzz_blob.fix_checksums(F1_BLOB) == F1_BLOB
    assert fuzz_containers.fix_checksums(F1_HRRY) == F1_HRRY


# F2 (fixed: codecs.zstd.fresh_reason asks a new zstd context for the reason). The reason
# libzstd gives for a corrupt zstd frame depends on what the decoding
# thread decoded before. hurray_wire.codecs keeps one zstandard.ZstdDecompressor per thread
# and reads every frame through its stream_reader; libzstd keeps the streaming buffers it
# allocated for earlier frames. A frame without a declared content size goes through those
# buffers, which a fresh context sizes from the frame's window: a block that decodes to more
# than the window overflows them ("Destination buffer is too small"), while a context that
# once decoded a big-window frame of unknown size has room, and the block-size check refuses
# the block instead ("Data corruption detected"). The verdict, the error type, section,
# field and offset never change; str(error) does. Under decode(threads=N) a chunk decodes on
# whichever thread takes it, so the message for the same bytes varies from run to run. Found
# by the chunked-shuffle-zstd campaign (a chunk frame, "memoryview at offset 3" against
# threads=0); codecs 1 and 2 share the decompressor, so they have it too.
#
# One zstd frame of "abcdefgh" * 1125 (9000 bytes) in one compressed block, without a content
# size, with its window descriptor set to 2**10 bytes.
F2_FRAME = bytes.fromhex("28b52ffd000085000040616263646566676801001d637ce102")


def _on_new_thread(call: Callable[[], Any]) -> Any:
    """call() on a new thread: fresh thread-local decompression state."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call()))
    thread.start()
    thread.join()
    return out[0]


def _f2_error(call: Callable[[], object], warm: bool) -> hw.HurrayWireError:
    if warm:  # a frame of unknown content size with a big window, decoded before
        big = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(range(256)) * 4096)
        hw.codecs.decompress_into(1, 0, big, np.empty(1 << 20, np.uint8), threads=0)
    try:
        call()
    except hwe.DecompressionError as exc:
        return exc
    raise AssertionError("the F2 frame was accepted")


def _f2_frame() -> None:
    hw.codecs.decompress_into(1, 0, F2_FRAME, np.empty(9000, np.uint8), threads=0)


def _f2_blob() -> bytes:
    """A blob whose 9000-byte uint8 pool is a chunked section of one chunk: F2_FRAME."""
    tensor = hw.BlockPagedTensor.from_arrays(np.zeros((1, 9000, 1, 1), np.uint8), [0], [0, 1])
    spec = hw.Compression(hw.codecs.CODEC_CHUNKED, min_size=0, chunk_size=16384)
    blob = fuzz_blob.parse_blob(bytes(hw.encode(tensor, compression=spec)))
    assert blob is not None
    blob.sections[0].payload = fuzz_blob.join_chunks(16384, 1, [len(F2_FRAME)], [F2_FRAME])
    return fuzz_blob.build_blob(blob)


def test_f2_frame_error_does_not_depend_on_the_thread_history() -> None:
    fresh = _on_new_thread(lambda: str(_f2_error(_f2_frame, warm=False)))
    assert _on_new_thread(lambda: str(_f2_error(_f2_frame, warm=True))) == fresh


def test_f2_blob_decode_error_does_not_depend_on_the_thread_history() -> None:
    data = _f2_blob()
    call = lambda: hw.decode(data, threads=0)  # noqa: E731
    fresh = _on_new_thread(lambda: str(_f2_error(call, warm=False)))
    assert _on_new_thread(lambda: str(_f2_error(call, warm=True))) == fresh


def test_f2_same_error_in_every_respect() -> None:
    """Fixed: the verdict, type, section, field, offset and message are the same."""
    data = _f2_blob()
    call = lambda: hw.decode(data, threads=0)  # noqa: E731
    fresh = _on_new_thread(lambda: _f2_error(call, warm=False))
    warm = _on_new_thread(lambda: _f2_error(call, warm=True))
    assert (fresh.section, fresh.field, fresh.offset) == ("buffer[0]", "chunk 0", warm.offset)
    assert type(fresh) is type(warm) and str(fresh) == str(warm)
    assert fuzz_blob.zstd_reason_only(fresh, warm)


# -- F3-F6: resource findings of an earlier independent campaign, confirmed by the 2026-12-01
# campaign (tools/probe_resources.py prints the full figures; docs/security.md, "Known
# issues"), now fixed: each test holds its fix.
import probe_resources  # noqa: E402


def test_f3_section_table_over_the_limit_is_refused_at_once() -> None:
    data = probe_resources.section_table_blob(16384)
    limits = hw.DecodeLimits(max_sections=16)
    error = refused_within(
        lambda: hw.decode(data, limits=limits), hw.errors.LimitExceededError, 2_000
    )
    assert "too many sections" in str(error)  # before one entry of 16384 is read


def test_f4_zstd_block_walk_is_not_a_python_loop_per_block() -> None:
    data = probe_resources.walk_blob((16 << 20) // 3)
    ran = python_lines(lambda: hw.decode(data))
    assert ran < 100_000, ran  # its 5.6 M blocks walked in Python: > 50 M lines


def _big_metadata_stream() -> bytes:
    header = reference.StreamHeader(model="m", metadata={"big": b"\x00" * 4096})
    sink = io.BytesIO()
    with reference.StreamWriter(sink, header) as writer:
        writer.write(probe_resources._small_tensor(), compression=None)
    return sink.getvalue()


def test_f5_stream_reader_applies_max_metadata_bytes_to_the_header() -> None:
    limits = hw.DecodeLimits(max_metadata_bytes=96)
    with pytest.raises(hw.errors.LimitExceededError):
        list(reference.StreamReader(_big_metadata_stream(), limits=limits))


def test_f5_stream_file_applies_max_metadata_bytes_to_the_header() -> None:
    limits = hw.DecodeLimits(max_metadata_bytes=96)
    with pytest.raises(hw.errors.LimitExceededError):
        reference.StreamFile(_big_metadata_stream(), limits=limits)


def test_f6_decoding_big_descriptors_leaves_no_big_cache_behind() -> None:
    import gc
    import tracemalloc

    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for number in range(8):
            data = probe_resources.big_descriptor_blob(10_000 + number, 8 << 20)
            hw.decode(data)
            del data
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert retained < 48 << 20, f"{retained >> 20} MiB retained"


# -- F7 (2026-12-01 campaign, blob-fix round 2): a shuffle-zstd section of raw_size 0 accepts
# any bytes after a frame header that declares content size 0. The crash file (512 bytes):
# a uint8 blob of shape [0, 2, 8]; buffer 0 (page_pool, 0 bytes) is codec 2 (shuffle-zstd),
# width 8, raw_size 0, 33 stored bytes: the frame header 28b52ffd 24 00 (single segment,
# content checksum, content size 0), a last raw block of 0 bytes, a frame checksum that is
# wrong (ffd8e999; XXH64 of nothing ends 51d8e999) and 20 bytes after the frame. Every
# checksum of the blob is right. codecs.zstd.decode_frame takes its one-call path
# (width > 1 and content_size == raw_size) and python-zstandard's decompress returns b""
# for a frame declaring size 0 without reading its blocks, so neither the frame checksum
# nor allow_extra_data is checked, and the block walk runs only when zstd refuses. The
# same section with codec 1 is refused; the independent reader (tests/blob_reference.py)
# refuses both.
F7_BLOB = bytes.fromhex(
    "4852574201000000000200000000000065010000040001008500000000000000"
    "0101020800000000800100000000000021000000000000000000000000000000"
    "7265cb98f999be2840000000000000000101000001000000c001000000000000"
    "00000000000000000000000000000000c294d3380580062d4000000000000000"
    "0101030802000000c00100000000000019000000000000000400000000000000"
    "e34dbc79320cc84b400000000000000002010000000000000002000000000000"
    "00000000000000000000000000000000c294d3380580062d4000000000000000"
    "4852525901008500000000000000010a03000000000000000000000002000000"
    "0000000008000000000000000000000000000000040000000000000000000000"
    "000000000000000000ffffffff00000000000000030000000000000000400000"
    "0000000000000000000000000040000000000000000400000000000000400000"
    "00000000007b3dae35503c929800000000000000000000000000000000000000"
    "28b52ffd240001000099e9d8ffff03000000ce76073706c97fd0000000000000"
    "5100000000000000000000000000000000000000000000000000000000000000"
    "00000100010000000d00000028b52ffd20042100000000000000000000000000"
    "0000000000000000000000000000000000000000000000000000000000000000"
)


def _f7_variant(payload: bytes, codec: int = 2) -> bytes:
    blob = fuzz_blob.parse_blob(F7_BLOB)
    assert blob is not None
    section = blob.sections[0]
    section.payload, section.codec, section.param = payload, codec, 8 if codec == 2 else 0
    return fuzz_blob.build_blob(blob)


F7_HEADER = bytes.fromhex("28b52ffd2400")  # frame header: content size 0, checksum flag


def test_f7_inputs_are_well_formed_up_to_the_bug() -> None:
    blob = fuzz_blob.parse_blob(F7_BLOB)
    assert blob is not None and fuzz_blob.build_blob(blob) == F7_BLOB  # checksums all right
    section = blob.sections[0]
    assert (section.codec, section.param, section.raw_size) == (2, 8, 0)
    assert section.payload.startswith(F7_HEADER)
    with pytest.raises(hwe.DecompressionError):  # codec 1 refuses the same bytes
        hw.decode(_f7_variant(section.payload, codec=1))
    with pytest.raises(Exception, match="doesn't match checksum"):
        fuzz_blob.reference_reader().read_blob(F7_BLOB)


def test_f7_bad_frame_checksum_and_trailing_bytes_are_refused() -> None:
    with pytest.raises(hwe.DecompressionError):
        hw.decode(F7_BLOB)


def test_f7_garbage_after_an_empty_frame_header_is_refused() -> None:
    with pytest.raises(hwe.DecompressionError):
        hw.decode(_f7_variant(F7_HEADER + b"garbage!"))
