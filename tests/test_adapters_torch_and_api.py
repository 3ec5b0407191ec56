"""The torch adapter (DLPack, every torch element type), the reference-API ``Tensor``, the
guide's Python examples, and the top-level exports."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import hurray_wire as hurray
from tests.adapter_reference import random_batch, ref_tensor_sequences
from tests.conftest import ROOT

ADAPTER_NAMES = [
    "from_vllm",
    "to_vllm",
    "into_vllm",
    "from_flashinfer",
    "to_flashinfer",
    "from_sglang",
    "from_sglang_mla",
    "to_sglang",
    "to_sglang_mla",
    "from_torch",
    "to_torch",
    "merge_heads",
    "Tensor",
]


def test_top_level_exports_and_no_torch_import() -> None:
    for name in ADAPTER_NAMES:
        assert name in hurray.__all__ and hasattr(hurray, name)
    code = "import sys, hurray_wire; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# -- torch ------------------------------------------------------------------------------------
TORCH_TYPES = [
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "bool",
    "float8_e4m3fn",
    "float8_e5m2",
    "complex64",
    "complex128",
]


@pytest.mark.parametrize("name", TORCH_TYPES)
def test_from_arrays_takes_torch_without_copies(name: str) -> None:
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, name)
    raw = torch.randn(3, 4, 2, 8) * 4
    pool = raw.to(dtype) if not dtype.is_complex else raw.to(dtype) * (1 + 1j)
    bt = torch.tensor([2, 0], dtype=torch.int32)
    sp = torch.tensor([0, 2], dtype=torch.int64)
    t = hurray.BlockPagedTensor.from_arrays(pool, bt, sp, seq_lens=torch.tensor([7]))
    out = hurray.to_torch(t)
    assert set(out) == {"page_pool", "block_table", "seq_ptr", "seq_lens"}
    assert out["page_pool"].dtype == dtype and torch.equal(out["page_pool"], pool)
    if name != "bool":  # bool is bit-packed on the wire: unpacked, a copy
        assert out["page_pool"].data_ptr() == pool.data_ptr()  # no copy, both ways
    assert out["block_table"].tolist() == [2, 0] and out["seq_lens"].tolist() == [7]
    back = hurray.from_torch(
        out["page_pool"], out["block_table"], out["seq_ptr"], seq_lens=out["seq_lens"]
    )
    assert back.descriptor == t.descriptor


def test_to_torch_quantized_and_packed() -> None:
    torch = pytest.importorskip("torch")
    import ml_dtypes

    rng = np.random.default_rng(0)
    pool = rng.integers(-8, 8, (2, 4, 1, 8)).astype(ml_dtypes.int4)
    q = hurray.PerBlockAffine(0, 4, 3, hurray.bfloat16, 4)
    scales = np.ones(8, ml_dtypes.bfloat16)
    zps = np.arange(8, dtype=np.int32)
    t = hurray.BlockPagedTensor.from_arrays(
        pool, [1], [0, 1], quantization=q, scales=scales, zero_points=zps
    )
    out = hurray.to_torch(t)
    assert out["scales"].dtype == torch.bfloat16 and out["zero_points"].tolist() == list(range(8))
    assert out["page_pool"].dtype == torch.int8
    assert np.array_equal(out["page_pool"].numpy(), pool.astype(np.int8))
    with pytest.raises(hurray.errors.ArgumentTypeError):
        hurray.to_torch(pool)  # type: ignore[arg-type]


def test_torch_strided_and_engine_inputs() -> None:
    torch = pytest.importorskip("torch")
    b = random_batch(np.random.default_rng(1), page_size=16, heads=4, head_dim=64)
    # vLLM 0.20-0.22's [2, num_blocks, B, H, D]; block 0 is vLLM's null block, so pages
    # shift by one.
    pool = np.concatenate((np.zeros_like(b.pool[:1]), b.pool))
    cache = torch.from_numpy(np.stack((pool, pool))).to(torch.bfloat16)
    table = torch.from_numpy(b.padded() + 1)
    era: dict[str, Any] = {"backend": "FLASH_ATTN", "vllm_version": "0.22.0"}
    pair = hurray.from_vllm(cache, table, torch.tensor(b.lens), **era)
    assert isinstance(pair, tuple)
    key, value = pair
    assert key.element_type == hurray.bfloat16
    out = hurray.to_vllm((key, value), **era)[0]
    again = hurray.from_vllm(out, hurray.to_vllm((key, value), **era)[1], b.lens, **era)
    assert isinstance(again, tuple)
    again_k = again[0]
    assert all(
        np.array_equal(x.view(np.uint16), y.view(np.uint16))
        for x, y in zip(again_k.sequences(), key.sequences(), strict=True)
    )
    strided = cache.transpose(2, 3).contiguous().transpose(2, 3)  # HND memory, logical shape
    strided_pair = hurray.from_vllm(strided, table, b.lens, kv_cache_layout="HND", **era)
    assert isinstance(strided_pair, tuple)
    k2, _ = strided_pair
    assert all(  # strided: the referenced pages only, the same tokens
        np.array_equal(a.view(np.uint16), b.view(np.uint16))
        for a, b in zip(k2.sequences(), key.sequences(), strict=True)
    )
    fi = hurray.to_flashinfer(key)
    again = hurray.from_flashinfer(
        torch.from_numpy(fi[0].view(np.uint16)).view(torch.bfloat16),
        *(torch.from_numpy(a) for a in fi[1:]),
        kv_role="key",
    )
    assert isinstance(again, hurray.BlockPagedTensor) and again.descriptor == key.descriptor
    k_buf = torch.zeros(32, 2, 8, dtype=torch.float8_e4m3fn)
    req = torch.tensor([[0, 0, 0], [16, 17, 18]], dtype=torch.int32)
    sk, _ = hurray.from_sglang(k_buf, k_buf, req, torch.tensor([1]), torch.tensor([3]),
                               page_size=16)  # fmt: skip
    assert sk.element_type == hurray.float8_e4m3
    with pytest.warns(UserWarning), pytest.raises(hurray.errors.ArgumentTypeError):
        hurray.BlockPagedTensor.from_arrays(
            torch.zeros(1, 1, 1, 1, dtype=torch.complex32), [0], [0, 1]
        )


# -- reference API ----------------------------------------------------------------------------
def test_reference_tensor_builds_a_block_paged_tensor() -> None:
    b = random_batch(np.random.default_rng(2), num_pages=5, page_size=4, heads=2, head_dim=8)
    layout = hurray.BlockPagedLayout(
        page_size=4, num_pages=5, paged_axis=0, num_seqs=len(b.lens), kv_role="key", layer_index=3
    )
    tokens = sum(b.lens)
    bt = np.array(b.block_table(), np.uint32).tobytes()
    sp = np.array(b.seq_ptr(), np.uint32).tobytes()
    t = hurray.Tensor(
        b.pool.tobytes(),
        hurray.float16,
        [tokens, 2, 8],
        aux_buffers=[bt, sp],
        layout=layout,
        seq_lens=b.lens,
    )
    assert t.buffer_count == 3 and t.layout is layout and t.shape == (tokens, 2, 8)
    assert t.element_type == hurray.float16 and t.quantization is None
    bp = t.to_block_paged()
    assert isinstance(bp, hurray.BlockPagedTensor) and bp.layout == layout
    for a, e in zip(bp.sequences(), ref_tensor_sequences(bp), strict=True):
        assert np.array_equal(a, e)
    assert np.array_equal(bp.page_pool, b.pool)
    again = hurray.Tensor.from_block_paged(bp)
    assert again.to_block_paged().descriptor == bp.descriptor
    assert "Tensor(float16" in repr(t)


def test_reference_tensor_with_quantization_buffers() -> None:
    layout = hurray.BlockPagedLayout(page_size=4, num_pages=2, paged_axis=0, num_seqs=1)
    q = hurray.PerBlockAffine.asymmetric(
        axis=0,
        block_size=4,
        scale_buffer_index=3,
        zero_point_buffer_index=4,
        scale_type=hurray.float16,
    )
    pool = (np.arange(128) - 64).astype(np.int8).tobytes()
    aux = [
        np.array([1], "<u4").tobytes(),
        np.array([0, 1], "<u4").tobytes(),
        np.full(8, 0.5, np.float16).tobytes(),
        np.zeros(8, np.int32).tobytes(),
    ]
    t = hurray.Tensor(pool, hurray.int8, [4, 2, 8], aux_buffers=aux, layout=layout, quantization=q)
    assert t.buffer_count == 5
    bp = t.to_block_paged()
    assert np.array_equal(bp.dequantize()[1], np.arange(0, 64).reshape(4, 2, 8) * 0.5)


def test_reference_tensor_refuses() -> None:
    layout = hurray.BlockPagedLayout(page_size=4, num_pages=5, paged_axis=0, num_seqs=2)
    pool = bytes(5 * 4 * 2 * 8 * 2)
    bt = np.array([0, 1, 0], "<u4").tobytes()
    sp = np.array([0, 2, 3], "<u4").tobytes()
    hurray.Tensor(pool, hurray.float16, [9, 2, 8], aux_buffers=[bt, sp], layout=layout)
    cases: list[tuple[tuple[Any, ...], dict[str, Any], type]] = [
        (
            (pool[:-2], hurray.float16, [9, 2, 8]),
            {"aux_buffers": [bt, sp]},
            hurray.errors.InvalidTensorError,
        ),
        (
            (pool, hurray.float16, [9, 2]),
            {"aux_buffers": [bt, sp]},
            hurray.errors.InvalidDescriptorError,
        ),
        (
            (pool, hurray.float16, [9, 2, 8]),
            {"aux_buffers": [bt]},
            hurray.errors.InvalidTensorError,
        ),
        (
            (pool, hurray.float16, [9, 2, 8]),
            {"aux_buffers": [bt[:-1], sp]},
            hurray.errors.InvalidTensorError,
        ),
        (
            (pool, hurray.float16, [9, 2, 8]),
            {"aux_buffers": [bt, sp, sp]},
            hurray.errors.InvalidTensorError,
        ),
        ((pool, hurray.float16, [9, 2, 8]), {"aux_buffers": bt}, hurray.errors.ArgumentTypeError),
        (
            (pool, hurray.float16, [9, 2, 8]),
            {"aux_buffers": [bt, 5]},
            hurray.errors.ArgumentTypeError,
        ),
        (
            ("pool", hurray.float16, [9, 2, 8]),
            {"aux_buffers": [bt, sp]},
            hurray.errors.ArgumentTypeError,
        ),
        (
            (pool, hurray.float16, [9, 2, 8]),
            {"aux_buffers": [bt, sp], "layout": "bp"},
            hurray.errors.ArgumentTypeError,
        ),
    ]
    for args, kw, error in cases:
        with pytest.raises(error):
            hurray.Tensor(*args, **{"layout": layout, **kw})
    bad_sp = np.array([0, 2, 4], "<u4").tobytes()
    t = hurray.Tensor(pool, hurray.float16, [9, 2, 8], aux_buffers=[bt, bad_sp], layout=layout)
    with pytest.raises(hurray.errors.IndexBufferError):
        t.to_block_paged()
    bad_bt = np.array([0, 5, 0], "<u4").tobytes()
    t = hurray.Tensor(pool, hurray.float16, [9, 2, 8], aux_buffers=[bad_bt, sp], layout=layout)
    with pytest.raises(hurray.errors.IndexBufferError):
        t.to_block_paged()
    for lens in ([9, 0], [-1, 10], [[6, 3]]):
        t = hurray.Tensor(
            pool, hurray.float16, [9, 2, 8], aux_buffers=[bt, sp], layout=layout, seq_lens=lens
        )
        with pytest.raises(hurray.errors.IndexBufferError):
            t.to_block_paged()


# -- the guide's Python examples (block-paged-kv-cache-guide.md) ------------------------------
def test_guide_layout_examples() -> None:
    layout = hurray.BlockPagedLayout(
        page_size=4,
        num_pages=5,
        paged_axis=0,
        num_seqs=2,
        kv_role="key",
        layer_index=3,
        block_table_index_type="uint32",
    )
    assert layout.tag == 0x0A and layout.buffer_count == 3
    layout.validate_against_shape([9, 2, 8])
    with pytest.raises(hurray.errors.InvalidDescriptorError):
        layout.validate_against_shape([9, 2])
    layout.validate_index_buffers(seq_ptr=[0, 2, 3], block_table=[0, 1, 0])
    layout.validate_index_buffers([0, 2, 3], [0, 1, 0])  # positional: (seq_ptr, block_table)
    with pytest.raises(hurray.errors.InvalidDescriptorError):
        layout.validate_index_buffers(seq_ptr=[0, 2, 3], block_table=[0, 5, 0])
    with pytest.raises(hurray.errors.IndexBufferError):
        layout.validate_index_buffers([0, 2, 3], [0, 5, 0])
    with pytest.raises(hurray.errors.IndexBufferError):  # block_table given as seq_ptr: refused
        layout.validate_index_buffers([0, 1, 0], [0, 2, 3])


def test_guide_quantization_examples_and_scheme_tags() -> None:
    layout = hurray.BlockPagedLayout(page_size=4, num_pages=5, paged_axis=0, num_seqs=2)
    layout.validate_quantization_compatibility(
        hurray.PerBlockAffine.symmetric(
            axis=0, block_size=4, scale_buffer_index=3, scale_type=hurray.float32
        )
    )
    for incompatible in (
        hurray.PerBlockAffine.symmetric(
            axis=0, block_size=8, scale_buffer_index=3, scale_type=hurray.float32
        ),
        hurray.PerChannelAffine.symmetric(axis=0, scale_buffer_index=3),
    ):
        with pytest.raises(hurray.errors.InvalidDescriptorError):
            layout.validate_quantization_compatibility(incompatible)
    for tag in (0x03, 0x02, 1, True, "per_block_affine"):
        with pytest.raises(hurray.errors.InvalidDescriptorError, match="PerBlockAffine") as info:
            layout.validate_quantization_compatibility(tag)  # type: ignore[arg-type]
        assert "PerTensorAffine" in str(info.value) and "PerChannelAffine" in str(info.value)


@pytest.mark.parametrize("axes", [(0, 1, 2, 3), (0, 2, 1, 3), (2, 0, 1, 3), (0, 1, 3, 2)])
def test_rows_gathered_and_scattered_in_chunks_equal_fancy_indexing(axes: tuple[int, ...]) -> None:
    """``gather_rows`` / ``scatter_rows`` over strided views (a vLLM cache's head-major pages,
    a CPU slab's element-strided keys): NumPy's fancy indexing element for element, over
    more rows than one chunk holds, every other row untouched."""
    from hurray_wire._interop import GATHER_CHUNK, gather_rows, scatter_rows

    shape = (3 * GATHER_CHUNK // (16 * 4 * 8 * 2) + 5, 16, 4, 8)
    memory = np.arange(np.prod(shape), dtype=np.uint16).reshape([shape[a] for a in axes])
    view = memory.transpose([axes.index(a) for a in range(4)])[:, :, :, :5]
    ids = np.random.default_rng(1).permutation(len(view))[: len(view) - 3]
    taken = gather_rows(view, ids)
    assert taken.flags.c_contiguous and np.array_equal(taken, view[ids])
    expected, target = memory.copy(), memory.copy()
    logical = [a.transpose([axes.index(x) for x in range(4)]) for a in (expected, target)]
    rows = [taken + 1, np.ascontiguousarray(logical[0][:, :, :, 5:][ids]) + 2]  # keys, values
    logical[0][:, :, :, :5][ids] = rows[0]
    logical[0][:, :, :, 5:][ids] = rows[1]
    scatter_rows([logical[1][:, :, :, :5], logical[1][:, :, :, 5:]], ids, rows)
    assert np.array_equal(target, expected)
