"""The checks every registered codec runs (the numcodecs pattern: one helper, every codec).

``check_codec`` covers a round trip through the codec and through the public entry points,
the configuration round trip through a text spec, the refusal of every illegal codec
parameter and of an output of the wrong size, and the frozen golden bytes: each section of
``fixtures/blobs`` stored with the codec decodes to the arrays the manifest hashes and
encodes back to exactly its committed bytes. A new codec needs a golden fixture (add a
case to tools/make_fixtures.py) before it passes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from hurray_wire import codecs
from hurray_wire.codecs import registry
from hurray_wire.codecs.base import Codec
from hurray_wire.errors import DecompressionError
from tests.conftest import FIXTURES

U8 = np.uint8
MANIFEST: dict[str, Any] = json.loads((FIXTURES / "manifest.json").read_text(encoding="utf-8"))


def samples() -> Iterator[tuple[str, np.ndarray, int]]:
    """(label, raw bytes, element width): KV-like floats, a tail, noise, zeros, one byte."""
    rng = np.random.default_rng(7)
    for dtype, width in ((np.float16, 2), (np.float32, 4), (np.float64, 8)):
        values = (rng.standard_normal(20_000) * 0.5).astype(dtype).view(U8)
        yield f"{np.dtype(dtype).name}", values, width
        yield f"{np.dtype(dtype).name}+tail", np.concatenate([values, values[:3]]), width
    yield "int8", rng.integers(-3, 4, 30_000).astype(np.int8).view(U8), 1
    yield "odd width", np.tile(np.arange(3, dtype=U8), 7_000), 3
    yield "noise", rng.integers(0, 256, 9_000).astype(U8), 2
    yield "zeros", np.zeros(70_000, U8), 2
    yield "one byte", np.ones(1, U8), 1


def configs(codec: Codec) -> list[codecs.Compression]:
    """Compressions that select ``codec`` (a small chunk size, to get several chunks)."""
    if not codec.compresses:
        return [codecs.DEFAULT_COMPRESSION]  # ignored by a codec no Compression selects
    base = codecs.Compression(codec.codec_id, min_size=0, chunk_size=4096)
    return [base, dataclasses.replace(base, level=3, threads=2)]


def check_round_trip(codec: Codec) -> None:
    for config in configs(codec):
        for label, raw, width in samples():
            stored_as = codec.for_width(width)
            param, parts = stored_as.encode(raw, config, width)
            assert stored_as.valid_param(param), (label, param)
            stored = np.frombuffer(b"".join(parts), U8)
            back = stored_as.decode_into(param, stored, raw.size, None, 0)
            assert back.tobytes() == raw.tobytes(), label
            out = np.full(raw.size, 0xAA, U8)
            assert stored_as.decode_into(param, stored, raw.size, out, config.threads) is out
            assert out.tobytes() == raw.tobytes(), label
            public = codecs.decompress(stored_as.codec_id, param, stored.tobytes(), raw.size)
            assert public.tobytes() == raw.tobytes(), label
            if codec.compresses:  # and the same bytes through compress_parts
                again = codecs.compress_parts(raw, config, width)
                if again[0] != codecs.CODEC_RAW:
                    assert again == (stored_as.codec_id, param, parts), label


def check_config_round_trip(codec: Codec) -> None:
    assert registry.get(codec.codec_id) is codec
    assert registry.by_name(codec.name) is codec
    assert registry.name_or_id(codec.codec_id) == codec.name
    if not codec.compresses:
        assert codecs.parse_spec(codec.name) is None
        with pytest.raises(codecs.CodecConfigError):
            codecs.Compression(codec.codec_id)
        return
    for level in (1, 3, 22):
        config = codecs.Compression(codec.codec_id, level=level, threads=codec.spec_threads)
        assert str(config) == f"{codec.name}:{level}"
        assert codecs.parse_spec(str(config)) == config
        assert codecs.Compression.parse(config) is config
    assert codecs.parse_spec(codec.name) == codecs.Compression(
        codec.codec_id, threads=codec.spec_threads
    )


def _one_stored(codec: Codec) -> tuple[int, np.ndarray, np.ndarray]:
    raw = next(r for label, r, w in samples() if label == "float16")
    config = configs(codec)[0]
    stored_as = codec.for_width(2)
    assert stored_as is codec
    param, parts = codec.encode(raw, config, 2)
    return param, np.frombuffer(b"".join(parts), U8), raw


def check_refuses_wrong_params(codec: Codec) -> None:
    _, stored, raw = _one_stored(codec)
    bad = [p for p in range(256) if p not in codec.params]
    assert bad and all(not codec.valid_param(p) for p in bad)
    assert all(codec.valid_param(p) for p in codec.params)
    for p in bad:
        with pytest.raises(DecompressionError) as caught:
            codecs.decompress(codec.codec_id, p, stored, raw.size)
        assert (caught.value.field, caught.value.found) == ("codec_param", p)
        assert caught.value.expected == codec.expected_params()


def check_refuses_wrong_output_size(codec: Codec) -> None:
    param, stored, raw = _one_stored(codec)
    for size in (raw.size - 1, raw.size + 1, 0):
        with pytest.raises(DecompressionError):
            codecs.decompress_into(codec.codec_id, param, stored, np.empty(size, U8), threads=0)
        with pytest.raises(DecompressionError):
            codec.decode_into(param, stored, size, None, 0)


def golden_sections(codec: Codec) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(fixture name, section entry, manifest case) of every fixture section stored with
    ``codec``."""
    for case in MANIFEST["blobs"]:
        for entry in case["sections"]:
            if entry["codec"] == codec.codec_id:
                yield case["name"], entry, case


def _raw_name(entry: dict[str, Any], case: dict[str, Any]) -> str | None:
    if entry["kind"] == "buffer":
        return str(case["buffer_names"][entry["index"]])
    return "seq_lens" if entry["kind"] == "seq_lens" else None


def check_golden(codec: Codec) -> None:
    found = list(golden_sections(codec))
    assert found, f"no fixture blob stores a section with codec {codec.codec_id}"
    for name, entry, case in found:
        blob = (FIXTURES / case["file"]).read_bytes()
        start = entry["offset"]
        stored = np.frombuffer(blob, U8, entry["stored_size"], start)
        param = entry["codec_param"]
        raw = codec.decode_into(param, stored, entry["raw_size"], None, 0)
        array = case["arrays"].get(_raw_name(entry, case) or "")
        if array is not None:
            assert hashlib.sha256(raw.tobytes()).hexdigest() == array["sha256"], name
        options = case["options"]
        config = codecs.Compression.parse(options["compression"]) or codecs.DEFAULT_COMPRESSION
        if "chunk_size" in options:
            config = dataclasses.replace(config, chunk_size=options["chunk_size"])
        width = param if param else 1
        again_param, parts = codec.encode(raw, config, width)
        assert again_param == param, name
        assert b"".join(parts) == stored.tobytes(), f"{name}: the frozen bytes changed"


def check_codec(codec: Codec) -> None:
    """Every check, in order, on one registered codec."""
    check_config_round_trip(codec)
    check_round_trip(codec)
    check_refuses_wrong_params(codec)
    check_refuses_wrong_output_size(codec)
    check_golden(codec)
