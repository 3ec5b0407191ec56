"""Decode a blob with its page pool landed in the caller's memory (an engine's KV pages).

An engine that loads a layer copies its pool into memory it owns. ``decode`` followed by
that copy reads the pool twice (the checksum pass, then the copy); ``decode_into`` copies
the pool into the engine's array and hashes each chunk right after copying it, while it is
still in cache, so verification costs no second pass over memory (docs/performance.md,
"Whole caches on disk"). Every other check is the pipeline's (``decoder.run``), and they
all pass before the first byte lands: the destination's dtype and page shape, overlap with
the input, framing, header, padding, the other sections' checksums, page digests, index
invariants, metadata, fingerprint and the route's own checks (``accept``). The one check
made while the bytes move is the pool's own section checksum (docs/integrity.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from hurray_wire.blob.copying import copy_and_hash
from hurray_wire.blob.decoder import (
    Accept,
    DecodeOptions,
    checksum_mismatch,
    decode_options,
    decompress_pool,
    plan_of,
    run,
    stored_section_checksum,
)
from hurray_wire.blob.limits import DecodeLimits
from hurray_wire.buffers import byte_view
from hurray_wire.codecs import CODEC_RAW
from hurray_wire.errors import ArgumentTypeError
from hurray_wire.integrity import EngineFingerprint, PageStore
from hurray_wire.integrity.pool_store import engine_array
from hurray_wire.model.descriptor import TensorDescriptor
from hurray_wire.tensor import BlockPagedTensor, pool_form

__all__ = ["check_landing", "decode_into", "land_into"]


def check_landing(
    descriptor: TensorDescriptor, array: npt.NDArray[Any], *, pages: int | None = None,
    field: str = "page_pool",
) -> None:  # fmt: skip
    """``array`` can hold the blob's pool as the engine reads it: the pool's dtype and
    shape (``pages``: an engine pool of that many pages of the blob's page shape), or
    untyped bytes (uint8) of the same byte size. A float16 array for a bfloat16 pool, or a
    float32 array of half the length, is refused: the engine would read other values."""
    shape, dtype = pool_form(descriptor)
    if pages is not None:
        shape = (pages, *shape[1:])
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if array.dtype == np.uint8 and dtype != np.uint8:
        ok = array.nbytes == nbytes and (pages is None or array.shape[0] == pages)
    else:
        ok = array.dtype == dtype and tuple(array.shape) == tuple(shape)
    if not ok:
        raise ArgumentTypeError(
            "the engine array does not have the blob's page pool type and shape",
            field=field,
            found=f"{array.dtype} {list(array.shape)} ({array.nbytes} bytes)",
            expected=f"{dtype} {list(shape)} ({nbytes} bytes), or uint8 of its bytes",
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
    with the blob's dtype and shape when it is raw bytes).

    ``page_pool``: a writable C-contiguous NumPy array with the pool's dtype and shape, or
    uint8 of its byte size, not overlapping ``data``. Everything is checked before the
    first byte is written (on a refusal ``page_pool`` is untouched), except the pool's own
    section checksum, hashed while the pool is copied (one pass over memory): on that
    mismatch ``page_pool`` holds the refused bytes. A compressed pool is decompressed
    straight into it (a packed one is decompressed first, its padding bits checked, then
    copied); blobs with page digests or refs are verified page by page before the copy.
    """
    opts = decode_options(verify, limits, threads, page_store, expect_fingerprint)
    return land_into(byte_view(data), page_pool, opts)


def land_into(
    view: memoryview, page_pool: Any, opts: DecodeOptions, accept: Accept | None = None
) -> BlockPagedTensor:
    """The pipeline with the pool landed in ``page_pool`` (decode_into, StreamFile)."""
    out = engine_array(page_pool, "page_pool").reshape(-1).view(np.uint8)
    plan = plan_of(view, opts)
    check_landing(plan.descriptor, page_pool)
    whole = np.frombuffer(view, np.uint8)
    if out.size and whole.size and np.may_share_memory(out, whole):
        raise ArgumentTypeError(
            "page_pool overlaps the blob being decoded",
            field="page_pool",
            found="memory shared with data",
        )
    pool_entry = plan.buffers[0]
    defer = (
        opts.verify
        and plan.verify_sections
        and pool_entry.codec == CODEC_RAW
        and plan.page_digests is None
        and plan.page_refs is None
    )
    late = (
        pool_entry.codec != CODEC_RAW
        and plan.page_digests is None
        and plan.page_refs is None
        and not plan.descriptor.element_type.is_packed  # its padding bits are checked first
    )
    tensor = run(view, opts, accept=accept, plan=plan, defer_pool=defer,
                 late_pool=out if late else None)[0]  # fmt: skip
    if late:  # the one pass: decompressed into the destination
        decompress_pool(view, pool_entry, opts.threads, out)
    elif defer:  # the one pass: copied and hashed chunk by chunk
        hasher = xxhash.xxh3_64()
        copy_and_hash(out, whole[pool_entry.offset : pool_entry.offset + pool_entry.stored_size],
                      hasher)  # fmt: skip
        stored = stored_section_checksum(view, pool_entry)
        if hasher.intdigest() != stored:
            raise checksum_mismatch(pool_entry, int(hasher.intdigest()), stored)
    else:
        copy_and_hash(out, tensor.page_pool.reshape(-1).view(np.uint8), None)
    pool = tensor.page_pool
    if page_pool.dtype == pool.dtype and page_pool.shape == pool.shape:
        tensor.page_pool = page_pool
    else:
        tensor.page_pool = out.view(pool.dtype).reshape(pool.shape)
    return tensor
