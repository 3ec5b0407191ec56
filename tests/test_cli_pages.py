"""The command names bad pages, says what it could not verify, prints the index arrays,
keeps failed inputs in ``dump --json``, and exits as its ``--help`` says (issue 23).

Inputs are built here from a fixed seed (no fixture files); outputs are compared with
snapshots in tests/snapshots (``UPDATE_SNAPSHOTS=1`` regenerates them).
"""

from __future__ import annotations

import io
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire import cli
from hurray_wire.containers import write_stream
from hurray_wire.integrity import MemoryPageStore, store_pages
from tests.conftest import FIXTURES, ROOT
from tests.test_cli import check_snapshot

HRRY = FIXTURES / "conformance/block_paged/files/layer0_kv.hrry"
SCHEMA = json.loads((ROOT / "hurray_wire/schemas/dump.schema.json").read_text(encoding="utf-8"))


def run(args: list[object], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def tensor(layer: int = 0, role: str = "key") -> hw.BlockPagedTensor:
    """Three sequences over 6 pages of 4 tokens; page 1 is shared by sequences 0 and 2."""
    rng = np.random.default_rng(layer * 2 + (role == "value"))
    pool = rng.standard_normal((6, 4, 2, 8)).astype(np.float16)
    return hw.BlockPagedTensor.from_arrays(
        pool, [0, 1, 2, 3, 1, 4], [0, 2, 4, 6], seq_lens=[7, 8, 5], kv_role=role,
        layer_index=layer,
    )  # fmt: skip


def page_offset(blob: bytes, page: int) -> int:
    """Where physical page ``page`` of the raw pool starts in ``blob``."""
    t = hw.decode(blob, verify=False)
    pool = np.frombuffer(blob, np.uint8)
    base = int(t.page_pool.ctypes.data) - int(pool.ctypes.data)
    return base + page * int(t.page_pool[0].nbytes)


def damaged(blob: bytes, page: int) -> bytes:
    out = bytearray(blob)
    out[page_offset(blob, page) + 3] ^= 0x40
    return bytes(out)


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # relative names in the snapshots


# -- bad pages named -----------------------------------------------------------------------
def test_validate_and_dump_name_the_bad_page_of_a_blob(capsys: pytest.CaptureFixture[str]) -> None:
    good = bytes(hw.encode(tensor(), page_digests=True))
    Path("bad.hrwb").write_bytes(damaged(good, 1))
    code, out, err = run(["validate", "bad.hrwb"], capsys)
    assert (code, out) == (cli.EXIT_INVALID, "")
    assert err == (
        f"hurray-wire: bad.hrwb: blob (layer 0 key), page 1 at file offset "
        f"{page_offset(good, 1)}: 1 page(s) do not match their digest: physical pages "
        "[1]; logical positions (sequence, page) [(0, 1), (2, 0)]\n"
    )  # page 1 is shared: both of its places are named
    code, out, err = run(["dump", "bad.hrwb"], capsys)
    assert code == cli.EXIT_INVALID and "physical pages [1]" in err
    assert (
        "BAD PAGES (digest mismatch): physical [1], logical (sequence, page) [(0, 1), (2, 0)]"
        in out
    )


def test_a_blob_without_digests_still_says_only_the_section(
    capsys: pytest.CaptureFixture[str],
) -> None:
    Path("bad.hrwb").write_bytes(damaged(bytes(hw.encode(tensor())), 1))
    code, _, err = run(["validate", "bad.hrwb"], capsys)
    assert code == cli.EXIT_INVALID and "buffer[0]" in err and "checksum mismatch" in err


def test_validate_names_the_bad_page_of_a_stream_blob(capsys: pytest.CaptureFixture[str]) -> None:
    sink = io.BytesIO()
    with hw.StreamWriter(sink) as writer:
        for layer in range(2):
            writer.write(tensor(layer), page_digests=True)
    data = bytearray(sink.getvalue())
    entry = hw.StreamFile(bytes(data)).entries[1]
    blob = bytes(data[entry.offset : entry.offset + entry.length])
    data[entry.offset + page_offset(blob, 4) + 1] ^= 0x01
    Path("bad.hrws").write_bytes(bytes(data))
    code, _, err = run(["validate", "bad.hrws"], capsys)
    assert code == cli.EXIT_INVALID
    at = entry.offset + page_offset(blob, 4)
    assert (
        f"blob 1 @ {entry.offset} (layer 1 key), page 4 at file offset {at}: 1 page(s) do not "
        "match their digest: physical pages [4]" in err
    )
    assert "logical positions (sequence, page) [(2, 1)]" in err


def test_dump_shows_a_delta_blob_without_its_page_store(
    capsys: pytest.CaptureFixture[str],
) -> None:
    t = tensor()
    store = MemoryPageStore(1 << 20)
    store_pages(store, t, [0, 2, 3])
    Path("delta.hrwb").write_bytes(bytes(hw.encode(t, known_pages=store.digests())))
    code, out, err = run(["dump", "--index", "delta.hrwb"], capsys)
    assert (code, err) == (0, "")
    assert "pages by reference: [0, 2, 3]" in out and "block_table: [0, 1, 2, 3, 1, 4]" in out
    code, out, _ = run(["validate", "delta.hrwb"], capsys)
    assert code == 0 and "NOT VERIFIED: 3 page(s) held by reference" in out


# -- what could not be verified ------------------------------------------------------------
def test_validate_says_what_it_could_not_verify(capsys: pytest.CaptureFixture[str]) -> None:
    with hw.StreamWriter("plain.hrws") as writer:
        writer.write(tensor(0), checksum=False)
        writer.write(tensor(1))
    with open("ref.hrrs", "wb") as sink:
        write_stream(sink, tensor())
    with hw.StreamWriter("checked.hrws") as writer:
        writer.write(tensor(0))
    code, out, err = run(["validate", "plain.hrws", "ref.hrrs", "checked.hrws"], capsys)
    assert (code, err) == (0, "")
    check_snapshot("validate_unverified.txt", out)
    assert out.splitlines()[2] == "checked.hrws: ok (blob-stream, 1 tensor)"


# -- index arrays -------------------------------------------------------------------------
def test_dump_index_prints_the_arrays_in_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    Path("one.hrwb").write_bytes(bytes(hw.encode(tensor(), page_digests=True)))
    code, out, err = run(["dump", "--index", "one.hrwb"], capsys)
    assert (code, err) == (0, "")
    check_snapshot("dump_index.txt", out)
    code, out, _ = run(["dump", "--json", "--index", "one.hrwb"], capsys)
    (document,) = json.loads(out)
    jsonschema.validate([document], SCHEMA)
    assert document["items"][0]["arrays"] == {
        "block_table": [0, 1, 2, 3, 1, 4], "seq_ptr": [0, 2, 4, 6], "seq_lens": [7, 8, 5],
    }  # fmt: skip
    assert document["items"][0]["pages"]["digests"] is True


# -- dump --json keeps every input ----------------------------------------------------------
def test_dump_json_lists_failed_inputs_with_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    Path("junk.bin").write_bytes(b"not hurray at all")
    good = bytes(hw.encode(tensor(), page_digests=True))
    Path("good.hrwb").write_bytes(good)
    Path("bad.hrwb").write_bytes(damaged(good, 2))
    Path("corrupt.hrwb").write_bytes(damaged(bytes(hw.encode(tensor())), 2))
    names = ["missing.hrwb", "junk.bin", "good.hrwb", "bad.hrwb", "corrupt.hrwb"]
    code, out, _ = run(["dump", "--json", *names], capsys)
    documents = json.loads(out)
    jsonschema.validate(documents, SCHEMA)
    assert [d["path"] for d in documents] == names
    errors = [d.get("error", {}).get("exit_code") for d in documents]
    assert errors == [cli.EXIT_FILE, cli.EXIT_INVALID, None, cli.EXIT_INVALID, cli.EXIT_INVALID]
    assert code == cli.EXIT_FILE
    assert documents[1]["kind"] is None and "unrecognised input" in documents[1]["error"]["message"]
    bad = documents[3]  # the tensor is shown, with its bad page named, and an error
    assert bad["items"][0]["pages"]["bad_pages"] == [2]
    assert "physical pages [2]" in bad["error"]["message"]
    corrupt = documents[4]  # its structure read without checksums, then the error and hint
    assert [i["envelope"]["checksums_verified"] for i in corrupt["items"]] == [False]
    assert "checksum mismatch" in corrupt["error"]["message"]
    assert corrupt["error"]["type"] == "ChecksumError" and "--no-verify" in corrupt["error"]["hint"]


# -- ChecksumError says expected = the stored value ----------------------------------------
def test_checksum_error_expected_is_the_stored_checksum() -> None:
    blob = bytes(hw.encode(tensor()))
    stored = hw.report.describe_blob_envelope(blob, False)["sections"][0]["checksum"]
    with pytest.raises(hw.errors.ChecksumError) as info:
        hw.decode(damaged(blob, 0))
    assert info.value.expected == stored and info.value.found != stored
    header = bytearray(blob)
    header[40] ^= 1  # a byte of the section table: the header checksum fails
    stored_header = int.from_bytes(blob[info_header_at(blob) :][:8], "little")
    with pytest.raises(hw.errors.ChecksumError) as info:
        hw.decode(bytes(header))
    assert info.value.expected == f"0x{stored_header:016x}"


def info_header_at(blob: bytes) -> int:
    return int(hw.report.describe_blob_envelope(blob, False)["header_length"])


# -- dump --hex ----------------------------------------------------------------------------
def test_dump_hex_shows_non_zero_padding_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    blob = bytearray(hw.encode(tensor()))
    sections = hw.report.describe_blob_envelope(bytes(blob), False)["sections"]
    gap = next(
        (a["offset"] + a["stored_size"], b["offset"])
        for a, b in itertools.pairwise(sections)
        if b["offset"] > a["offset"] + a["stored_size"]
    )
    blob[gap[0]] = 0x7F
    Path("pad.hrwb").write_bytes(bytes(blob))
    code, out, err = run(["dump", "--hex", "pad.hrwb"], capsys)
    assert f"{gap[0]:08x}  7f" in out and "padding = NON-ZERO (1 bytes)" in out
    assert code == cli.EXIT_INVALID and "pad.hrwb" in err


def test_dump_hex_of_a_cut_blob_annotates_what_is_there(capsys: pytest.CaptureFixture[str]) -> None:
    blob = bytes(hw.encode(tensor()))
    Path("cut.hrwb").write_bytes(blob[: len(blob) - 100])
    code, out, err = run(["dump", "--hex", "cut.hrwb"], capsys)
    assert code == cli.EXIT_INVALID and err.count("\n") == 1
    assert "header_checksum" in out and "CUT:" in out
    assert out.rstrip().endswith(f"blob: {len(blob)} bytes declared, {len(blob) - 100} present")


def test_dump_hex_of_a_valid_hrry_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["dump", "--hex", HRRY], capsys)
    assert (code, err) == (0, "") and "index = " in out


# -- exit codes ----------------------------------------------------------------------------
def test_validate_bad_then_good_into_head_exits_non_zero_under_pipefail() -> None:
    """A broken pipe after an invalid input returns the invalid input's code, not 0."""
    Path("bad.hrwb").write_bytes(b"HRWB" + bytes(60))
    Path("g.hrwb").write_bytes((FIXTURES / "blobs/spec_example_f16_key_l3.hrwb").read_bytes())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    goods = " ".join(["g.hrwb"] * 4000)  # enough lines to fill the pipe after head leaves
    command = (
        f"set -o pipefail; {sys.executable} -m hurray_wire validate bad.hrwb {goods} | head -1"
    )
    done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, timeout=300)
    assert done.returncode == cli.EXIT_INVALID, done.stderr[-500:]
    assert done.stdout.decode().endswith(": ok (blob, 1 tensor)\n")
    ok = f"set -o pipefail; {sys.executable} -m hurray_wire validate {goods} | head -1"
    assert subprocess.run(["bash", "-c", ok], env=env, timeout=300).returncode == 0
