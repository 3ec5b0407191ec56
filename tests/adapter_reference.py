"""Plain loop-based references for the adapter and transform tests: slow, obvious, and
written from the engines' and the spec's descriptions, not from the library's code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]


@dataclass
class Batch:
    """A random engine-style batch: ragged per-sequence page lists with shared prefixes."""

    pool: Array  # [num_pages, page_size, H, D]
    pages: list[list[int]]  # physical pages of each sequence, in order
    lens: list[int]

    @property
    def page_size(self) -> int:
        return int(self.pool.shape[1])

    def block_table(self) -> list[int]:
        return [p for row in self.pages for p in row]

    def seq_ptr(self) -> list[int]:
        out = [0]
        for row in self.pages:
            out.append(out[-1] + len(row))
        return out

    def padded(self, width: int | None = None, pad: int = 0) -> Array:
        width = max((len(r) for r in self.pages), default=0) if width is None else width
        table = np.full((len(self.pages), width), pad, np.int32)
        for s, row in enumerate(self.pages):
            for j, page in enumerate(row):
                table[s, j] = page
        return table


def random_values(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> Array:
    """Random values of ``dtype``: every bit pattern for ints, finite normals for floats."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype)
    if dtype.name in ("int4", "uint4", "int2", "uint2"):  # ml_dtypes' sub-byte integers
        small = ml_dtypes.iinfo(dtype)
        values = rng.integers(int(small.min), int(small.max), size=shape, endpoint=True)
        return values.astype(dtype)
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def random_batch(
    rng: np.random.Generator,
    *,
    num_pages: int = 24,
    page_size: int = 16,
    heads: int = 4,
    head_dim: int = 64,
    dtype: Any = np.float16,
    num_seqs: int = 4,
    share: bool = True,
    allow_empty: bool = True,
) -> Batch:
    """Sequences over distinct pages, some sharing a prefix of whole pages, partial last
    pages, and (optionally) empty sequences."""
    pool = random_values(rng, (num_pages, page_size, heads, head_dim), dtype)
    free = list(rng.permutation(num_pages))
    pages: list[list[int]] = []
    lens: list[int] = []
    for _s in range(num_seqs):
        prefix: list[int] = []
        if share and pages and pages[0] and rng.random() < 0.6:
            full = len(pages[0]) - (1 if lens[0] % page_size else 0)
            prefix = pages[0][: int(rng.integers(0, full + 1))]
        extra = int(rng.integers(0 if allow_empty else 1, 4))
        extra = min(extra, len(free))
        row = prefix + [int(free.pop()) for _ in range(extra)]
        if not row:
            pages.append([])
            lens.append(0)
            continue
        lens.append((len(row) - 1) * page_size + int(rng.integers(1, page_size + 1)))
        if len(row) == len(prefix) and prefix:  # ends on a shared page: keep it full
            lens[-1] = len(row) * page_size
        pages.append(row)
    return Batch(pool, pages, lens)


def ref_sequences(pool: Array, pages: list[list[int]], lens: list[int]) -> list[Array]:
    """Token by token through the spec's element lookup (block-paged.md § 5)."""
    page_size = pool.shape[1]
    out = []
    for row, length in zip(pages, lens, strict=True):
        tokens = [pool[row[t // page_size], t % page_size] for t in range(length)]
        out.append(np.array(tokens, pool.dtype).reshape(length, *pool.shape[2:]))
    return out


def ref_tensor_sequences(tensor: Any) -> list[Array]:
    """``ref_sequences`` of a BlockPagedTensor's own buffers."""
    bt = [int(x) for x in tensor.block_table]
    sp = [int(x) for x in tensor.seq_ptr]
    pages = [bt[sp[s] : sp[s + 1]] for s in range(len(sp) - 1)]
    if tensor.seq_lens is None:
        lens = [len(r) * tensor.layout.page_size for r in pages]
    else:
        lens = [int(x) for x in tensor.seq_lens]
    return ref_sequences(tensor.unpacked_page_pool(), pages, lens)


def ref_sglang_sequences(buffer: Array, req_to_token: Array, lens: list[int]) -> list[Array]:
    """Token t of request s lives in slot req_to_token[s, t]."""
    return [
        np.array([buffer[int(req_to_token[s, t])] for t in range(n)]).reshape(n, *buffer.shape[1:])
        for s, n in enumerate(lens)
    ]


def ref_dequantize(tensor: Any) -> Array:
    """Element by element (per page slot) by the spec's formulas, in float32."""
    pool = tensor.unpacked_page_pool()
    quant = tensor.quantization
    out = np.zeros(pool.shape, np.float32)
    pages, size, heads, dims = pool.shape
    for p in range(pages):
        for i in range(size):
            slot = p * size + i
            for h in range(heads):
                q = pool[p, i, h].astype(np.int64)
                name = None if quant is None else quant.name
                if name is None:
                    scale = tensor.kv_scale
                    v = pool[p, i, h].astype(np.float32)
                    out[p, i, h] = v if scale is None else v * np.float32(scale)
                elif name == "per_tensor_affine":
                    out[p, i, h] = (q - quant.zero_point).astype(np.float32) * np.float32(
                        quant.scale
                    )
                elif name == "per_channel_affine":
                    for d in range(dims):
                        c = h if quant.axis == 1 else d
                        zp = 0 if tensor.zero_points is None else int(tensor.zero_points[c])
                        out[p, i, h, d] = np.float32(q[d] - zp) * np.float32(tensor.scales[c])
                else:
                    zp = 0 if tensor.zero_points is None else int(tensor.zero_points[slot])
                    scale = np.float32(tensor.scales[slot])
                    out[p, i, h] = (q - zp).astype(np.float32) * scale
    return out
