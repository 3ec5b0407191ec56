"""How encode compresses: :class:`Compression`, a value object checked once when built
(configuration is data, kept apart from the bytes), and the edges' text specs
(``"zstd:3"``), read by :func:`parse_spec`."""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass

import zstandard

from hurray_wire.codecs import registry
from hurray_wire.codecs.chunked import CHUNK_SIZE_MAX, CHUNK_SIZE_MIN, CODEC_CHUNKED, is_chunk_size
from hurray_wire.errors import ArgumentTypeError, CodecConfigError

__all__ = ["DEFAULT_COMPRESSION", "Compression", "check_threads", "int_arg", "parse_spec"]

_MIN_LEVEL = 1
_MAX_LEVEL: int = zstandard.MAX_COMPRESSION_LEVEL
_SPEC_RE = re.compile(r"([a-z0-9-]+)(?::([0-9]{1,3}))?")


def int_arg(value: object, name: str) -> int:
    """Return value as an int; bools and non-integers are type errors."""
    if isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be an int", field=name, found=type(value).__name__)
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ArgumentTypeError(
            f"{name} must be an int", field=name, found=type(value).__name__
        ) from None


def check_threads(threads: object) -> int:
    """A thread count as the codecs take it: -1 (every usable core), 0 (the caller only)
    or a count; anything else is refused."""
    value = int_arg(threads, "threads")
    if value < -1:
        raise CodecConfigError(
            "threads must be -1 (every core), 0 (the caller only) or a thread count",
            field="threads",
            found=value,
        )
    return value


def _names(names: list[str]) -> str:
    """``a, b or c``, as the error messages list choices."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


@dataclass(frozen=True)
class Compression:
    """How encode compresses sections: ``codec``, a compressing codec's id; ``level``, zstd's
    (1-22); ``threads`` (0: the caller, -1: every usable core) for the chunked codec's
    chunks or zstd's workers from 1 MiB; ``min_size``, below which sections stay raw;
    ``chunk_size``, the chunked codec's (a power of two, 4 KiB to 1 GiB)."""

    codec: int
    level: int = 1
    threads: int = 0
    min_size: int = 4096
    chunk_size: int = 1 << 20

    def __post_init__(self) -> None:
        codec = int_arg(self.codec, "codec")
        level = int_arg(self.level, "level")
        threads = check_threads(self.threads)
        min_size = int_arg(self.min_size, "min_size")
        chunk_size = int_arg(self.chunk_size, "chunk_size")
        found = registry.find(codec)
        if found is None or not found.compresses:
            choices = registry.compressing()
            raise CodecConfigError(
                f"compression codec must be {_names([c.name for c in choices])} "
                "(no compression is None)",
                field="codec",
                expected=_names([str(c.codec_id) for c in choices]),
                found=codec,
            )
        if not is_chunk_size(chunk_size):
            raise CodecConfigError(
                "chunk_size must be a power of two",
                field="chunk_size",
                expected=f"{CHUNK_SIZE_MIN}..{CHUNK_SIZE_MAX}",
                found=chunk_size,
            )
        if not _MIN_LEVEL <= level <= _MAX_LEVEL:
            raise CodecConfigError(
                "zstd level out of range",
                field="level",
                expected=f"{_MIN_LEVEL}..{_MAX_LEVEL}",
                found=level,
            )
        if min_size < 0:
            raise CodecConfigError(
                "min_size must not be negative", field="min_size", found=min_size
            )
        # Normalise integer-like values (np.uint8, ...) to plain ints.
        object.__setattr__(self, "codec", codec)
        object.__setattr__(self, "level", level)
        object.__setattr__(self, "threads", threads)
        object.__setattr__(self, "min_size", min_size)
        object.__setattr__(self, "chunk_size", chunk_size)

    def __str__(self) -> str:
        return f"{registry.get(self.codec).name}:{self.level}"

    @classmethod
    def parse(cls, spec: str | Compression | None) -> Compression | None:
        """:func:`parse_spec` for a text spec; a Compression or None comes back as it is
        (for callers that hold either, such as a fixture's options)."""
        if spec is None or isinstance(spec, Compression):
            return spec
        return parse_spec(spec)


def parse_spec(spec: str) -> Compression | None:
    """Read a CLI/config spec: "none" (or "raw"), "default", or a compressing codec's
    name with an optional zstd level, such as "zstd:3" or "chunked-shuffle-zstd"."""
    if not isinstance(spec, str):
        raise ArgumentTypeError(
            "compression must be a str, a Compression or None",
            field="compression",
            found=type(spec).__name__,
        )
    text = spec.strip().lower()
    if text in ("none", "raw"):
        return None
    if text == "default":
        return DEFAULT_COMPRESSION
    match = _SPEC_RE.fullmatch(text)
    codec = None if match is None else registry.find_name(match.group(1))
    if match is None or codec is None or not codec.compresses:
        names = [f'"{c.name}[:LEVEL]"' for c in registry.compressing()]
        raise CodecConfigError(
            "unknown compression spec",
            field="compression",
            expected=_names(['"none"', '"default"', *names]),
            found=repr(spec),
        )
    level = 1 if match.group(2) is None else int(match.group(2))
    return Compression(codec.codec_id, level=level, threads=codec.spec_threads)


#: 1 MiB chunks, each byte-shuffled and compressed at zstd level 1, on every usable core:
#: smaller and faster than plain zstd-3 and than blosc2 (shuffle + zstd) on fp16 and
#: bf16 KV data (docs/compression.md).
DEFAULT_COMPRESSION = Compression(
    CODEC_CHUNKED,
    level=1,
    threads=-1,
    min_size=4096,
    chunk_size=1 << 20,
)
