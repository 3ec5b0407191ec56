"""vLLM adapter against plain references restated from vLLM's code (no vLLM imported here).

The references index the cache the way each backend's view expression does, element by
element: FlashAttention & co. ``kv_cache.transpose(1, 2).split(head_size, -1)`` on the
per-layer ``[num_blocks, H, block_size, 2 * head_size]`` view
(vllm/v1/attention/backends/flash_attn.py:1257), the CPU kernel's per-ISA slab order written
as loops from csrc/cpu/cpu_attn_vec.hpp / cpu_attn_amx.hpp ``reshape_and_cache``, the older
eras' ``[2, N, B, H, D]`` / ``[N, 2, B, H, D]``. engine_tests/oracle_vllm checks the same
against vLLM's own code.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire import errors as hwe
from hurray_wire.adapters import into_vllm

LAYOUTS = {  # KVCacheLayout member -> memory order of (block, head, token, content)
    "LBHNC": (0, 1, 2, 3),
    "LBNHC": (0, 2, 1, 3),
    "LHBNC": (1, 0, 2, 3),
    "BLHNC": (0, 1, 2, 3),
    "BLNHC": (0, 2, 1, 3),
    "BHLNC": (0, 1, 2, 3),
}
TABLE = [[3, 5, 1], [3, 7], [2], [6, 4]]  # shared first block between sequences 0 and 1


def lens_for(block: int) -> list[int]:
    return [2 * block + 3, block + 1, block, 2 * block]


def values(shape: tuple[int, ...], dtype: Any, seed: int = 0) -> Any:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.uint8:
        return rng.integers(0, 0x78, size=shape, dtype=np.uint8)  # finite fp8 patterns
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def allocate(shape: tuple[int, ...], physical: tuple[int, ...], dtype: Any, seed: int) -> Any:
    """Logical ``shape`` with memory in ``physical`` order (create_kv_cache_views' strides)."""
    memory = values(tuple(shape[a] for a in physical), dtype, seed)
    return memory.transpose([physical.index(a) for a in range(len(shape))])


def same(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and bool(np.array_equal(a.view(np.uint8), b.view(np.uint8)))


# -- references, token by token ----------------------------------------------------------------
def ref_layer(cache: Any, table: list[list[int]], lens: list[int], role: int) -> list[Any]:
    """[num_blocks, H, B, 2D]: token t of a sequence is cache[block, :, t % B, role half]."""
    block, dim = cache.shape[2], cache.shape[3] // 2
    return [
        np.stack(
            [cache[row[t // block], :, t % block, role * dim : (role + 1) * dim] for t in range(n)]
        )
        for row, n in zip(table, lens, strict=True)
    ]


def cpu_write(isa: str, slab: Any, n: int, block: int, key: Any, value: Any) -> None:
    """One token's key and value into a flat (block, head) slab, as the kernel's loops do."""
    dim = len(key)
    if isa == "amx":  # cpu_attn_amx.hpp: quadwords (element pairs) in 16-token groups
        group, offset = divmod(n, 16)
        for j in range(dim // 2):
            at = group * 16 * dim + j * 32 + offset * 2
            slab[at : at + 2] = key[2 * j : 2 * j + 2]
        sub, sub_offset = divmod(n, 2)
        for i in range(dim // 16):
            for j in range(16):
                slab[block * dim + i * block * 16 + sub * 32 + j * 2 + sub_offset] = value[
                    i * 16 + j
                ]
    else:  # cpu_attn_vec.hpp: key column-major [dim, block], value row-major [block, dim]
        for i in range(dim):
            slab[i * block + n] = key[i]
        slab[block * dim + n * dim : block * dim + (n + 1) * dim] = value


def cpu_cache(
    isa: str, blocks: int, heads: int, block: int, dim: int, dtype: Any, seed: int
) -> Any:
    """A CPU_ATTN cache and the (key, value) of every (block, token, head) written into it."""
    keys = values((blocks, block, heads, dim), dtype, seed)
    vals = values((blocks, block, heads, dim), dtype, seed + 1)
    cache = np.zeros((blocks, heads, block, 2 * dim), keys.dtype)
    for b in range(blocks):
        for h in range(heads):
            slab = cache[b, h].reshape(-1)
            for n in range(block):
                cpu_write(isa, slab, n, block, keys[b, n, h], vals[b, n, h])
    return cache, keys, vals


def ref_pool(pool: Any, table: list[list[int]], lens: list[int]) -> list[Any]:
    block = pool.shape[1]
    return [
        np.stack([pool[row[t // block], t % block] for t in range(n)])
        for row, n in zip(table, lens, strict=True)
    ]


def check(tensor: hw.BlockPagedTensor, expected: list[Any]) -> None:
    got = tensor.sequences()
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert same(a, b)


def pair(got: Any) -> tuple[hw.BlockPagedTensor, hw.BlockPagedTensor]:
    assert isinstance(got, tuple)
    return got


# -- vLLM >= 0.26: one [num_blocks, H, block_size, 2 * head_size] view per layer ---------------
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("backend", ["FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION", "FLASHINFER"])
@pytest.mark.parametrize(
    ("block", "heads", "dim", "dtype"),
    [(16, 2, 64, np.float16), (32, 4, 128, ml_dtypes.bfloat16), (64, 1, 64, np.float16)],
)
def test_layer_view_every_layout(
    layout: str, backend: str, block: int, heads: int, dim: int, dtype: Any
) -> None:
    if backend == "FLEX_ATTENTION" and layout != "LBNHC":
        pytest.skip("FlexAttention supports LBNHC only")
    cache = allocate((8, heads, block, 2 * dim), LAYOUTS[layout], dtype, seed=block + heads)
    before = cache.copy()
    lens = lens_for(block)
    table = np.zeros((4, 5), np.int32)  # zero padded past each row, as vLLM's
    for s, row in enumerate(TABLE):
        table[s, : len(row)] = row
    for given in (layout, None):
        key, value = pair(
            hw.from_vllm(cache, table, lens, backend=backend, kv_cache_layout=given, layer_index=2)
        )
        check(key, ref_layer(cache, TABLE, lens, 0))
        check(value, ref_layer(cache, TABLE, lens, 1))
        assert (key.kv_role, value.kv_role, key.layer_index) == ("key", "value", 2)
    assert same(cache, before)
    out, out_table, out_lens = hw.to_vllm(
        (key, value), backend=backend, vllm_version="0.33.0", kv_cache_layout=layout
    )
    back_k, back_v = pair(
        hw.from_vllm(out, out_table, out_lens, backend=backend, kv_cache_layout=layout)
    )
    check(back_k, ref_layer(cache, TABLE, lens, 0))
    check(back_v, ref_layer(cache, TABLE, lens, 1))
    assert not out[0].any()  # the null block
    physical = [out.strides[a] for a in LAYOUTS[layout] if out.shape[a] > 1]
    assert physical == sorted(physical, reverse=True)  # vLLM's memory order


def test_layer_view_from_torch_and_the_permuted_array_is_refused() -> None:
    torch = pytest.importorskip("torch")
    cache = allocate((8, 2, 16, 128), LAYOUTS["LBNHC"], np.float16, seed=3)
    lens = lens_for(16)
    tcache = torch.from_numpy(cache)
    key, _ = pair(hw.from_vllm(tcache, TABLE, torch.tensor(lens), backend="FLASH_ATTN"))
    check(key, ref_layer(cache, TABLE, lens, 0))
    physical = np.ascontiguousarray(cache.transpose(0, 2, 1, 3))  # [N, B, H, 2D] in memory order
    with pytest.raises(hwe.InvalidTensorError, match="strides"):
        hw.from_vllm(physical, TABLE, lens, backend="FLASH_ATTN", kv_cache_layout="NHD")


def test_layer_view_poisoned_control() -> None:
    """Read as another backend, the same tensor gives other values: the backend matters."""
    cache = allocate((8, 2, 32, 128), LAYOUTS["LBHNC"], np.float16, seed=5)
    lens = lens_for(32)
    flash, _ = pair(hw.from_vllm(cache, TABLE, lens, backend="FLASH_ATTN"))
    cpu, _ = pair(hw.from_vllm(cache, TABLE, lens, backend="CPU_ATTN", isa="vec"))
    assert not same(flash.sequence(0), cpu.sequence(0))


# -- CPU_ATTN ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("isa", "block", "heads", "dim", "dtype"),
    [
        ("vec", 32, 2, 64, np.float16),
        ("vec", 64, 1, 128, np.float32),
        ("vec16", 16, 2, 80, np.float16),
        ("amx", 32, 2, 64, ml_dtypes.bfloat16),
        ("amx", 64, 2, 128, ml_dtypes.bfloat16),
        ("vec", 32, 2, 64, np.uint8),
        ("amx", 32, 1, 64, np.uint8),
    ],
)
def test_cpu_attn(isa: str, block: int, heads: int, dim: int, dtype: Any) -> None:
    cache, keys, vals = cpu_cache(isa, 8, heads, block, dim, dtype, seed=block + dim)
    fp8: dict[str, Any] = {"kv_cache_dtype": "fp8_e4m3"} if dtype == np.uint8 else {}
    lens = lens_for(block)
    key, value = pair(hw.from_vllm(cache, TABLE, lens, backend="CPU_ATTN", isa=isa, **fp8))
    as_type = ml_dtypes.float8_e4m3fn if fp8 else keys.dtype
    check(key, ref_pool(keys.view(as_type), TABLE, lens))
    check(value, ref_pool(vals.view(as_type), TABLE, lens))
    if fp8:
        assert key.element_type.name == "float8_e4m3"
    out, out_table, out_lens = hw.to_vllm(
        (key, value), backend="CPU_ATTN", vllm_version="0.32.0", isa=isa
    )
    assert out.dtype == cache.dtype and not out[0].any()
    back_k, back_v = pair(
        hw.from_vllm(out, out_table, out_lens, backend="CPU_ATTN", isa=isa, **fp8)
    )
    check(back_k, ref_pool(keys.view(as_type), TABLE, lens))
    check(back_v, ref_pool(vals.view(as_type), TABLE, lens))


def test_cpu_attn_other_isa_reads_other_values() -> None:
    cache, keys, _ = cpu_cache("amx", 4, 1, 32, 64, ml_dtypes.bfloat16, seed=1)
    wrong, _ = pair(hw.from_vllm(cache, [[1]], [32], backend="CPU_ATTN", isa="vec"))
    right, _ = pair(hw.from_vllm(cache, [[1]], [32], backend="CPU_ATTN", isa="amx"))
    assert same(right.sequence(0), keys[1]) and not same(wrong.sequence(0), keys[1])


# -- older eras, MLA, one role -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("version", "backend", "stacked"),
    [
        ("0.21.1", "FLASH_ATTN", 0),
        ("0.20.0", "FLEX_ATTENTION", 0),
        ("0.22.0", "FLASHINFER", 1),
        ("0.21.0", "TRITON_ATTN", 1),
        ("0.24.0", "FLASH_ATTN", 1),
        ("0.25.2", "FLEX_ATTENTION", 1),
    ],
)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_older_eras(version: str, backend: str, stacked: int, layout: str) -> None:
    block, heads, dim = 16, 2, 64
    tail = (2, 3, 4) if layout == "NHD" else (3, 2, 4)
    shape = (2, 8, block, heads, dim) if stacked == 0 else (8, 2, block, heads, dim)
    cache = allocate(shape, (0, 1, *tail), np.float16, seed=7)
    key_pool = cache[0] if stacked == 0 else cache[:, 0]
    lens = lens_for(block)
    key, value = pair(
        hw.from_vllm(
            cache, TABLE, lens, backend=backend, vllm_version=version, kv_cache_layout=layout
        )
    )
    check(key, ref_pool(key_pool, TABLE, lens))
    with pytest.raises(hwe.ArgumentTypeError, match="vllm_version"):
        hw.from_vllm(cache, TABLE, lens, backend=backend)
    out, table, out_lens = hw.to_vllm(
        (key, value), backend=backend, vllm_version=version, kv_cache_layout=layout
    )
    assert out.shape[stacked] == 2 and out.ndim == 5
    back, _ = pair(hw.from_vllm(out, table, out_lens, backend=backend, vllm_version=version))
    check(back, ref_pool(key_pool, TABLE, lens))


@pytest.mark.parametrize(("version", "ndim"), [("0.33.0", 4), ("0.25.0", 3)])
def test_mla_fused(version: str, ndim: int) -> None:
    latent = values((8, 64, 576), ml_dtypes.bfloat16, seed=11)
    cache = latent[:, None] if ndim == 4 else latent
    lens = lens_for(64)
    tensor = hw.from_vllm(cache, TABLE, lens, backend="FLASHMLA", vllm_version=version, k_scale=2.0)
    assert isinstance(tensor, hw.BlockPagedTensor)
    assert (tensor.kv_role, tensor.shape[1:], tensor.kv_scale) == ("fused", (1, 576), 2.0)
    check(tensor, ref_pool(latent[:, :, None, :], TABLE, lens))
    out, table, out_lens = hw.to_vllm(tensor, backend="TRITON_MLA", vllm_version=version)
    assert out.ndim == ndim
    back = hw.from_vllm(out, table, out_lens, backend="TRITON_MLA", vllm_version=version)
    assert isinstance(back, hw.BlockPagedTensor)
    check(back, ref_pool(latent[:, :, None, :], TABLE, lens))


def test_one_role_view() -> None:
    cache = allocate((8, 2, 16, 128), LAYOUTS["LBNHC"], np.float16, seed=13)
    key_view = cache.transpose(0, 2, 1, 3)[..., :64]  # the backends' split
    lens = lens_for(16)
    with pytest.raises(hwe.InvalidTensorError, match="kv_role"):
        hw.from_vllm(key_view, TABLE, lens, backend="FLASH_ATTN")  # not a layer: refused
    key = hw.from_vllm(key_view, TABLE, lens, backend="FLASH_ATTN", kv_role="key")
    assert isinstance(key, hw.BlockPagedTensor) and key.kv_role == "key"
    check(key, ref_layer(cache, TABLE, lens, 0))
    hw.from_vllm(key_view, TABLE, lens, backend="FLASH_ATTN", kv_role="key", kv_cache_layout="NHD")
    with pytest.raises(hwe.InvalidTensorError, match="strides"):
        hw.from_vllm(
            key_view, TABLE, lens, backend="FLASH_ATTN", kv_role="key", kv_cache_layout="HND"
        )


# -- fp8, scales, sliding window --------------------------------------------------------------
@pytest.mark.parametrize(
    ("setting", "numpy_type"),
    [
        ("fp8", ml_dtypes.float8_e4m3fn),
        ("fp8_e4m3", ml_dtypes.float8_e4m3fn),
        ("fp8_e5m2", ml_dtypes.float8_e5m2),
    ],
)
def test_fp8_storage_travels_as_float8(setting: str, numpy_type: Any) -> None:
    cache = allocate((8, 2, 16, 128), LAYOUTS["LBNHC"], np.uint8, seed=17)
    lens = lens_for(16)
    key, value = pair(
        hw.from_vllm(
            cache,
            TABLE,
            lens,
            backend="FLASH_ATTN",
            kv_cache_dtype=setting,
            k_scale=0.5,
            v_scale=0.25,
        )
    )
    check(key, [r.view(numpy_type) for r in ref_layer(cache, TABLE, lens, 0)])
    assert (key.kv_scale, value.kv_scale) == (0.5, 0.25)
    expected = ref_layer(cache, TABLE, lens, 1)[0].view(numpy_type).astype(np.float32) * 0.25
    assert np.array_equal(value.sequence(0, dequantize=True), expected)


@pytest.mark.parametrize(
    "scale",
    [0.5, 1, np.float32(0.5), np.array(0.5, np.float32), np.array([0.5, 0.5]), [0.5, 0.5]],
    ids=["float", "int", "np-scalar", "0-d", "per-head", "list"],
)
def test_scale_forms(scale: Any) -> None:
    cache = allocate((8, 2, 16, 128), LAYOUTS["LBNHC"], np.uint8, seed=19)
    key, _ = pair(
        hw.from_vllm(
            cache, TABLE, lens_for(16), backend="FLASH_ATTN", kv_cache_dtype="fp8", k_scale=scale
        )
    )
    assert key.kv_scale == float(np.asarray(scale).reshape(-1)[0])


def test_scale_torch_forms() -> None:
    torch = pytest.importorskip("torch")
    cache = allocate((8, 2, 16, 128), LAYOUTS["LBNHC"], np.uint8, seed=19)
    for scale in (torch.tensor(0.5), torch.tensor([0.5, 0.5])):
        key, _ = pair(
            hw.from_vllm(
                cache,
                TABLE,
                lens_for(16),
                backend="FLASH_ATTN",
                kv_cache_dtype="fp8",
                k_scale=scale,
            )
        )
        assert key.kv_scale == 0.5


def test_sliding_window_null_blocks_are_not_pages() -> None:
    block, window = 16, 20
    cache = allocate((8, 2, block, 128), LAYOUTS["LBNHC"], np.float16, seed=23)
    table = [[0, 0, 5, 1], [3, 7]]  # 2 * 16 tokens left the window of sequence 0
    lens = [3 * block + 5, block + 1]
    key, _ = pair(hw.from_vllm(cache, table, lens, backend="FLASH_ATTN", sliding_window=window))
    assert key.seq_lens is not None and key.seq_lens.tolist() == [block + 5, block + 1]
    assert key.metadata["vllm.skipped_tokens"] == [2 * block, 0]
    check(key, ref_layer(cache, [[5, 1], [3, 7]], [block + 5, block + 1], 0))
    with pytest.raises(hwe.IndexBufferError, match="null block"):
        hw.from_vllm(cache, table, lens, backend="FLASH_ATTN")
    with pytest.raises(hwe.IndexBufferError, match="window"):
        hw.from_vllm(
            cache, [[0, 0, 0, 1], [3, 7]], lens, backend="FLASH_ATTN", sliding_window=window
        )
    with pytest.raises(hwe.IndexBufferError, match="window"):
        hw.from_vllm(
            cache, [[5, 0, 2, 1], [3, 7]], lens, backend="FLASH_ATTN", sliding_window=window
        )


# -- landing into an engine cache -------------------------------------------------------------
@pytest.mark.parametrize("torch_target", [False, True])
@pytest.mark.parametrize(
    ("backend", "isa", "layout"),
    [("FLASH_ATTN", None, "LBNHC"), ("FLASH_ATTN", None, "LBHNC"), ("CPU_ATTN", "amx", "LBHNC"),
     ("CPU_ATTN", "vec", "LBHNC")],
)  # fmt: skip
def test_into_vllm(torch_target: bool, backend: str, isa: str | None, layout: str) -> None:
    block, heads, dim = 32, 2, 64
    dtype = ml_dtypes.bfloat16 if isa == "amx" else np.float16
    if backend == "CPU_ATTN":
        source, _, _ = cpu_cache(str(isa), 8, heads, block, dim, dtype, seed=29)
    else:
        source = allocate((8, heads, block, 2 * dim), LAYOUTS[layout], dtype, seed=29)
    lens = lens_for(block)
    kv: dict[str, Any] = {"backend": backend, "isa": isa}
    key, value = pair(hw.from_vllm(source, TABLE, lens, **kv))
    target = allocate((10, heads, block, 2 * dim), LAYOUTS[layout], dtype, seed=31)
    if backend == "CPU_ATTN":
        target = np.ascontiguousarray(target)
    before = target.copy()
    ids = [[9, 2, 4], [9, 8], [1], [3, 6]]
    if torch_target:
        torch = pytest.importorskip("torch")
        if dtype is ml_dtypes.bfloat16:
            pytest.skip("torch.from_numpy takes no bfloat16")
        into_vllm((key, value), torch.from_numpy(target), ids, **kv)
    else:
        into_vllm((key, value), target, ids, **kv)
    back_k, back_v = pair(hw.from_vllm(target, ids, lens, **kv))
    for a, b in ((back_k, key), (back_v, value)):
        assert all(same(x, y) for x, y in zip(a.sequences(), b.sequences(), strict=True))
    untouched = [b for b in range(10) if b not in (9, 2, 4, 8, 1, 3, 6)]
    assert same(target[untouched], before[untouched])
    # the partial last page of sequence 0 (block 4: 3 valid tokens) keeps its tail
    tail_k, _ = pair(hw.from_vllm(target, [[4]], [block], **kv))
    old_k, _ = pair(hw.from_vllm(before, [[4]], [block], **kv))
    assert same(tail_k.sequence(0)[3:], old_k.sequence(0)[3:])


@pytest.mark.parametrize(
    ("version", "backend"), [("0.22.0", "FLASH_ATTN"), ("0.24.0", "TRITON_ATTN")]
)
def test_into_vllm_older_eras(version: str, backend: str) -> None:
    source = allocate((2, 8, 16, 2, 64), (0, 1, 2, 3, 4), np.float16, seed=47)
    if version == "0.24.0":
        source = np.ascontiguousarray(source.transpose(1, 0, 2, 3, 4))
    kw: dict[str, Any] = {"backend": backend, "vllm_version": version}
    lens = lens_for(16)
    got = pair(hw.from_vllm(source, TABLE, lens, **kw))
    target = np.zeros_like(source)
    ids = [[7, 2, 4], [7, 6], [1], [3, 5]]
    into_vllm(got, target, ids, **kw)
    back = pair(hw.from_vllm(target, ids, lens, **kw))
    for a, b in zip(back, got, strict=True):
        assert all(same(x, y) for x, y in zip(a.sequences(), b.sequences(), strict=True))


def into_case() -> tuple[Any, Any, tuple[hw.BlockPagedTensor, hw.BlockPagedTensor]]:
    source = allocate((8, 2, 16, 128), LAYOUTS["LBNHC"], np.float16, seed=37)
    got = pair(hw.from_vllm(source, TABLE, lens_for(16), backend="FLASH_ATTN"))
    target = allocate((10, 2, 16, 128), LAYOUTS["LBNHC"], np.float16, seed=41)
    return source, target, got


IDS = [[9, 2, 4], [9, 8], [1], [3, 6]]


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"block_ids": [[9, 2, 10], [9, 8], [1], [3, 6]]}, hwe.IndexBufferError, "range"),
        ({"block_ids": [[9, 2, 0], [9, 8], [1], [3, 6]]}, hwe.IndexBufferError, "null"),
        (
            {"block_ids": [[9, 2, 4], [5, 8], [4], [3, 6]]},
            hwe.IndexBufferError,
            "two different",
        ),
        ({"block_ids": [[9, 2], [9, 8], [1], [3, 6]]}, hwe.IndexBufferError, "blocks"),
        ({"target_dtype": np.float32}, hwe.InvalidTensorError, "dtype"),
        ({"target_shape": (10, 2, 32, 128)}, hwe.InvalidTensorError, "page shape"),
        (
            {"backend": "CPU_ATTN", "isa": "vec"},
            hwe.InvalidTensorError,
            "CPU_ATTN|slab|dtype|block",
        ),
        ({"backend": "TRITON_MLA"}, hwe.InvalidTensorError, "fused"),
        ({"backend": None}, hwe.ArgumentTypeError, "backend"),
        ({"k_scale": 2.0}, hwe.InvalidTensorError, "scale"),
        ({"read_only": True}, hwe.ArgumentTypeError, "read-only"),
        ({"kv_cache_dtype": "fp8"}, hwe.InvalidTensorError, "kv_cache_dtype"),
    ],
)
def test_into_vllm_refuses_before_writing(change: dict[str, Any], error: type, match: str) -> None:
    _, target, got = into_case()
    if "target_dtype" in change:
        target = target.astype(change.pop("target_dtype"))
    if "target_shape" in change:
        target = values(change.pop("target_shape"), np.float16, seed=1)
    if change.pop("read_only", False):
        target.flags.writeable = False
    before = target.copy()
    kw: dict[str, Any] = {"block_ids": IDS, "backend": "FLASH_ATTN", **change}
    with pytest.raises(error, match=match):
        into_vllm(got, target, **kw)
    assert same(target, before)


def test_into_vllm_shared_prefix_page_once() -> None:
    _, target, got = into_case()
    into_vllm(got, target, IDS, backend="FLASH_ATTN")  # block 9 holds sequences 0 and 1's page
    back, _ = pair(hw.from_vllm(target, IDS, lens_for(16), backend="FLASH_ATTN"))
    assert all(same(a, b) for a, b in zip(back.sequences(), got[0].sequences(), strict=True))


def test_into_vllm_names_block_ids_in_its_errors() -> None:
    """from_table serves block_table and block_ids: its errors name the caller's argument."""
    key, value = pair(hw.from_vllm(LAYER, [[1]], [3], backend="FLASH_ATTN"))
    engine = np.zeros_like(LAYER)
    for ids, match in (([], "one row per sequence"), ([[]], "blocks"), (np.asarray(1), "2-D")):
        with pytest.raises(hw.HurrayWireError, match=match) as info:
            hw.into_vllm((key, value), engine, ids, backend="FLASH_ATTN")
        assert info.value.field == "block_ids"
    assert not engine.any()


def test_into_vllm_refuses_gpu_tensors() -> None:
    torch = pytest.importorskip("torch")
    _, target, got = into_case()
    meta = torch.empty(target.shape, dtype=torch.float16, device="meta")
    with pytest.raises(hwe.ArgumentTypeError, match="host memory") as info:
        into_vllm(got, meta, IDS, backend="FLASH_ATTN")
    assert info.value.field == "kv_cache"


# -- every refusal of from_vllm / to_vllm -----------------------------------------------------
LAYER = np.zeros((8, 2, 32, 128), np.float16)


def fa(**kw: Any) -> dict[str, Any]:
    return {"backend": "FLASH_ATTN", **kw}


def cpu(**kw: Any) -> dict[str, Any]:
    return {"backend": "CPU_ATTN", "isa": "vec", **kw}


FIVE = np.zeros((2, 8, 16, 2, 64), np.float16)
NHD_MEMORY = LAYER.transpose(0, 2, 1, 3).copy().transpose(0, 2, 1, 3)


@pytest.mark.parametrize(
    ("cache", "kw", "error", "match"),
    [
        (LAYER, {}, hwe.ArgumentTypeError, "backend is required"),
        (LAYER, {"backend": "FLASH_ATTENTION"}, hwe.ArgumentTypeError, "backend"),
        (LAYER, {"backend": 3}, hwe.ArgumentTypeError, "backend"),
        (LAYER, {"backend": "CPU_ATTN"}, hwe.ArgumentTypeError, "isa"),
        (LAYER, {"backend": "CPU_ATTN", "isa": "neon"}, hwe.InvalidTensorError, "not supported"),
        (LAYER, {"backend": "CPU_ATTN", "isa": "avx"}, hwe.ArgumentTypeError, "isa"),
        (LAYER, cpu(kv_role="key"), hwe.InvalidTensorError, "slab"),
        (LAYER, cpu(vllm_version="0.24"), hwe.InvalidTensorError, "0.26"),
        (LAYER[:, :, :16], cpu(), hwe.InvalidTensorError, "multiple"),
        (NHD_MEMORY, cpu(), hwe.InvalidTensorError, "contiguous"),
        (LAYER, fa(kv_cache_layout="NDH"), hwe.ArgumentTypeError, "kv_cache_layout"),
        (LAYER, fa(kv_cache_layout="LBNHC"), hwe.InvalidTensorError, "strides"),
        (LAYER, fa(vllm_version="0.24.0"), hwe.InvalidTensorError, "kv_role"),
        (LAYER, fa(vllm_version="v0.19.0"), hwe.InvalidTensorError, "0.20"),
        (LAYER, fa(vllm_version="latest"), hwe.ArgumentTypeError, "version"),
        (LAYER, fa(vllm_version=26), hwe.ArgumentTypeError, "version"),
        (LAYER[..., :127], {"backend": "FLASH_ATTN"}, hwe.InvalidTensorError, "even"),
        (LAYER, fa(kv_role="keys"), hwe.ArgumentTypeError, "kv_role"),
        (LAYER[0], fa(kv_role="key"), hwe.InvalidTensorError, "one-role"),
        (LAYER[0], {"backend": "FLASH_ATTN"}, hwe.InvalidTensorError, "4-D"),
        (FIVE, {"backend": "FLASH_ATTN"}, hwe.ArgumentTypeError, "vllm_version"),
        (FIVE, fa(vllm_version="0.30"), hwe.InvalidTensorError, "cross-layer"),
        (FIVE, fa(vllm_version="0.23.1"), hwe.InvalidTensorError, "allocates"),
        (FIVE, fa(vllm_version="0.21", kv_cache_layout="LHBNC"), hwe.ArgumentTypeError, "NHD"),
        (LAYER, {"backend": "FLASHMLA"}, hwe.InvalidTensorError, "MLA"),
        (LAYER[:, :1], {"backend": "FLASHMLA", "kv_role": "key"}, hwe.InvalidTensorError, "fused"),
        (LAYER[:, 0], {"backend": "FLASHMLA"}, hwe.InvalidTensorError, "MLA"),
        (LAYER.view(np.uint8), {"backend": "FLASH_ATTN"}, hwe.ArgumentTypeError, "kv_cache_dtype"),
        (LAYER.view(np.uint8), fa(kv_cache_dtype="int8"), hwe.ArgumentTypeError, "kv_cache_dtype"),
        (LAYER, fa(kv_cache_dtype="fp8"), hwe.InvalidTensorError, "kv_cache_dtype"),
        (LAYER.view(np.int16), fa(), hwe.InvalidTensorError, "integer"),
        (LAYER, fa(k_scale=True), hwe.ArgumentTypeError, "k_scale"),
        (LAYER, fa(k_scale="0.5"), hwe.ArgumentTypeError, "k_scale"),
        (LAYER, fa(v_scale=np.ones((2, 2))), hwe.ArgumentTypeError, "v_scale"),
        (LAYER, fa(k_scale=[0.5, 0.25]), hwe.InvalidTensorError, "differs"),
        (LAYER, fa(k_scale=-1.0), hwe.InvalidMetadataError, "kv_scale"),
        (LAYER, fa(sliding_window=0), hwe.ArgumentTypeError, "sliding_window"),
        ("cache", {"backend": "FLASH_ATTN"}, hwe.ArgumentTypeError, "kv_cache"),
    ],
)  # fmt: skip
def test_from_vllm_refuses(cache: Any, kw: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        hw.from_vllm(cache, [[1]], [3], **kw)


@pytest.mark.parametrize(
    ("table", "lens", "match"),
    [
        ([[9]], [3], "range"),
        ([[1]], [40], "blocks"),
        ([[-1]], [3], "negative"),
        ([[0]], [3], "null"),
    ],
)
def test_from_vllm_refuses_tables(table: Any, lens: Any, match: str) -> None:
    for backend, isa in (("FLASH_ATTN", None), ("CPU_ATTN", "vec")):
        with pytest.raises(hwe.IndexBufferError, match=match):
            hw.from_vllm(LAYER, table, lens, backend=backend, isa=isa)


@pytest.mark.parametrize("table", [np.asarray(1), 1, "1", b"1"])
def test_from_vllm_refuses_a_table_that_is_no_table(table: Any) -> None:
    """A 0-d array once reached len() and raised TypeError; now every such table is typed."""
    for backend, isa in (("FLASH_ATTN", None), ("CPU_ATTN", "vec")):
        with pytest.raises(hwe.ArgumentTypeError, match="2-D table or a list of lists"):
            hw.from_vllm(LAYER, table, [3], backend=backend, isa=isa)


def test_to_vllm_refuses() -> None:
    key, value = pair(hw.from_vllm(LAYER, [[1]], [3], backend="FLASH_ATTN"))
    fused = hw.from_vllm(LAYER[:, :1], [[1]], [3], backend="TRITON_MLA")
    with pytest.raises(hwe.ArgumentTypeError, match="backend"):
        hw.to_vllm((key, value), vllm_version="0.33.0")
    with pytest.raises(hwe.ArgumentTypeError, match="vllm_version"):
        hw.to_vllm((key, value), backend="FLASH_ATTN")
    with pytest.raises(hwe.ArgumentTypeError, match="kv_cache_layout"):
        hw.to_vllm((key, value), backend="FLASHINFER", vllm_version="0.33.0")
    with pytest.raises(hwe.InvalidTensorError, match="LBNHC"):
        hw.to_vllm(
            (key, value), backend="FLEX_ATTENTION", vllm_version="0.33.0", kv_cache_layout="HND"
        )
    with pytest.raises(hwe.ArgumentTypeError, match="NHD"):
        hw.to_vllm(
            (key, value), backend="FLASH_ATTN", vllm_version="0.22.0", kv_cache_layout="BLHNC"
        )
    with pytest.raises(hwe.InvalidTensorError, match="CPU_ATTN"):
        hw.to_vllm((key, value), backend="CPU_ATTN", vllm_version="0.25.0", isa="vec")
    with pytest.raises(hwe.ArgumentTypeError, match="isa"):
        hw.to_vllm((key, value), backend="CPU_ATTN", vllm_version="0.33.0")
    with pytest.raises(hwe.InvalidTensorError, match="fused"):
        hw.to_vllm((key, value), backend="FLASHMLA", vllm_version="0.33.0")
    with pytest.raises(hwe.InvalidTensorError, match="pair"):
        hw.to_vllm(fused, backend="FLASH_ATTN", vllm_version="0.33.0")
    with pytest.raises(hwe.InvalidTensorError):
        hw.to_vllm((value, key), backend="FLASH_ATTN", vllm_version="0.33.0")
    with pytest.raises(hwe.InvalidTensorError, match="max_blocks"):
        hw.to_vllm((key, value), backend="FLASH_ATTN", vllm_version="0.33.0", max_blocks=0)


def test_backend_named_by_class_or_enum() -> None:
    class CPUAttentionBackend:
        @staticmethod
        def get_name() -> str:
            return "CPU_ATTN"

    class Member:
        name, value = "FLASH_ATTN", "vllm.v1.attention.backends.flash_attn.FlashAttentionBackend"

    cache, keys, _ = cpu_cache("vec", 4, 1, 32, 64, np.float16, seed=43)
    key, _ = pair(hw.from_vllm(cache, [[1]], [32], backend=CPUAttentionBackend, isa="vec"))
    assert same(key.sequence(0), keys[1])
    flash, _ = pair(hw.from_vllm(cache, [[1]], [32], backend=Member()))
    assert same(flash.sequence(0), cache[1].transpose(1, 0, 2)[:, :, :64])


def test_from_vllm_results_are_typed_by_backend() -> None:
    """``k, v = from_vllm(..., backend=...)`` type-checks (mypy --strict runs over tests):
    a standard backend gives a pair, an MLA backend or ``kv_role`` one tensor."""
    memory = np.arange(4 * 16 * 2 * 32, dtype=np.float16).reshape(4, 16, 2, 32)  # [N, B, H, 2D]
    layer = memory.transpose(0, 2, 1, 3)  # the logical [N, H, B, 2D] vLLM hands connectors
    k, v = hw.from_vllm(layer, [[1]], [3], backend="FLASH_ATTN")
    assert (k.kv_role, v.kv_role) == ("key", "value")
    one: hw.BlockPagedTensor = hw.from_vllm(  # one role's view [N, B, H, D]
        memory[..., 16:], [[1]], [3], backend="TRITON_ATTN", kv_role="value"
    )
    assert np.array_equal(one.sequence(0), v.sequence(0))
    mla = np.zeros((4, 1, 16, 576), np.float16)
    latent: hw.BlockPagedTensor = hw.from_vllm(mla, [[1]], [3], backend="TRITON_MLA")
    assert latent.kv_role == "fused"


# -- the kernel-block split: scheduler (manager) block ids -> kernel blocks -------------------
def kernel_rows(table: list[list[int]], ratio: int) -> list[list[int]]:
    """vLLM's ``map_to_kernel_block_table`` (vllm/v1/worker/utils.py): block ``b`` -> kernel
    blocks ``b * ratio + j``, j in 0 .. ratio - 1."""
    return [[b * ratio + j for b in row for j in range(ratio)] for row in table]


KERNEL = 16  # the cache's own block axis
SPLIT = allocate((16, 2, KERNEL, 32), LAYOUTS["LBNHC"], np.float16, seed=53)


@pytest.mark.parametrize(
    ("block_size", "table", "lens", "kernel_ids"),
    [
        (None, [[5]], [1], [[5]]),  # no block_size: ids are the tensor's own blocks
        (16, [[5]], [16], [[5]]),  # block_size == kernel block size: ratio 1
        (64, [[3]], [1], [[12]]),  # one token: kernel block b * 4
        (64, [[3]], [16], [[12]]),  # one full kernel block
        (64, [[3]], [17], [[12, 13]]),  # one token into the next kernel block
        (64, [[3]], [64], [[12, 13, 14, 15]]),  # the whole manager block
        (64, [[1, 3]], [65], [[4, 5, 6, 7, 12]]),  # into the second manager block
        (32, [[7, 2], [7]], [40, 17], [[14, 15, 4], [14, 15]]),  # shared manager block
        (32, np.array([[7, 2, 0], [6, 0, 0]], np.int32), [64, 5], [[14, 15, 4, 5], [12]]),
    ],
)
def test_kernel_block_translation(
    block_size: int | None, table: Any, lens: list[int], kernel_ids: list[list[int]]
) -> None:
    key, value = pair(hw.from_vllm(SPLIT, table, lens, backend="FLASH_ATTN", block_size=block_size))
    check(key, ref_layer(SPLIT, kernel_ids, lens, 0))
    check(value, ref_layer(SPLIT, kernel_ids, lens, 1))
    target = np.zeros_like(SPLIT)
    into_vllm((key, value), target, table, backend="FLASH_ATTN", block_size=block_size)
    written = sorted({b for row in kernel_ids for b in row})
    assert target[written].any() and not np.delete(target, written, axis=0).any()
    back, _ = pair(hw.from_vllm(target, kernel_ids, lens, backend="FLASH_ATTN"))
    check(back, ref_layer(SPLIT, kernel_ids, lens, 0))


def test_kernel_blocks_read_without_block_size_are_wrong() -> None:
    """The control: manager ids read as kernel blocks (or with another ratio) give other
    values than the attention reads."""
    lens, table = [30], [[3, 5]]
    want = ref_layer(SPLIT, kernel_rows(table, 4), lens, 0)
    for block_size in (None, 32):
        key, _ = pair(hw.from_vllm(SPLIT, table, lens, backend="FLASH_ATTN", block_size=block_size))
        assert not same(key.sequence(0), want[0])


@pytest.mark.parametrize("layout", ["LBNHC", "LBHNC"])
@pytest.mark.parametrize("backend", ["FLASHINFER", "FLASHINFER_MLA", "CPU_ATTN"])
def test_to_vllm_kernel_block_allocation(layout: str, backend: str) -> None:
    """``to_vllm(block_size=)`` allocates ``num_blocks * ratio`` kernel blocks, the table in
    manager blocks; read back through the translation it gives the pages it was given."""
    kw: dict[str, Any] = {"backend": backend, "kv_cache_layout": layout}
    if backend == "FLASHINFER_MLA":
        source: Any = values((9, 1, 32, 64), np.float16, seed=59)
        kw.pop("kv_cache_layout")
    elif backend == "CPU_ATTN":
        if layout != "LBHNC":
            pytest.skip("CPU_ATTN supports LBHNC only")
        source, _, _ = cpu_cache("vec", 9, 2, 32, 32, np.float16, seed=59)
        kw["isa"] = "vec"
    else:
        source = allocate((9, 2, 32, 64), LAYOUTS[layout], np.float16, seed=59)
    table, lens = [[3, 5, 1], [3], [2, 7, 8]], [70, 20, 96]
    got = hw.from_vllm(source, table, lens, **kw)
    out, out_table, out_lens = hw.to_vllm(got, vllm_version="0.33.0", block_size=128, **kw)
    # 2 + 1 + 1 manager blocks of 128 tokens, each 4 kernel blocks of 32; block 0 the null
    assert out.shape[0] == 4 * 4 and not out[:4].any()
    assert out_table.tolist() == [[1], [2], [3]] and out_lens.tolist() == lens
    back = hw.from_vllm(out, out_table, out_lens, block_size=128, **kw)
    pairs = zip(back, got, strict=True) if isinstance(got, tuple) else [(back, got)]
    for a, b in pairs:
        assert isinstance(a, hw.BlockPagedTensor) and isinstance(b, hw.BlockPagedTensor)
        assert all(same(x, y) for x, y in zip(a.sequences(), b.sequences(), strict=True))
    wide = hw.to_vllm(got, vllm_version="0.33.0", block_size=64, max_blocks=3, **kw)[1]
    assert wide.tolist() == [[1, 2, 0], [3, 0, 0], [4, 5, 0]]


def test_kernel_blocks_sliding_window() -> None:
    """A manager null block is kernel blocks 0 .. ratio - 1: dropped as one window block."""
    lens = [3 * 32 + 5]
    key, _ = pair(
        hw.from_vllm(
            SPLIT, [[0, 3, 5, 6]], lens, backend="FLASH_ATTN", block_size=32, sliding_window=40
        )
    )
    assert key.metadata["vllm.skipped_tokens"] == [32]
    check(key, ref_layer(SPLIT, [[6, 7, 10, 11, 12]], [2 * 32 + 5], 0))
    with pytest.raises(hwe.IndexBufferError, match="null block"):
        hw.from_vllm(SPLIT, [[0, 3, 5, 6]], lens, backend="FLASH_ATTN", block_size=32)


@pytest.mark.parametrize(
    ("cache", "table", "kw", "error", "match"),
    [
        (SPLIT, [[1]], {"block_size": 24}, hwe.InvalidTensorError, "24.*not a multiple.*16"),
        (SPLIT, [[1]], {"block_size": 8}, hwe.InvalidTensorError, "8.*not a multiple.*16"),
        (SPLIT, [[1]], {"block_size": 0}, hwe.InvalidTensorError, "block_size"),
        (SPLIT, [[1]], {"block_size": "64"}, hwe.ArgumentTypeError, "block_size"),
        (SPLIT[:15], [[1]], {"block_size": 64}, hwe.InvalidTensorError, "num_blocks \\* 4"),
        (SPLIT, [[4]], {"block_size": 64}, hwe.IndexBufferError, "range"),
        (SPLIT, [[0]], {"block_size": 64}, hwe.IndexBufferError, "null block"),
        (SPLIT, [[1]], {"block_size": 64, "kv_cache_layout": "BLNHC"}, hwe.InvalidTensorError,
         "LBNHC"),
    ],
)  # fmt: skip
def test_kernel_block_refusals(
    cache: Any, table: Any, kw: dict[str, Any], error: type[hw.HurrayWireError], match: str
) -> None:
    with pytest.raises(error, match=match) as info:
        hw.from_vllm(cache, table, [3], backend="FLASH_ATTN", **kw)
    if "range" in match:
        assert info.value.expected == "< 4"  # manager blocks: 16 kernel blocks / 4
    key, value = pair(hw.from_vllm(SPLIT, [[1]], [3], backend="FLASH_ATTN"))
    target = np.zeros_like(cache)
    land = {k: v for k, v in kw.items() if k != "kv_cache_layout"}
    if "kv_cache_layout" not in kw:
        with pytest.raises(error, match=match):
            into_vllm((key, value), target, table, backend="FLASH_ATTN", **land)
        assert not target.any()


@pytest.mark.parametrize(
    ("isa", "block", "dim"), [("vec", 32, 32), ("vec16", 16, 48), ("amx", 32, 64)]
)
def test_cpu_role_views_are_the_slab_index(isa: str, block: int, dim: int) -> None:
    """The strided CPU_ATTN views hold each token's key and value where the slab index (the
    kernel's loops) says: element for element on a cache of distinct values."""
    from hurray_wire.adapters import _vllm_forms as forms

    cache = np.arange(3 * 2 * block * 2 * dim, dtype=np.uint16).reshape(3, 2, block, 2 * dim)
    slabs = cache.reshape(3, 2, -1)
    for view, index in zip(forms.cpu_role_views(cache, isa), forms.cpu_slab_index(isa, block, dim),
                           strict=True):  # fmt: skip
        pages = np.ascontiguousarray(view).reshape(3, block, 2, dim)
        np.testing.assert_array_equal(pages, slabs[:, :, index].transpose(0, 2, 1, 3))


@pytest.mark.parametrize(
    ("backend", "shape", "layout", "takes"),
    [
        ("FLASH_ATTN", (4, 2, 1, 128), "LHBNC", "multiples of 16"),  # was: "pass kv_role"
        ("FLASH_ATTN", (4, 2, 1, 128), "LBNHC", "multiples of 16"),
        ("TRITON_ATTN", (4, 2, 8, 128), "LBHNC", "multiples of 16"),
        ("FLASHINFER", (4, 2, 48, 128), "LBNHC", "16, 32, 64, 128"),
        ("FLASHMLA", (4, 1, 32, 576), "LBNHC", "64"),
        ("CUTLASS_MLA", (4, 1, 64, 576), "LBNHC", "128"),
        ("CPU_MLA", (4, 1, 32, 576), "LBNHC", "16"),
    ],
)
def test_block_sizes_no_kernel_takes_are_refused(
    backend: str, shape: tuple[int, ...], layout: str, takes: str
) -> None:
    """vLLM allocates only kernel block sizes the backend takes (its
    get_supported_kernel_block_sizes); any other is refused saying so, by all three."""
    cache = allocate(shape, LAYOUTS[layout], np.float16, seed=61)
    before = cache.copy()
    match = f"{backend}'s kernels take no {shape[2]}-token blocks \\(only {takes}"
    with pytest.raises(hwe.InvalidTensorError, match=match):
        hw.from_vllm(cache, [[1]], [1], backend=backend, kv_cache_layout=layout)
    mla = "MLA" in backend
    pages = values((2, shape[2], 1 if mla else shape[1], shape[3] if mla else shape[3] // 2),
                   np.float16, seed=3)  # fmt: skip
    roles = ("fused",) if mla else ("key", "value")
    made = [hw.BlockPagedTensor.from_arrays(pages, [0, 1], [0, 2], kv_role=r) for r in roles]
    given: Any = made[0] if mla else (made[0], made[1])
    with pytest.raises(hwe.InvalidTensorError, match=match):
        into_vllm(given, cache, [[1, 2]], backend=backend)
    assert same(cache, before)  # nothing written
    with pytest.raises(hwe.InvalidTensorError, match=match):
        hw.to_vllm(given, backend=backend, vllm_version="0.33.0", kv_cache_layout=layout)


def test_block_size_rule_is_vllm_0_26_and_later() -> None:
    """The table is vLLM 0.33's; an older era's cache is read at any block size."""
    old = allocate((2, 6, 8, 2, 64), (0, 1, 2, 3, 4), np.float16, seed=71)
    key, _ = pair(hw.from_vllm(old, [[1, 2]], [12], backend="FLASH_ATTN", vllm_version="0.22.0"))
    assert same(key.sequence(0), np.concatenate([old[0, 1], old[0, 2, :4]]))


@pytest.mark.parametrize(
    ("setting", "cache", "backend", "why"),
    [
        ("fp8_per_token_head", LAYER.view(np.uint8)[..., :136], "TRITON_ATTN", "float32 scale"),
        ("int8_per_token_head", LAYER.view(np.int8)[..., :136], "TRITON_ATTN", "float32 scale"),
        ("int4_per_token_head", LAYER.view(np.uint8)[..., :72], "TRITON_ATTN", "float32 scale"),
        ("fp8_ds_mla", np.zeros((4, 1, 64, 656), np.uint8), "FLASHMLA", "656-byte"),
        ("nvfp4", LAYER.view(np.uint8), "FLASHINFER", "fp4"),
        ("turboquant_k8v4", LAYER.view(np.uint8), "TRITON_ATTN", "Lloyd-Max"),
    ],
)
def test_page_quantized_cache_dtypes_are_not_supported(
    setting: str, cache: Any, backend: str, why: str
) -> None:
    """vLLM's quantized settings whose pages hold scales or codes inline: "not supported",
    with what the page holds (not "kv_cache_dtype must be vLLM's fp8 setting")."""
    match = f"kv_cache_dtype '{setting}' is not supported: .*{why}"
    with pytest.raises(hwe.InvalidTensorError, match=match) as info:
        hw.from_vllm(cache, [[1]], [1], backend=backend, kv_cache_dtype=setting)
    assert info.value.field == "kv_cache_dtype"
    given: Any = (
        hw.from_vllm(LAYER[:, :1], [[1]], [1], backend="TRITON_MLA")
        if "MLA" in backend
        else pair(hw.from_vllm(LAYER, [[1]], [1], backend="FLASH_ATTN"))
    )
    with pytest.raises(hwe.InvalidTensorError, match=match):
        into_vllm(given, cache.copy(), [[1]], backend=backend, kv_cache_dtype=setting)
