"""hurray-wire against FlashInfer 0.7.2.post1's own unpacking and length rule, on CPU.

``flashinfer.utils._unpack_paged_kv_cache`` turns every cache form FlashInfer accepts into
its ``(k, v)`` 4-D caches; ``flashinfer.page.get_seq_lens`` gives the lengths. The oracle
reads token ``t`` of request ``s`` at page ``kv_indices[kv_indptr[s] + t // page_size]``,
slot ``t % page_size`` (``[page, slot]`` NHD, ``[page, :, slot]`` HND), as the paged kernels
index it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from flashinfer.page import get_seq_lens
from flashinfer.utils import _unpack_paged_kv_cache

import hurray_wire as hw


def bits(values: Any) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        width = values.element_size()
        return values.contiguous().view({1: torch.uint8, 2: torch.int16}[width]).numpy()
    return np.ascontiguousarray(values).view({1: np.uint8, 2: np.int16}[values.itemsize])


def oracle(cache: Any, layout: str, indptr: torch.Tensor, indices: torch.Tensor,
           last: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:  # fmt: skip
    k, v = _unpack_paged_kv_cache(cache, layout)
    page_size = k.shape[1] if layout == "NHD" else k.shape[2]
    lens = get_seq_lens(indptr, last, page_size)
    out = []
    for s, n in enumerate(lens.tolist()):
        t = torch.arange(n)
        pages = indices[indptr[s] + t // page_size]
        if layout == "NHD":
            out.append((k[pages, t % page_size], v[pages, t % page_size]))
        else:
            out.append((k[pages, :, t % page_size], v[pages, :, t % page_size]))
    return out


CASES = [  # (form, layout, page_size, dtype, heads, head_dim)
    ("tuple", "NHD", 16, torch.float16, 2, 64),
    ("tuple", "HND", 16, torch.bfloat16, 4, 128),
    ("combined", "NHD", 16, torch.bfloat16, 2, 128),
    ("combined", "HND", 64, torch.float16, 2, 64),
    ("tuple", "NHD", 1, torch.bfloat16, 2, 64),
    ("tuple", "HND", 1, torch.float16, 2, 64),
    ("combined", "NHD", 1, torch.float16, 4, 64),
    ("combined", "HND", 1, torch.bfloat16, 2, 128),
    ("tuple", "NHD", 16, torch.float8_e4m3fn, 2, 128),
    ("combined", "HND", 16, torch.float8_e5m2, 2, 64),
    ("role", "NHD", 16, torch.float16, 2, 64),
    ("role", "HND", 1, torch.bfloat16, 2, 64),
    ("role", "NHD", 1, torch.float16, 2, 64),
]


@pytest.mark.parametrize(("form", "layout", "page_size", "dtype", "heads", "head_dim"), CASES)
def test_flashinfer_cache_read_as_flashinfer_unpacks_it(
    form: str, layout: str, page_size: int, dtype: torch.dtype, heads: int, head_dim: int
) -> None:
    gen = torch.Generator().manual_seed(page_size * heads + head_dim)
    num_pages = 12
    inner = (page_size, heads, head_dim) if layout == "NHD" else (heads, page_size, head_dim)
    if page_size == 1:
        inner = (heads, head_dim)  # FlashInfer's page-size-1 forms (_expand_4d / _expand_5d)
    full = torch.randn(num_pages, 2, *inner, generator=gen).to(dtype)
    # three requests: one shares request 0's first page, one is empty; partial last pages
    indices = torch.tensor([5, 2, 9, 5, 7, 1], dtype=torch.int32)
    indptr = torch.tensor([0, 3, 6, 6], dtype=torch.int32)
    last = torch.tensor([max(page_size - 3, 1), 1, 0], dtype=torch.int32)
    if form == "combined":
        cache: Any = full
    elif form == "tuple":
        cache = (full[:, 0].contiguous(), full[:, 1].contiguous())
    else:
        cache = full[:, 0].contiguous()
    expect = oracle((full[:, 0], full[:, 1]), layout, indptr.long(), indices.long(), last.long())
    if form == "role":
        got: Any = (hw.from_flashinfer(cache, indptr, indices, last, kv_layout=layout,
                                       kv_role="key"),)  # fmt: skip
    else:
        got = hw.from_flashinfer(cache, indptr, indices, last, kv_layout=layout)
    for s, pair in enumerate(expect):
        for tensor, want in zip(got, pair, strict=False):
            assert np.array_equal(bits(tensor.sequence(s)), bits(want)), (s, tensor.kv_role)
    if form == "combined":
        assert np.array_equal(bits(expect[0][1]), bits(got[1].sequence(0)))
    # valid but poisoned control: the same cache with kv_indices reversed is accepted and
    # must read other tokens than FlashInfer's unpacking of the true indices
    poisoned = hw.from_flashinfer(cache, indptr, indices.flip(0), last, kv_layout=layout,
                                  kv_role="key" if form == "role" else None)  # fmt: skip
    first = poisoned if isinstance(poisoned, hw.BlockPagedTensor) else poisoned[0]
    assert not np.array_equal(bits(first.sequence(0)), bits(expect[0][0]))
    if form == "tuple" and page_size > 1 and heads != page_size:
        with pytest.raises(hw.HurrayWireError):  # a tuple names both roles: no kv_role
            hw.from_flashinfer(cache, indptr, indices, last, kv_layout=layout, kv_role="key")
    # back out: FlashInfer's unpacking of to_flashinfer's cache reads the same tokens
    if form != "role":
        out = hw.to_flashinfer(got, kv_layout=layout, combined=form == "combined", as_torch=True)
        again = oracle(out[0], layout, out[1].long(), out[2].long(), out[3].long())
        assert get_seq_lens(out[1], out[3], page_size).tolist() == [len(e[0]) for e in expect]
        for (k0, v0), (k1, v1) in zip(expect, again, strict=True):
            assert np.array_equal(bits(k0), bits(k1)) and np.array_equal(bits(v0), bits(v1))


@pytest.mark.parametrize(("counts", "last", "page_size"), [
    ([0], [5], 16),     # empty request, nonzero last page length: get_seq_lens says 5 tokens
    ([2], [0], 16),     # two pages, last page empty: get_seq_lens says 16 (pages unused)
    ([1], [17], 16),    # last page longer than a page
    ([0, 1], [1, 1], 1),
])  # fmt: skip
def test_lengths_flashinfer_gives_that_pages_cannot_hold_are_refused(
    counts: list[int], last: list[int], page_size: int
) -> None:
    indptr = torch.tensor(np.concatenate(([0], np.cumsum(counts))), dtype=torch.int32)
    lens = get_seq_lens(indptr, torch.tensor(last, dtype=torch.int32), page_size)
    pages = -(-lens // page_size)
    assert (pages != torch.diff(indptr)).any()  # FlashInfer's own lengths disagree with pages
    cache = torch.zeros(4, page_size, 1, 8, dtype=torch.float16)
    indices = torch.zeros(int(indptr[-1]), dtype=torch.int32)
    with pytest.raises(hw.errors.IndexBufferError) as info:
        hw.from_flashinfer((cache, cache), indptr, indices, torch.tensor(last), kv_layout="NHD")
    assert info.value.field == "kv_last_page_len"


def test_empty_request_with_zero_last_page_len_is_empty() -> None:
    indptr = torch.tensor([0, 0, 1], dtype=torch.int32)
    last = torch.tensor([0, 3], dtype=torch.int32)
    assert get_seq_lens(indptr, last, 16).tolist() == [0, 3]
    cache = torch.zeros(2, 16, 1, 8, dtype=torch.float16)
    k, _ = hw.from_flashinfer((cache, cache), indptr, torch.tensor([1]), last)
    assert k.seq_lens.tolist() == [0, 3]
