"""Decoder and Encoder: options checked once, one bounded plan cache each, the module
functions thin calls on a default instance (docs/architecture.md, "One decode pipeline").
"""

from __future__ import annotations

import gc
import threading
import tracemalloc
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire.blob import DEFAULT_DECODER, DEFAULT_ENCODER, Decoder, Encoder
from hurray_wire.blob.decoder import decode_options
from hurray_wire.blob.encoder import encoder_for
from hurray_wire.codecs import parse_spec
from hurray_wire.memo import BoundedMemo


def _tensor(layer: int = 0, **kwargs: Any) -> hw.BlockPagedTensor:
    pool = np.arange(4 * 2 * 1 * 8, dtype=np.float16).reshape(4, 2, 1, 8)
    return hw.BlockPagedTensor.from_arrays(pool, [0, 3, 1], [0, 2, 3], layer_index=layer, **kwargs)


def _error(call: Callable[[], Any]) -> tuple[Any, ...]:
    with pytest.raises(hw.HurrayWireError) as info:
        call()
    e = info.value
    return type(e), str(e), e.section, e.field, e.offset


# -- options ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"verify": 1}, "verify"),
        ({"limits": "small"}, "limits"),
        ({"threads": -5}, "threads"),
        ({"page_store": "store"}, "page_store"),
        ({"plans": {}}, "plans"),
    ],
)
def test_decoder_refuses_bad_options(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(hw.HurrayWireError) as info:
        Decoder(**kwargs)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"compression": 3}, "compression"),
        ({"checksum": "yes"}, "checksum"),
        ({"compact": None}, "compact"),
        ({"page_digests": 1}, "page_digests"),
        ({"layouts": []}, "layouts"),
    ],
)
def test_encoder_refuses_bad_options(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(hw.HurrayWireError) as info:
        Encoder(**kwargs)
    assert info.value.field == field


def test_decoder_options_act() -> None:
    blob = bytearray(hw.encode(_tensor()))
    pool_at = int(hw.blob.envelope.ENTRY.unpack_dict(blob, hw.blob.envelope.entry_at(0))["offset"])
    blob[pool_at] ^= 1  # only a checksum can tell
    with pytest.raises(hw.errors.ChecksumError):
        Decoder().decode(blob)
    assert Decoder(verify=False).decode(blob).layer_index == 0
    tight = Decoder(limits=hw.DecodeLimits(max_sections=2))
    assert _error(lambda: tight.decode(blob)) == _error(
        lambda: hw.decode(blob, limits=hw.DecodeLimits(max_sections=2))
    )
    assert Decoder().peek_descriptor(bytes(blob)) == hw.decode(blob, verify=False).descriptor


def test_encoder_options_act() -> None:
    tensor = _tensor(seq_lens=[3, 1])
    for kwargs in (
        {},
        {"checksum": False},
        {"compression": "zstd:3"},
        {"compression": parse_spec("zstd:1")},
        {"compact": True},
        {"page_digests": True},
    ):
        encoder = Encoder(**kwargs)
        blob = bytes(encoder.encode(tensor))
        assert blob == bytes(hw.encode(tensor, **kwargs))
        assert blob == b"".join(encoder.encode_parts(tensor))
        out = bytearray(len(blob))
        assert encoder.encode_into(tensor, out) == len(blob) and bytes(out) == blob
    assert Encoder(compression="zstd:3").compression == parse_spec("zstd:3")


# -- the default instance ---------------------------------------------------------------------
def test_module_functions_use_the_default_instances() -> None:
    assert decode_options() is DEFAULT_DECODER
    other = decode_options(verify=False)
    assert other.plans is DEFAULT_DECODER.plans and other.verify is False
    assert encoder_for() is DEFAULT_ENCODER
    assert encoder_for(compression="zstd:1").layouts is DEFAULT_ENCODER.layouts
    assert Decoder().plans is not DEFAULT_DECODER.plans  # one's own, unless given


def test_default_instance_gives_the_module_functions_verdicts() -> None:
    """Every byte flipped in the header and first padding: decode(), the default decoder
    and a decoder with a cold cache give the same tensor or the same error."""
    tensor = _tensor(seq_lens=[3, 1], metadata={"m": 1})
    blob = bytes(hw.encode(tensor))
    hw.decode(blob)
    header = hw.blob.envelope.ENTRY.unpack_dict(blob, hw.blob.envelope.entry_at(0))["offset"]
    for at in range(0, header + 2, 3):
        damaged = bytearray(blob)
        damaged[at] ^= 0x41
        routes: list[Callable[[], Any]] = [
            partial(hw.decode, damaged),
            partial(DEFAULT_DECODER.decode, damaged),
            partial(Decoder().decode, damaged),
        ]
        try:
            expected = routes[0]()
        except hw.HurrayWireError:
            verdicts = {_error(route) for route in routes}
            assert len(verdicts) == 1, (at, verdicts)
        else:
            for route in routes[1:]:
                got = route()
                assert got.descriptor == expected.descriptor
                assert got.page_pool.tobytes() == expected.page_pool.tobytes()


def test_default_encoder_gives_the_module_functions_bytes() -> None:
    tensor = _tensor(metadata={"a": b"x"})
    assert bytes(DEFAULT_ENCODER.encode(tensor)) == bytes(hw.encode(tensor))
    assert bytes(Encoder().encode(tensor)) == bytes(hw.encode(tensor))
    assert _error(lambda: DEFAULT_ENCODER.encode("not a tensor")) == _error(  # type: ignore[arg-type]
        lambda: hw.encode("not a tensor")  # type: ignore[arg-type]
    )


# -- the caches' bounds, measured -------------------------------------------------------------
def _held(fill: Callable[[], None]) -> int:
    """The bytes still allocated after ``fill()``: what the caches it filled keep alive."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        fill()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("kind", ["plain", "padding", "metadata"])
def test_plan_cache_holds_no_more_than_it_counts(kind: str) -> None:
    """Fill a decoder's cache with many distinct descriptors: the memory it holds is at
    most what it counts (so at most its bound), whatever the headers look like."""
    options: dict[str, dict[str, Any]] = {
        "plain": {},
        "padding": {"alignment": 4096},
        "metadata": {"metadata": {"k": 1}},
    }
    blobs = [bytes(hw.encode(_tensor(layer, **options[kind]))) for layer in range(300)]
    decoder = Decoder(plans=BoundedMemo(1000, 64 << 20))

    def fill() -> None:
        for blob in blobs:
            decoder.decode(blob)
            decoder.peek_descriptor(blob)

    held = _held(fill)
    assert len(decoder.plans) >= 600  # every plan and descriptor still held (and a mask)
    assert held <= decoder.plans.nbytes <= decoder.plans.max_bytes


def test_plan_cache_bound_under_more_descriptors_than_it_holds() -> None:
    blobs = [bytes(hw.encode(_tensor(layer))) for layer in range(700)]
    decoder = Decoder()
    for blob in blobs:
        assert decoder.decode(blob).layer_index == blobs.index(blob)
        assert len(decoder.plans) <= decoder.plans.max_entries
    assert decoder.plans.nbytes <= decoder.plans.max_bytes


def test_layout_cache_holds_no_more_than_it_counts() -> None:
    tensors = [_tensor(layer) for layer in range(300)]
    encoder = Encoder(layouts=BoundedMemo(1000, 64 << 20))

    def fill() -> None:
        for tensor in tensors:
            encoder.encode(tensor)

    held = _held(fill)
    assert len(encoder.layouts) == 600  # every layout and descriptor still held
    assert held <= encoder.layouts.nbytes <= encoder.layouts.max_bytes


def test_from_arrays_cache_holds_no_more_than_it_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    from hurray_wire import tensor as tensor_module

    memo: BoundedMemo[Any] = BoundedMemo(10_000, 16 << 20)
    monkeypatch.setattr(tensor_module, "_BUILT", memo)
    pool = np.zeros((4, 2, 1, 8), np.float16)
    table, starts = np.array([0, 3, 1], np.uint32), np.array([0, 2, 3], np.uint32)

    def fill() -> None:
        for layer in range(100):  # geometries, each with its most descriptors
            for tokens in range(1, 7):
                hw.BlockPagedTensor.from_arrays(
                    pool, table, starts, layer_index=layer, total_tokens=tokens
                )

    held = _held(fill)
    assert len(memo) >= 100
    assert held <= memo.nbytes <= memo.max_bytes


# -- threads ----------------------------------------------------------------------------------
def test_threads_share_a_plan_cache() -> None:
    """Two threads decode blobs of different descriptors through one decoder whose tiny
    cache is cleared under them all the time: every result is its own blob's."""
    decoder = Decoder(plans=BoundedMemo(3, 1 << 20))
    blobs = {layer: bytes(hw.encode(_tensor(layer))) for layer in range(8)}
    expected = {layer: hw.decode(blob).page_pool.tobytes() for layer, blob in blobs.items()}
    wrong: list[tuple[int, Any]] = []

    def work(layers: list[int]) -> None:
        for _ in range(150):
            for layer in layers:
                got = decoder.decode(blobs[layer])
                if got.layer_index != layer or got.page_pool.tobytes() != expected[layer]:
                    wrong.append((layer, got.layer_index))

    threads = [threading.Thread(target=work, args=(ls,)) for ls in ([0, 1, 2, 3], [4, 5, 6, 7])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
        assert not thread.is_alive()
    assert wrong == []
    assert len(decoder.plans) <= 3
