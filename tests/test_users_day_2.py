"""Issue 32, a user's day part two: damaged caches located, safetensors-like save/load,
a clean repository."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire import cli, cli_parser, errors as hwe, report
from tests.conftest import FIXTURES, ROOT
from tests.test_model_cache import cache as whole_model

STREAM = FIXTURES / "streams/whole_cache_2_layers.hrws"
DUMP_SCHEMA: dict[str, Any] = json.loads(Path(cli_parser.DUMP_SCHEMA).read_text(encoding="utf-8"))
VALIDATE_SCHEMA: dict[str, Any] = json.loads(
    Path(cli_parser.VALIDATE_SCHEMA).read_text(encoding="utf-8")
)


@pytest.mark.parametrize("to", ["hrws", ".hrws", "blob-stream"])
def test_to_takes_the_extensions_too(tmp_path: Path, to: str) -> None:
    out = tmp_path / "out.bin"
    assert cli.main(["convert", "-q", "--to", to, str(STREAM), str(out)]) == 0
    assert out.read_bytes()[:4] == STREAM.read_bytes()[:4]


def test_to_refuses_an_unknown_format(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["convert", "--to", "hrwx", str(STREAM), "-"])
    assert info.value.code == 2 and "invalid choice: 'hrwx'" in capsys.readouterr().err


def test_every_doc_imports_engine_fingerprint_one_way() -> None:
    """``hw.EngineFingerprint`` or ``from hurray_wire import EngineFingerprint``, nothing
    else, in every page users read."""
    assert hw.EngineFingerprint is hw.integrity.EngineFingerprint
    assert "EngineFingerprint" in hw.__all__
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for block in re.findall(r"```python\n(.*?)```", text, flags=re.S):
            statements = re.findall(r"^from (\S+) import (\([^)]*\)|[^\n]*)", block, flags=re.M)
            for module, names in statements:
                if re.search(r"\bEngineFingerprint\b", names):
                    assert module == "hurray_wire", (page.name, module)


# -- a damaged cache, located ---------------------------------------------------------------
PAGE_BYTES = 4 * 2 * 8 * 2  # a page: 4 tokens x 2 heads x 8 dims of float16


def model(layers: int = 2) -> dict[tuple[int, str], hw.BlockPagedTensor]:
    """Two layers of test_model_cache's model (6 pages of 4 tokens, 2 heads of 8 dims)."""
    return whole_model(layers)


@dataclass(frozen=True)
class Damage:
    """One flipped byte in a saved cache and what every reader must say about it."""

    name: str
    blob: int
    where: str  # "header_checksum", "descriptor", "pool"
    digests: bool
    error: type[hw.HurrayWireError]
    section: str
    pages: tuple[int, ...] = ()
    located_layer: bool = True  # a bad header checksum leaves the descriptor unread


DAMAGES = [
    Damage("header checksum", 2, "header_checksum", False, hwe.ChecksumError, "header",
           located_layer=False),
    Damage("descriptor", 1, "descriptor", False, hwe.ChecksumError, "header", located_layer=False),
    Damage("pool section", 3, "pool", False, hwe.ChecksumError, "buffer[0]"),
    Damage("page, with digests", 1, "pool", True, hwe.ChecksumError, "buffer[0]", pages=(2,)),
]  # fmt: skip


def damaged(tmp_path: Path, case: Damage) -> tuple[Path, int, int, hw.BlockPagedTensor]:
    """A saved cache with one byte flipped: (path, the flipped byte's file offset, the
    blob's stream offset, the tensor of that blob)."""
    path = tmp_path / f"{case.name.replace(' ', '_')}.hrws"
    source = model()
    hw.save_cache(path, source, page_digests=case.digests, progress=False)
    data = bytearray(path.read_bytes())
    with hw.StreamFile(path) as stream:
        entry = stream.entries[case.blob]
    tensor = source[entry.layer_index, entry.kv_role]  # type: ignore[index]
    blob = bytes(data[entry.offset : entry.offset + entry.length])
    envelope = report.describe_blob_envelope(blob, True)
    if case.where == "header_checksum":
        at = entry.offset + envelope["header_length"] + 3
    elif case.where == "descriptor":
        at = entry.offset + envelope["header_length"] - 20  # inside the descriptor
    else:  # a byte of physical page 2
        at = data.index(tensor.page_pool.tobytes(), entry.offset) + 2 * PAGE_BYTES + 5
    data[at] ^= 0x10
    path.write_bytes(bytes(data))
    return path, at, entry.offset, tensor


def check_located(error: hw.HurrayWireError, case: Damage, at: int, start: int,
                  tensor: hw.BlockPagedTensor) -> None:  # fmt: skip
    assert type(error) is case.error, error
    assert (error.blob, error.blob_offset, error.section) == (case.blob, start, case.section)
    if case.located_layer:
        assert (error.layer, error.role) == (tensor.layer_index, tensor.kv_role)
        assert f"blob {case.blob} (layer {tensor.layer_index} {tensor.kv_role})" in str(error)
    assert error.file_offset is not None and error.offset is not None
    assert error.file_offset == start + error.offset  # the file's, not the blob's
    assert f"at file offset {error.file_offset}" in str(error)
    assert error.pages == case.pages
    if case.pages:  # the bad page's row: the flipped byte lies in it
        assert error.file_offset <= at < error.file_offset + PAGE_BYTES
        assert f"physical page(s) {list(case.pages)}" in str(error)
    elif case.section == "header":  # the stored header checksum: the span is named
        assert error.field == "header_checksum" and "covers bytes [0, " in str(error)
        stored = range(error.file_offset, error.file_offset + 8)  # the stored checksum
        assert (at in stored) == (case.where == "header_checksum")
    else:  # the section's start: the flipped byte is inside it
        assert error.file_offset <= at


@pytest.mark.parametrize("case", DAMAGES, ids=lambda c: c.name)
def test_a_damaged_byte_is_located_by_every_reader(
    tmp_path: Path, case: Damage, capsys: pytest.CaptureFixture[str]
) -> None:
    path, at, start, tensor = damaged(tmp_path, case)
    with pytest.raises(hw.HurrayWireError) as loaded:
        hw.load_cache(path, progress=False)
    check_located(loaded.value, case, at, start, tensor)
    with pytest.raises(hw.HurrayWireError) as read:
        list(hw.StreamReader(path))
    check_located(read.value, case, at, start, tensor)
    assert read.value.details() == loaded.value.details()
    with hw.StreamFile(path) as stream, pytest.raises(hw.HurrayWireError) as picked:
        stream.read(stream.entries[case.blob])  # random access: the index names the blob
    check_located(picked.value, case, at, start, tensor)
    capsys.readouterr()
    assert cli.main(["validate", "--json", "-q", str(path)]) == cli.EXIT_INVALID
    (result,) = json.loads(capsys.readouterr().out)
    jsonschema.validate([result], VALIDATE_SCHEMA)
    expected = {**loaded.value.details(), "exit_code": 1}
    expected["reason"] = expected.pop("message")
    got = result["error"]
    if case.pages:  # the command reads pages as decode_report does: their logical places too
        assert got["type"] == "PageDigestError" and got["positions"] == [[1, 0]]
        for name in ("type", "reason", "field", "positions", "expected", "found"):
            expected.pop(name, None)
            got.pop(name, None)
    assert {k: v for k, v in got.items() if k != "message"} == expected


def test_a_cut_cache_names_the_blob_and_the_file_offset(tmp_path: Path) -> None:
    path = tmp_path / "cut.hrws"
    hw.save_cache(path, model(), progress=False)
    with hw.StreamFile(path) as stream:
        entry = stream.entries[2]
    path.write_bytes(path.read_bytes()[: entry.offset + 100])
    with pytest.raises(hwe.StreamBlobTruncatedError) as info:
        hw.load_cache(path, progress=False)
    assert (info.value.blob, info.value.blob_offset) == (2, entry.offset)
    assert info.value.file_offset == entry.offset + 100


def test_the_error_schemas_agree() -> None:
    """``validate --json`` and ``dump --json`` describe an error with one definition."""
    assert VALIDATE_SCHEMA["$defs"]["error"] == DUMP_SCHEMA["$defs"]["error"]
    fields = set(DUMP_SCHEMA["$defs"]["error"]["properties"])
    error = hwe.PageDigestError("x", section="s", field="f", offset=1, expected=1, found=2)
    error.located(blob=0, blob_offset=0, layer=0, role="key")
    assert set(error.details()) - {"message"} <= fields


def test_dump_shows_the_blob_whose_checksum_fails_then_suggests_no_verify(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _, start, _ = damaged(tmp_path, DAMAGES[2])
    assert cli.main(["dump", "-q", str(path)]) == cli.EXIT_INVALID
    captured = capsys.readouterr()
    assert f"[blob 3 @ {start}]" in captured.out  # the structure it could read
    assert "checksums xxh3_64 (not verified)" in captured.out
    assert "dump --no-verify reads past it" in captured.err
    assert cli.main(["dump", "-q", "--no-verify", str(path)]) == cli.EXIT_OK
    header, _, _, _ = damaged(tmp_path, DAMAGES[0])  # no structure to show: no hint
    assert cli.main(["dump", "-q", str(header)]) == cli.EXIT_INVALID
    assert "--no-verify" not in capsys.readouterr().err


def test_a_header_checksum_mismatch_names_the_field_that_reads_invalid() -> None:
    blob = bytearray(hw.encode(model(1)[0, "key"]))
    blob[40] ^= 0x40  # section 0's offset (32 + the entry's offset field)
    with pytest.raises(hwe.ChecksumError) as info:
        hw.decode(bytes(blob))
    assert info.value.field == "header_checksum"
    assert "read without it, field offset at byte offset 40 is invalid" in str(info.value)


# -- save / load as a mapping ---------------------------------------------------------------
def test_load_cache_is_a_read_only_mapping(tmp_path: Path) -> None:
    path = tmp_path / "m.hrws"
    source = model()
    hw.save_cache(path, source, progress=False)
    cache = hw.load_cache(path, progress=False)
    assert isinstance(cache, Mapping) and len(cache) == 4
    assert list(cache) == sorted(source) == list(cache.keys())
    assert (1, "value") in cache and (5, "value") not in cache
    assert 0 not in cache  # type: ignore[comparison-overlap]  # (issue 32: was KeyError: 0)
    assert cache.get((5, "value")) is None and cache.get((0, "key")) is cache[0, "key"]
    assert dict(cache.items()).keys() == source.keys()
    with pytest.raises(KeyError, match=r"no \(5, 'value'\)"):
        cache[5, "value"]
    with pytest.raises(hwe.MissingTensorError):
        cache[0, "fused"]
    with pytest.raises(TypeError):
        cache[0, "key"] = source[0, "key"]  # type: ignore[index]
    with pytest.raises(TypeError):
        cache.tensors[0, "key"] = source[0, "key"]  # type: ignore[index]
    assert cache.num_layers == 2 and cache.model == ""  # the attributes stay


def test_a_key_that_names_another_tensor_is_refused(tmp_path: Path) -> None:
    source = model()
    with pytest.raises(hwe.InvalidStreamError, match=r"key \(5, 'value'\) maps to the tensor of "
                       r"layer 0 key") as info:  # fmt: skip
        hw.save_cache(tmp_path / "x.hrws", {(5, "value"): source[0, "key"]}, progress=False)
    assert (info.value.expected, info.value.found) == ("(5, 'value')", "(0, 'key')")
    with pytest.raises(hwe.ArgumentTypeError, match=r"\(layer, kv_role\) pairs"):
        hw.save_cache(tmp_path / "x.hrws", {"layer0.key": source[0, "key"]}, progress=False)
    assert not (tmp_path / "x.hrws").exists()


def test_load_cache_as_torch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    path = tmp_path / "m.hrws"
    source = model()
    hw.save_cache(path, source, progress=False)
    for cache in (hw.load_cache(path, progress=False, as_torch=True),
                  hw.load_cache(path, progress=False, device="cpu")):  # fmt: skip
        got = cache[1, "key"]
        assert (
            isinstance(got["page_pool"], torch.Tensor) and got["page_pool"].dtype == torch.float16
        )
        np.testing.assert_array_equal(got["page_pool"].numpy(), source[1, "key"].page_pool)
        assert got["block_table"].tolist() == [0, 1, 2, 4]
    with pytest.raises(hwe.ArgumentTypeError, match="device"):
        hw.load_cache(path, progress=False, device="no-such-device")
    with pytest.raises(hwe.ArgumentTypeError, match="as_torch"):
        hw.load_cache(path, progress=False, as_torch=1)  # type: ignore[call-overload]


def test_load_cache_says_what_a_non_cache_is(tmp_path: Path) -> None:
    path = tmp_path / "x.hrws"
    path.write_bytes(hw.encode(model(1)[0, "key"]))
    with pytest.raises(hwe.InvalidStreamError, match="this is a blob, not a blob stream"):
        hw.load_cache(path, progress=False)
    path.write_bytes(b"")
    with pytest.raises(hwe.StreamTruncatedError, match=r"empty input \(0 bytes\)"):
        hw.load_cache(path, progress=False)
    with pytest.raises(hwe.BlobTruncatedError, match=r"empty input \(0 bytes\)"):
        hw.decode(b"")
    with pytest.raises(hwe.ContainerTruncatedError, match=r"empty input \(0 bytes\)"):
        hw.HrryFile.from_buffer(b"")
    assert cli.main(["validate", "-q", str(path)]) == cli.EXIT_INVALID


def test_empty_input_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "empty"
    path.write_bytes(b"")
    assert cli.main(["dump", str(path)]) == cli.EXIT_INVALID
    assert (
        capsys.readouterr().err
        == f"hurray-wire: {path}: empty (0 bytes): not a hurray-wire input\n"
    )


def test_a_header_claiming_2_24_layers_is_refused_without_listing_them(tmp_path: Path) -> None:
    """Issue 29: a small stream claiming 2**24 layers: counted, the first few named."""
    path = tmp_path / "claims.hrws"
    header = hw.StreamHeader(num_layers=2**24, kv_roles=("key", "value"))
    with hw.StreamWriter(path, header) as writer:
        writer.write(model(1)[0, "key"])
    assert path.stat().st_size < 2048
    with pytest.raises(hwe.InvalidStreamError, match=r"missing layer 0 value, layer 1 key, .* "
                       r"\.\.\. \(33554431 in all\)"):  # fmt: skip
        hw.load_cache(path, progress=False)


def test_save_cache_writes_page_digests(tmp_path: Path) -> None:
    plain, digested = tmp_path / "plain.hrws", tmp_path / "digests.hrws"
    hw.save_cache(plain, model(), progress=False)
    hw.save_cache(digested, model(), page_digests=True, progress=False)
    assert digested.stat().st_size > plain.stat().st_size
    with hw.StreamFile(digested) as stream:
        blob = stream.buffer[stream.entries[0].offset :]
        kinds = [s["kind"] for s in report.describe_blob_envelope(blob, True)["sections"]]
    assert "page_digests" in kinds
    with pytest.raises(hwe.ArgumentTypeError):
        hw.save_cache(plain, model(), page_digests="yes", progress=False)  # type: ignore[arg-type]
