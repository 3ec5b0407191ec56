"""Decode a blob with its page pool landed in the caller's memory (an engine's KV pages).

An engine that loads a layer copies its pool into memory it owns. ``decode`` followed by
that copy reads the pool twice (the checksum pass, then the copy); ``decode_into`` copies
the pool into the engine's array and hashes each chunk right after copying it, while it is
still in cache, so verification costs no second pass over memory (docs/performance.md,
"Whole caches on disk"). Every other check is ``decode``'s own: the blob is decoded with
``verify=False`` first (envelope, descriptor, section table, padding, index invariants,
metadata, fingerprint), then every section checksum is compared where its bytes are.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from hurray_wire.blob.copying import copy_and_hash
from hurray_wire.blob.decoder import decode
from hurray_wire.blob.envelope import (
    ENTRY,
    I_CHECKSUM_TYPE,
    I_SECTION_COUNT,
    entry_at,
    fixed_header,
)
from hurray_wire.blob.limits import DecodeLimits
from hurray_wire.buffers import U8Array, byte_view
from hurray_wire.codecs import CODEC_RAW
from hurray_wire.errors import ArgumentTypeError, ChecksumError
from hurray_wire.integrity import EngineFingerprint, PageStore
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.wire import blob as w

__all__ = ["decode_into"]

_FIELD = {name: k for k, name in enumerate(ENTRY.names)}
_PAGE_KINDS = (w.KIND_PAGE_DIGESTS, w.KIND_PAGE_REFS)


def _landing(page_pool: object) -> U8Array:
    """The caller's array as flat writable bytes (no copy), or a typed error."""
    if not isinstance(page_pool, np.ndarray):
        raise ArgumentTypeError(
            "page_pool must be a numpy array (the engine's memory for this pool)",
            field="page_pool",
            found=type(page_pool).__name__,
        )
    if page_pool.dtype.hasobject or not page_pool.flags.c_contiguous:
        raise ArgumentTypeError(
            "page_pool must be a C-contiguous array of plain data",
            field="page_pool",
            found=f"dtype {page_pool.dtype}, contiguous {page_pool.flags.c_contiguous}",
        )
    if not page_pool.flags.writeable:
        raise ArgumentTypeError(
            "page_pool must be writable", field="page_pool", found="a read-only array"
        )
    return page_pool.reshape(-1).view(np.uint8)


def _sections(view: memoryview) -> tuple[list[tuple[Any, ...]], bool]:
    """The section entries of a blob ``decode`` has already accepted, and whether its
    sections carry checksums."""
    head = fixed_header(view)
    count = head[I_SECTION_COUNT]
    entries = [ENTRY.struct.unpack_from(view, entry_at(k)) for k in range(count)]
    return entries, head[I_CHECKSUM_TYPE] == w.CHECKSUM_XXH3_64


def _where(entry: tuple[Any, ...]) -> str:
    kind = entry[_FIELD["kind"]]
    return f"{w.SECTION_KINDS.get(kind, f'kind 0x{kind:02X}')}[{entry[_FIELD['index']]}]"


def _check(entry: tuple[Any, ...], computed: int) -> None:
    stored = entry[_FIELD["checksum"]]
    if computed != stored:
        raise ChecksumError(
            "section checksum mismatch",
            section=_where(entry),
            offset=entry[_FIELD["offset"]],
            expected=f"0x{computed:016x}",
            found=f"0x{stored:016x}",
        )


def decode_into(
    data: Any,
    page_pool: npt.NDArray[Any],
    *,
    verify: bool = True,
    limits: DecodeLimits | None = None,
    threads: int = -1,
    page_store: PageStore | None = None,
    expect_fingerprint: EngineFingerprint | None = None,
) -> BlockPagedTensor:
    """Validate the blob at the start of ``data`` as :func:`decode` does, land its page
    pool in ``page_pool`` and return the tensor, whose ``page_pool`` is that array (viewed
    with the blob's dtype and shape when the caller's differ, e.g. raw bytes).

    ``page_pool``: a writable C-contiguous NumPy array of exactly the pool's byte size.
    A raw pool is copied and hashed in one pass (on two cores when two are idle); a
    compressed one is decompressed, then copied. On any error the blob is refused and
    ``page_pool``'s contents are unspecified (it is the destination: nothing else the
    caller passed is written). Blobs with page digests or page refs take ``decode``'s
    path (their pages are checked one by one), then the copy.
    """
    if type(verify) is not bool:
        raise ArgumentTypeError("verify must be True or False", field="verify", found=repr(verify))
    out = _landing(page_pool)
    view = byte_view(data)
    tensor = decode(view, verify=False, limits=limits, threads=threads, page_store=page_store,
                    expect_fingerprint=expect_fingerprint)  # fmt: skip
    pool = tensor.page_pool
    if pool.nbytes != out.nbytes:
        raise ArgumentTypeError(
            "page_pool's size is not the blob's page pool size",
            field="page_pool",
            found=f"{out.nbytes} bytes",
            expected=f"{pool.nbytes} bytes ({pool.dtype} {tuple(pool.shape)})",
        )
    entries, checked = _sections(view)
    if any(e[_FIELD["kind"]] in _PAGE_KINDS for e in entries):
        if verify and checked:  # the page-by-page checks are decode's own
            tensor = decode(view, verify=True, limits=limits, threads=threads,
                            page_store=page_store,
                            expect_fingerprint=expect_fingerprint)  # fmt: skip
            pool = tensor.page_pool
        out[...] = pool.reshape(-1).view(np.uint8)
        return _retarget(tensor, page_pool, out)
    whole = np.frombuffer(view, np.uint8)
    landed = False
    for e in entries:
        start = e[_FIELD["offset"]]
        stored = whole[start : start + e[_FIELD["stored_size"]]]
        is_pool = e[_FIELD["kind"]] == w.KIND_BUFFER and e[_FIELD["index"]] == 0
        if is_pool and e[_FIELD["codec"]] == CODEC_RAW:
            hasher = xxhash.xxh3_64() if verify and checked else None
            copy_and_hash(out, stored, hasher)
            landed = True
            if hasher is not None:
                _check(e, int(hasher.intdigest()))
        elif verify and checked:
            _check(e, xxhash.xxh3_64_intdigest(stored.data))
    if not landed:  # a compressed pool: decoded (and its stored bytes checked) above
        out[...] = pool.reshape(-1).view(np.uint8)
    return _retarget(tensor, page_pool, out)


def _retarget(
    tensor: BlockPagedTensor, page_pool: npt.NDArray[Any], out: U8Array
) -> BlockPagedTensor:
    """Point the tensor's page_pool at the caller's array (its own object when it already
    has the blob's dtype and shape)."""
    pool = tensor.page_pool
    if page_pool.dtype == pool.dtype and page_pool.shape == pool.shape:
        tensor.page_pool = page_pool
    else:
        tensor.page_pool = out.view(pool.dtype).reshape(pool.shape)
    return tensor
