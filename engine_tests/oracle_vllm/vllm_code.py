"""vLLM 0.33.0's own code, run on CPU, as the oracle of hurray-wire's vLLM adapter.

Caches come from vLLM's ``allocate_kv_cache`` (vllm/v1/worker/utils.py) over a
``KVCacheConfig`` planned by vLLM's ``get_kv_cache_config_from_groups``
(vllm/v1/core/kv_cache_planning.py); block ids from vLLM's ``BlockPool`` (block 0 is its
null block) and tables from its worker ``BlockTable``. Where a backend's read is an inline
expression inside a CUDA-only ``forward``, ``VIEWS`` restates it with the file it comes from,
and ``test_view_expressions_are_vllms`` checks the installed file still says exactly that.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager

try:
    from vllm.v1.core.kv_cache_planning import get_kv_cache_config_from_groups
except ImportError:  # vllm(-cpu) 0.32: the same function in kv_cache_utils
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheGroupSpec,
    MLAAttentionSpec,
)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.worker.block_table import BlockTable
from vllm.v1.worker.utils import AttentionGroup, allocate_kv_cache, select_common_block_size

LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")

#: The backends' reads of one layer's cache (vllm 0.33.0), as (module, source text).
VIEWS = {
    "FLASH_ATTN": (
        "vllm.v1.attention.backends.flash_attn",
        "kv_cache.transpose(1, 2).split(self.head_size, dim=-1)",
    ),
    "TRITON_ATTN": (
        "vllm.v1.attention.backends.triton_attn",
        "kv_cache.transpose(1, 2).split(self.head_size, dim=-1)",
    ),
    "FLEX_ATTENTION": (
        "vllm.v1.attention.backends.flex_attention",
        "kv_cache.transpose(1, 2).split(self.head_size, dim=-1)",
    ),
    "FLASHINFER": (
        "vllm.v1.attention.backends.flashinfer",
        "kv_cache_permute = kv_cache.permute(*stride_order)",
    ),
    "CPU_ATTN": (
        "vllm.v1.attention.backends.cpu_attn",
        "kv_cache = kv_cache.view((num_blocks, num_kv_heads, block_size * 2, -1))",
    ),
    "MLA": (
        "vllm.model_executor.layers.attention.mla_attention",
        "self.kv_cache = kv_cache.squeeze(1)",
    ),
}
FLASHINFER_SPLIT = "kv_cache_tuple = kv_cache_permute.split(hs, dim=-1)"
CPU_CHUNK = "key_cache, value_cache = kv_cache.chunk(2, dim=2)"


def source_of(module: str) -> str:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).read_text(encoding="utf-8")


def plan(spec: Any, layout: KVCacheLayout, num_blocks: int) -> Any:
    """vLLM's KVCacheConfig for two layers of ``spec`` under ``layout``."""
    config = SimpleNamespace(
        cache_config=SimpleNamespace(
            get_resolved_kv_cache_layout=lambda: layout,
            num_gpu_blocks_override=num_blocks,
            prefix_cache_retention_interval=None,
        ),
        attention_config=SimpleNamespace(hisparse_config=None),
    )
    groups = [KVCacheGroupSpec(list(LAYERS), spec)]
    return get_kv_cache_config_from_groups(config, groups, 1 << 40)  # type: ignore[arg-type]


def allocate(
    spec: Any, layout: KVCacheLayout, num_blocks: int, kernel_block_size: int | None = None
) -> dict[str, torch.Tensor]:
    """Every layer's cache, as vLLM allocates it on this device (CPU); in kernel blocks
    when ``kernel_block_size`` (the worker's ``allocate_kv_cache(..., kernel_block_sizes)``)."""
    sizes = None if kernel_block_size is None else [kernel_block_size]
    caches = allocate_kv_cache(plan(spec, layout, num_blocks), torch.device("cpu"), layout, sizes)
    return dict(caches)


def backend_class(name: str) -> Any:
    """vLLM's backend class, or where it cannot be imported here (its module needs CUDA or
    the flashinfer package) a stand-in carrying the class's own
    ``get_supported_kernel_block_sizes``, its source from the installed file run alone."""
    member = AttentionBackendEnum[name]
    try:
        return member.get_class()
    except (ImportError, AssertionError, RuntimeError):
        pass
    module, class_name = member.get_path().rsplit(".", 1)
    tree = ast.parse(source_of(module))
    namespace: dict[str, Any] = {}
    for node in tree.body:  # the module's imports that import on CPU
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            try:
                exec(compile(ast.Module([node], []), module, "exec"), namespace)
            except (ImportError, AssertionError, RuntimeError):
                continue
    owner = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    method = next(
        n
        for n in owner.body
        if isinstance(n, ast.FunctionDef) and n.name == "get_supported_kernel_block_sizes"
    )
    method.decorator_list = []
    exec(compile(ast.Module([method], []), module, "exec"), namespace)
    return type(
        class_name,
        (),
        {
            "get_supported_kernel_block_sizes": staticmethod(namespace[method.name]),
            "get_name": staticmethod(lambda: name),
        },
    )


def kernel_block_size(name: str, spec: Any) -> int:
    """The kernel block size vLLM's worker picks for ``spec`` under backend ``name``
    (vllm/v1/worker/utils.py ``prepare_kernel_block_sizes`` for a layer-compact layout)."""
    return int(select_common_block_size(spec.block_size, [backend_class(name)], [spec]))


def kernel_table(name: str, spec: Any, kernel: int, table: np.ndarray) -> np.ndarray:
    """vLLM's ``AttentionGroup.map_to_kernel_block_table`` of a scheduler block table, the
    group set up as ``create_metadata_builders`` sets it for ``kernel``-token blocks."""
    ratio = spec.block_size // kernel
    rows, cols = table.shape
    group = AttentionGroup(
        backend=backend_class(name),
        layer_names=list(LAYERS),
        kv_cache_spec=spec,
        kv_cache_group_id=0,
        kernel_block_size=None if ratio == 1 else kernel,
        kernel_block_table=torch.zeros(1, rows, cols * ratio, dtype=torch.int32),
        kernel_block_offsets=torch.arange(ratio, dtype=torch.int32),
    )
    mapped = group.map_to_kernel_block_table(torch.from_numpy(table))
    return np.array(mapped.numpy(), copy=True)


def attention_spec(block_size: int, heads: int, head_size: int, dtype: torch.dtype) -> Any:
    return FullAttentionSpec(
        block_size=block_size, num_kv_heads=heads, head_size=head_size, dtype=dtype
    )


def mla_spec(block_size: int, dtype: torch.dtype) -> Any:
    return MLAAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=576, dtype=dtype)


def fill(cache: torch.Tensor, seed: int) -> None:
    """Every byte of the layer's memory random; fp8 (uint8) bytes finite."""
    gen = torch.Generator().manual_seed(seed)
    if cache.dtype == torch.uint8:
        cache.copy_(torch.randint(0, 0x78, cache.shape, generator=gen, dtype=torch.uint8))
    else:
        cache.copy_(torch.randn(cache.shape, generator=gen).to(cache.dtype))


class Requests:
    """Requests over blocks handed out by vLLM's BlockPool, and vLLM's BlockTable rows."""

    def __init__(self, num_blocks: int, block_size: int, lens: list[int], share: int) -> None:
        self.pool = BlockPool(num_blocks, enable_caching=False, hash_block_size=block_size)
        self.block_size = block_size
        self.lens = lens
        self.rows: list[list[int]] = []
        for s, n in enumerate(lens):
            need = -(-n // block_size)
            shared = self.rows[0][:share] if s and share else []
            fresh = self.pool.get_new_blocks(need - len(shared))
            self.rows.append(shared + [b.block_id for b in fresh])

    def table(self) -> np.ndarray:
        """vLLM's worker BlockTable, padded (with 2 spare columns)."""
        width = max(len(r) for r in self.rows) + 2
        table = BlockTable(
            block_size=self.block_size,
            max_num_reqs=len(self.rows) + 1,
            max_num_blocks_per_req=width,
            max_num_batched_tokens=sum(self.lens) + 1,
            pin_memory=False,
            device=torch.device("cpu"),
            cp_kv_cache_interleave_size=1,
        )
        for s, row in enumerate(self.rows):
            table.add_row(row, s)
        return table.get_numpy_array()[: len(self.rows)].copy()


def window_row(spec: Any, num_blocks: int, tokens: int) -> list[int]:
    """One request's block ids from vLLM's SlidingWindowManager after it freed the blocks the
    window has left (the null block, id 0, in their place)."""
    pool = BlockPool(num_blocks, enable_caching=False, hash_block_size=spec.block_size)
    manager = SlidingWindowManager(
        spec,
        block_pool=pool,
        enable_caching=False,
        kv_cache_group_id=0,
        scheduler_block_size=spec.block_size,
    )
    manager.allocate_new_blocks("r", tokens, tokens)
    manager.remove_skipped_blocks("r", tokens)
    return [b.block_id for b in manager.req_to_blocks["r"]]


def layer_view(backend: str, cache: torch.Tensor, head_size: int, layout: Any) -> Any:
    """``(key_cache, value_cache)`` as ``[num_blocks, block_size, H, D]`` index functions of
    the backend's own view (FlashInfer's is in memory order; indexed back by its axes)."""
    if backend == "FLASHINFER":
        order = layout.layer_view_order  # flashinfer.py: kv_cache.permute(*stride_order)
        permuted = cache.permute(*order)
        k, v = permuted.split(head_size, dim=-1)  # flashinfer.py: .split(hs, dim=-1)
        # physical axes -> logical (block, head, token, dim), then the [N, B, H, D] order
        back = [order.index(a) for a in range(4)]
        return tuple(t.permute(*back).transpose(1, 2) for t in (k, v))
    return cache.transpose(1, 2).split(head_size, dim=-1)
