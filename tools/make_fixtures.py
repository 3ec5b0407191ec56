"""Regenerate fixtures/blobs, fixtures/descriptors and fixtures/manifest.json deterministically.

    python tools/make_fixtures.py            # write into fixtures/
    python tools/make_fixtures.py --out DIR  # write elsewhere (the tests compare the two)

Array contents come from integer formulas only (no floating-point maths, no RNG streams),
so the bytes are the same on every machine and NumPy version. zstd output is pinned by the
zstandard version in the test extra of pyproject.toml.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

import hurray_wire as hw
from hurray_wire import blob, codecs
from hurray_wire.blob import envelope
from hurray_wire.wire import blob as wire

ROOT = Path(__file__).resolve().parent.parent
SMALL = 4096  # arrays up to this many bytes are listed in full in the manifest


def lcg(count: int, seed: int) -> np.ndarray:
    """``count`` pseudo-random uint32: a splitmix64-style hash of the index (exact integers)."""
    state = np.uint64(seed)
    out = np.empty(count, np.uint64)
    index = np.arange(count, dtype=np.uint64)
    mixed = (index * np.uint64(0x9E3779B97F4A7C15) + state) & np.uint64(0xFFFFFFFFFFFFFFFF)
    mixed ^= mixed >> np.uint64(29)
    mixed = (mixed * np.uint64(0xBF58476D1CE4E5B9)) & np.uint64(0xFFFFFFFFFFFFFFFF)
    mixed ^= mixed >> np.uint64(32)
    out[:] = mixed
    low: np.ndarray = out & np.uint64(0xFFFFFFFF)
    return low.astype(np.uint32)


def spec_pool(num_pages: int, page_size: int, heads: int, dim: int, used: set[int]) -> np.ndarray:
    """pool[p, slot, h, d] = p*64 + slot*8 + h*4 + d/2 in used slots, 0 elsewhere (the
    formula of the conformance stream vectors)."""
    p, s, h, d = np.meshgrid(
        np.arange(num_pages), np.arange(page_size), np.arange(heads), np.arange(dim), indexing="ij"
    )
    values = (p * 64 + s * 8 + h * 4).astype(np.float32) + d.astype(np.float32) / 2
    slots = p * page_size + s
    mask = np.isin(slots, sorted(used))
    return np.where(mask, values, 0).astype(np.float16)


def used_slots(
    block_table: list[int], seq_ptr: list[int], seq_lens: list[int], page: int
) -> set[int]:
    slots = set()
    for seq, length in enumerate(seq_lens):
        pages = block_table[seq_ptr[seq] : seq_ptr[seq + 1]]
        for token in range(length):
            slots.add(pages[token // page] * page + token % page)
    return slots


def activation_like(shape: tuple[int, ...], seed: int, dtype: Any) -> np.ndarray:
    """Half-precision values with a narrow exponent range and noisy mantissas, like K/V
    activations: compressible by byte shuffle, built from integer bits only."""
    bits = lcg(int(np.prod(shape)), seed)
    if np.dtype(dtype) == np.float16:
        exponent = (np.uint32(12) + (bits >> np.uint32(28)) % np.uint32(5)) << np.uint32(10)
        sign = (bits >> np.uint32(27) & np.uint32(1)) << np.uint32(15)
        raw: np.ndarray = (sign | exponent | (bits & np.uint32(0x3FF))).astype(np.uint16)
        return raw.view(np.float16).reshape(shape)
    exponent = (np.uint32(120) + (bits >> np.uint32(28)) % np.uint32(6)) << np.uint32(7)
    sign = (bits >> np.uint32(27) & np.uint32(1)) << np.uint32(15)
    raw = (sign | exponent | (bits & np.uint32(0x7F))).astype(np.uint16)
    values: np.ndarray = raw.view(ml_dtypes.bfloat16)
    return values.reshape(shape)


Case = tuple[str, str, Callable[[], hw.BlockPagedTensor], dict[str, Any]]


def spec_example(**kw: Any) -> hw.BlockPagedTensor:
    bt, sp, lens = [0, 1, 0], [0, 2, 3], [6, 3]
    pool = spec_pool(5, 4, 2, 8, used_slots(bt, sp, lens, 4)).reshape(5, 4, 2, 8)
    options = {"seq_lens": lens, "kv_role": "key", "layer_index": 3, **kw}
    return hw.BlockPagedTensor.from_arrays(pool, bt, sp, **options)


def vllm_like(role: str, layer: int, dtype: Any = np.float16, **kw: Any) -> hw.BlockPagedTensor:
    """page_size 16, 4 KV heads of 64, three sequences of 40, 17 and 33 tokens; sequences
    0 and 2 share their first two pages (a common prompt prefix)."""
    lens = [40, 17, 33]
    bt = [0, 1, 2, 3, 4, 0, 1, 5]
    sp = [0, 3, 5, 8]
    pool = activation_like((8, 16, 4, 64), seed=layer * 2 + (role == "value"), dtype=dtype)
    return hw.BlockPagedTensor.from_arrays(
        pool, bt, sp, seq_lens=lens, kv_role=role, layer_index=layer, **kw
    )


def quantized_int8_sym() -> hw.BlockPagedTensor:
    q = hw.PerBlockAffine.symmetric(
        axis=0, block_size=4, scale_buffer_index=3, scale_type=hw.float32
    )
    codes = (lcg(5 * 4 * 2 * 8, 7) % np.uint32(255)).astype(np.int16) - 127
    pool = codes.astype(np.int8).reshape(5, 4, 2, 8)
    scales = (np.arange(20, dtype=np.float32) + 1) / 64
    return hw.BlockPagedTensor.from_arrays(
        pool, [0, 1, 0], [0, 2, 3], seq_lens=[6, 3], layer_index=3, quantization=q, scales=scales
    )


def quantized_uint8_asym() -> hw.BlockPagedTensor:
    q = hw.PerBlockAffine.asymmetric(
        axis=0, block_size=4, scale_buffer_index=3, zero_point_buffer_index=4, scale_type=hw.float16
    )
    pool = (lcg(4 * 4 * 2 * 4, 11) % np.uint32(256)).astype(np.uint8).reshape(4, 4, 2, 4)
    scales = ((np.arange(16) % 7 + 1) / 32).astype(np.float16)
    zero_points = (np.arange(16, dtype=np.int32) * 5) % 128
    return hw.BlockPagedTensor.from_arrays(
        pool,
        [3, 1, 2],
        [0, 2, 3],
        seq_lens=[7, 2],
        kv_role="value",
        layer_index=5,
        quantization=q,
        scales=scales,
        zero_points=zero_points,
    )


def fp8_cache() -> hw.BlockPagedTensor:
    codes = (lcg(6 * 8 * 2 * 16, 13) % np.uint32(0x7E)).astype(np.uint8)  # finite, positive
    pool = codes.view(ml_dtypes.float8_e4m3fn).reshape(6, 8, 2, 16)
    return hw.BlockPagedTensor.from_arrays(
        pool,
        [5, 0, 3, 1],
        [0, 2, 4],
        seq_lens=[12, 9],
        kv_role="key",
        layer_index=0,
        metadata={"hurray.k_scale": 0.03125, "model": "fixture-fp8", "request_ids": ["r-1", "r-2"]},
    )


def empty_batch() -> hw.BlockPagedTensor:
    pool = np.zeros((2, 4, 2, 8), np.float16)
    return hw.BlockPagedTensor.from_arrays(pool, [], [0], seq_lens=[], layer_index=1)


def uint64_index() -> hw.BlockPagedTensor:
    return spec_example(block_table_index_type="uint64", kv_role="value")


CASES: list[Case] = [
    (
        "spec_example_f16_key_l3",
        "Spec worked example: float16 [9,2,8], page_size 4, 5 pages, "
        "2 sequences (6 + 3 tokens) sharing page 0, layer 3 keys, with seq_lens",
        spec_example,
        {},
    ),
    (
        "layer_none_f16_key",
        "Spec example without a layer (wire 0xFFFFFFFF)",
        lambda: spec_example(layer_index=None),
        {},
    ),
    (
        "value_role_u64_index",
        "Spec example as values with uint64 block_table / seq_ptr",
        uint64_index,
        {},
    ),
    (
        "fused_role_no_seq_lens",
        "Spec example, fused role, no seq_lens (total_tokens given)",
        lambda: spec_example(kv_role="fused", seq_lens=None, total_tokens=9),
        {},
    ),
    ("empty_batch", "The empty batch: num_seqs 0, seq_ptr [0], a 2-page pool", empty_batch, {}),
    (
        "vllm_prefix_sharing_f16",
        "vLLM-like page_size 16 batch: partial last pages, sequences 0 and 2 share a 2-page prefix",
        lambda: vllm_like("key", 12),
        {},
    ),
    (
        "bf16_value",
        "bfloat16 values of the vLLM-like batch",
        lambda: vllm_like("value", 12, ml_dtypes.bfloat16),
        {},
    ),
    (
        "int8_per_block_sym",
        "int8 cache, per-block affine (per page slot) f32 scales, symmetric",
        quantized_int8_sym,
        {},
    ),
    (
        "uint8_per_block_asym",
        "uint8 cache, per-block affine f16 scales and int32 zero points",
        quantized_uint8_asym,
        {},
    ),
    (
        "fp8_e4m3_with_metadata",
        "float8_e4m3 cache (unquantized, [A12]) with k_scale and request "
        "ids in the metadata section",
        fp8_cache,
        {},
    ),
    (
        "zstd_f16",
        "vLLM-like batch, every buffer zstd-compressed (level 3)",
        lambda: vllm_like("key", 1),
        {"compression": "zstd:3"},
    ),
    (
        "shuffle_zstd_f16",
        "vLLM-like batch, byte-shuffle + zstd as one frame",
        lambda: vllm_like("key", 2),
        {"compression": "shuffle-zstd:1"},
    ),
    (
        "shuffle_zstd_bf16",
        "bfloat16 batch, byte-shuffle + zstd",
        lambda: vllm_like("value", 2, ml_dtypes.bfloat16),
        {"compression": "shuffle-zstd:1"},
    ),
    (
        "chunked_shuffle_zstd_f16",
        "vLLM-like batch in the default codec with 16 KiB chunks (4 chunk frames), level 1",
        lambda: vllm_like("value", 3),
        {"compression": hw.Compression(codecs.CODEC_CHUNKED, threads=0, chunk_size=1 << 14)},
    ),
    (
        "no_checksums",
        "Spec example without section checksums (checksum_type 0)",
        spec_example,
        {"checksum": False},
    ),
]

STREAM = (
    "whole_cache_2_layers",
    "A small whole cache: a stream header, layers 0 and 1 x key and value as four blobs, and "
    "the end record with its index",
)


def stream_tensors() -> list[hw.BlockPagedTensor]:
    return [vllm_like(role, layer) for layer in (0, 1) for role in ("key", "value")]


def digest(data: Any) -> str:
    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return hashlib.sha256(memoryview(data).cast("B")).hexdigest()


def describe(tensor: hw.BlockPagedTensor, data: bytes, options: dict[str, Any]) -> dict[str, Any]:
    """The manifest entry of one blob: every field a reader should find."""
    d = tensor.descriptor
    layout = d.layout
    count = envelope.HEADER.unpack_dict(data)["section_count"]
    sections = []
    for number in range(count):
        entry = envelope.ENTRY.struct.unpack_from(data, envelope.entry_at(number))
        sections.append(
            {
                "kind": wire.SECTION_KINDS[entry[0]],
                "flags": entry[1],
                "codec": entry[2],
                "codec_param": entry[3],
                "index": entry[4],
                "offset": entry[5],
                "stored_size": entry[6],
                "raw_size": entry[7],
                "checksum": f"{entry[8]:016x}",
                "alignment": entry[9],
            }
        )
    arrays = {
        "page_pool": tensor.page_pool,
        "block_table": tensor.block_table,
        "seq_ptr": tensor.seq_ptr,
        "scales": tensor.scales,
        "zero_points": tensor.zero_points,
        "seq_lens": tensor.seq_lens,
    }
    contents: dict[str, Any] = {}
    for name, array in arrays.items():
        if array is None:
            continue
        entry_: dict[str, Any] = {
            "sha256": digest(np.ascontiguousarray(array)),
            "dtype": str(array.dtype),
            "shape": list(array.shape),
        }
        if array.nbytes <= SMALL:
            entry_["values"] = (
                array.reshape(-1).view(f"u{array.itemsize}").tolist()
                if (array.dtype.kind not in "iu")
                else array.reshape(-1).tolist()
            )
            entry_["values_are"] = "raw bit patterns" if array.dtype.kind not in "iu" else "values"
        contents[name] = entry_
    quant = d.quantization
    compression = options.get("compression")
    return {
        "options": {
            "compression": None if compression is None else str(compression),
            **(
                {"chunk_size": compression.chunk_size}
                if isinstance(compression, hw.Compression)
                and compression.codec == codecs.CODEC_CHUNKED
                else {}
            ),
            "checksum": options.get("checksum", True),
        },
        "total_length": len(data),
        "sha256": digest(data),
        "descriptor_hex": hw.encode_descriptor(d).hex(),
        "element_type": d.element_type.name,
        "shape": list(d.shape),
        "page_size": layout.page_size,
        "num_pages": layout.num_pages,
        "num_seqs": layout.num_seqs,
        "kv_role": layout.kv_role,
        "layer_index": layout.layer_index,
        "block_table_index_type": layout.block_table_index_type,
        "buffer_names": list(d.buffer_names),
        "buffer_byte_sizes": [h.byte_size for h in d.buffers],
        "quantization": None
        if quant is None
        else {
            "scheme": quant.name,
            **{k: (v.name if isinstance(v, hw.ElementType) else v) for k, v in vars(quant).items()},
        },
        "sections": sections,
        "seq_lens": None if tensor.seq_lens is None else tensor.seq_lens.tolist(),
        "metadata": {k: v for k, v in tensor.metadata.items()},
        "arrays": contents,
    }


def generate(out: Path) -> dict[str, Any]:
    """Write every fixture below ``out`` and return the manifest."""
    (out / "blobs").mkdir(parents=True, exist_ok=True)
    (out / "descriptors").mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {
        "format": "hurray-wire fixtures",
        "generator": "tools/make_fixtures.py",
        "blob_format": "docs/wire-format.md, version 1.0",
        "blobs": [],
        "streams": [],
    }
    for name, description, build, options in CASES:
        tensor = build()
        data = bytes(blob.encode(tensor, **options))
        (out / "blobs" / f"{name}.hrwb").write_bytes(data)
        (out / "descriptors" / f"{name}.bin").write_bytes(hw.encode_descriptor(tensor.descriptor))
        manifest["blobs"].append(
            {
                "file": f"blobs/{name}.hrwb",
                "descriptor_file": f"descriptors/{name}.bin",
                "name": name,
                "description": description,
                **describe(tensor, data, options),
            }
        )
    name, description = STREAM
    sink = io.BytesIO()
    header = hw.StreamHeader(
        model="fixture-llm",
        num_layers=2,
        kv_roles=("key", "value"),
        element_type=hw.float16,
        metadata={"request_id": "req-0001"},
    )
    with hw.StreamWriter(sink, header) as writer:
        for tensor in stream_tensors():
            writer.write(tensor, pages="all")
    data = sink.getvalue()
    (out / "streams").mkdir(exist_ok=True)
    (out / "streams" / f"{name}.hrws").write_bytes(data)
    entries = hw.StreamFile(data).entries
    manifest["streams"].append(
        {
            "file": f"streams/{name}.hrws",
            "name": name,
            "description": description,
            "total_length": len(data),
            "sha256": digest(data),
            "header": {
                "model": header.model,
                "num_layers": header.num_layers,
                "kv_roles": list(header.kv_roles),
                "element_type": "float16",
                "metadata": dict(header.metadata),
                "end_record": True,
            },
            "blobs": [
                {
                    "offset": e.offset,
                    "length": e.length,
                    "kv_role": e.kv_role,
                    "layer_index": e.layer_index,
                }
                for e in entries
            ],
        }
    )
    text = json.dumps(manifest, indent=1, sort_keys=False) + "\n"
    (out / "manifest.json").write_text(text, encoding="utf-8")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "fixtures")
    args = parser.parse_args(argv)
    manifest = generate(args.out)
    print(
        f"wrote {len(manifest['blobs'])} blobs and {len(manifest['streams'])} stream(s) "
        f"to {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
