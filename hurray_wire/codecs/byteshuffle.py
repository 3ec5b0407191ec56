"""The byte-shuffle filter's kernels on checked flat uint8 arrays (docs/wire-format.md § 6).

NumPy's unshuffle (~10 GB/s) is a fifth of a chunk's decode time, so c-blosc2's SIMD
kernels (python-blosc2's library, through ``ctypes``, never importing python-blosc2) run
when present, after reproducing the NumPy definition on a self-test once.
``HURRAY_WIRE_SHUFFLE=numpy`` forces NumPy; ``HURRAY_WIRE_BLOSC2_LIBRARY`` names a
libblosc2 (docs/decisions.md).
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["backend", "reload", "shuffle_into", "unshuffle_into"]

U8Array = npt.NDArray[np.uint8]
_Kernel = Callable[[int, int, int | bytes, int], int]

#: Environment variable: "numpy" forces the NumPy kernels (anything else: automatic).
SHUFFLE_ENV = "HURRAY_WIRE_SHUFFLE"
#: Environment variable: path of a libblosc2 shared library to use.
LIBRARY_ENV = "HURRAY_WIRE_BLOSC2_LIBRARY"

_LITTLE_ENDIAN = sys.byteorder == "little"
_UINT_OF_WIDTH: dict[int, type[np.unsignedinteger[Any]]] = {
    2: np.uint16,
    4: np.uint32,
    8: np.uint64,
}
_INT32_MAX = (1 << 31) - 1  # c-blosc2 takes the block size as int32_t
_SELF_TEST_SIZES = (1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 64, 255, 1000, 4099, 65541)
_SELF_TEST_WIDTHS = (2, 3, 4, 8, 16)


# -- NumPy: the definition -------------------------------------------------------------


def _whole_elements(s: U8Array, w: int, o: U8Array) -> int:
    """Bytes in whole elements, after copying the tail (the same in both directions); 0
    when the shuffle is the identity (width 1, or less than one element), after copying
    everything."""
    m = s.size // w * w
    if w == 1 or m == 0:
        np.copyto(o, s)
        return 0
    o[m:] = s[m:]
    return m


def _numpy_shuffle(s: U8Array, w: int, o: U8Array) -> None:
    """Widths 2 and 4 use integer shifts over a wide view (~2x a transpose copy); other
    widths copy one strided plane at a time."""
    m = _whole_elements(s, w, o)
    if not m:
        return
    planes = o[:m].reshape(w, m // w)
    if _LITTLE_ENDIAN and w in (2, 4):
        wide = s[:m].view(_UINT_OF_WIDTH[w])
        np.copyto(planes[0], wide, casting="unsafe")  # keeps the low byte
        for j in range(1, w):
            np.right_shift(wide, 8 * j, out=planes[j], casting="unsafe")
    else:
        elements = s[:m].reshape(m // w, w)
        for j in range(w):
            planes[j] = elements[:, j]


def _numpy_unshuffle(s: U8Array, w: int, o: U8Array) -> None:
    m = _whole_elements(s, w, o)
    if not m:
        return
    planes = s[:m].reshape(w, m // w)
    if _LITTLE_ENDIAN and w == 2:
        # hi * 256 + lo in uint16: both ufuncs run on one dtype (~20% faster than
        # left_shift + bitwise_or, whose mixed uint8/uint16 operands need a cast buffer).
        wide = o[:m].view(np.uint16)
        np.multiply(planes[1], np.uint16(256), out=wide, dtype=np.uint16)
        np.add(wide, planes[0], out=wide, dtype=np.uint16)
    else:
        elements = o[:m].reshape(m // w, w)
        for j in range(w):
            elements[:, j] = planes[j]


# -- c-blosc2 --------------------------------------------------------------------------


class _Blosc2Kernels:
    """blosc2_shuffle / blosc2_unshuffle of one loaded library."""

    shuffle: _Kernel
    unshuffle: _Kernel

    def __init__(self, path: str) -> None:
        lib = ctypes.CDLL(path)
        self.path = path
        for name in ("shuffle", "unshuffle"):
            kernel = getattr(lib, f"blosc2_{name}")  # AttributeError: an older c-blosc2
            kernel.restype = ctypes.c_int32
            kernel.argtypes = [ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p]
            setattr(self, name, kernel)


def candidate_libraries() -> list[str]:
    """libblosc2 files to try: the one named by LIBRARY_ENV, else python-blosc2's own."""
    named = os.environ.get(LIBRARY_ENV)
    if named:
        return [named]
    try:
        spec = importlib.util.find_spec("blosc2")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    found: list[str] = []
    for root in spec.submodule_search_locations:
        # python-blosc2 4.x ships it in blosc2/lib; 3.8-3.12 beside the package, in lib64.
        places = ("lib", "bin", os.path.join(os.pardir, "lib64"), os.path.join(os.pardir, "lib"))
        for place in places:
            for pattern in ("libblosc2.so*", "libblosc2*.dylib", "*blosc2*.dll"):
                hits = glob.glob(os.path.join(root, place, pattern))
                found.extend(sorted(os.path.normpath(hit) for hit in hits))
    return found


def self_test(kernels: _Blosc2Kernels) -> bool:
    """Does the library reproduce the NumPy kernels (tails and odd widths included)?

    Also initialises c-blosc2's lazy CPU dispatch from one thread."""
    rng = np.random.default_rng(0x5EED)
    for size in _SELF_TEST_SIZES:
        data = rng.integers(0, 256, size, dtype=np.uint8)
        for w in _SELF_TEST_WIDTHS:
            expected = np.empty_like(data)
            _numpy_shuffle(data, w, expected)
            got = np.empty_like(data)
            back = np.empty_like(data)
            if kernels.shuffle(w, size, data.ctypes.data, got.ctypes.data) != size:
                return False
            if kernels.unshuffle(w, size, got.ctypes.data, back.ctypes.data) != size:
                return False
            if not (np.array_equal(got, expected) and np.array_equal(back, data)):
                return False
    return True


def _load() -> _Blosc2Kernels | None:
    if os.environ.get(SHUFFLE_ENV, "").strip().lower() == "numpy":
        return None
    for path in candidate_libraries():
        try:
            kernels = _Blosc2Kernels(path)
        except (OSError, AttributeError):
            continue
        if self_test(kernels):
            return kernels
    return None


_lock = threading.Lock()
state: list[_Blosc2Kernels | None] = []  # empty until loaded; then [kernels or None]


def _kernels() -> _Blosc2Kernels | None:
    if not state:
        with _lock:
            if not state:
                state.append(_load())
    return state[0]


def reload() -> str:
    """Choose the kernels again (after changing the environment variables); returns
    :func:`backend`."""
    with _lock:
        state.clear()
        state.append(_load())
    return backend()


def backend() -> str:
    """``"blosc2"`` (with the library's path) or ``"numpy"``: which kernels run."""
    kernels = _kernels()
    return "numpy" if kernels is None else f"blosc2 ({kernels.path})"


# -- the kernels -----------------------------------------------------------------------


def library_for(width: int, size: int) -> _Blosc2Kernels | None:
    """The loaded library, when it takes this width and size (int32 sizes, 1 < width < 256)."""
    kernels = _kernels()
    if kernels is None or not 1 < width < 256 or not width <= size <= _INT32_MAX:
        return None
    return kernels


def shuffle_into(src: U8Array, width: int, dst: U8Array) -> None:
    """Shuffle flat C-contiguous uint8 ``src`` into ``dst`` of the same size (no overlap)."""
    size = src.size
    lib = library_for(width, size)
    # A library that refuses its arguments (never seen after the self-test) falls back.
    if lib is None or lib.shuffle(width, size, src.ctypes.data, dst.ctypes.data) != size:
        _numpy_shuffle(src, width, dst)


def unshuffle_into(src: U8Array | bytes, width: int, dst: U8Array) -> None:
    """Inverse of :func:`shuffle_into` for the same ``width``. ``src`` may also be a
    ``bytes`` object (zstd's output), which ctypes passes without building an address
    (a NumPy array's ``.ctypes.data`` costs as many instructions as a 4 KiB unshuffle)."""
    size = len(src) if isinstance(src, bytes) else src.size
    lib = library_for(width, size)
    address = src if isinstance(src, bytes) else src.ctypes.data
    if lib is None or lib.unshuffle(width, size, address, dst.ctypes.data) != size:
        plain = np.frombuffer(src, np.uint8) if isinstance(src, bytes) else src
        _numpy_unshuffle(plain, width, dst)
