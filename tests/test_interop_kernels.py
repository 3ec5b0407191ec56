"""The row kernels under the connector's reads and landings (``_interop.gather_many`` /
``gather_rows`` / ``scatter_rows``): every route (a row per call, chunks of rows, slices of
consecutive ids, a layer's K and V written as one view, element-strided rows put in
memory order in cache) equals NumPy's fancy indexing byte for byte, on a boundary table of
ids, each cache layout and element width (fp16, bf16 as ml_dtypes, fp8 as its uint8
storage)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest

from hurray_wire._interop import GATHER_CHUNK, ROW_CALL_MIN, gather_many, gather_rows, scatter_rows
from hurray_wire.adapters import _vllm_forms as forms

Array = npt.NDArray[Any]
Geometry = tuple[int, int, int]  # block size, heads, head dim
Maker = Callable[[int, Geometry, Any], tuple[Array, Callable[[Array], list[Array]]]]


def _layer(layout: str) -> Maker:
    """A cache of ``layout`` (random bits) and its K / V page views ``[N, bs, H, D]``
    of any memory shaped like it, as ``forms.page_views`` reads vLLM's logical
    ``[N, H, bs, 2D]`` view."""
    physical = forms.LAYOUTS[layout]

    def make(
        blocks: int, geometry: Geometry, dtype: Any
    ) -> tuple[Array, Callable[[Array], list[Array]]]:
        bs, heads, dim = geometry
        shape = (blocks, heads, bs, 2 * dim)
        memory = _bits([shape[a] for a in physical], dtype)
        logical = [physical.index(a) for a in range(4)]
        return memory, lambda m: forms.page_views(m.transpose(logical), mla=False)

    return make


def _cpu(
    blocks: int, geometry: Geometry, dtype: Any
) -> tuple[Array, Callable[[Array], list[Array]]]:
    bs, heads, dim = geometry
    memory = _bits([blocks, heads, bs, 2 * dim], dtype)
    return memory, lambda m: list(forms.cpu_role_views(m, "vec"))


def _mla(
    blocks: int, geometry: Geometry, dtype: Any
) -> tuple[Array, Callable[[Array], list[Array]]]:
    bs, _, dim = geometry
    memory = _bits([blocks, 1, bs, dim], dtype)
    return memory, lambda m: forms.page_views(m, mla=True)


#: Element types: fp16, bf16 and fp8 as the adapters see a cache (ml_dtypes), fp8's storage.
DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "fp8 uint8": np.uint8,
          "float8_e5m2": ml_dtypes.float8_e5m2}  # fmt: skip
#: (name, maker, geometry): rows below and above ROW_CALL_MIN, runs of contiguous
#: elements and element-strided rows (CPU_ATTN's keys), C-contiguous rows (MLA).
FORMS: list[tuple[str, Maker, Geometry]] = [
    ("LBNHC small rows", _layer("LBNHC"), (4, 2, 4)),
    ("LBHNC small rows", _layer("LBHNC"), (4, 2, 4)),
    ("LBNHC row calls", _layer("LBNHC"), (16, 4, 32)),
    ("LBHNC row calls", _layer("LBHNC"), (16, 4, 32)),
    ("CPU_ATTN vec slabs", _cpu, (32, 2, 32)),
    ("CPU_ATTN vec small slabs", _cpu, (32, 1, 32)),
    ("MLA contiguous rows", _mla, (32, 1, 64)),
]


def _ids(case: str, blocks: int, per_chunk: int) -> npt.NDArray[np.int64]:
    rng = np.random.default_rng(7)
    return {
        "empty": np.zeros(0, np.int64),
        "one page": np.array([blocks - 1], np.int64),
        "consecutive": np.arange(2, blocks - 1, dtype=np.int64),
        "non-consecutive": rng.permutation(blocks)[: blocks - 3].astype(np.int64),
        "partial chunk": rng.permutation(blocks)[: per_chunk + 1].astype(np.int64),
        "runs and jumps": np.array([5, 6, 7, 1, 9, 10, 0], np.int64),
        "reversed": np.arange(blocks - 1, 0, -1, dtype=np.int64),
    }[case]


CASES = ["empty", "one page", "consecutive", "non-consecutive", "partial chunk",
         "runs and jumps", "reversed"]  # fmt: skip


def _bits(shape: list[int], dtype: Any, seed: int = 0) -> Array:
    """Random bits of ``dtype`` (NaN patterns included: compared as bytes)."""
    width = np.dtype(dtype).itemsize
    raw = np.random.default_rng(seed).integers(0, 1 << (8 * width), shape, f"u{width}")
    return raw.astype(f"u{width}").view(dtype)


def _same(a: Array, b: Array) -> bool:
    """Equal byte for byte (NaNs of bf16 / fp16 included)."""
    return a.shape == b.shape and np.array_equal(
        np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8)
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(("name", "make", "geometry"), FORMS, ids=[f[0] for f in FORMS])
def test_gather_and_scatter_equal_fancy_indexing(
    case: str, name: str, make: Maker, geometry: Geometry, dtype: str
) -> None:
    """Gathered pages: new C-contiguous arrays equal to ``view[ids]``; scattered rows: the
    cache equal to fancy assignment's, every other element untouched."""
    bs, heads, dim = geometry
    element = DTYPES[dtype]
    role_nbytes = bs * heads * dim * np.dtype(element).itemsize
    roles = 1 if name.startswith("MLA") else 2
    per_chunk = max(1, GATHER_CHUNK // (roles * role_nbytes))
    blocks = max(per_chunk + 4, 12)
    memory, views_of = make(blocks, geometry, element)
    views = views_of(memory)
    ids = _ids(case, blocks, per_chunk)
    if dtype == "float16":
        assert (role_nbytes >= ROW_CALL_MIN) == ("small" not in name)

    taken = gather_many(views, ids)
    for view, pages in zip(views, taken, strict=True):
        assert pages.flags.c_contiguous and not np.may_share_memory(pages, memory)
        assert _same(pages, view[ids])
    assert _same(gather_rows(views[-1], ids), views[-1][ids])

    rows = [_bits(list(pages.shape), pages.dtype, seed=1 + k) for k, pages in enumerate(taken)]
    expected, target = memory.copy(), memory.copy()
    for view, source in zip(views_of(expected), rows, strict=True):
        view[ids] = source
    scatter_rows(views_of(target), ids, rows)
    assert _same(target, expected)
    assert (case == "empty") == _same(target, memory)


@pytest.mark.parametrize("layout", ["LBNHC", "LBHNC"])
@pytest.mark.parametrize("form", ["same form", "other strides", "one allocation", "same memory"])
def test_scatter_sources_of_any_form(layout: str, form: str) -> None:
    """A layer's K and V written in one pass need both roles' rows of one form at evenly
    spaced addresses; rows of other strides, two views of one allocation and one array
    given twice take the per-role route: the cache always equals fancy assignment's."""
    memory, views_of = _layer(layout)(9, (16, 4, 32), np.uint16)
    ids = np.array([3, 4, 8, 1, 2], np.int64)
    rng = np.random.default_rng(3)
    pages = rng.integers(0, 1 << 16, (2, len(ids), 16, 4, 32)).astype(np.uint16)
    rows = {
        "same form": [pages[0].copy(), pages[1].copy()],
        "other strides": [pages[0], np.asfortranarray(pages[1])],
        "one allocation": [pages[0], pages[1]],
        "same memory": [pages[0], pages[0]],
    }[form]
    expected, target = memory.copy(), memory.copy()
    for view, source in zip(views_of(expected), rows, strict=True):
        view[ids] = source
    scatter_rows(views_of(target), ids, rows)
    assert np.array_equal(target, expected)
