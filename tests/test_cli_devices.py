"""Issue 22, the CLI's paths and devices: an output that is a FIFO or a character device is
streamed into, never replaced by a regular file; a block device and a read-only file are
refused; an input that is not a regular file (stdin, a pipe, a FIFO, ``/dev/zero``) is read
within ``--max-input-bytes`` and ``--input-timeout``; each refusal is one line, exit 3."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hurray_wire import cli
from hurray_wire.containers.atomic import atomic_output
from hurray_wire.errors import FileAccessError
from tests.conftest import FIXTURES, ROOT

BLOB = FIXTURES / "blobs/spec_example_f16_key_l3.hrwb"
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")


def run(args: list[Any], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli.main([str(a) for a in args])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert code == 0 or (err.count("\n") == 1 and err.startswith("hurray-wire: "))
    return code, err


def cli_process(
    args: list[str], stdin: Any, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "hurray_wire", *args], stdin=stdin, capture_output=True,
        text=True, timeout=timeout, env=env, check=False,
    )  # fmt: skip


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.hrws"
    os.mkfifo(path)
    return path


# -- outputs -----------------------------------------------------------------------------------
def test_convert_streams_into_a_fifo(fifo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, before the writer
    try:
        assert run(["convert", "-q", BLOB, fifo], capsys)[0] == 0  # fits the pipe buffer
        got = os.read(reader, 1 << 16)
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # still the FIFO, not a regular file
    assert got.startswith(b"HRWS") and cli.identify(got) == "blob-stream"
    assert sorted(p.name for p in fifo.parent.iterdir()) == ["pipe.hrws"]  # no temp file


def test_a_fifo_without_a_reader_is_refused_not_replaced(
    fifo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run(["convert", "-q", BLOB, fifo], capsys)
    assert code == cli.EXIT_FILE and "no process is reading" in err
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in fifo.parent.iterdir()) == ["pipe.hrws"]


@ROOT_ONLY
def test_convert_streams_into_a_character_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a /dev/null of our own
    for to in ("blob", "blob-stream", "reference-stream", "hrry-file"):
        assert run(["convert", "-q", "--to", to, BLOB, null], capsys)[0] == 0
        assert stat.S_ISCHR(os.stat(null).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]


@ROOT_ONLY
def test_a_block_device_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    disk = tmp_path / "disk"
    os.mknod(disk, stat.S_IFBLK | 0o600, os.makedev(7, 200))  # a loop device node, unused
    code, err = run(["convert", "-q", "--to", "blob", BLOB, disk], capsys)
    assert code == cli.EXIT_FILE and "block device" in err
    assert stat.S_ISBLK(os.stat(disk).st_mode)


def test_a_read_only_output_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ro.hrws"
    out.write_bytes(b"keep me")
    out.chmod(0o444)
    code, err = run(["convert", "-q", BLOB, out], capsys)
    assert code == cli.EXIT_FILE and "read-only" in err and "0444" in err
    assert out.read_bytes() == b"keep me" and stat.S_IMODE(out.stat().st_mode) == 0o444
    with pytest.raises(FileAccessError, match="read-only"), atomic_output(out):
        pass


def test_a_failed_stream_into_a_device_leaves_no_file(tmp_path: Path) -> None:
    null = Path(os.devnull)
    with pytest.raises(RuntimeError), atomic_output(null) as handle:  # never replaced
        handle.write(b"x")
        raise RuntimeError("the writer failed")
    assert stat.S_ISCHR(os.stat(null).st_mode)


# -- inputs ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "stdin"),
    [
        (["validate", "/dev/zero"], None),
        (["validate", "-"], "/dev/zero"),
        (["dump", "-"], "/dev/urandom"),
        (["dump", "--json", "-"], "/dev/zero"),
        (["convert", "-", "out.hrws"], "/dev/zero"),
    ],
)
def test_an_endless_device_is_refused_after_its_head(
    args: list[str], stdin: str | None, tmp_path: Path
) -> None:
    args = [str(tmp_path / a) if a.endswith(".hrws") else a for a in args]
    with open(stdin or os.devnull, "rb") as source:
        done = cli_process(args, source)
    assert done.returncode == cli.EXIT_INVALID, done.stderr
    assert "unrecognised input" in done.stderr and done.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_an_endless_input_that_looks_valid_is_cut_at_max_input_bytes() -> None:
    head = BLOB.read_bytes()
    reader, writer = os.pipe()

    def feed() -> None:
        with open(writer, "wb") as sink:
            try:
                sink.write(head)
                while True:
                    sink.write(bytes(1 << 16))
            except BrokenPipeError:
                pass

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    with open(reader, "rb") as source:
        done = cli_process(["validate", "--max-input-bytes", "1000000", "-"], source)
    thread.join(10)
    assert done.returncode == cli.EXIT_FILE, done.stderr
    assert "more than 1000000 bytes" in done.stderr and "--max-input-bytes" in done.stderr


def test_a_fifo_nobody_writes_times_out(fifo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    code, err = run(["validate", "--input-timeout", "0.5", fifo], capsys)
    assert code == cli.EXIT_FILE and "no input for 0.5 s" in err
    assert time.monotonic() - started < 20


def test_a_stalled_writer_times_out(fifo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    release = threading.Event()

    def stall() -> None:
        with open(fifo, "wb") as sink:
            sink.write(BLOB.read_bytes()[:100])
            sink.flush()
            release.wait(30)

    thread = threading.Thread(target=stall, daemon=True)
    thread.start()
    code, err = run(["validate", "--input-timeout", "0.5", fifo], capsys)
    release.set()
    thread.join(10)
    assert code == cli.EXIT_FILE and "no input for 0.5 s" in err


def test_a_fifo_whose_writer_comes_later_is_read(
    fifo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def late() -> None:
        time.sleep(0.3)
        with open(fifo, "wb") as sink:
            sink.write(BLOB.read_bytes())

    thread = threading.Thread(target=late, daemon=True)
    thread.start()
    code, _ = run(["validate", fifo], capsys)
    thread.join(10)
    assert code == 0


def test_stdin_pipe_within_the_bounds_is_read() -> None:
    with open(BLOB, "rb") as source:
        done = cli_process(["validate", "-"], source)
    assert done.returncode == 0 and done.stdout == "-: ok (blob, 1 tensor)\n"


@pytest.mark.parametrize("bad", ["x", "-1", "nan", "1e99"])
def test_bad_bounds_are_usage_errors(bad: str) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["validate", "--input-timeout", bad, str(BLOB)])
    assert info.value.code == cli.EXIT_USAGE
