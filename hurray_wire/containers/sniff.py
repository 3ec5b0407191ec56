"""What bytes are (a descriptor, a blob, a stream, a ``.hrry`` file), from magic bytes and
framing fields alone, never by decoding: the CLI prints it, readers do the checking."""

from __future__ import annotations

import contextlib
import enum
from typing import Any

from hurray_wire.blob import blob_length
from hurray_wire.containers.io import open_memory
from hurray_wire.wire import blob as wb, containers as wc, descriptor as wd, stream as ws
from hurray_wire.wire.fast import offset_of

__all__ = ["Format", "identify", "known_magic"]

_AT_LENGTH = offset_of(wd.FIXED_HEADER, "descriptor_length")
_LENGTH_END = offset_of(wd.FIXED_HEADER, "flags")
_PEEK = max(len(wc.FILE_MAGIC), _LENGTH_END)


class Format(str, enum.Enum):
    """A kind of hurray-wire input; the value is the name the CLI prints."""

    DESCRIPTOR = "descriptor"
    BLOB = "blob"
    BLOB_STREAM = "blob-stream"
    REFERENCE_STREAM = "reference-stream"
    HRRY_FILE = "hrry-file"
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value


def identify(data_or_path: Any) -> Format:
    """The format of a bytes-like object or of the file at a path (``UNKNOWN`` if none); a
    lone blob or descriptor is one whose own length field is exactly the input's length."""
    with contextlib.closing(open_memory(data_or_path, name="data")) as source:
        view = source.view
        head = bytes(view[:_PEEK])
        if head.startswith(ws.STREAM_MAGIC):
            return Format.BLOB_STREAM
        if head.startswith(wb.BLOB_MAGIC):
            return Format.BLOB if blob_length(view) == len(view) else Format.BLOB_STREAM
        if head.startswith(wc.FILE_MAGIC):
            return Format.HRRY_FILE
        if head.startswith(wd.MAGIC):
            length = 0
            if len(view) >= _LENGTH_END:
                length = int.from_bytes(view[_AT_LENGTH:_LENGTH_END], "little")
            return Format.DESCRIPTOR if length == len(view) else Format.REFERENCE_STREAM
        return Format.UNKNOWN


def known_magic(head: bytes) -> bool:
    """Whether ``head`` starts like some hurray-wire input (so that a reader of an endless
    source, ``/dev/urandom``, can stop after its first bytes)."""
    magics = (ws.STREAM_MAGIC, wb.BLOB_MAGIC, wc.FILE_MAGIC, wd.MAGIC)
    return any(head.startswith(m[: len(head)]) for m in magics)
