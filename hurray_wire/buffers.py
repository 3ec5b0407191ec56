"""Bytes-like arguments, coerced here by every entry point: a C-contiguous, unreleased
buffer-protocol object that is not a ``str``; anything else an ``ArgumentTypeError`` naming
the argument, never the buffer protocol's own ``BufferError`` or ``TypeError``."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import numpy.typing as npt

from hurray_wire.errors import ArgumentTypeError, HurrayWireError

__all__ = ["U8Array", "align", "byte_view", "check_zero", "u8_array", "writable_u8"]

U8Array = npt.NDArray[np.uint8]
_SMALL_REGION = 4096  # below this a padding region is checked as one integer


def _not_bytes(name: str, data: object) -> ArgumentTypeError:
    return ArgumentTypeError(
        f"{name} must be a bytes-like object",
        field=name,
        expected="bytes, bytearray, memoryview, mmap or a NumPy array",
        found=type(data).__name__,
    )


def byte_view(data: object, name: str = "data", *, allow_copy: bool = False) -> memoryview:
    """A flat unsigned-byte memoryview of a C-contiguous bytes-like object (no copy);
    ``allow_copy``: a strided one copied instead of refused (checksums, metadata)."""
    if type(data) is bytes:  # the common cases, fast
        return memoryview(data)
    if type(data) is memoryview:  # e.g. encode()'s output
        try:
            view = memoryview(data)
        except ValueError:  # released
            raise _not_bytes(name, data) from None
        if view.c_contiguous and view.ndim == 1 and view.format == "B":
            return view
    if isinstance(data, str):
        raise _not_bytes(name, data)
    if isinstance(data, np.ndarray):
        return memoryview(u8_array(data, name, allow_copy=allow_copy))  # type: ignore[arg-type]
    try:
        view = memoryview(data)  # type: ignore[arg-type]
    except (TypeError, ValueError, BufferError):  # no buffer, or a released one
        raise _not_bytes(name, data) from None
    if not view.c_contiguous:
        if not allow_copy:
            raise ArgumentTypeError(
                f"{name} must be C-contiguous", field=name, found=f"strides {view.strides}"
            )
        view = memoryview(view.tobytes())
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def u8_array(data: object, name: str = "data", *, allow_copy: bool = False) -> U8Array:
    """A flat uint8 NumPy view of a C-contiguous bytes-like object or array (no copy; also
    dtypes that export no buffer: bfloat16, the float8 types)."""
    if isinstance(data, np.ndarray):
        if data.dtype.hasobject:
            raise ArgumentTypeError(
                f"{name} must hold plain data, not objects", field=name, found=str(data.dtype)
            )
        if not data.flags.c_contiguous:
            if allow_copy:
                return cast(U8Array, np.ascontiguousarray(data).reshape(-1).view(np.uint8))
            raise ArgumentTypeError(
                f"{name} must be C-contiguous", field=name, found=f"strides {data.strides}"
            )
        return cast(U8Array, data.reshape(-1).view(np.uint8))
    view = byte_view(data, name, allow_copy=allow_copy)
    try:
        return np.frombuffer(view, dtype=np.uint8)
    except (ValueError, BufferError) as exc:  # pragma: no cover - byte_view checked it
        raise ArgumentTypeError(f"{name} is not a usable buffer: {exc}", field=name) from None


def writable_u8(out: object, name: str = "out") -> U8Array:
    """A caller's output buffer as a flat, writable uint8 array (no copy)."""
    if not isinstance(out, np.ndarray):
        raise ArgumentTypeError(
            f"{name} must be a numpy uint8 array", field=name, found=type(out).__name__
        )
    if out.dtype != np.uint8 or not out.flags.c_contiguous or not out.flags.writeable:
        raise ArgumentTypeError(
            f"{name} must be a writable C-contiguous uint8 array",
            field=name,
            found=f"dtype {out.dtype}, contiguous {out.flags.c_contiguous}, "
            f"writable {out.flags.writeable}",
        )
    return cast(U8Array, out.reshape(-1))


def align(value: int, alignment: int) -> int:
    """``value`` rounded up to a multiple of ``alignment`` (a positive integer)."""
    return -(-value // alignment) * alignment


def check_zero(
    view: Any,
    start: int,
    stop: int,
    *,
    error: type[HurrayWireError],
    section: str,
    base: int = 0,
) -> None:
    """Raise ``error`` at ``base +`` the first non-zero byte of ``view[start:stop]``
    (padding, reserved bytes), vectorised and copy-free."""
    if stop <= start:
        return
    if stop - start <= _SMALL_REGION and not int.from_bytes(view[start:stop], "little"):
        return  # the common case, a few bytes of zero padding: no NumPy call
    region = np.frombuffer(view, np.uint8, stop - start, start)
    if not region.any():
        return
    first = int(np.argmax(region != 0))
    raise error(
        "padding bytes must be zero",
        section=section,
        offset=base + start + first,
        found=f"0x{int(region[first]):02X}",
    )
