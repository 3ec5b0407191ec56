"""The byte-shuffle kernels: c-blosc2's (when installed) against NumPy's, and how the
module chooses between them."""

from __future__ import annotations

import ctypes.util
import importlib.machinery
import importlib.util
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hurray_wire import codecs
from hurray_wire.codecs import byteshuffle
from tests.blob_reference import shuffle as reference_shuffle, unshuffle as reference_unshuffle

U8 = np.uint8
HAVE_BLOSC2 = importlib.util.find_spec("blosc2") is not None


@pytest.fixture
def fresh_choice(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Let a test choose the kernels again; the original choice is restored after it."""
    saved = list(byteshuffle.state)
    monkeypatch.delenv(byteshuffle.SHUFFLE_ENV, raising=False)
    monkeypatch.delenv(byteshuffle.LIBRARY_ENV, raising=False)
    yield monkeypatch
    byteshuffle.state[:] = saved


def _round_trip_all(width: int, sizes: list[int]) -> None:
    rng = np.random.default_rng(width)
    for n in sizes:
        data = rng.integers(0, 256, n, dtype=U8)
        shuffled = np.empty(n, U8)
        byteshuffle.shuffle_into(data, width, shuffled)
        assert shuffled.tobytes() == reference_shuffle(data.tobytes(), width), (n, width)
        back = np.empty(n, U8)
        byteshuffle.unshuffle_into(shuffled, width, back)
        assert back.tobytes() == data.tobytes() == reference_unshuffle(shuffled.tobytes(), width)
        from_bytes = np.empty(n, U8)
        byteshuffle.unshuffle_into(shuffled.tobytes(), width, from_bytes)  # zstd's output
        assert from_bytes.tobytes() == data.tobytes(), (n, width)


SIZES = [*range(0, 70), 127, 128, 129, 1000, 4095, 4096, 4097, 65536 + 7, 393216]


@pytest.mark.skipif(not HAVE_BLOSC2, reason="python-blosc2 is not installed")
def test_blosc2_is_found_and_used(fresh_choice: pytest.MonkeyPatch) -> None:
    assert byteshuffle.reload().startswith("blosc2 (")
    assert byteshuffle.library_for(2, 1 << 20) is not None


@pytest.mark.skipif(not HAVE_BLOSC2, reason="python-blosc2 is not installed")
@pytest.mark.parametrize("width", [2, 3, 4, 5, 8, 16, 255])
def test_blosc2_kernels_match_the_definition(width: int, fresh_choice: pytest.MonkeyPatch) -> None:
    byteshuffle.reload()
    _round_trip_all(width, SIZES)


@pytest.mark.parametrize("width", [1, 2, 3, 4, 8, 16, 256, 300])
def test_numpy_kernels_match_the_definition(width: int, fresh_choice: pytest.MonkeyPatch) -> None:
    fresh_choice.setenv(byteshuffle.SHUFFLE_ENV, "numpy")
    assert byteshuffle.reload() == "numpy"
    _round_trip_all(width, SIZES)


@pytest.mark.skipif(not HAVE_BLOSC2, reason="python-blosc2 is not installed")
def test_widths_and_sizes_outside_the_library_use_numpy(
    fresh_choice: pytest.MonkeyPatch,
) -> None:
    byteshuffle.reload()
    assert byteshuffle.library_for(1, 100) is None  # the identity
    assert byteshuffle.library_for(256, 1000) is None  # c-blosc2 takes typesize < 256
    assert byteshuffle.library_for(4, 3) is None  # all tail
    assert byteshuffle.library_for(2, 1 << 31) is None  # its sizes are int32
    assert byteshuffle.library_for(2, (1 << 31) - 1) is not None


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=600), width=st.sampled_from([1, 2, 3, 4, 8, 16]))
def test_kernels_agree_property(data: bytes, width: int) -> None:
    """Whatever the loaded backend, both directions equal the definition."""
    src = np.frombuffer(data, U8)
    out = np.empty(len(data), U8)
    byteshuffle.shuffle_into(src, width, out)
    assert out.tobytes() == reference_shuffle(data, width)
    back = np.empty(len(data), U8)
    byteshuffle.unshuffle_into(out, width, back)
    assert back.tobytes() == data


def test_env_forces_numpy(fresh_choice: pytest.MonkeyPatch) -> None:
    fresh_choice.setenv(byteshuffle.SHUFFLE_ENV, " NumPy ")
    assert byteshuffle.reload() == "numpy"
    assert byteshuffle.library_for(2, 1000) is None


def test_a_missing_library_falls_back(fresh_choice: pytest.MonkeyPatch) -> None:
    fresh_choice.setenv(byteshuffle.LIBRARY_ENV, "/nonexistent/libblosc2.so")
    assert byteshuffle.reload() == "numpy"
    _round_trip_all(2, [0, 5, 4096])


def test_a_library_without_the_kernels_falls_back(fresh_choice: pytest.MonkeyPatch) -> None:
    libc = ctypes.util.find_library("c")
    if libc is None:
        pytest.skip("no C library to load")
    fresh_choice.setenv(byteshuffle.LIBRARY_ENV, libc)
    assert byteshuffle.reload() == "numpy"


def test_no_blosc2_package_falls_back(fresh_choice: pytest.MonkeyPatch) -> None:
    fresh_choice.setattr(importlib.util, "find_spec", lambda name: None)
    assert byteshuffle.candidate_libraries() == []
    assert byteshuffle.reload() == "numpy"


class _FakeKernels:
    """A library whose kernels write garbage or refuse their arguments."""

    path = "fake"

    def __init__(self, result: int | None) -> None:
        self.result = result

    def _run(self, width: int, size: int, src: int, dst: int) -> int:
        ctypes.memset(dst, 0x5A, size)
        return size if self.result is None else self.result

    shuffle = _run
    unshuffle = _run


def test_a_library_that_fails_the_self_test_is_not_used(
    fresh_choice: pytest.MonkeyPatch,
) -> None:
    garbage = _FakeKernels(None)
    assert not byteshuffle.self_test(garbage)  # type: ignore[arg-type]
    refusing = _FakeKernels(-1)
    assert not byteshuffle.self_test(refusing)  # type: ignore[arg-type]
    fresh_choice.setattr(byteshuffle, "candidate_libraries", lambda: ["fake"])
    fresh_choice.setattr(byteshuffle, "_Blosc2Kernels", lambda path: garbage)
    assert byteshuffle.reload() == "numpy"


def test_a_kernel_that_refuses_its_arguments_falls_back_to_numpy(
    fresh_choice: pytest.MonkeyPatch,
) -> None:
    byteshuffle.state[:] = [_FakeKernels(-1)]  # type: ignore[list-item]
    _round_trip_all(2, [2, 17, 4096])
    _round_trip_all(4, [4, 4097])


def test_codecs_round_trip_on_each_backend(fresh_choice: pytest.MonkeyPatch) -> None:
    """The stored bytes do not depend on the backend."""
    rng = np.random.default_rng(7)
    data = (rng.standard_normal(300_000) * 0.1).astype(np.float16)
    stored = []
    for choice in ("numpy", "auto"):
        fresh_choice.setenv(byteshuffle.SHUFFLE_ENV, choice)
        byteshuffle.reload()
        codec, param, blob = codecs.compress(data, codecs.DEFAULT_COMPRESSION, 2)
        stored.append(bytes(blob))
        back = codecs.decompress(codec, param, blob, data.nbytes)
        assert back.tobytes() == data.tobytes()
    assert stored[0] == stored[1]


def test_a_library_whose_unshuffle_fails_is_not_used() -> None:
    class HalfRight:
        path = "half"

        def shuffle(self, width: int, size: int, src: int, dst: int) -> int:
            data = np.ctypeslib.as_array(ctypes.cast(src, ctypes.POINTER(ctypes.c_uint8)), (size,))
            out = np.ctypeslib.as_array(ctypes.cast(dst, ctypes.POINTER(ctypes.c_uint8)), (size,))
            byteshuffle._numpy_shuffle(data, width, out)
            return size

        def unshuffle(self, width: int, size: int, src: int, dst: int) -> int:
            return -1

    assert not byteshuffle.self_test(HalfRight())  # type: ignore[arg-type]


def test_an_unreadable_blosc2_spec_falls_back(fresh_choice: pytest.MonkeyPatch) -> None:
    def broken(name: str) -> None:
        raise ValueError("blosc2.__spec__ is None")

    fresh_choice.setattr(importlib.util, "find_spec", broken)
    assert byteshuffle.candidate_libraries() == []


@pytest.mark.skipif(not HAVE_BLOSC2, reason="python-blosc2 is not installed")
def test_the_python_blosc2_3x_layout_is_found(
    tmp_path: Path, fresh_choice: pytest.MonkeyPatch
) -> None:
    """python-blosc2 3.8-3.12 install the library beside the package, in lib64."""
    real = byteshuffle.candidate_libraries()[0]
    package = tmp_path / "blosc2"
    package.mkdir()
    (tmp_path / "lib64").mkdir()
    shutil.copy(real, tmp_path / "lib64" / "libblosc2.so.5")
    spec = importlib.machinery.ModuleSpec("blosc2", None, is_package=True)
    spec.submodule_search_locations = [str(package)]
    fresh_choice.setattr(importlib.util, "find_spec", lambda name: spec)
    expected = str(tmp_path / "lib64" / "libblosc2.so.5")
    assert byteshuffle.candidate_libraries() == [expected]
    assert byteshuffle.reload() == f"blosc2 ({expected})"
    _round_trip_all(2, [4096, 4099])
