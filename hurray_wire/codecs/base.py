"""The interface every storage codec implements (a stateless object named by its id in the
section table, docs/wire-format.md § 6), what their modules share, and codec 0, raw;
adding a codec is one module with one subclass, registered in
:mod:`hurray_wire.codecs.registry`."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, Protocol, cast

import numpy as np

from hurray_wire.buffers import U8Array
from hurray_wire.errors import DecompressionError, LimitExceededError

__all__ = [
    "CODEC_RAW",
    "RAW",
    "Codec",
    "Progress",
    "Raw",
    "Settings",
    "bytes_view",
    "local",
    "output",
    "scratch",
]

CODEC_RAW = 0

#: ``progress(n)``: the first ``n`` bytes of a decode's output are final (n ascending).
Progress = Callable[[int], None]

#: Per-thread state of the codec modules: zstd contexts and a scratch buffer.
local = threading.local()
_SCRATCH_MAX = 8 << 20


class Settings(Protocol):
    """What a codec's ``encode`` reads of a checked :class:`~hurray_wire.codecs.Compression`:
    a protocol, so that the codecs never import the configuration that selects among them
    (config imports the codecs, not the other way: no import circle)."""

    @property
    def level(self) -> int: ...
    @property
    def threads(self) -> int: ...
    @property
    def chunk_size(self) -> int: ...


class Codec(ABC):
    """A storage codec: ``encode`` into stored pieces, ``decode_into`` a given output, which
    checks the stored layout against the raw size before allocating or decompressing
    (every failure a ``HurrayWireError``, its offset relative to ``stored``)."""

    #: The id in the section table's ``codec`` byte.
    codec_id: ClassVar[int]
    #: The name in docs, specs ("zstd:3") and dumps.
    name: ClassVar[str]
    #: Every legal ``codec_param``; a section with another one is refused.
    params: ClassVar[frozenset[int]] = frozenset({0})
    #: Whether a :class:`Compression` may select it (raw is "no compression", None).
    compresses: ClassVar[bool] = True
    #: The ``threads`` a text spec such as "zstd:3" gives this codec.
    spec_threads: ClassVar[int] = 0
    #: Whether ``decode_into`` takes a last argument ``progress``, called as the output
    #: becomes final so that a caller checks each piece while in cache (``decode_section``).
    progressive: ClassVar[bool] = False

    def valid_param(self, param: int) -> bool:
        """Whether ``param`` is a legal codec parameter of this codec."""
        return param in self.params

    def expected_params(self) -> object:
        """The legal parameters as an error reports them: the one value, or the list."""
        return min(self.params) if len(self.params) == 1 else sorted(self.params)

    def for_width(self, width: int) -> Codec:
        """The codec that stores elements of ``width`` bytes for this one (itself, unless a
        transform is the identity at that width)."""
        return self

    @abstractmethod
    def encode(self, src: U8Array, config: Settings, width: int) -> tuple[int, list[bytes]]:
        """``(codec_param, stored pieces)`` of ``src``, a non-empty flat uint8 array of
        ``width``-byte elements; the pieces are written one after the other."""

    @abstractmethod
    def decode_into(
        self, param: int, stored: U8Array, raw_size: int, out: U8Array | None, threads: int
    ) -> U8Array:
        """Decode checked-legal ``param`` and ``stored`` into ``out`` (``raw_size`` bytes)
        or, when None, into a new array allocated once the stored layout has passed its
        checks; return the output. ``threads``: -1 every usable core, 0 the caller."""

    def __repr__(self) -> str:
        return f"<codec {self.codec_id} {self.name}>"


def bytes_view(a: U8Array) -> memoryview:
    """A memoryview of a flat uint8 array (numpy's stubs do not declare the buffer protocol)."""
    return memoryview(cast(Any, a))


def output(out: U8Array | None, raw_size: int) -> U8Array:
    """``out``, or a new array of ``raw_size`` bytes: called after the layout checks, so a
    blob cannot make the decoder allocate before its bytes are known to be consistent."""
    if out is not None:
        return out
    try:
        return np.empty(raw_size, np.uint8)
    except (MemoryError, ValueError):
        raise LimitExceededError(
            "cannot allocate the decompressed section", field="raw_size", found=raw_size
        ) from None


def scratch(size: int) -> U8Array:
    """A per-thread reusable uint8 buffer for shuffled bytes (fresh small memory faults per
    4 KiB: ~3x slower); a thread keeps at most _SCRATCH_MAX bytes."""
    if size > _SCRATCH_MAX:
        return np.empty(size, np.uint8)
    buf: U8Array | None = getattr(local, "scratch", None)
    if buf is None or buf.size < size:
        buf = local.scratch = np.empty(size, np.uint8)
    return buf[:size]


class Raw(Codec):
    """No compression: the stored bytes are the raw bytes. No :class:`Compression` selects
    it (that is None); encoders store a section raw when it is small or compression would
    not shrink it."""

    codec_id = CODEC_RAW
    name = "raw"
    compresses = False

    def encode(self, src: U8Array, config: Settings, width: int) -> tuple[int, list[bytes]]:
        """The raw bytes themselves, as one piece (a copy: blob encoders never call this,
        a raw section is written from the tensor's own arrays)."""
        return 0, [src.tobytes()]

    def decode_into(
        self, param: int, stored: U8Array, raw_size: int, out: U8Array | None, threads: int
    ) -> U8Array:
        """Copy ``stored``, which must be exactly ``raw_size`` bytes."""
        if stored.size != raw_size:
            raise DecompressionError(
                "raw section's stored size differs from its raw size",
                field="stored",
                expected=raw_size,
                found=stored.size,
            )
        dst = output(out, raw_size)
        np.copyto(dst, stored)
        return dst


RAW = Raw()
