"""hurray-wire reads what vLLM's attention reads, element by element, on caches vLLM built.

Every case: vLLM allocates two layers (``allocate_kv_cache`` for a ``KVCacheLayout``
member), every byte is random, vLLM's BlockPool hands out the block ids and its worker
BlockTable holds them (zero padded); hurray-wire's ``tensor.sequence(s)`` of layer 1 must
equal the backend's own view at every (sequence, token, head, dim); layer 0 read with layer
1's expectations must not (the poisoned control). Then the tensors go through
encode/decode, land with ``into_vllm`` at other block ids of a fresh vLLM allocation, and
vLLM's view there reads the same values back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from vllm.v1.kv_cache_layout import KVCacheLayout

import hurray_wire as hw
from engine_tests.oracle_vllm import vllm_code as vc

STANDARD = ("FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION", "FLASHINFER")
# (block_size, kv heads, head_size, torch dtype, vLLM kv_cache_dtype)
GEOMETRIES = [
    (16, 8, 64, torch.float16, "auto"),  # GQA, 8 KV heads
    (32, 2, 128, torch.bfloat16, "auto"),
    (64, 4, 64, torch.uint8, "fp8"),
    (32, 1, 128, torch.uint8, "fp8_e5m2"),
]
FP8_TYPES = {
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def bits(value: Any) -> np.ndarray:
    """The bytes of a torch tensor or NumPy array, for bit-exact comparison."""
    if isinstance(value, torch.Tensor):
        return value.contiguous().view(torch.uint8).numpy()
    return np.ascontiguousarray(value).view(np.uint8)


def expected(view: torch.Tensor, rows: list[list[int]], lens: list[int]) -> list[np.ndarray]:
    """Per sequence ``[tokens, H, D]`` from a backend view ``[num_blocks, block_size, H, D]``."""
    block = view.shape[1]
    out = []
    for row, n in zip(rows, lens, strict=True):
        t = torch.arange(n)
        out.append(bits(view[torch.tensor(row)[t // block], t % block]))
    return out


def same_sequences(tensor: hw.BlockPagedTensor, want: list[np.ndarray]) -> bool:
    got = [bits(tensor.sequence(s)) for s in range(tensor.num_seqs)]
    return len(got) == len(want) and all(
        a.shape == b.shape and np.array_equal(a, b) for a, b in zip(got, want, strict=True)
    )


def equal(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def torched(array: np.ndarray) -> torch.Tensor:
    """A NumPy cache as torch (bfloat16 through its bits), sharing memory."""
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def as_fp8(view: torch.Tensor, setting: str) -> torch.Tensor:
    return view.view(FP8_TYPES[setting]) if setting != "auto" else view


def test_view_expressions_are_vllms() -> None:
    """The views restated in vllm_code.py are the installed vLLM's own text."""
    for module, text in vc.VIEWS.values():
        assert text in vc.source_of(module), (module, text)
    assert vc.FLASHINFER_SPLIT in vc.source_of(vc.VIEWS["FLASHINFER"][0])
    assert vc.CPU_CHUNK in vc.source_of(vc.VIEWS["CPU_ATTN"][0])


def cases() -> list[Any]:
    out = []
    for backend in STANDARD:
        for layout in KVCacheLayout:
            if backend == "FLEX_ATTENTION" and layout is not KVCacheLayout.LBNHC:
                continue  # flex_attention.py supported_kv_cache_layouts: LBNHC only
            for geometry in GEOMETRIES:
                out.append(
                    pytest.param(
                        backend,
                        layout,
                        *geometry,
                        id=f"{backend}-{layout.name}-{geometry[0]}-{geometry[4]}-{geometry[3]}",
                    )
                )
    return out


@pytest.mark.parametrize(
    ("backend", "layout", "block", "heads", "dim", "dtype", "setting"), cases()
)
def test_layer_view(
    backend: str, layout: KVCacheLayout, block: int, heads: int, dim: int, dtype: Any, setting: str
) -> None:
    spec = vc.attention_spec(block, heads, dim, dtype)
    assert vc.kernel_block_size(backend, spec) == block  # vLLM allocates these unsplit
    caches = vc.allocate(spec, layout, num_blocks=24)
    for i, name in enumerate(vc.LAYERS):
        vc.fill(caches[name], seed=7 + i)
    layer, other = caches[vc.LAYERS[1]], caches[vc.LAYERS[0]]
    lens = [2 * block + 3, block + 5, block, 3 * block - 1]  # partial pages; 1 shares a block
    reqs = vc.Requests(24, block, lens, share=1)
    table = reqs.table()
    kw: dict[str, Any] = {"backend": backend, "kv_cache_layout": layout.name}
    if setting != "auto":
        kw["kv_cache_dtype"] = setting
    key, value = hw.from_vllm(layer, table, lens, layer_index=1, **kw)
    k_view, v_view = (as_fp8(v, setting) for v in vc.layer_view(backend, layer, dim, layout))
    want_k, want_v = expected(k_view, reqs.rows, lens), expected(v_view, reqs.rows, lens)
    assert same_sequences(key, want_k) and same_sequences(value, want_v)
    if setting != "auto":
        assert key.element_type.name == ("float8_e5m2" if "e5m2" in setting else "float8_e4m3")
    poisoned, _ = hw.from_vllm(other, table, lens, **kw)
    assert not same_sequences(poisoned, want_k)

    # encode -> decode -> land at other blocks of a fresh vLLM allocation -> vLLM's view
    sent = tuple(hw.decode(hw.encode(t)) for t in (key, value))
    target = vc.allocate(spec, layout, num_blocks=30)[vc.LAYERS[0]]
    there = vc.Requests(30, block, [3 * block, *lens], share=0)  # a first request shifts ids
    ids = there.rows[1:]
    hw.into_vllm(sent, target, ids, **{k: v for k, v in kw.items() if k != "kv_cache_layout"})
    k_there, v_there = (as_fp8(v, setting) for v in vc.layer_view(backend, target, dim, layout))
    assert equal(expected(k_there, ids, lens), want_k)
    assert equal(expected(v_there, ids, lens), want_v)
    written = {b for row in ids for b in row}
    untouched = [b for b in range(30) if b not in written]
    assert not target[untouched].any()  # vLLM allocates zeros; nothing else was written

    # to_vllm allocates as vLLM does for this layout: same strides order, same reading
    out, out_table, out_lens = hw.to_vllm(
        (key, value), backend=backend, vllm_version="0.33.0", kv_cache_layout=layout.name
    )
    single = vc.allocate(spec, layout, num_blocks=out.shape[0])[vc.LAYERS[0]]
    assert np.argsort(out.strides).tolist() == np.argsort(single.stride()).tolist()
    rows = [[int(b) for b in r[: -(-n // block)]] for r, n in zip(out_table, out_lens, strict=True)]
    k_out, v_out = (as_fp8(v, setting) for v in vc.layer_view(backend, torched(out), dim, layout))
    assert equal(expected(k_out, rows, lens), want_k)
    assert equal(expected(v_out, rows, lens), want_v)


@pytest.mark.parametrize("layout", list(KVCacheLayout))
def test_one_role_split_needs_kv_role(layout: KVCacheLayout) -> None:
    """The backends' split of a layer is one role's view: refused as a layer, read with
    kv_role."""
    spec = vc.attention_spec(16, 4, 64, torch.float16)
    layer = vc.allocate(spec, layout, num_blocks=12)[vc.LAYERS[1]]
    vc.fill(layer, seed=21)
    k_view, v_view = vc.layer_view("FLASH_ATTN", layer, 64, layout)
    lens = [20, 16]
    reqs = vc.Requests(12, 16, lens, share=1)
    with pytest.raises(hw.errors.InvalidTensorError, match="kv_role"):
        hw.from_vllm(k_view, reqs.table(), lens, backend="FLASH_ATTN")
    value = hw.from_vllm(v_view, reqs.table(), lens, backend="FLASH_ATTN", kv_role="value")
    assert isinstance(value, hw.BlockPagedTensor)
    assert same_sequences(value, expected(v_view, reqs.rows, lens))
