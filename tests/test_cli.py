"""The hurray-wire command: snapshot tests of its output, exit codes and error lines.

Regenerate the snapshots after an intended change with ``UPDATE_SNAPSHOTS=1 pytest
tests/test_cli.py`` and review the diff.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

import hurray_wire as hw
from hurray_wire import cli
from tests.conftest import BLOCK_PAGED, FIXTURES, REFERENCE, ROOT

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = os.environ.get("UPDATE_SNAPSHOTS") == "1"


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def check_snapshot(name: str, text: str) -> None:
    path = SNAPSHOTS / name
    if UPDATE or not path.exists():
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"output differs from {path}"


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.fixture(autouse=True)
def _in_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


SNAPSHOT_CASES = {
    "dump_spec_example.txt": ["dump", "fixtures/blobs/spec_example_f16_key_l3.hrwb"],
    "dump_quantized.txt": [
        "dump",
        "fixtures/blobs/uint8_per_block_asym.hrwb",
        "fixtures/blobs/int8_per_block_sym.hrwb",
    ],
    "dump_metadata_fp8.txt": ["dump", "fixtures/blobs/fp8_e4m3_with_metadata.hrwb"],
    "dump_compressed.txt": ["dump", "fixtures/blobs/shuffle_zstd_f16.hrwb"],
    "dump_empty_batch.txt": ["dump", "fixtures/blobs/empty_batch.hrwb"],
    "dump_layer_none_descriptor.txt": [
        "dump",
        "fixtures/conformance/block_paged/descriptors/bp_layer_none_f16_key.bin",
    ],
    "dump_reference_csr.txt": [
        "dump",
        "fixtures/conformance/reference/descriptors/csr_f32_3x3.bin",
    ],
    "dump_stream.txt": ["dump", "fixtures/streams/whole_cache_2_layers.hrws"],
    "dump_hex_spec_example.txt": ["dump", "--hex", "fixtures/blobs/spec_example_f16_key_l3.hrwb"],
    "dump_hex_stream.txt": ["dump", "--hex", "fixtures/streams/whole_cache_2_layers.hrws"],
    "dump_hex_descriptor.txt": [
        "dump",
        "--hex",
        "fixtures/conformance/block_paged/descriptors/bp_layer_none_f16_key.bin",
    ],
    "validate_fixtures.txt": [
        "validate",
        "fixtures/blobs/spec_example_f16_key_l3.hrwb",
        "fixtures/streams/whole_cache_2_layers.hrws",
        "fixtures/conformance/reference/descriptors/row_major_f32_3x4.bin",
    ],
}


@pytest.mark.parametrize("name", sorted(SNAPSHOT_CASES))
def test_output_matches_snapshot(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(SNAPSHOT_CASES[name], capsys)
    assert (code, err) == (0, "")
    check_snapshot(name, out)


def test_layer_none_is_named_as_the_sentinel(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(SNAPSHOT_CASES["dump_layer_none_descriptor.txt"], capsys)
    assert "layer_index: none (0xFFFFFFFF)" in out
    _, out, _ = run(SNAPSHOT_CASES["dump_hex_descriptor.txt"], capsys)
    assert "ff ff ff ff" in out and "layer_index = none (0xFFFFFFFF)" in out


def test_json_validates_against_the_schema(capsys: pytest.CaptureFixture[str]) -> None:
    schema = json.loads((ROOT / "hurray_wire/schemas/dump.schema.json").read_text(encoding="utf-8"))
    paths = sorted(str(p.relative_to(ROOT)) for p in (FIXTURES / "blobs").iterdir())
    paths += [rel(FIXTURES / "streams/whole_cache_2_layers.hrws")]
    paths += sorted(rel(p) for p in (REFERENCE / "descriptors").iterdir())
    paths += sorted(rel(p) for p in (BLOCK_PAGED / "descriptors").iterdir())
    code, out, err = run(["dump", "--json", *paths], capsys)
    assert (code, err) == (0, "")
    document = json.loads(out)
    jsonschema.validate(document, schema)
    assert len(document) == len(paths)
    spec = document[paths.index("fixtures/blobs/spec_example_f16_key_l3.hrwb")]
    item = spec["items"][0]
    assert item["descriptor"]["layout"]["layer_index"] == 3
    assert item["index"]["shared_pages"] == 1
    assert item["index"]["tokens_per_sequence"] == {"min": 3, "median": 4.5, "max": 6}
    assert item["envelope"]["checksums_verified"] is True


def test_dump_reads_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = (FIXTURES / "blobs/spec_example_f16_key_l3.hrwb").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    code, out, _ = run(["dump", "-"], capsys)
    assert code == 0
    assert out.startswith("-: blob, 1216 bytes")


INVALID = [
    (BLOCK_PAGED / "invalid" / name, fragment)
    for name, fragment in [
        ("bp_bad_kv_role3.bin", "field kv_role, at byte offset 72"),
        ("bp_bad_rank2.bin", "field rank, at byte offset 16"),
        ("bp_bad_pool_size.bin", "field buffers[0].byte_size, at byte offset 85"),
        ("bp_bad_has_shard.bin", "shard section"),
    ]
]


@pytest.mark.parametrize(("path", "fragment"), INVALID, ids=lambda v: getattr(v, "name", ""))
def test_validate_invalid_prints_one_line_and_exits_1(
    path: Path, fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["validate", rel(path)], capsys)
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1 and fragment in err and "Traceback" not in err


def test_validate_catches_a_corrupted_blob(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = bytearray((FIXTURES / "blobs/spec_example_f16_key_l3.hrwb").read_bytes())
    data[500] ^= 0x10  # inside page_pool
    bad = tmp_path / "bad.hrwb"
    bad.write_bytes(bytes(data))
    code, _, err = run(["validate", str(bad)], capsys)
    assert code == 1
    assert "section buffer[0]" in err and "checksum mismatch" in err


def test_unreadable_inputs_exit_3_and_unrecognised_inputs_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["dump", str(tmp_path / "missing.hrwb")], capsys)
    assert code == 3 and "cannot open for reading (No such file or directory)" in err
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a hurray file")
    code, _, err = run(["validate", str(junk)], capsys)
    assert code == 1 and "unrecognised input" in err
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    code, _, err = run(["dump", str(empty)], capsys)
    assert code == 1 and err.count("\n") == 1


@pytest.mark.parametrize("argv", [[], ["dump"], ["frobnicate"], ["dump", "--json", "--hex", "x"],
                                  ["convert", "a"]])  # fmt: skip
def test_usage_errors_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2


def test_version_and_help_through_the_console_script() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hurray_wire.cli", "--version"], capture_output=True, text=True
    )
    assert result.returncode == 0 and result.stdout.strip() == f"hurray-wire {hw.__version__}"
    result = subprocess.run(
        [sys.executable, "-m", "hurray_wire.cli", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0 and "dump" in result.stdout and "convert" in result.stdout


def test_convert_blob_to_stream_and_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = FIXTURES / "blobs/vllm_prefix_sharing_f16.hrwb"
    stream = tmp_path / "one.hrws"
    code, _, err = run(["convert", str(source), str(stream), "--compression", "shuffle-zstd"],
                       capsys)  # fmt: skip
    assert (code, err) == (0, "")
    original = hw.decode(source.read_bytes())
    (converted,) = list(hw.StreamReader(stream.read_bytes()))
    assert converted.page_pool.tobytes() == original.page_pool.tobytes()
    assert converted.seq_lens is not None and original.seq_lens is not None
    assert converted.seq_lens.tolist() == original.seq_lens.tolist()
    back = tmp_path / "back.hrwb"
    code, _, _ = run(["convert", str(stream), str(back)], capsys)
    assert code == 0
    assert back.read_bytes() == source.read_bytes()


def test_convert_refuses_what_it_cannot_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stream = FIXTURES / "streams/whole_cache_2_layers.hrws"
    code, _, err = run(["convert", rel(stream), str(tmp_path / "x.hrwb")], capsys)
    assert code == cli.EXIT_USAGE and "holds one tensor" in err and "holds 4" in err
    code, _, err = run(["convert", rel(stream), str(tmp_path / "x.unknown")], capsys)
    assert code == 2 and "--to" in err  # a usage error
    descriptor = BLOCK_PAGED / "descriptors/bp_spec_example_f16_key_l3.bin"
    code, _, err = run(["convert", rel(descriptor), str(tmp_path / "x.hrws")], capsys)
    assert code == 1 and "no buffers" in err


def test_convert_shows_progress_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["convert", "fixtures/streams/whole_cache_2_layers.hrws",
                        str(tmp_path / "x.hrws"), "--progress"], capsys)  # fmt: skip
    assert code == 0 and "4/4" in err and "tensor" in err


def test_hex_annotation_of_chunk_tables_survives_bad_tables() -> None:
    from hurray_wire import report as summary

    table = (65536).to_bytes(4, "little") + (2).to_bytes(4, "little")
    sizes = (5).to_bytes(4, "little") + (6).to_bytes(4, "little")
    good = summary.annotate_chunk_table(table + sizes + bytes(11), 0, 27, "s", "buffer")
    assert [a[2] for a in good] == [
        "s.chunk_size", "s.chunk_count", "s.frame_size[0]", "s.frame_size[1]", "s frames"
    ]  # fmt: skip
    assert good[-1][1:] == (11, "s frames", "2 zstd frames, 11 bytes")
    cut = summary.annotate_chunk_table(table + sizes[:3], 0, 11, "s", "buffer")
    assert cut[-1][2] == "s payload" and cut[-1][1] == 3
    tiny = summary.annotate_chunk_table(table[:5], 0, 5, "s", "buffer")
    assert tiny == [(0, 5, "s payload", "buffer, 5 bytes")]
