"""Issue 11, the CLI part: each "found" item as a regression test, and the new behaviour.

No command may destroy an input, leave a partial output, or print a traceback; every failure
is one line on stderr with a documented exit code (``cli.EXIT_CODES``).
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import hurray_wire as hw
from hurray_wire import cli, containers as hc
from hurray_wire.errors import InvalidBlobError
from tests.conftest import BLOCK_PAGED, FIXTURES, ROOT

BLOB = FIXTURES / "blobs/spec_example_f16_key_l3.hrwb"
STREAM = FIXTURES / "streams/whole_cache_2_layers.hrws"
HRRY = BLOCK_PAGED / "files/layer0_kv.hrry"
EXTENSIONS = [".hrwb", ".hrws", ".hrrs", ".hrry"]


def run(
    args: Sequence[str | os.PathLike[str]], capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in args])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out, captured.err


def one_line(err: str) -> None:
    assert err.count("\n") == 1 and err.startswith("hurray-wire: ") and "Traceback" not in err


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.fixture
def inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Path]:
    """One small input of each output kind, in a directory of its own."""
    home = tmp_path / "in"
    home.mkdir()
    made = {".hrwb": home / "x.hrwb"}
    shutil.copy(BLOB, made[".hrwb"])
    for ext in EXTENSIONS[1:]:
        made[ext] = home / f"x{ext}"
        assert run(["convert", BLOB, made[ext]], capsys)[0] == 0
    return made


# -- found: convert F F destroyed its input --------------------------------------------------
@pytest.mark.parametrize("ext", EXTENSIONS)
@pytest.mark.parametrize("alias", ["same", "dot", "hardlink", "symlink"])
def test_convert_onto_its_input_is_refused_and_the_input_is_intact(
    inputs: dict[str, Path], ext: str, alias: str, capsys: pytest.CaptureFixture[str]
) -> None:
    source = inputs[ext]
    before = source.read_bytes()
    output = {"same": source, "dot": source.parent / "." / source.name,
              "hardlink": source.parent / f"hard{ext}", "symlink": source.parent / f"soft{ext}"}[
        alias
    ]  # fmt: skip
    if alias == "hardlink":
        output.hardlink_to(source)
    elif alias == "symlink":
        output.symlink_to(source)
    names = listing(source.parent)
    code, out, err = run(["convert", source, output], capsys)
    assert code == cli.EXIT_FILE and out == ""
    one_line(err)
    assert "refusing to write onto the input" in err
    assert source.read_bytes() == before and listing(source.parent) == names


# -- found: a failed convert left a partial output -------------------------------------------
@pytest.mark.parametrize("ext", [".hrwb", ".hrws"])
def test_a_bad_codec_level_leaves_no_output(
    tmp_path: Path, ext: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["convert", BLOB, tmp_path / f"out{ext}", "--compression", "zstd:99"],
                       capsys)  # fmt: skip
    assert code == cli.EXIT_USAGE and "zstd level out of range" in err
    one_line(err)
    assert listing(tmp_path) == []


@pytest.mark.parametrize("ext", EXTENSIONS)
@pytest.mark.parametrize(
    ("failure", "exit_code"),
    [(InvalidBlobError("codec broke"), cli.EXIT_INVALID), (KeyboardInterrupt(), 130),
     (OSError(28, "No space left on device"), cli.EXIT_FILE)],
    ids=["error", "interrupt", "disk-full"],
)  # fmt: skip
def test_a_failure_while_writing_leaves_no_output_and_no_temporary(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    ext: str,
    failure: BaseException,
    exit_code: int,
) -> None:
    source = STREAM if ext != ".hrwb" else BLOB
    target = tmp_path / f"out{ext}"
    target.write_bytes(b"an older file")
    calls = {"n": 0}

    def failing(*args: Any, **kw: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == (2 if ext != ".hrwb" else 1):  # after some bytes went out
            raise failure
        return original(*args, **kw)

    name = {".hrwb": "encode_parts", ".hrrs": "write_stream"}.get(ext)
    if name is not None:
        original = getattr(cli, name)
        monkeypatch.setattr(cli, name, failing)
    elif ext == ".hrws":
        original = hc.StreamWriter.write
        monkeypatch.setattr(hc.StreamWriter, "write", failing)
    else:  # the failure comes from write_file's progress call, after a tensor's bytes
        monkeypatch.setattr(cli, "write_file", _failing_image(failure))
    code, _, err = run(["convert", source, target], capsys)
    assert code == exit_code
    one_line(err)
    assert target.read_bytes() == b"an older file" and listing(tmp_path) == [target.name]


def _failing_image(failure: BaseException) -> Any:
    real = hc.write_file  # as cli.py imports it

    def write_file(path: Any, tensors: Any, metadata: Any = None, **kw: Any) -> int:
        def explode(_: int) -> None:
            raise failure

        return real(path, tensors, metadata, **{**kw, "progress": explode})

    return write_file


# -- found: a missing directory or a directory gave a traceback ------------------------------
def _bad_inputs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    regular = tmp_path / "regular.bin"
    regular.write_bytes(b"x")
    return {
        "missing": (tmp_path / "missing.hrwb", "No such file or directory"),
        "directory": (tmp_path, "Is a directory"),
        "under-a-file": (regular / "x.hrwb", "Not a directory"),
    }


@pytest.mark.parametrize("command", ["dump", "validate", "convert"])
@pytest.mark.parametrize("case", ["missing", "directory", "under-a-file"])
def test_an_unreadable_input_is_one_line_exit_3(
    tmp_path: Path, command: str, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path, reason = _bad_inputs(tmp_path)[case]
    argv: list[str | Path] = [command, path]
    if command == "convert":
        argv.append(tmp_path / "out.hrws")
    code, out, err = run(argv, capsys)
    assert code == cli.EXIT_FILE and out == ""
    one_line(err)
    assert str(path) in err and reason in err
    assert not (tmp_path / "out.hrws").exists()


@pytest.mark.parametrize("case", ["missing-dir", "a-directory", "under-a-file"])
@pytest.mark.parametrize("ext", EXTENSIONS)
def test_an_unwritable_output_is_one_line_exit_3(
    tmp_path: Path, case: str, ext: str, capsys: pytest.CaptureFixture[str]
) -> None:
    regular = tmp_path / "regular.bin"
    regular.write_bytes(b"x")
    (tmp_path / f"dir{ext}").mkdir()
    output = {"missing-dir": tmp_path / "nowhere" / f"out{ext}",
              "a-directory": tmp_path / f"dir{ext}",
              "under-a-file": regular / f"out{ext}"}[case]  # fmt: skip
    code, _, err = run(["convert", BLOB, output], capsys)
    assert code == cli.EXIT_FILE
    one_line(err)
    assert str(output) in err
    assert listing(tmp_path) == sorted([f"dir{ext}", "regular.bin"])
    assert listing(tmp_path / f"dir{ext}") == []


# -- found: validate stopped at the first bad file -------------------------------------------
def test_validate_checks_every_input_and_names_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not hurray")
    bad = BLOCK_PAGED / "invalid/bp_bad_kv_role3.bin"
    missing = tmp_path / "missing.hrws"
    code, out, err = run(["validate", BLOB, junk, STREAM, bad, missing, HRRY], capsys)
    assert code == cli.EXIT_FILE  # several failures: the highest code (3 unreadable > 1)
    assert out.splitlines() == [
        f"{BLOB}: ok (blob, 1 tensor)",
        f"{STREAM}: ok (blob-stream, 4 tensors)",
        f"{HRRY}: ok (hrry-file, 2 tensors); NOT VERIFIED: a hrry-file carries no data "
        "checksums: structure checked, values not",
    ]
    lines = err.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith(f"hurray-wire: {junk}: unrecognised input")
    assert lines[1].startswith(f"hurray-wire: {bad}: ") and "kv_role" in lines[1]
    assert lines[2].startswith(f"hurray-wire: {missing}: cannot open for reading")


def test_validate_exit_code_is_the_most_severe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, _ = run(["validate", BLOB, tmp_path / "missing.hrwb"], capsys)
    assert code == cli.EXIT_FILE
    code, _, _ = run(["validate", BLOCK_PAGED / "invalid/bp_bad_kv_role3.bin", BLOB], capsys)
    assert code == cli.EXIT_INVALID
    code, out, _ = run(["validate", BLOB, STREAM], capsys)
    assert code == 0 and len(out.splitlines()) == 2


# -- found: a cut stream dumped nothing ------------------------------------------------------
def _cut(tmp_path: Path, source: Path, at: int) -> Path:
    cut = tmp_path / f"cut{source.suffix}"
    cut.write_bytes(source.read_bytes()[:at])
    return cut


def test_dump_of_a_stream_cut_mid_blob_prints_the_intact_blobs_then_the_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    entries = hc.StreamFile(STREAM).entries
    cut = _cut(tmp_path, STREAM, entries[2].offset + 1000)  # inside blob 2
    code, out, err = run(["dump", cut], capsys)
    assert code == cli.EXIT_INVALID
    assert f"[blob 0 @ {entries[0].offset}]" in out and f"[blob 1 @ {entries[1].offset}]" in out
    assert "[blob 2" not in out and "end record: no" in out
    one_line(err)
    assert err.startswith(f"hurray-wire: {cut}: ") and "blob" in err
    code, out, err = run(["validate", cut], capsys)
    assert code == cli.EXIT_INVALID and out == ""
    one_line(err)


def test_dump_json_of_a_cut_stream_keeps_the_intact_blobs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    entries = hc.StreamFile(STREAM).entries
    cut = _cut(tmp_path, STREAM, entries[3].offset + 20)
    code, out, err = run(["dump", "--json", cut, BLOB], capsys)
    assert code == cli.EXIT_INVALID
    one_line(err)
    document = json.loads(out)
    assert [len(d["items"]) for d in document] == [3, 1]


def test_dump_of_a_cut_reference_stream_prints_the_intact_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = BLOCK_PAGED / "streams/multi_record.hrrs"
    records = list(hc.read_stream(source.read_bytes()))
    cut = _cut(tmp_path, source, source.stat().st_size - 3)
    code, out, err = run(["dump", cut], capsys)
    assert code == cli.EXIT_INVALID
    assert out.count("[record ") == len(records) - 1
    one_line(err)


# -- --hex on a blob stream ------------------------------------------------------------------
def test_dump_hex_annotates_every_record_of_a_stream(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["dump", "--hex", STREAM], capsys)
    assert (code, err) == (0, "")
    assert "stream_header.model_name = 'fixture-llm'" in out
    assert "stream_header.kv_roles = 0x03 (key, value)" in out
    entries = hc.StreamFile(STREAM).entries
    for number, entry in enumerate(entries):
        assert f"{entry.offset:08x}  48 52 57 42" in out  # each blob's magic at its offset
        assert f"blob[{number}].header.total_length = {entry.length}" in out
    assert "end_record.entry[3].kv_role = value" in out and "end_record.checksum" in out
    cut = _cut(tmp_path, STREAM, entries[1].offset + 100)
    code, out, err = run(["dump", "--hex", cut], capsys)
    assert out.rstrip().endswith("'HRWB': 66112 bytes declared, 100 present")
    assert code == cli.EXIT_INVALID and "stream ends inside blob 1" in err  # shown, then refused
    one_line(err)


def test_dump_hex_annotates_a_hrry_file_and_refuses_a_reference_stream(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(["dump", "--hex", HRRY], capsys)
    assert (code, err) == (0, "")
    assert "header.magic = 'HRRYFILE'" in out and "trailer.magic = 'HRRY'" in out
    assert "(no checksum)" in out and "layout_tag = 0x0A" in out
    source = str(BLOCK_PAGED / "streams/multi_record.hrrs")
    code, _, err = run(["dump", "--hex", source], capsys)
    assert code == cli.EXIT_USAGE and "--hex is available for" in err
    one_line(err)


# -- what each conversion keeps --------------------------------------------------------------
def test_stream_to_stream_keeps_the_stream_header(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "copy.hrws"
    assert run(["convert", STREAM, out, "--compression", "zstd:3"], capsys)[0] == 0
    original, copy = hc.StreamFile(STREAM), hc.StreamFile(out)
    assert copy.header == original.header and copy.header is not None
    assert original.header is not None
    assert dict(copy.header.metadata) == dict(original.header.metadata)
    assert copy.complete and [e.layer_index for e in copy.entries] == [0, 0, 1, 1]


def test_stream_to_hrry_names_tensors_by_layer_and_role_and_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hrry = tmp_path / "cache.hrry"
    assert run(["convert", STREAM, hrry], capsys)[0] == 0
    with hc.HrryFile(hrry) as reader:
        assert reader.names == ("layer0.key", "layer0.value", "layer1.key", "layer1.value")
        assert reader.user_metadata == {
            "request_id": "req-0001",
            "stream.model": "fixture-llm",
            "stream.num_layers": 2,
            "stream.kv_roles": ["key", "value"],
            "stream.element_type": "float16",
        }
        tensor = reader.tensor("layer1.value")
        assert tensor.seq_lens is not None  # kept, as hurray.seq_lens.<name>
    back = tmp_path / "back.hrws"
    assert run(["convert", hrry, back], capsys)[0] == 0
    assert hc.StreamFile(back).header == hc.StreamFile(STREAM).header
    for a, b in zip(hc.StreamReader(back), hc.StreamReader(STREAM), strict=True):
        assert a.page_pool.tobytes() == b.page_pool.tobytes() and a.metadata == b.metadata
    again = tmp_path / "again.hrry"
    assert run(["convert", back, again], capsys)[0] == 0
    assert hc.read_file_metadata(again) == hc.read_file_metadata(hrry)


def test_blob_to_hrry_and_hrry_to_hrry_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "one.hrry"
    assert run(["convert", BLOB, out], capsys)[0] == 0
    assert hc.HrryFile(out).names == ("layer3.key",)
    copy = tmp_path / "copy.hrry"
    assert run(["convert", HRRY, copy], capsys)[0] == 0
    assert hc.HrryFile(copy).names == hc.HrryFile(HRRY).names
    assert hc.HrryFile(copy).user_metadata == hc.HrryFile(HRRY).user_metadata


def test_tensor_names_are_unique_and_layer_none_is_named() -> None:
    tensor = hw.decode((FIXTURES / "blobs/layer_none_f16_key.hrwb").read_bytes())
    taken: set[str] = set()
    assert [cli._tensor_name(tensor, taken) for _ in range(3)] == [
        "layer_none.key", "layer_none.key#1", "layer_none.key#2"
    ]  # fmt: skip


# -- stdin and stdout ------------------------------------------------------------------------
def _console(*argv: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    script = Path(sys.executable).parent / "hurray-wire"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "hurray_wire"]
    return subprocess.run([*command, *argv], input=stdin, capture_output=True, cwd=ROOT)


def test_convert_stdin_to_stdout_through_the_console_script() -> None:
    result = _console("convert", "-", "-", "--to", "blob-stream", stdin=STREAM.read_bytes())
    assert result.returncode == 0 and b"Traceback" not in result.stderr
    got = list(hc.StreamReader(result.stdout))
    assert len(got) == 4 and hc.StreamFile(result.stdout).header == hc.StreamFile(STREAM).header
    result = _console("convert", "-", "-", "--to", "blob", stdin=BLOB.read_bytes())
    assert result.returncode == 0 and result.stdout == BLOB.read_bytes()
    result = _console("convert", "-", "-", "--to", "reference-stream", stdin=BLOB.read_bytes())
    assert result.returncode == 0 and len(list(hc.read_stream(result.stdout))) == 1


def test_console_script_failures_are_one_line(tmp_path: Path) -> None:
    cut = _cut(tmp_path, STREAM, 70_000)
    for argv, code in [
        (["validate", str(cut)], 1),
        (["dump", str(tmp_path / "missing")], 3),
        (["convert", str(cut), str(cut)], 3),
        (["convert", str(BLOB), str(tmp_path / "nowhere" / "x.hrws")], 3),
        (["convert", str(BLOB), "-", "--to", "hrry-file"], 2),
        (["convert", str(BLOB), "-"], 2),
        (["dump", "--quiet", "--progress", str(BLOB)], 2),
    ]:
        result = _console(*argv)
        assert result.returncode == code, (argv, result.stderr)
        assert b"Traceback" not in result.stderr and result.stderr.count(b"\n") >= 1
        if code != 2 or argv[0] == "convert":
            assert result.stderr.count(b"\n") == 1, result.stderr
    result = _console("dump", "-", stdin=BLOB.read_bytes())
    assert result.returncode == 0 and result.stdout.startswith(b"-: blob, 1216 bytes")


def test_stdin_read_by_validate(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(STREAM.read_bytes())))
    code, out, _ = run(["validate", "-"], capsys)
    assert code == 0 and out == "-: ok (blob-stream, 4 tensors)\n"


def test_stdout_is_refused_for_hrry_and_needs_to(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["convert", BLOB, "-", "--to", "hrry-file"], capsys)
    assert code == cli.EXIT_USAGE and out == "" and "not to - (stdout)" in err
    code, _, err = run(["convert", BLOB, "-"], capsys)
    assert code == cli.EXIT_USAGE and "pass --to" in err
    code, _, err = run(["convert", BLOB, "x.hrry", "--compression", "zstd"], capsys)
    assert code == cli.EXIT_USAGE and "--compression applies to blob outputs" in err
    assert not (ROOT / "x.hrry").exists()


# -- progress, help, interrupts --------------------------------------------------------------
@pytest.mark.parametrize("command", ["dump", "validate"])
def test_progress_moves_per_record_for_dump_and_validate(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run([command, "--progress", STREAM], capsys)
    assert code == 0 and "4/4" in err and "record" in err
    code, _, err = run([command, "-q", STREAM], capsys)
    assert (code, err) == (0, "")
    code, _, err = run([command, STREAM], capsys)  # stderr is not a terminal here
    assert (code, err) == (0, "")


@pytest.mark.parametrize("ext", EXTENSIONS[1:])
def test_progress_moves_per_byte_for_every_output_kind_and_names_the_files(
    tmp_path: Path, ext: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli._Counted, "_SLICE", 4096)  # one tensor moves the bar many times
    code, _, err = run(["convert", "--progress", STREAM, tmp_path / f"x{ext}"], capsys)
    assert code == 0 and f"x{ext}: 100%" in err and "check whole_cache_2_layers.hrws" in err
    assert "4/4" in err  # the check: per tensor
    if ext != ".hrry":  # written in 4 KiB slices: the bar moves at each (tqdm draws fewer)
        updates: list[int] = []

        class Recording(cli.tqdm):  # type: ignore[misc, name-defined]
            def update(self, n: int = 1) -> Any:
                updates.append(n)
                return super().update(n)

        monkeypatch.setattr(cli, "tqdm", Recording)
        assert run(["convert", "--progress", STREAM, tmp_path / f"y{ext}"], capsys)[0] == 0
        assert len(updates) > 4 * 16  # 4 tensors of 64 KiB: 16 slices each at least


@pytest.mark.parametrize("argv", [["--help"], ["convert", "--help"], ["--version"], ["nope"]])
def test_help_loads_no_library_code(argv: list[str]) -> None:
    """--help, --version and a usage error parse arguments only: no NumPy, no blob,
    container or transport module (a command loads them once it runs)."""
    probe = (
        "import sys\n"
        "from hurray_wire.cli_args import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = [m for m in sys.modules if m == 'numpy' or m.startswith(("
        "'hurray_wire.blob', 'hurray_wire.containers', 'hurray_wire.transport', "
        "'hurray_wire.report')) or m == 'hurray_wire.cli']\n"
        "print(heavy, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr


def test_help_lists_exit_codes_and_explains_positionals(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["convert", "--help"], ["validate", "--help"]):
        with pytest.raises(SystemExit) as info:
            cli.main(argv)
        assert info.value.code == 0
        out = capsys.readouterr().out
        assert "exit codes:" in out
        for code in cli.EXIT_CODES:
            assert f"  {code} " in out
    with pytest.raises(SystemExit):
        cli.main(["convert", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps to the terminal width
    assert "never onto IN" in out and "- reads stdin" in out


def test_keyboard_interrupt_exits_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*_: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_validate_one", interrupted)
    code, _, err = run(["validate", BLOB], capsys)
    assert code == 130 and err == "hurray-wire: interrupted\n"


def test_python_dash_m_runs_the_command() -> None:
    result = subprocess.run([sys.executable, "-m", "hurray_wire", "validate", str(BLOB)],
                            capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert result.returncode == 0 and result.stdout == f"{BLOB}: ok (blob, 1 tensor)\n"
    assert os.fspath(BLOB) in result.stdout


def test_an_internal_error_is_one_line_exit_4(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*_: Any) -> None:
        raise TypeError("a bug")

    monkeypatch.setattr(cli, "_validate_one", broken)
    code, _, err = run(["validate", BLOB, BLOB], capsys)
    assert code == cli.EXIT_INTERNAL and err.count("internal error: TypeError: a bug") == 2


def test_a_named_pipe_is_read_not_mapped(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", f"cat {BLOB} > {fifo}"])
    result = _console("validate", str(fifo))
    writer.wait()
    assert result.returncode == 0 and result.stdout == f"{fifo}: ok (blob, 1 tensor)\n".encode()
