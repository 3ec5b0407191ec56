"""The codecs by id and by name: the one place that knows which codecs exist (the decoder,
the report and the text specs ask here; registering a codec is all it takes)."""

from __future__ import annotations

from hurray_wire.codecs.base import RAW, Codec
from hurray_wire.codecs.chunked import CHUNKED
from hurray_wire.codecs.zstd import SHUFFLE_ZSTD, ZSTD
from hurray_wire.errors import CodecConfigError, DecompressionError

__all__ = [
    "BY_ID",
    "by_name",
    "compressing",
    "find",
    "find_name",
    "get",
    "ids",
    "name_or_id",
    "names",
    "register",
]

#: Every registered codec by id (read-only for callers: use :func:`register`). The blob
#: decoder indexes it directly on its hot path.
BY_ID: dict[int, Codec] = {}
_BY_NAME: dict[str, Codec] = {}


def register(codec: Codec) -> Codec:
    """Add ``codec``; its id (a u8 of the section table) and name must both be new."""
    if not 0 <= codec.codec_id <= 0xFF:
        raise CodecConfigError(
            "codec id must fit in a byte", field="codec_id", found=codec.codec_id
        )
    clash = BY_ID.get(codec.codec_id) or _BY_NAME.get(codec.name)
    if clash is not None:
        raise CodecConfigError(
            "a codec with this id or name is already registered",
            field="codec",
            expected=f"an id other than {sorted(BY_ID)} and a new name",
            found=f"{codec.codec_id} {codec.name!r} (registered: {clash!r})",
        )
    BY_ID[codec.codec_id] = codec
    _BY_NAME[codec.name] = codec
    return codec


#: The codec with this id, or None.
find = BY_ID.get


def get(codec_id: int) -> Codec:
    """The codec with this id; an unknown id is a :class:`DecompressionError` (a stored
    section names it)."""
    codec = BY_ID.get(codec_id)
    if codec is None:
        raise DecompressionError(
            "unknown codec id", field="codec", expected=sorted(BY_ID), found=codec_id
        )
    return codec


#: The codec with this name ("zstd", "chunked-shuffle-zstd", ...), or None.
find_name = _BY_NAME.get


def by_name(name: str) -> Codec:
    """The codec with this name; an unknown name is a :class:`CodecConfigError`."""
    codec = _BY_NAME.get(name)
    if codec is None:
        raise CodecConfigError(
            "unknown codec name", field="codec", expected=sorted(_BY_NAME), found=repr(name)
        )
    return codec


def name_or_id(codec_id: int) -> str:
    """The codec's name, or its id as text when no codec has it (dumps of bad blobs)."""
    codec = BY_ID.get(codec_id)
    return str(codec_id) if codec is None else codec.name


def ids() -> list[int]:
    """Registered codec ids, ascending."""
    return sorted(BY_ID)


def names() -> dict[int, str]:
    """Name of each registered codec by id, ascending ids."""
    return {i: BY_ID[i].name for i in sorted(BY_ID)}


def compressing() -> list[Codec]:
    """The codecs a :class:`~hurray_wire.codecs.Compression` may select, by id."""
    return [BY_ID[i] for i in sorted(BY_ID) if BY_ID[i].compresses]


for _codec in (RAW, ZSTD, SHUFFLE_ZSTD, CHUNKED):
    register(_codec)
