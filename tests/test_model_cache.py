"""save_cache / load_cache: a whole model's cache in one call each, checked and atomic."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire import cli
from hurray_wire.containers import blob_stream
from hurray_wire.integrity import EngineFingerprint

FP = EngineFingerprint("tiny-llm", "vllm", "0.9.1", "NHD", "float16", 4, 0, 1)
LAYERS = 3


def cache(layers: int = LAYERS) -> dict[tuple[int, str], hw.BlockPagedTensor]:
    out = {}
    for layer in range(layers):
        for role in ("key", "value"):
            rng = np.random.default_rng(layer * 2 + (role == "value"))
            pool = rng.standard_normal((6, 4, 2, 8)).astype(np.float16)
            out[layer, role] = hw.BlockPagedTensor.from_arrays(
                pool, [0, 1, 2, 4], [0, 2, 4], seq_lens=[7, 5], kv_role=role, layer_index=layer
            )
    return out


def test_round_trip_of_every_layer_and_role_with_metadata_and_fingerprint(tmp_path: Path) -> None:
    path = tmp_path / "model.hrws"
    source = cache()
    size = hw.save_cache(path, source, model="tiny-llm", metadata={"request": "r-7"},
                         fingerprint=FP, progress=False)  # fmt: skip
    assert size == path.stat().st_size
    got = hw.load_cache(path, expect_fingerprint=FP, progress=False)
    assert (got.model, dict(got.metadata), got.fingerprint) == ("tiny-llm", {"request": "r-7"}, FP)
    assert got.num_layers == LAYERS and set(got.tensors) == set(source)
    for key, tensor in source.items():
        back = got[key]
        np.testing.assert_array_equal(back.page_pool, tensor.page_pool)  # the whole pool
        np.testing.assert_array_equal(back.block_table, tensor.block_table)
        np.testing.assert_array_equal(back.seq_lens, tensor.seq_lens)
    # checksummed: the command verifies every blob and has nothing to say it could not
    assert cli.main(["validate", "-q", str(path)]) == 0


def test_a_damaged_byte_is_refused_on_load(tmp_path: Path) -> None:
    path = tmp_path / "model.hrws"
    hw.save_cache(path, cache(), progress=False)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x08
    path.write_bytes(bytes(data))
    with pytest.raises(hw.HurrayWireError):
        hw.load_cache(path, progress=False)


def test_another_engine_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.hrws"
    hw.save_cache(path, cache(), fingerprint=FP, progress=False)
    other = EngineFingerprint("tiny-llm", "vllm", "0.9.1", "NHD", "float16", 16, 0, 1)
    with pytest.raises(hw.errors.IncompatibleFingerprintError, match="block_size"):
        hw.load_cache(path, expect_fingerprint=other, progress=False)


def test_a_failed_save_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "model.hrws"
    path.write_bytes(b"the previous save")
    calls = {"n": 0}
    write = blob_stream.StreamWriter.write

    def failing(self: Any, tensor: hw.BlockPagedTensor, **kw: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device")
        return write(self, tensor, **kw)

    monkeypatch.setattr(blob_stream.StreamWriter, "write", failing)
    with pytest.raises(OSError, match="No space"):
        hw.save_cache(path, cache(), progress=False)
    assert path.read_bytes() == b"the previous save"
    assert os.listdir(tmp_path) == ["model.hrws"]


@pytest.mark.parametrize(
    "bad, error, match",
    [
        ({k: v for k, v in cache().items() if k != (1, "value")}, hw.errors.InvalidStreamError,
         "missing layer 1 value"),
        ([], hw.errors.InvalidStreamError, "no tensor"),
        ([*cache().values(), cache()[0, "key"]], hw.errors.InvalidStreamError, "twice"),
        ([np.zeros(3)], hw.errors.ArgumentTypeError, "not a BlockPagedTensor"),
        (b"bytes", hw.errors.ArgumentTypeError, "iterable"),
        ([hw.BlockPagedTensor.from_arrays(np.zeros((2, 4, 1, 2), np.float16), [0], [0, 1])],
         hw.errors.InvalidStreamError, "layer_index"),
    ],
)  # fmt: skip
def test_what_is_not_a_whole_model_cache_is_refused(
    tmp_path: Path, bad: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        hw.save_cache(tmp_path / "x.hrws", bad, progress=False)
    assert not (tmp_path / "x.hrws").exists()


def test_load_refuses_a_stream_that_misses_a_layer(tmp_path: Path) -> None:
    path = tmp_path / "part.hrws"
    header = hw.StreamHeader(num_layers=LAYERS, kv_roles=("key", "value"))
    with hw.StreamWriter(path, header) as writer:
        for key, tensor in cache().items():
            if key != (2, "key"):
                writer.write(tensor)
    with pytest.raises(hw.errors.InvalidStreamError, match="missing layer 2 key"):
        hw.load_cache(path, progress=False)
    with hw.StreamWriter(path) as writer:  # no num_layers / kv_roles: not a model cache
        writer.write(cache()[0, "key"])
    with pytest.raises(hw.errors.InvalidStreamError, match="num_layers and kv_roles"):
        hw.load_cache(path, progress=False)


def test_progress_hook_sees_every_byte_and_no_bar_off_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "model.hrws"
    saved: list[tuple[int, int]] = []
    hw.save_cache(path, cache(), progress=lambda done, total: saved.append((done, total)))
    total = sum(t.nbytes for t in cache().values())
    assert len(saved) == 2 * LAYERS and saved[-1] == (total, total)
    assert [d for d, _ in saved] == sorted(d for d, _ in saved)
    loaded: list[tuple[int, int]] = []
    hw.load_cache(path, progress=lambda done, total: loaded.append((done, total)))
    assert len(loaded) == 2 * LAYERS and loaded[-1][1] == path.stat().st_size
    assert loaded[-1][0] < path.stat().st_size  # the end record comes after the last blob
    hw.save_cache(path, cache())  # progress=None: stderr is not a terminal here, no bar
    hw.load_cache(path)
    assert capsys.readouterr().err == ""
    with pytest.raises(hw.errors.ArgumentTypeError, match="progress"):
        hw.save_cache(path, cache(), progress="yes")  # type: ignore[arg-type]
