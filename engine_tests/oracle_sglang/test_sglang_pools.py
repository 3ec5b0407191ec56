"""hurray-wire against SGLang 0.5.23's own pools, allocators and readers, on CPU.

Pools are built by SGLang (``MHATokenToKVPool``, ``MLATokenToKVPool``, ``ReqToTokenPool``),
slots come from SGLang's allocators (``PagedTokenToKVPoolAllocator.alloc_extend`` /
``alloc_decode``, ``TokenToKVPoolAllocator.alloc``), rows from ``ReqToTokenPool.alloc_rows``
(which never hands out row 0), tokens are written by SGLang's ``set_kv_buffer``. The oracle
is what SGLang's attention reads: ``get_key_buffer(layer)[req_to_token[row, :len]]``
(``layers/attention/torch_native_backend.py`` ``_run_sdpa_forward_extend``) for NHD,
``[slot // page_size, :, slot % page_size]`` for HND (``memory_pool.py`` ``set_kv_buffer``'s
HND branch, the only place SGLang's Python indexes that layout), and fp8 values times the
layer's ``k_scale_float`` (``triton_backend.py`` ``k_descale``). Every (request, token, head,
dim) is compared with ``tensor.sequence(s)``; then ``to_sglang``'s buffers are copied into a
fresh SGLang pool and SGLang's readers must see the same tokens again.
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest
import torch
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool, ReqToTokenPool
from sglang.srt.runtime_context import get_parallel

import hurray_wire as hw

LAYER = types.SimpleNamespace(layer_id=1)  # set_kv_buffer reads layer.layer_id only
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


class Batch:
    """Requests placed by SGLang's own allocators: a shared prefix, partial pages, decode."""

    def __init__(self, page_size: int, size: int, lens: list[int], share: int, seed: int):
        self.page_size = page_size
        self.size = size
        self.rows_pool = ReqToTokenPool(size=6, max_context_len=256, device="cpu",
                                        enable_memory_saver=False)  # fmt: skip
        self.lens = list(lens)
        self.rows = self.rows_pool.alloc_rows(len(lens))  # popped from the tail: not 0..n-1
        assert 0 not in self.rows
        self.rng = torch.Generator().manual_seed(seed)
        self.share = share  # whole pages request 1 shares with request 0

    def allocate(self, pool: Any) -> list[torch.Tensor]:
        """Slots per request, written into req_to_token; returns each request's new slots."""
        ps = self.page_size
        table = self.rows_pool.req_to_token
        if ps == 1:
            alloc: Any = TokenToKVPoolAllocator(self.size, pool.dtype, "cpu", pool, need_sort=False)
        else:
            alloc = PagedTokenToKVPoolAllocator(self.size, ps, pool.dtype, "cpu", pool,
                                                need_sort=False)  # fmt: skip
        new: list[torch.Tensor] = []
        for i, (row, n) in enumerate(zip(self.rows, self.lens, strict=True)):
            prefix = self.share * ps if i == 1 else 0
            if prefix:
                table[row, :prefix] = table[self.rows[0], :prefix]
            if ps == 1:
                slots = alloc.alloc(n - prefix)
            else:
                last = table[row, prefix - 1 : prefix].long() if prefix else torch.tensor([-1])
                slots = alloc.alloc_extend(
                    torch.tensor([prefix]), torch.tensor([prefix]), torch.tensor([n]),
                    torch.tensor([n]), last, n - prefix)  # fmt: skip
            assert slots is not None
            table[row, prefix:n] = slots.to(torch.int32)
            new.append(slots.long())
        # one decode step for the last request: a new token, maybe a new page
        row, n = self.rows[-1], self.lens[-1]
        if ps == 1:
            slot = alloc.alloc(1)
        else:
            slot = alloc.alloc_decode(torch.tensor([n + 1]), torch.tensor([n + 1]),
                                      table[row, n - 1 : n].long())  # fmt: skip
        table[row, n] = slot.to(torch.int32)
        self.lens[-1] = n + 1
        new[-1] = torch.cat((new[-1], slot.long()))
        return new


def mha_pool(monkeypatch: pytest.MonkeyPatch, layout: str, size: int, page_size: int,
             dtype: torch.dtype, heads: int, head_dim: int) -> MHATokenToKVPool:  # fmt: skip
    monkeypatch.setenv("SGLANG_USE_HND_KVCACHE", "1" if layout == "hnd" else "0")
    pool = MHATokenToKVPool(size=size, page_size=page_size, dtype=dtype, head_num=heads,
                            head_dim=head_dim, layer_num=2, device="cpu",
                            enable_memory_saver=False, start_layer=0)  # fmt: skip
    assert pool.kv_cache_layout == layout
    return pool


def read(pool: Any, layout: str, role: str, slots: torch.Tensor) -> torch.Tensor:
    """What SGLang's attention reads for these slots (see the module docstring)."""
    buf = pool.get_key_buffer(1) if role == "key" else pool.get_value_buffer(1)
    if layout == "hnd":
        ps = pool.page_size
        return buf[slots // ps, :, slots % ps]
    return buf[slots]


def bits(values: Any) -> np.ndarray:
    """Element bits, so that NaN payloads and -0.0 compare exactly."""
    if isinstance(values, torch.Tensor):
        width = values.element_size()
        values = values.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[width])
        return values.numpy()
    return np.ascontiguousarray(values).view(
        {1: np.uint8, 2: np.int16, 4: np.int32}[values.itemsize]
    )


CASES = [  # (layout, page_size, dtype, heads, head_dim, lens, share)
    ("nhd", 16, torch.float16, 2, 64, [37, 21], 1),
    ("nhd", 16, torch.bfloat16, 4, 128, [16, 33, 5], 1),
    ("nhd", 1, torch.float16, 2, 64, [7, 9], 3),
    ("nhd", 64, torch.bfloat16, 1, 128, [70, 64], 1),
    ("nhd", 16, torch.float8_e4m3fn, 2, 128, [40, 37], 2),
    ("nhd", 64, torch.float8_e5m2, 2, 64, [65, 3], 0),
    ("hnd", 16, torch.bfloat16, 2, 64, [37, 21], 1),
    ("hnd", 64, torch.float16, 4, 128, [100, 64], 1),
    ("hnd", 1, torch.bfloat16, 2, 64, [5, 6], 2),
    ("hnd", 16, torch.float8_e4m3fn, 2, 64, [31, 18], 1),
]


@pytest.mark.parametrize(("layout", "page_size", "dtype", "heads", "head_dim", "lens", "share"),
                         CASES)  # fmt: skip
def test_mha_pool_read_and_written_back_as_sglang_reads_it(
    monkeypatch: pytest.MonkeyPatch, layout: str, page_size: int, dtype: torch.dtype,
    heads: int, head_dim: int, lens: list[int], share: int) -> None:  # fmt: skip
    odd = 3 if page_size > 1 and layout == "nhd" else 0  # NHD: sizes not a page multiple too
    size = (sum(lens) // page_size + 6) * page_size + odd
    pool = mha_pool(monkeypatch, layout, size, page_size, dtype, heads, head_dim)
    batch = Batch(page_size, size, lens, share, seed=len(lens) * page_size)
    scales = (0.5, 0.25) if dtype in FP8 else (None, None)
    for slots in batch.allocate(pool):
        k = torch.randn(len(slots), heads, head_dim, generator=batch.rng)
        v = torch.randn(len(slots), heads, head_dim, generator=batch.rng)
        pool.set_kv_buffer(LAYER, slots, k.to(dtype) if dtype not in FP8 else k, v if dtype in FP8
                           else v.to(dtype), k_scale=scales[0], v_scale=scales[1])  # fmt: skip
    rows = torch.tensor(batch.rows)
    seq_lens = torch.tensor(batch.lens)
    table = batch.rows_pool.req_to_token
    # SGLang's own buffers as a connector holds them: raw storage (uint8 for fp8) + pool.dtype
    raw = {"dtype": pool.dtype} if dtype in FP8 else {}
    key, value = hw.from_sglang(pool.k_buffer[1], pool.v_buffer[1], table, rows, seq_lens,
                                page_size=page_size, kv_cache_layout=pool.kv_cache_layout,
                                k_scale=scales[0], v_scale=scales[1], layer_index=1,
                                **raw)  # fmt: skip
    # ... and the float8 views SGLang's readers return, as NumPy: the same tensors
    key2, _ = hw.from_sglang(pool.get_key_buffer(1), pool.get_value_buffer(1), table.numpy(),
                             rows.numpy(), seq_lens.numpy(), page_size=page_size,
                             kv_cache_layout=layout)  # fmt: skip
    expect_type = {torch.float8_e4m3fn: "float8_e4m3", torch.float8_e5m2: "float8_e5m2"}
    assert key.element_type.name == expect_type.get(dtype, str(dtype).removeprefix("torch."))
    for s, (row, n) in enumerate(zip(batch.rows, batch.lens, strict=True)):
        slots = table[row, :n].long()
        for role, tensor in (("key", key), ("value", value)):
            oracle = read(pool, layout, role, slots)
            got = tensor.sequence(s)
            assert got.shape == (n, heads, head_dim)
            assert np.array_equal(bits(got), bits(oracle)), (role, s)
            if dtype in FP8:  # the values attention uses: q * k_scale_float
                scale = scales[0] if role == "key" else scales[1]
                real = oracle.to(torch.float32) * scale
                assert np.array_equal(tensor.sequence(s, dequantize=True), real.numpy())
        assert np.array_equal(bits(key2.sequence(s)), bits(key.sequence(s)))
    if share and page_size > 1:
        assert key.prefix_sharing(), "the shared prefix pages stay shared"
    # poisoned control: the old reading "request s is row s" gives other tokens (or is refused)
    wrong = torch.tensor([r + 1 if r + 1 < 7 else 1 for r in batch.rows])
    try:
        bad, _ = hw.from_sglang(pool.k_buffer[1], pool.v_buffer[1], table, wrong, seq_lens,
                                page_size=page_size, kv_cache_layout=layout, **raw)  # fmt: skip
    except hw.errors.IndexBufferError:
        pass
    else:
        assert any(not np.array_equal(bits(bad.sequence(s)), bits(key.sequence(s)))
                   for s in range(len(lens)))  # fmt: skip
    # back into a fresh SGLang pool: SGLang's readers see the same tokens
    kb, vb, req, idx, out_lens = hw.to_sglang((key, value), kv_cache_layout=layout, as_torch=True,
                                              max_context_len=256)  # fmt: skip
    slots_total = kb.shape[0] * (page_size if layout == "hnd" else 1)
    fresh = mha_pool(
        monkeypatch, layout, slots_total - page_size, page_size, dtype, heads, head_dim
    )
    store = pool.k_buffer[1].dtype
    fresh.k_buffer[1].copy_(kb.view(store))
    fresh.v_buffer[1].copy_(vb.view(store))
    rows_pool = ReqToTokenPool(size=req.shape[0] - 1, max_context_len=256, device="cpu",
                               enable_memory_saver=False)  # fmt: skip
    rows_pool.req_to_token.copy_(req)
    assert not req[0].any(), "row 0 (padding) never written"
    for s, (row, n) in enumerate(zip(idx.tolist(), out_lens.tolist(), strict=True)):
        assert n == batch.lens[s]
        slots = rows_pool.req_to_token[row, :n].long()
        assert int(slots.min()) >= page_size, "no request token in the padding page"
        for role in ("key", "value"):
            before = read(pool, layout, role, table[batch.rows[s], :n].long())
            assert np.array_equal(bits(read(fresh, layout, role, slots)), bits(before))


@pytest.mark.parametrize(("page_size", "dtype"), [(16, torch.bfloat16), (1, torch.float16),
                                                  (64, torch.float8_e4m3fn)])  # fmt: skip
def test_mla_pool_is_one_fused_tensor(page_size: int, dtype: torch.dtype) -> None:
    size = 8 * max(page_size, 16)
    pool = MLATokenToKVPool(size=size, page_size=page_size, dtype=dtype, kv_lora_rank=512,
                            qk_rope_head_dim=64, layer_num=2, device="cpu",
                            enable_memory_saver=False)  # fmt: skip
    share = {1: 5, 16: 2, 64: 0}[page_size]  # whole pages of request 0 (40 tokens)
    batch = Batch(page_size, size, [40, 70], share=share, seed=page_size)
    with get_parallel().override(dcp_enabled=False):
        for slots in batch.allocate(pool):
            latent = torch.randn(len(slots), 1, 576, generator=batch.rng).to(dtype)
            pool.set_kv_buffer(LAYER, slots, latent, None)
    rows, lens = torch.tensor(batch.rows), torch.tensor(batch.lens)
    raw = {"dtype": pool.dtype} if dtype in FP8 else {}
    fused = hw.from_sglang_mla(pool.kv_buffer[1], batch.rows_pool.req_to_token, rows, lens,
                               page_size=page_size, kv_scale=1.0 if raw else None,
                               **raw)  # fmt: skip
    assert (fused.kv_role, fused.shape[1:]) == ("fused", (1, 576))
    for s, (row, n) in enumerate(zip(batch.rows, batch.lens, strict=True)):
        slots = batch.rows_pool.req_to_token[row, :n].long()
        got = fused.sequence(s)
        assert np.array_equal(bits(got), bits(pool.get_key_buffer(1)[slots]))
        assert np.array_equal(bits(got[..., :512]), bits(pool.get_value_buffer(1)[slots]))
    kv, req, idx, out_lens = hw.to_sglang_mla(fused, as_torch=True, max_context_len=256)
    fresh = MLATokenToKVPool(size=kv.shape[0] - page_size, page_size=page_size, dtype=dtype,
                             kv_lora_rank=512, qk_rope_head_dim=64, layer_num=2, device="cpu",
                             enable_memory_saver=False)  # fmt: skip
    fresh.kv_buffer[1].copy_(kv.view(pool.kv_buffer[1].dtype))
    for s, (row, n) in enumerate(zip(idx.tolist(), out_lens.tolist(), strict=True)):
        before = pool.get_key_buffer(1)[batch.rows_pool.req_to_token[batch.rows[s], :n].long()]
        assert np.array_equal(bits(fresh.get_key_buffer(1)[req[row, :n].long()]), bits(before))


def test_sglang_rules_the_adapter_relies_on() -> None:
    """The facts from_sglang is built on, asserted on SGLang itself."""
    rows = ReqToTokenPool(size=4, max_context_len=8, device="cpu", enable_memory_saver=False)
    assert rows.req_to_token.shape == (5, 8) and 0 not in rows.alloc_rows(4)  # row 0: padding
    pool = MHATokenToKVPool(size=40, page_size=16, dtype=torch.float8_e4m3fn, head_num=1,
                            head_dim=64, layer_num=1, device="cpu",
                            enable_memory_saver=False)  # fmt: skip
    assert pool.k_buffer[0].shape == (56, 1, 64) and pool.k_buffer[0].dtype == torch.uint8
    assert pool.get_key_buffer(0).dtype == torch.float8_e4m3fn
    alloc = PagedTokenToKVPoolAllocator(40, 16, pool.dtype, "cpu", pool, need_sort=False)
    assert alloc.free_pages.tolist() == [1, 2]  # page 0 never handed out; 56 slots, 2 pages
