"""The chunked codec's chunk table (docs/wire-format.md § 6): a header, then one frame
size per chunk, derived from ``wire/blob.py``'s structs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hurray_wire.wire import blob as wb
from hurray_wire.wire.fast import array_struct, item_dtype, item_struct

HEAD = wb.FAST_CHUNK_TABLE_HEADER  # chunk_size, chunk_count
_FRAME_SIZE = item_struct(wb.CHUNK_FRAME_SIZE)
FRAME_SIZES = item_dtype(wb.CHUNK_FRAME_SIZE)  # the frame sizes read as one array
SMALL_TABLE = 64  # up to this many sizes a struct beats NumPy's fixed costs


def table_size(count: int) -> int:
    """Bytes of a chunk table of ``count`` chunks."""
    return HEAD.size + _FRAME_SIZE.size * count


def pack_table(chunk_size: int, sizes: Sequence[int]) -> bytes:
    """The chunk table of frames of these stored sizes."""
    head = HEAD.pack(chunk_size, len(sizes))
    if len(sizes) <= SMALL_TABLE:
        return head + array_struct(wb.CHUNK_FRAME_SIZE, len(sizes)).pack(*sizes)
    return head + np.array(sizes, FRAME_SIZES).tobytes()


def unpack_sizes(view: memoryview, count: int) -> tuple[int, ...]:
    """The frame sizes of a short table (``count`` <= SMALL_TABLE) whose header starts ``view``."""
    return array_struct(wb.CHUNK_FRAME_SIZE, count).unpack_from(view, HEAD.size)
