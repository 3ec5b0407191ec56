"""Atomic output and typed file-access errors: the library half of issue 11.

Every path-taking writer goes through ``containers.atomic.atomic_output`` (temporary file in
the target's directory, fsync, rename; removed on failure) and every path-taking reader
turns the file system's ``OSError`` into ``FileAccessError`` (also an ``OSError``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

import hurray_wire as hw
from hurray_wire import containers as hc
from hurray_wire.containers.atomic import atomic_output, check_not_input
from hurray_wire.errors import FileAccessError, HurrayWireError
from tests.conftest import FIXTURES

BLOB = FIXTURES / "blobs/spec_example_f16_key_l3.hrwb"


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_atomic_output_appears_only_on_success(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    with atomic_output(target) as out:
        out.write(b"abc")
        assert not target.exists() and len(leftovers(tmp_path)) == 1
    assert target.read_bytes() == b"abc" and leftovers(tmp_path) == []


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_atomic_output_failure_leaves_the_old_file(tmp_path: Path, error: type) -> None:
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(error), atomic_output(target) as out:
        out.write(b"new, half")
        raise error()
    assert target.read_bytes() == b"old" and leftovers(tmp_path) == []


def test_atomic_output_keeps_a_replaced_file_mode_and_follows_symlinks(tmp_path: Path) -> None:
    real = tmp_path / "real.bin"
    real.write_bytes(b"old")
    real.chmod(0o640)
    link = tmp_path / "link.bin"
    link.symlink_to(real)
    with atomic_output(link) as out:
        out.write(b"new")
    assert link.is_symlink() and real.read_bytes() == b"new"
    assert real.stat().st_mode & 0o777 == 0o640


def test_writing_onto_an_input_is_refused_before_opening(tmp_path: Path) -> None:
    source = tmp_path / "in.bin"
    source.write_bytes(b"keep")
    (tmp_path / "hard.bin").hardlink_to(source)
    (tmp_path / "soft.bin").symlink_to(source)
    for alias in ("in.bin", "hard.bin", "soft.bin", "./in.bin"):
        with pytest.raises(FileAccessError, match="refusing to write onto the input"):
            check_not_input(tmp_path / alias, [source])
        with pytest.raises(FileAccessError), atomic_output(tmp_path / alias, inputs=[source]):
            pass  # pragma: no cover - never reached
    assert source.read_bytes() == b"keep" and leftovers(tmp_path) == []
    check_not_input(tmp_path / "other.bin", [source])  # a new file is fine


@pytest.mark.parametrize("where", ["missing/out.bin", "file.bin/out.bin", "."])
def test_atomic_output_to_a_bad_place_is_a_file_access_error(tmp_path: Path, where: str) -> None:
    (tmp_path / "file.bin").write_bytes(b"x")
    with pytest.raises(FileAccessError) as info, atomic_output(tmp_path / where):
        pass  # pragma: no cover - never reached
    assert isinstance(info.value, OSError) and isinstance(info.value, HurrayWireError)
    assert isinstance(info.value.__cause__, OSError) and info.value.errno is not None
    assert str(tmp_path / where) in str(info.value)


def test_write_file_and_stream_writer_are_atomic(tmp_path: Path) -> None:
    tensor = hw.decode(BLOB.read_bytes())
    hrry = tmp_path / "a.hrry"
    with pytest.raises(HurrayWireError):
        hc.write_file(hrry, {"": tensor})  # a bad name: refused after the target is chosen
    assert not hrry.exists() and leftovers(tmp_path) == []
    seen: list[int] = []
    hc.write_file(hrry, {"t": tensor}, progress=seen.append)
    assert len(seen) == 1 and seen[0] >= tensor.nbytes  # data bytes, padding included
    assert hc.read_file(hrry)["t"].nbytes == tensor.nbytes
    stream = tmp_path / "a.hrws"
    with pytest.raises(RuntimeError), hc.StreamWriter(stream) as writer:
        writer.write(tensor)
        raise RuntimeError("cut")
    assert not stream.exists() and leftovers(tmp_path) == []
    writer = hc.StreamWriter(stream)
    writer.write(tensor)
    writer.abort()
    assert not stream.exists() and leftovers(tmp_path) == []
    with hc.StreamWriter(stream) as writer:
        writer.write(tensor)
    assert len(list(hc.StreamReader(stream))) == 1 and leftovers(tmp_path) == []


def _bad_paths(tmp_path: Path) -> list[Path]:
    (tmp_path / "file.bin").write_bytes(b"x")
    return [tmp_path / "missing.bin", tmp_path / "file.bin" / "x", tmp_path]


@pytest.mark.parametrize(
    "opener",
    [hc.StreamFile, hc.HrryFile, hc.read_file, hc.read_file_metadata, hc.identify,
     lambda p: list(hc.StreamReader(p)), lambda p: hc.write_file(p / "x" / "y", {}),
     lambda p: hc.StreamWriter(p / "x" / "y")],
    ids=["StreamFile", "HrryFile", "read_file", "read_file_metadata", "identify",
         "StreamReader", "write_file", "StreamWriter"],
)  # fmt: skip
def test_library_opens_raise_file_access_error(
    tmp_path: Path, opener: Callable[[Path], object]
) -> None:
    for path in _bad_paths(tmp_path):
        with pytest.raises(FileAccessError) as info:
            opener(path)
        assert isinstance(info.value.__cause__, OSError)
        assert os.fspath(path) in str(info.value)
        with pytest.raises(OSError):  # old ``except OSError`` callers still catch it
            opener(path)
