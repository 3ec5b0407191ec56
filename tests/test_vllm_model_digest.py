"""hurray_wire.vllm.model_digest: the same files digest the same wherever they are loaded
from; a byte of a weight file changed in place, another file or another config does not."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from hurray_wire.errors import ArgumentTypeError
from hurray_wire.vllm import model_digest as md

CONFIG = {"hidden_size": 128, "_name_or_path": "/here", "text": {"_name_or_path": "x", "a": 1}}


@pytest.fixture
def checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = tmp_path / "a"
    (folder / "sub").mkdir(parents=True)
    (folder / "model-1.safetensors").write_bytes(bytes(range(256)) * 64)
    (folder / "sub" / "model-2.bin").write_bytes(b"\x01" * 1000)
    (folder / "config.json").write_text("{}")  # not a weight file: the config comes parsed
    return folder


def test_same_files_elsewhere_digest_the_same(checkpoint: Path, tmp_path: Path) -> None:
    first = md.checkpoint_digest(checkpoint, CONFIG)
    other = tmp_path / "b"
    shutil.copytree(checkpoint, other)
    moved = {**CONFIG, "_name_or_path": "/there", "text": {"_name_or_path": "y", "a": 1}}
    assert md.checkpoint_digest(other, moved) == first
    assert (tmp_path / "cache" / "hurray_wire" / "model_digests.json").is_file()


def test_a_byte_changed_in_place_or_another_config_differs(checkpoint: Path) -> None:
    first = md.checkpoint_digest(checkpoint, CONFIG)
    path = checkpoint / "model-1.safetensors"
    data = bytearray(path.read_bytes())
    data[5000] ^= 1
    stat = path.stat()
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))  # a new version of the file
    assert md.checkpoint_digest(checkpoint, CONFIG) != first
    assert md.checkpoint_digest(checkpoint, {**CONFIG, "hidden_size": 64}) != md.checkpoint_digest(
        checkpoint, CONFIG
    )
    (checkpoint / "sub" / "model-2.bin").unlink()
    assert md.checkpoint_digest(checkpoint, CONFIG) != first


def test_the_file_cache_serves_a_restart(checkpoint: Path) -> None:
    first = md.checkpoint_digest(checkpoint, CONFIG)
    md._memo.clear()
    path = checkpoint / "model-1.safetensors"
    assert md.file_digest(path, md._load_cache()) == md.file_digest(path)
    assert md.checkpoint_digest(checkpoint, CONFIG) == first


def test_the_memory_memo_keeps_the_most_recent_files(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(md, "MAX_FILES", 2)
    md._memo.clear()
    paths = [checkpoint / "model-1.safetensors", checkpoint / "sub" / "model-2.bin"]
    paths.append(checkpoint / "config.json")  # any file digests; three of them
    digests = [md.file_digest(path) for path in paths]
    assert len(md._memo) == 2 and list(md._memo.values()) == digests[1:]
    assert md.file_digest(paths[1]) == digests[1]  # a hit moves to the most recent end
    assert list(md._memo.values()) == [digests[2], digests[1]]
    assert md.file_digest(paths[0]) == digests[0]  # hashed again: the same digest


def test_config_only_and_bad_mode() -> None:
    assert md.checkpoint_digest(None, CONFIG) == md.checkpoint_digest(None, dict(CONFIG))
    assert md.checkpoint_digest(None, CONFIG) != md.checkpoint_digest(None, {"hidden_size": 1})
    with pytest.raises(ArgumentTypeError, match="model_digest"):
        md.engine_model_digest(object(), "bytes")
