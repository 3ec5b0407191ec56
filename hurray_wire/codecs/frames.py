"""One zstd frame of untrusted bytes: it declares the raw size (or none), ends where its
stored bytes end and decodes to exactly that size (docs/wire-format.md section 6), checked
before zstd allocates anything. Shared by the zstd codecs, whose name each error carries."""

from __future__ import annotations

from typing import Any, NamedTuple

import zstandard

from hurray_wire.buffers import U8Array
from hurray_wire.codecs import byteshuffle
from hurray_wire.codecs.base import Progress, bytes_view, local, scratch
from hurray_wire.errors import DecompressionError, LimitExceededError

__all__ = ["FrameHeader", "decode_frame", "frame_header"]

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# zstd's own layout (RFC 8878 § 3.1.1), not hurray-wire's: the 3-byte block header
# (last_block bit, 2-bit type, 21-bit size) and the optional 4-byte content checksum.
_BLOCK_HEAD = 3
_CONTENT_CHECKSUM = 4
# zstd allocates a window only when a frame does not declare its content size; such a
# frame may ask for at most max(raw size, this) bytes of window.
_UNKNOWN_SIZE_WINDOW_LIMIT = 8 << 20


def _decompressor() -> Any:
    dctx = getattr(local, "decompressor", None)
    if dctx is None:
        dctx = local.decompressor = zstandard.ZstdDecompressor()
    return dctx


class FrameHeader(NamedTuple):
    """What decoding needs from a checked zstd frame header (a tuple: built per chunk)."""

    size: int
    content_size: int  # zstandard.CONTENTSIZE_UNKNOWN when the frame does not say
    has_checksum: bool


def frame_header(src: U8Array, raw_size: int, codec_name: str) -> FrameHeader:
    """Check the frame header of ``src`` against ``raw_size`` before zstd allocates: another
    content size, a dictionary or a window beyond the output is refused."""
    n = src.size
    if n < len(_ZSTD_MAGIC) or src[: len(_ZSTD_MAGIC)].tobytes() != _ZSTD_MAGIC:
        raise DecompressionError(
            f"{codec_name} section is not a zstd frame",
            field="stored",
            offset=0,
            expected=f"magic {_ZSTD_MAGIC.hex()}",
            found=src[: len(_ZSTD_MAGIC)].tobytes().hex() if n else "no bytes",
        )
    view = bytes_view(src)
    try:
        header_size = zstandard.frame_header_size(view)
        params = zstandard.get_frame_parameters(view)
    except zstandard.ZstdError as exc:
        raise DecompressionError(
            f"{codec_name} section has a bad zstd frame header: {exc}",
            field="stored",
            offset=0,
            found=f"{n} stored bytes",
        ) from None
    if header_size > n:
        raise DecompressionError(
            f"{codec_name} section ends inside the zstd frame header",
            field="stored",
            expected=f">= {header_size} bytes",
            found=n,
        )
    if params.dict_id:
        raise DecompressionError(
            f"{codec_name} frame needs a zstd dictionary, which blobs never use",
            field="stored",
            found=f"dictionary id {params.dict_id}",
        )
    content_size = params.content_size
    if content_size == zstandard.CONTENTSIZE_UNKNOWN:
        if params.window_size > max(raw_size, _UNKNOWN_SIZE_WINDOW_LIMIT):
            raise LimitExceededError(
                f"{codec_name} frame of unknown content size asks for a zstd window "
                "larger than its raw size",
                field="stored",
                expected=f"<= {max(raw_size, _UNKNOWN_SIZE_WINDOW_LIMIT)} bytes",
                found=params.window_size,
            )
    elif content_size != raw_size:
        raise DecompressionError(
            f"{codec_name} frame declares a content size other than the section's raw size",
            field="stored",
            expected=raw_size,
            found=content_size,
        )
    return FrameHeader(header_size, content_size, params.has_checksum)


# The Python walk over block headers costs ~270 ns a block: it walks at most this many
# (128 MiB of full 128 KiB blocks, far beyond one chunk of a chunked section). A frame with
# more blocks (a flood of empty ones is legal zstd) is decoded by libzstd incrementally
# instead, which finds the frame's end itself at ~10 ns a block.
_WALK_LIMIT = 1024
# Input fed to libzstd per call in the incremental decode. A frame that declares its
# content size cannot make libzstd write past it; one that does not could expand 32768x
# (4-byte RLE blocks of 128 KiB), so it gets small steps: at most 32 MiB of output per step
# before the size check refuses it.
_STEP_KNOWN_SIZE = 4 << 20
_STEP_UNKNOWN_SIZE = 1 << 10
#: The output reported at a time when a caller checks it as it comes (in L2 with its source).
_PROGRESS_STEP = 1 << 20


def _walk_blocks(
    src: U8Array, header: FrameHeader, codec_name: str, limit: int = _WALK_LIMIT
) -> bool:
    """Check that the blocks make exactly one frame ending where ``src`` ends, naming a cut
    block (python-zstandard cannot find a frame's end). False, nothing proven, past
    ``limit`` blocks: ``_decode_incrementally`` checks those at C speed."""
    view = bytes_view(src)
    n = src.size
    pos = header.size
    for _ in range(limit):
        if pos + _BLOCK_HEAD > n:
            raise DecompressionError(
                f"{codec_name} section ends inside a zstd block header",
                field="stored",
                offset=pos,
                expected=f">= {pos + _BLOCK_HEAD} stored bytes",
                found=n,
            )
        block = int.from_bytes(view[pos : pos + _BLOCK_HEAD], "little")
        block_type = (block >> 1) & 3
        if block_type == 3:
            raise DecompressionError(
                f"{codec_name} frame has a reserved zstd block type", field="stored", offset=pos
            )
        body = 1 if block_type == 1 else block >> 3  # an RLE block stores one byte
        if pos + _BLOCK_HEAD + body > n:
            raise DecompressionError(
                f"{codec_name} section ends inside a zstd block",
                field="stored",
                offset=pos,
                expected=f">= {pos + _BLOCK_HEAD + body} stored bytes",
                found=n,
            )
        pos += _BLOCK_HEAD + body
        if block & 1:
            break
    else:
        return False
    end = pos + _CONTENT_CHECKSUM if header.has_checksum else pos
    if end != n:
        raise DecompressionError(
            f"{codec_name} section "
            f"{'ends inside the checksum of' if end > n else 'has bytes after'} its zstd frame",
            field="stored",
            offset=min(end, n),
            expected=f"{end} stored bytes",
            found=n,
        )
    return True


def _decode_incrementally(
    src: U8Array, dst: U8Array, header: FrameHeader, codec_name: str, progress: Progress | None
) -> None:
    """Decode a frame of many blocks into ``dst``, libzstd finding its end: exactly
    ``dst.size`` bytes from one frame ending where ``src`` ends, or an error; linear at C
    speed, each step's output bounded by ``dst``."""
    known = header.content_size != zstandard.CONTENTSIZE_UNKNOWN
    step = _STEP_KNOWN_SIZE if known else _STEP_UNKNOWN_SIZE
    view = bytes_view(src)
    out = bytes_view(dst)
    n = src.size
    dobj = zstandard.ZstdDecompressor().decompressobj()
    got = 0
    fed = 0
    try:
        while fed < n and not dobj.eof:
            chunk = dobj.decompress(view[fed : fed + step])
            fed = min(n, fed + step)
            if got + len(chunk) > dst.size:
                _check_decoded_size(dst.size + 1, dst.size, codec_name)
            out[got : got + len(chunk)] = chunk
            got += len(chunk)
            if progress is not None and chunk:
                progress(got)
    except zstandard.ZstdError as exc:
        raise _corrupt(src, scratch(dst.size), codec_name, exc) from None
    if not dobj.eof:
        raise DecompressionError(
            f"{codec_name} section ends inside its zstd frame",
            field="stored",
            offset=n,
            found=f"{n} stored bytes",
        )
    trailing = len(dobj.unused_data) + (n - fed)
    if trailing:
        raise DecompressionError(
            f"{codec_name} section has bytes after its zstd frame",
            field="stored",
            offset=n - trailing,
            expected=f"{n - trailing} stored bytes",
            found=n,
        )
    _check_decoded_size(got, dst.size, codec_name)


def _read_frame(
    dctx: Any, src: U8Array, dst: U8Array, progress: Progress | None = None
) -> tuple[int, bytes]:
    """Stream one frame into ``dst``: (bytes written, whatever the frame had beyond);
    with ``progress``, in steps of ``_PROGRESS_STEP`` bytes, each reported."""
    got = 0
    step = dst.size if progress is None else _PROGRESS_STEP
    with dctx.stream_reader(bytes_view(src), read_across_frames=False) as reader:
        view = bytes_view(dst)
        while got < dst.size:
            k = reader.readinto(view[got : got + step])
            if not k:
                break
            got += k
            if progress is not None:
                progress(got)
        extra = reader.read(1)
    return got, extra


def decode_frame(
    src: U8Array, dst: U8Array, width: int, codec_name: str, header: FrameHeader,
    progress: Progress | None = None,
) -> None:  # fmt: skip
    """Decompress one frame, its header checked, into ``dst`` (unshuffled when ``width`` >
    1): exactly ``dst.size`` bytes or a DecompressionError. A sized shuffled frame is one
    zstd call (the block walk only names a refusal); others are walked, then streamed."""
    # (not for an empty frame: python-zstandard returns b"" for a declared size of 0 without
    # reading the blocks, so bytes after the frame would pass)
    if width > 1 and header.content_size == dst.size > 0:
        try:
            plain = _decompressor().decompress(bytes_view(src), allow_extra_data=False)
        except zstandard.ZstdError as exc:
            _walk_blocks(src, header, codec_name)
            raise _corrupt(src, scratch(dst.size), codec_name, exc) from None
        _check_decoded_size(len(plain), dst.size, codec_name)
        byteshuffle.unshuffle_into(plain, width, dst)
        if progress is not None:  # the byte planes end together: the whole output at once
            progress(dst.size)
        return
    target, streamed = (dst, progress) if width == 1 else (scratch(dst.size), None)
    if not _walk_blocks(src, header, codec_name):  # more blocks than the walk takes
        _decode_incrementally(src, target, header, codec_name, streamed)
    else:
        try:
            got, extra = _read_frame(_decompressor(), src, target, streamed)
        except zstandard.ZstdError as exc:
            raise _corrupt(src, target, codec_name, exc) from None
        _check_decoded_size(got if not extra else dst.size + 1, dst.size, codec_name)
    if width > 1:
        byteshuffle.unshuffle_into(target, width, dst)
        if progress is not None:
            progress(dst.size)


def _corrupt(
    src: U8Array, target: U8Array, codec_name: str, exc: zstandard.ZstdError
) -> DecompressionError:
    return DecompressionError(
        f"{codec_name} section is corrupt: {fresh_reason(src, target) or exc}",
        field="stored",
        found=f"{src.size} stored bytes for {target.size} raw bytes",
    )


def _check_decoded_size(got: int, raw_size: int, codec_name: str) -> None:
    if got != raw_size:
        raise DecompressionError(
            f"{codec_name} section decompresses to "
            f"{'fewer' if got < raw_size else 'more'} bytes than its raw size",
            field="stored",
            expected=raw_size,
            found=got if got < raw_size else f"more than {raw_size}",
        )


def fresh_reason(src: U8Array, dst: U8Array) -> str | None:
    """libzstd's reason for refusing ``src`` from a new context: a reused one words the
    same fault by what it decoded before; this gives one answer on every thread."""
    try:
        _read_frame(zstandard.ZstdDecompressor(), src, dst)
    except zstandard.ZstdError as exc:
        return str(exc)
    return None
