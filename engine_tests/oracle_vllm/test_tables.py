"""The tables hurray-wire keeps of vLLM (``hurray_wire/adapters/_vllm_forms.py``) are vLLM's.

The adapter imports no engine; these checks hold its tables against the installed vLLM, so
a vLLM that changes a layout, alias, backend name or fp8 storage fails here first.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import vllm
from vllm.config.cache import _LAYOUT_COMPAT_ALIASES
from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.backends.utils import _DEFAULT_LAYOUT_PREFERENCE
from vllm.v1.kv_cache_layout import KVCacheLayout

import hurray_wire as hw
from hurray_wire.adapters import _vllm_forms as forms


def test_layouts_and_aliases() -> None:
    assert set(forms.LAYOUTS) == {m.name for m in KVCacheLayout}
    for member in KVCacheLayout:
        assert forms.LAYOUTS[member.name] == member.layer_view_order
    assert forms.LAYOUT_ALIASES == _LAYOUT_COMPAT_ALIASES
    assert _DEFAULT_LAYOUT_PREFERENCE[0] is KVCacheLayout.LBNHC  # to_vllm's default
    assert forms.layout_name(KVCacheLayout.BLNHC) == "BLNHC"  # the member itself


def test_installed_version_is_the_layer_view_era() -> None:
    assert forms.era_of(None) == forms.ERA_LAYER_VIEWS == forms.era_of(vllm.__version__)


def test_fp8_storage() -> None:
    for setting in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        assert STR_DTYPE_TO_TORCH_DTYPE[setting] == torch.uint8
        forms.float8_name(setting)


@pytest.mark.parametrize("name", forms.BACKENDS)
def test_backend_names_and_classes(name: str) -> None:
    member = AttentionBackendEnum[name]
    assert forms.backend_name(member) == name
    try:
        backend = member.get_class()
    except (ImportError, AssertionError):  # needs CUDA or flashinfer to import
        return
    assert forms.backend_name(backend) == name
    declared = backend.supported_kv_cache_layouts()
    if name in forms.BACKEND_LAYOUTS:
        assert tuple(m.name for m in declared) == forms.BACKEND_LAYOUTS[name]
    else:
        assert declared is None  # any layout (FLASHINFER: by GPU, refused without one)


def test_backend_class_reads_like_its_name() -> None:
    backend = AttentionBackendEnum["CPU_ATTN"].get_class()
    cache = np.zeros((4, 1, 32, 128), np.float16)
    cache[1, 0, 0, :64] = np.arange(64)  # vec: keys [head_size, block_size]: token 0 at stride 32
    by_class, _ = hw.from_vllm(cache, [[1]], [1], backend=backend, isa="vec")
    by_name, _ = hw.from_vllm(cache, [[1]], [1], backend="CPU_ATTN", isa="vec")
    assert np.array_equal(by_class.sequence(0), by_name.sequence(0))
    assert by_class.sequence(0)[0, 0, :2].tolist() == [0.0, 32.0]
