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
from hurray_wire.blob.decoder import (
    checksum_mismatch,
    decode,
    header_plan,
    stored_section_checksum,
)
from hurray_wire.blob.envelope import I_TOTAL_LENGTH, whole_blob_header
from hurray_wire.blob.limits import DEFAULT_LIMITS, DecodeLimits, check_limits_argument
from hurray_wire.blob.sections import Entry
from hurray_wire.buffers import U8Array, byte_view
from hurray_wire.codecs import CODEC_RAW
from hurray_wire.errors import ArgumentTypeError
from hurray_wire.integrity import EngineFingerprint, PageStore, check_integrity_arguments
from hurray_wire.tensor import BlockPagedTensor

__all__ = ["decode_into"]


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


def _check(view: memoryview, e: Entry, computed: int) -> None:
    """Compare a section's checksum with the one its table entry stores."""
    stored = stored_section_checksum(view, e)
    if computed != stored:
        raise checksum_mismatch(e, computed, stored)


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
    check_integrity_arguments(page_store, expect_fingerprint)
    view = byte_view(data)
    head = whole_blob_header(view)
    checked = DEFAULT_LIMITS if limits is None else check_limits_argument(limits)
    plan = header_plan(view, head[I_TOTAL_LENGTH], checked, memoise=True, head=head)
    if plan.page_digests is not None or plan.page_refs is not None:
        tensor = decode(view, verify=verify, limits=limits, threads=threads,
                        page_store=page_store,
                        expect_fingerprint=expect_fingerprint)  # fmt: skip
        _fits(tensor, out)[...] = tensor.page_pool.reshape(-1).view(np.uint8)
        return _retarget(tensor, page_pool, out)
    # Every check but the section checksums (the plan is the memoised one just taken).
    tensor = decode(view, verify=False, limits=limits, threads=threads,
                    expect_fingerprint=expect_fingerprint)  # fmt: skip
    _fits(tensor, out)
    pool_entry = plan.buffers[0]
    hashing = verify and plan.verify_sections
    whole = np.frombuffer(view, np.uint8, plan.total)
    for e in plan.entries:
        stored = whole[e.offset : e.offset + e.stored_size]
        if e is pool_entry and e.codec == CODEC_RAW:
            hasher = xxhash.xxh3_64() if hashing else None
            copy_and_hash(out, stored, hasher)
            if hasher is not None:
                _check(view, e, int(hasher.intdigest()))
        elif hashing:
            _check(view, e, xxhash.xxh3_64_intdigest(stored.data))
    if pool_entry.codec != CODEC_RAW:  # decompressed by decode, its stored bytes checked
        out[...] = tensor.page_pool.reshape(-1).view(np.uint8)
    return _retarget(tensor, page_pool, out)


def _fits(tensor: BlockPagedTensor, out: U8Array) -> U8Array:
    """``out`` if it has the byte size of the tensor's pool, else a typed error."""
    pool = tensor.page_pool
    if pool.nbytes != out.nbytes:
        raise ArgumentTypeError(
            "page_pool's size is not the blob's page pool size",
            field="page_pool",
            found=f"{out.nbytes} bytes",
            expected=f"{pool.nbytes} bytes ({pool.dtype} {tuple(pool.shape)})",
        )
    return out


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
