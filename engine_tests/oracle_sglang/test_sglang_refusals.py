"""SGLang 0.5.23 pools hurray-wire refuses, each refusal naming what SGLang's code says.

DSA fp8 MLA (``DSATokenToKVPool`` with ``dsa_kv_cache_store_fp8``): each row packs
``kv_lora_rank`` fp8 values, one float32 scale per ``quant_block_size`` of them and the rope
dims in ``rope_storage_dtype`` (mem_cache/kv_cache_configurator.py
``calculate_mla_kv_cache_dim``): not float8 values, so never carried as such. An
``MHATokenToKVPool`` with ``v_head_dim < head_dim`` is no MLA pool, and an MLA pool's
``get_kv_buffer`` pair is read with ``from_sglang_mla``.
"""

from __future__ import annotations

import pytest
import torch
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.runtime_context import get_parallel

import hurray_wire as hw
from engine_tests.oracle_sglang.test_sglang_pools import Batch


def dsa_pool(dtype: torch.dtype, kv_cache_dim: int) -> DSATokenToKVPool:
    with get_parallel().override(dcp_enabled=False, attn_dcp_size=1):
        return DSATokenToKVPool(size=256, page_size=64, kv_lora_rank=512, dtype=dtype,
                                qk_rope_head_dim=64, layer_num=2, device="cpu",
                                index_head_dim=128, enable_memory_saver=False,
                                kv_cache_dim=kv_cache_dim)  # fmt: skip


def test_dsa_fp8_mla_pool_is_refused() -> None:
    fp8_row = (512 + 512 // DSATokenToKVPool.quant_block_size * 4
               + 64 * DSATokenToKVPool.rope_storage_dtype.itemsize)  # fmt: skip
    pool = dsa_pool(torch.float8_e4m3fn, fp8_row)
    assert pool.dsa_kv_cache_store_fp8 and fp8_row == 656
    assert pool.kv_buffer[1].shape == (256 + 64, 1, 656) and pool.kv_buffer[1].dtype == torch.uint8
    batch = Batch(64, 256, [40, 70], share=0, seed=5)
    with get_parallel().override(dcp_enabled=False):
        batch.allocate(pool)
    pool.kv_buffer[1].copy_(torch.randint(0, 0x78, pool.kv_buffer[1].shape, dtype=torch.uint8))
    rows, lens = torch.tensor(batch.rows), torch.tensor(batch.lens)
    table = batch.rows_pool.req_to_token
    for buffer, dtype in ((pool.kv_buffer[1], pool.dtype), (pool.get_key_buffer(1), None)):
        with pytest.raises(
            hw.errors.InvalidTensorError, match=r"DSA fp8 MLA pool .*not supported"
        ) as e:
            hw.from_sglang_mla(buffer, table, rows, lens, page_size=64, dtype=dtype)
        assert e.value.field == "kv_buffer" and "656 fp8 bytes per token" in str(e.value)
    # the same DSA pool in bfloat16 holds the plain latent (kv_lora_rank + rope): read
    plain = dsa_pool(torch.bfloat16, 576)
    assert not plain.dsa_kv_cache_store_fp8
    latent = hw.from_sglang_mla(plain.kv_buffer[1], table, rows, lens, page_size=64)
    assert latent.shape[1:] == (1, 576)


def test_v_head_dim_refusals_name_the_pool() -> None:
    mha = MHATokenToKVPool(size=64, page_size=16, dtype=torch.float16, head_num=2, head_dim=128,
                           v_head_dim=64, layer_num=1, device="cpu",
                           enable_memory_saver=False)  # fmt: skip
    assert mha.k_buffer[0].shape[-1] == 128 and mha.v_buffer[0].shape[-1] == 64
    table = torch.zeros((2, 32), dtype=torch.int32)
    table[1, :20] = torch.arange(16, 36)
    with pytest.raises(
        hw.errors.InvalidTensorError, match=r"v_head_dim != head_dim .*not supported"
    ) as e:
        hw.from_sglang(mha.k_buffer[0], mha.v_buffer[0], table, [1], [20], page_size=16)
    assert "from_sglang_mla" not in str(e.value)
    mla = MLATokenToKVPool(size=64, page_size=16, dtype=torch.bfloat16, kv_lora_rank=512,
                           qk_rope_head_dim=64, layer_num=1, device="cpu",
                           enable_memory_saver=False)  # fmt: skip
    with pytest.raises(hw.errors.InvalidTensorError, match=r"MLATokenToKVPool.*from_sglang_mla"):
        hw.from_sglang(*mla.get_kv_buffer(0), table, [1], [20], page_size=16)
