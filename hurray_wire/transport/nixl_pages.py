"""Landing a blob's pages at the engine's own page ids (``NixlReceiver.expect(page_ids=)``).

An engine receiving a request's KV cache has allocated blocks for it in its pool: block
ids, usually not contiguous. The blob's pool pages are read into the receiver's staging
ring, checked there, then scattered to those pages (with ``one_pass=True``: read straight
into them, one NIXL descriptor per run of consecutive ids, and checked in blob order where
they landed); the tensor handed back is over the engine's whole pool with its block table
in engine page ids: what the engine's attention kernel indexes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from hurray_wire.blob.landing import check_landing
from hurray_wire.errors import ArgumentTypeError, TransportError
from hurray_wire.integrity.pool_store import page_id_array
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.transport.records import Segment

__all__ = [
    "PageLanding",
    "check_target",
    "engine_tensor",
    "gather_pages",
    "land_pool",
    "page_landing",
    "page_segments",
]

_U8 = npt.NDArray[np.uint8]
_IDS = npt.NDArray[np.int64]


@dataclass(frozen=True)
class PageLanding:
    """Where an expected blob's pool goes: an engine array, whole or at ``page_ids``."""

    flat: _U8  # the engine's array as flat bytes
    page_ids: _IDS | None = None  # engine page id of each blob page; None: the whole array
    page_bytes: int = 0  # bytes of one engine page (with page_ids)
    array: npt.NDArray[Any] | None = None  # the engine's array as given (its dtype, shape)
    one_pass: bool = False  # READ straight into it (else staged, copied in once checked)

    @property
    def nbytes(self) -> int:
        """Bytes the blob's pool fills: the array, or its pages at ``page_ids``."""
        return self.flat.nbytes if self.page_ids is None else self.page_ids.size * self.page_bytes

    @property
    def engine_pages(self) -> int:
        return self.flat.nbytes // self.page_bytes if self.page_bytes else 0

    def spans(self) -> list[tuple[int, int]]:
        """The [start, end) addresses this landing writes."""
        base = int(self.flat.ctypes.data)
        if self.page_ids is None:
            return [(base, base + self.flat.nbytes)]
        size = self.page_bytes
        ids = self.page_ids
        return [
            (base + int(ids[first]) * size, base + (int(ids[first]) + count) * size)
            for first, count in self.runs()
        ]

    def overlaps(self, other: PageLanding) -> bool:
        return any(a < d and c < b for a, b in self.spans() for c, d in other.spans())

    def runs(self) -> list[tuple[int, int]]:
        """(first blob page, page count) of each run of consecutive engine ids."""
        ids = self.page_ids
        if ids is None or not ids.size:
            return []
        breaks = (np.flatnonzero(np.diff(ids) != 1) + 1).tolist()
        starts = [0, *breaks]
        ends = [*breaks, int(ids.size)]
        return [(s, e - s) for s, e in zip(starts, ends, strict=True)]


def page_landing(
    page_pool: npt.NDArray[Any], flat: _U8, page_ids: object, one_pass: bool = False
) -> PageLanding:
    """Check ``page_ids`` against the engine's pool array ``[pages, ...]`` (distinct ids
    in range, an integer 1-D array or sequence) and describe the landing."""
    if page_pool.ndim < 2 or page_pool.shape[0] == 0:
        raise ArgumentTypeError(
            "with page_ids, page_pool is the engine's pool: [num_pages, ...] with pages",
            field="page_pool",
            found=f"shape {tuple(page_pool.shape)}",
        )
    engine_pages = int(page_pool.shape[0])
    ids = page_id_array(page_ids, engine_pages, "page_ids", distinct=True)
    return PageLanding(flat, ids, flat.nbytes // engine_pages, page_pool, one_pass)


def page_segments(landing: PageLanding, pool_offset: int) -> list[Segment]:
    """The segments of the blob's pool range [pool_offset, +pages) on the engine's pages."""
    base = int(landing.flat.ctypes.data)
    size = landing.page_bytes
    assert landing.page_ids is not None
    ids = landing.page_ids
    return [
        Segment(pool_offset + first * size, count * size, base + int(ids[first]) * size)
        for first, count in landing.runs()
    ]


def gather_pages(landing: PageLanding) -> _U8:
    """The landed pages in blob order, as the blob's pool bytes (one copy: the pipeline
    checks them as ``decode`` checks a pool)."""
    assert landing.page_ids is not None
    rows = landing.flat.reshape(landing.engine_pages, landing.page_bytes)
    return rows[landing.page_ids].reshape(-1)


def check_target(
    tensor: BlockPagedTensor, landing: PageLanding, layer: int | None, role: str | None
) -> None:
    """The engine array has the blob's pool dtype and page shape (``check_landing``), and
    a quantized blob is not landed at page ids; raised before anything is copied there."""
    array = landing.array if landing.array is not None else landing.flat
    pages = None if landing.page_ids is None else int(array.shape[0])
    check_landing(tensor.descriptor, array, pages=pages)  # named layer/role by the receiver
    if landing.page_ids is not None and tensor.quantization is not None:
        raise TransportError(
            "page_ids take an unquantized pool (per-page scales would need an engine-sized "
            "scale array); expect() this blob without page_ids",
            layer=layer,
            role=role,
        )


def land_pool(
    landing: PageLanding, pool: npt.NDArray[Any], layer: int | None, role: str | None
) -> None:
    """Copy a checked pool into the engine's memory: the whole array, or its pages to
    their page ids (if it is ``page_ids`` pages of the engine's page size)."""
    flat = pool.reshape(-1).view(np.uint8)
    if landing.page_ids is None:
        np.copyto(landing.flat, flat)
        return
    count = landing.page_ids.size
    if pool.shape[0] != count or pool.nbytes != count * landing.page_bytes:
        raise TransportError("page pool differs from page_ids x the engine's page size",
                             layer=layer, role=role, expected=count * landing.page_bytes,
                             found=pool.nbytes)  # fmt: skip
    rows = landing.flat.reshape(landing.engine_pages, landing.page_bytes)
    rows[landing.page_ids] = flat.reshape(count, -1)


def engine_tensor(
    tensor: BlockPagedTensor, landing: PageLanding, layer: int | None, role: str | None
) -> BlockPagedTensor:
    """``tensor`` (decoded from the blob) over the engine's memory: its page pool the
    engine's array viewed with the blob's dtype and shape; with page ids, the engine's
    whole pool, the block table in engine page ids, everything else as decoded, validated
    as any new tensor is."""
    pool = tensor.page_pool
    if landing.page_ids is None:
        tensor.page_pool = landing.flat.view(pool.dtype).reshape(pool.shape)
        return tensor
    if landing.page_ids.size != pool.shape[0]:
        raise TransportError("page_ids do not match the blob's page count", layer=layer,
                             role=role, expected=int(pool.shape[0]),
                             found=int(landing.page_ids.size))  # fmt: skip
    engine = landing.flat.view(pool.dtype).reshape(landing.engine_pages, *pool.shape[1:])
    table = landing.page_ids[np.asarray(tensor.block_table, np.int64)]
    return BlockPagedTensor.from_arrays(
        engine,
        table,
        tensor.seq_ptr,
        seq_lens=tensor.seq_lens,
        total_tokens=tensor.shape[0],
        kv_role=tensor.kv_role,
        layer_index=tensor.layer_index,
        element_type=tensor.element_type,
        metadata=tensor.metadata,
        alignment=tensor.descriptor.buffers[0].alignment,
    )
