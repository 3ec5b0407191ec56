"""Refusals that say what vLLM's own code says: caches vLLM builds and hurray-wire refuses.

The kernel block sizes each backend takes (``_vllm_forms.KERNEL_BLOCK_SIZES``) against the
backends' own ``get_supported_kernel_block_sizes`` as vLLM's ``select_common_block_size``
applies them; vLLM's LHBNC cache of one-token blocks; Triton's per-token-head quantized
cache; every ``kv_cache_dtype`` setting vLLM knows.
"""

from __future__ import annotations

from typing import Any, get_args

import pytest
import torch
from vllm.config.cache import CacheDType
from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVQuantMode
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.worker.utils import _block_size_is_supported

import hurray_wire as hw
from engine_tests.oracle_vllm import vllm_code as vc
from hurray_wire.adapters import _vllm_forms as forms
from hurray_wire.errors import InvalidTensorError

#: FlashInfer takes 128 .. 1024 on Blackwell only (flashinfer.py): not visible on a CPU.
BLACKWELL_ONLY = {"FLASHINFER": {128, 256, 512, 1024}}


@pytest.mark.parametrize("backend", sorted(forms.KERNEL_BLOCK_SIZES))
def test_kernel_block_sizes_are_the_backends(backend: str) -> None:
    spec = vc.mla_spec(16, torch.bfloat16) if "MLA" in backend else None
    spec = spec or vc.attention_spec(16, 2, 64, torch.float16)
    cls = vc.backend_class(backend)
    for size in range(1, 1025):
        theirs = _block_size_is_supported([cls], size, [spec])
        try:
            forms.check_kernel_block(backend, size, forms.ERA_LAYER_VIEWS)
            ours = True
        except InvalidTensorError:
            ours = False
        assert ours == (theirs or size in BLACKWELL_ONLY.get(backend, ())), size


def test_lhbnc_one_token_blocks() -> None:
    """vLLM's allocation builds it; no backend hurray-wire reads takes 1-token blocks, so
    vLLM refuses it at start, and so does from_vllm (it once said "pass kv_role")."""
    spec = vc.attention_spec(1, 2, 64, torch.float16)
    layer = vc.allocate(spec, KVCacheLayout.LHBNC, 8)[vc.LAYERS[0]]
    assert tuple(layer.shape) == (8, 2, 1, 128)
    for backend in forms.STANDARD_BACKENDS:
        with pytest.raises(ValueError, match="No common block size"):
            vc.kernel_block_size(backend, spec)
        with pytest.raises(hw.errors.InvalidTensorError, match="take no 1-token blocks") as info:
            hw.from_vllm(layer, [[1]], [1], backend=backend, kv_cache_layout="LHBNC")
        assert "kv_role" not in str(info.value)


def test_triton_per_token_head_cache_is_not_supported() -> None:
    """TritonAttentionBackend.customize_spec puts a float32 scale after each head's K and V
    data: [num_blocks, H, block_size, 2 * head_size + 8] bytes."""
    spec: Any = FullAttentionSpec(
        block_size=16,
        num_kv_heads=2,
        head_size=64,
        dtype=torch.uint8,
        kv_quant_mode=KVQuantMode.FP8_PER_TOKEN_HEAD,
    )
    spec = TritonAttentionBackend.customize_spec(spec)
    layer = vc.allocate(spec, KVCacheLayout.LBNHC, 6)[vc.LAYERS[0]]
    assert tuple(layer.shape) == (6, 2, 16, 2 * 64 + 8) and layer.dtype == torch.uint8
    with pytest.raises(
        hw.errors.InvalidTensorError,
        match=r"'fp8_per_token_head' is not supported: .*float32 scale",
    ):
        hw.from_vllm(layer, [[1]], [3], backend="TRITON_ATTN", kv_cache_dtype="fp8_per_token_head")


@pytest.mark.parametrize("setting", get_args(CacheDType))
def test_every_cache_dtype_is_carried_or_named_not_supported(setting: str) -> None:
    if setting in forms.CARRIED_CACHE_DTYPES:
        forms.check_cache_dtype(setting)
        return
    with pytest.raises(hw.errors.InvalidTensorError, match=f"'{setting}' is not supported: "):
        forms.check_cache_dtype(setting)
