"""Every backend vLLM 0.33 can allocate, x its layouts x fp16 / bf16 / fp8 x with and
without vLLM's kernel-block split: a prefill worker's cache, saved and pulled by
HurrayConnector, lands in the decode worker's cache so that the decode backend's own view
reads exactly what the prefill backend's own view read, element by element; cross-backend
pairs convert; what cannot convert is refused, naming the field (pd.py says how each
piece is vLLM's own).

Transport: the socket stream. NIXL is not installed in this venv (``nixl_cu12`` does not
import); its transport is covered by tests/test_nixl*.py and engine_tests/vllm_cpu.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from engine_tests.oracle_vllm import vllm_code as vc
from engine_tests.vllm_033_backends import pd
from engine_tests.vllm_033_backends.pd import Side
from engine_tests.vllm_cpu.conftest import free_port

pytest.importorskip("vllm.v1.core.sched.scheduler")

BACKENDS = ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION", "CPU_ATTN",
            "FLASHMLA", "FLASH_ATTN_MLA", "TRITON_MLA", "CUTLASS_MLA", "FLASHINFER_MLA",
            "CPU_MLA"]  # fmt: skip
#: The scheduler block sizes tried per backend: the first runs unsplit where vLLM can, the
#: second makes vLLM split it into kernel blocks (select_common_block_size) where it does.
BLOCKS = {"CPU_ATTN": (32,), "FLASHMLA": (64, 128), "CUTLASS_MLA": (128, 256),
          "FLASHINFER": (64, 128), "FLASHINFER_MLA": (64, 128), "CPU_MLA": (16, 32)}  # fmt: skip
PORT = free_port()


def cells() -> list[Any]:
    out = []
    for backend in BACKENDS:
        for layout in pd.layouts_of(backend):
            for dtype in pd.dtypes_of(backend):
                for block in BLOCKS.get(backend, (16,)):
                    side = Side(backend, layout, dtype, block)
                    kernel = side.kernel_block()
                    if kernel is None:  # vLLM refuses it too (packed blocks are not split)
                        continue
                    split = "split" if kernel != block else "whole"
                    out.append(pytest.param(side, id=f"{side}-{split}{kernel}"))
    return out


def compare(h: pd.Handoff, prefill: Side, decode: Side, *, read_as: str | None = None) -> None:
    """Every prompt token of every layer and role: the decode backend's view of the decode
    cache (or ``read_as``'s view of it, a control) equals the prefill backend's view of the
    prefill cache; blocks outside the load are untouched."""
    count = len(pd.PROMPT)
    reader = read_as or decode.backend
    for name in pd.LAYERS:
        theirs = pd.token_values(prefill.backend, prefill.layout, prefill.isa(), h.prefill[name])
        ours = pd.token_values(reader, decode.layout, decode.isa() or "vec", h.decode[name])
        want = pd.tokens_of(theirs, list(h.plan.save.block_ids), prefill.block, count)
        got = pd.tokens_of(ours, list(h.plan.load.block_ids), decode.block, count)
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g.view(torch.uint8), w.view(torch.uint8)), name
        landed = set(h.plan.load.block_ids)
        ratio = decode.block // h.decode[name].shape[2]
        for b in range(pd.NUM_BLOCKS):
            if b not in landed:
                kernel = slice(b * ratio, (b + 1) * ratio)
                assert torch.equal(h.decode[name][kernel], h.decode_before[name][kernel])


@pytest.mark.parametrize("side", cells())
def test_same_backend(side: Side) -> None:
    h = pd.handoff(side, side, PORT)
    assert h.finished == {"d-1"} and h.errors == set()
    compare(h, side, side)


CROSS = [
    (Side("FLASH_ATTN", "LBHNC", "float16", 16), Side("FLASHINFER", "LBNHC", "float16", 16)),
    (Side("FLASHINFER", "LBHNC", "bfloat16", 128), Side("TRITON_ATTN", "LBNHC", "bfloat16", 16)),
    (Side("CPU_ATTN", "LBHNC", "float16", 32), Side("FLASH_ATTN", "LBNHC", "float16", 16)),
    (Side("FLASH_ATTN", "BLNHC", "bfloat16", 32), Side("CPU_ATTN", "LBHNC", "bfloat16", 32)),
    (Side("FLEX_ATTENTION", "LBNHC", "float16", 16), Side("FLASHINFER", "LHBNC", "float16", 64)),
    (Side("FLASHMLA", "LBHNC", "fp8", 128), Side("TRITON_MLA", "LBNHC", "fp8", 16)),
    (Side("CUTLASS_MLA", "LBNHC", "bfloat16", 256), Side("CPU_MLA", "LBNHC", "bfloat16", 16)),
]


@pytest.mark.parametrize(("prefill", "decode"), CROSS, ids=[f"{p}->{d}" for p, d in CROSS])
def test_cross_backend_pairs_convert(prefill: Side, decode: Side) -> None:
    h = pd.handoff(prefill, decode, PORT)
    assert h.finished == {"d-1"} and h.errors == set()
    compare(h, prefill, decode)


REFUSED = [
    (Side("FLASH_ATTN", "LBNHC", "float16", 16), Side("FLASH_ATTN", "LBNHC", "bfloat16", 16),
     "cache_dtype"),
    (Side("FLASHMLA", "LBNHC", "bfloat16", 64), Side("FLASH_ATTN", "LBNHC", "bfloat16", 16),
     "kv_cache_layout"),
    (Side("TRITON_ATTN", "LBNHC", "fp8", 16),
     Side("TRITON_ATTN", "LBNHC", "fp8", 16, k_scale=0.125), "extras.vllm.kv_scales"),
]  # fmt: skip


@pytest.mark.parametrize(("prefill", "decode", "field"), REFUSED, ids=[r[2] for r in REFUSED])
def test_what_cannot_convert_is_refused_naming_the_field(
    prefill: Side, decode: Side, field: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="hurray_wire.vllm"):
        h = pd.handoff(prefill, decode, PORT)
    assert h.finished == {"d-1"} and h.errors == set(h.plan.load.block_ids)
    assert field in caplog.text
    for name in pd.LAYERS:
        assert torch.equal(h.decode[name], h.decode_before[name])


@pytest.mark.parametrize(
    "side", [Side("FLASHINFER", "LBHNC", "float16", 128), Side("FLASHMLA", "LBNHC", "fp8", 128)]
)
def test_a_flipped_byte_fails_the_load_and_lands_nothing(
    side: Side, caplog: pytest.LogCaptureFixture
) -> None:
    """One bit flipped on the wire inside the second page of layer 0's first role: the page
    digest names that page (position 1), the load fails and the connector reports the
    request's blocks from its first on. Nothing of a failed transfer lands, so no block
    of it may be reported valid: vLLM recomputes from the first reported block, and
    reporting only the flipped one would let it trust blocks never written. The decode
    cache stays untouched."""
    clean = pd.handoff(side, side, PORT)
    values = pd.token_values(side.backend, side.layout, side.isa(), clean.prefill[pd.LAYERS[0]])
    page = pd.tokens_of(values, list(clean.plan.save.block_ids), side.block, 2 * side.block)
    needle = page[0][side.block : side.block + 4].contiguous().view(torch.uint8)
    with caplog.at_level(logging.ERROR, logger="hurray_wire.vllm"):
        h = pd.handoff(side, side, PORT, flip=needle.numpy().tobytes())
    assert h.finished == {"d-1"} and h.errors == set(h.plan.load.block_ids)
    assert "digest" in caplog.text and "[1]" in caplog.text, caplog.text
    for name in pd.LAYERS:
        assert torch.equal(h.decode[name], h.decode_before[name])


@pytest.mark.parametrize(
    ("side", "other"),
    [(Side("CPU_ATTN", "LBHNC", "float16", 32), "FLASH_ATTN"),
     (Side("FLASH_ATTN", "LBHNC", "float16", 32), "CPU_ATTN")],
)  # fmt: skip
def test_reading_with_another_backends_view_fails(side: Side, other: str) -> None:
    """The same logical shape under CPU_ATTN and FLASH_ATTN holds other bytes: reading the
    landed cache with the other backend's expression fails the comparison."""
    h = pd.handoff(side, side, PORT)
    assert h.errors == set()
    compare(h, side, side)
    with pytest.raises(AssertionError):
        compare(h, side, side, read_as=other)


def test_stated_backends_are_vllms() -> None:
    """The backends stated in pd.STATED (their modules need GPU libraries to import) still
    declare those kernel block sizes and dtypes in vLLM's installed source."""
    for name, (path, sizes, dtypes) in pd.STATED.items():
        module = path.removesuffix(".py").replace("/", ".")
        source = vc.source_of(module)
        assert f'return "{name}"' in source
        literal = "[MultipleOf(16)]" if sizes == [None] else str(sizes)
        assert f"return {literal}" in source, (name, literal)
        for dtype in dtypes:
            assert f'"{dtype}"' in source, (name, dtype)


def _registered(side: Side, layers: dict[str, Any], caches: dict[str, torch.Tensor]) -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from hurray_wire.vllm import HurrayConnector

    config = pd.vllm_config("kv_consumer", side.block, PORT)
    config.cache_config.kv_cache_layout = side.layout
    config.compilation_config.static_forward_context = layers
    connector = HurrayConnector(config, KVConnectorRole.WORKER, None)
    try:
        connector.register_kv_caches(caches)
    finally:
        connector.shutdown()


@pytest.mark.parametrize("backend", ["FLASHMLA_SPARSE", "ROCM_ATTN"])
def test_another_backend_is_refused_at_register_naming_it(backend: str) -> None:
    """A backend whose cache the adapters do not read stops the engine at start
    (register_kv_caches), not at its first forward pass."""
    from hurray_wire.errors import InvalidTensorError

    side = Side("FLASHMLA" if "MLA" in backend else "FLASH_ATTN", "LBNHC", "bfloat16", 64)
    _, caches = side.caches(seed=5)
    layers = side.layers()
    other = type(backend, (), {"get_name": staticmethod(lambda: backend)})
    for layer in layers.values():
        layer.get_attn_backend = lambda: other
    with pytest.raises(InvalidTensorError, match=backend) as info:
        _registered(side, layers, caches)
    assert info.value.field == "backend"


def test_an_integer_cache_is_refused_at_register() -> None:
    """TRITON_ATTN's int8 per-token-head cache keeps its scales inside the pages."""
    from hurray_wire.errors import InvalidTensorError

    side = Side("TRITON_ATTN", "LBNHC", "int8", 16)
    _, caches = side.caches(seed=5)
    with pytest.raises(InvalidTensorError, match="integer"):
        _registered(side, side.layers(), caches)
