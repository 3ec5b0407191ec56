"""The codec registry: every registered codec passes the shared checks, and the registry
is the codec table of docs/wire-format.md section 6."""

from __future__ import annotations

import re

import pytest

from hurray_wire import codecs
from hurray_wire.codecs import registry
from hurray_wire.codecs.base import Codec
from hurray_wire.codecs.zstd import Zstd
from hurray_wire.errors import CodecConfigError, DecompressionError, HurrayWireError
from tests.codec_checks import check_codec
from tests.conftest import ROOT


@pytest.mark.parametrize("codec_id", registry.ids(), ids=lambda i: registry.get(i).name)
def test_every_registered_codec_passes_the_shared_checks(codec_id: int) -> None:
    check_codec(registry.get(codec_id))


def _wire_format_table() -> dict[int, str]:
    """The id | name rows of the codec table of docs/wire-format.md section 6."""
    text = (ROOT / "docs" / "wire-format.md").read_text(encoding="utf-8")
    section = text.split("## 6. Codecs", 1)[1].split("\n## ", 1)[0]
    table = section.split("| id | name |", 1)[1].split("\n\n", 1)[0]  # the first table
    rows = re.findall(r"^\|\s*(\d+)\s*\|\s*([a-z0-9-]+)\s*\|", table, re.MULTILINE)
    return {int(codec_id): name for codec_id, name in rows}


def test_the_registry_is_the_wire_format_codec_table() -> None:
    table = _wire_format_table()
    assert table == {0: "raw", 1: "zstd", 2: "shuffle-zstd", 3: "chunked-shuffle-zstd"}
    assert registry.names() == table == codecs.CODEC_NAMES
    assert registry.ids() == sorted(table)
    assert [c.name for c in registry.compressing()] == [table[i] for i in (1, 2, 3)]


def test_lookups_of_unknown_ids_and_names() -> None:
    with pytest.raises(DecompressionError) as unknown:
        registry.get(4)
    assert (unknown.value.field, unknown.value.expected, unknown.value.found) == (
        "codec", [0, 1, 2, 3], 4
    )  # fmt: skip
    assert registry.find(4) is None and registry.find_name("lz4") is None
    with pytest.raises(CodecConfigError):
        registry.by_name("lz4")
    assert registry.name_or_id(200) == "200"


def test_register_refuses_a_taken_id_or_name_and_an_id_beyond_a_byte() -> None:
    class Clash(Zstd):
        name = "zstd-again"

    class Renamed(Zstd):
        codec_id = 9

    class Wide(Zstd):
        codec_id = 256
        name = "wide"

    before = dict(registry.BY_ID)
    for codec in (Clash(), Renamed(), Wide()):
        with pytest.raises(CodecConfigError):
            registry.register(codec)
    assert before == registry.BY_ID


def test_compression_names_its_codecs_through_the_registry() -> None:
    with pytest.raises(CodecConfigError) as caught:
        codecs.Compression(0)
    assert caught.value.message == (
        "compression codec must be zstd, shuffle-zstd or chunked-shuffle-zstd "
        "(no compression is None)"
    )
    assert caught.value.expected == "1, 2 or 3"
    with pytest.raises(CodecConfigError) as spec:
        codecs.parse_spec("lz4:3")
    assert spec.value.expected == (
        '"none", "default", "zstd[:LEVEL]", "shuffle-zstd[:LEVEL]" or '
        '"chunked-shuffle-zstd[:LEVEL]"'
    )
    for text in ("raw:3", "zstd:", "zstd:1:2", ":3"):
        with pytest.raises(CodecConfigError):
            codecs.parse_spec(text)
    assert codecs.parse_spec(" Default ") is codecs.DEFAULT_COMPRESSION
    assert codecs.parse_spec("NONE") is None


def test_codec_config_error_lives_in_the_error_tree() -> None:
    from hurray_wire import errors

    assert codecs.CodecConfigError is errors.CodecConfigError
    assert issubclass(errors.CodecConfigError, HurrayWireError)
    assert issubclass(errors.CodecConfigError, ValueError)
    assert "CodecConfigError" in errors.__all__


def test_a_codec_is_one_subclass() -> None:
    """The interface a new codec module implements: two methods and three attributes."""
    assert Codec.__abstractmethods__ == frozenset({"encode", "decode_into"})
    for codec in registry.BY_ID.values():
        assert isinstance(codec, Codec)
        assert repr(codec) == f"<codec {codec.codec_id} {codec.name}>"


def test_text_specs_are_read_once_per_encode_and_never_for_a_compression(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import numpy as np

    import hurray_wire as hw
    from hurray_wire.blob import encoder

    calls: list[str] = []

    def counting(spec: str) -> codecs.Compression | None:
        calls.append(spec)
        return codecs.parse_spec(spec)

    monkeypatch.setattr(encoder, "parse_spec", counting)
    pool = np.zeros((4, 4, 2, 64), np.float16)
    tensor = hw.BlockPagedTensor.from_arrays(pool, [0, 1, 2, 3], [0, 4])
    expected = bytes(hw.encode(tensor, compression=codecs.DEFAULT_COMPRESSION))
    assert calls == []
    assert bytes(hw.encode(tensor, compression="default")) == expected
    assert b"".join(hw.encode_parts(tensor, compression="default")) == expected
    assert calls == ["default", "default"]
