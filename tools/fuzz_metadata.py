#!/usr/bin/env python3
"""atheris fuzz harness for the KV metadata codec, ``hurray_wire.metadata.decode_metadata``
(containers.md § B.4: the ``.hrry`` KV section, the stream header's and a blob's metadata).

``check_metadata(data)`` decodes the bytes as they are, as a ``bytearray``, through a
``memoryview`` slice at offset 3 of a larger buffer and with ``base_offset=7``, and fails on
any exception that is not a ``HurrayWireError`` and on any disagreement:

* every path gives the same verdict, the same error type and message text up to the offset,
  and with ``base_offset=7`` every error offset is the plain one plus 7;
* the input is never modified;
* a section that decodes (and holds no empty array, which the reference writer refuses too)
  re-encodes with ``encode_metadata`` to exactly its own bytes (the codec has one encoding
  per value: the decoded types name the tags), and that decodes to the same entries.

Modes. By default libFuzzer's byte mutations drive the search; ``--fix-checksums`` (the
flag name is shared with the other harnesses; metadata has no checksum) installs the
structure-aware mutator: a field of the section (``kv_count``, a key length, a value tag, a
string / bytes / array length or count, an element tag), located by walking the section
as the decoder does, set to a boundary value; or the section decoded, an entry added,
dropped, duplicated, retyped or renamed, and encoded again; or a plain byte mutation.

Usage (``pip install atheris``)::

    mkdir -p /tmp/hw-metadata
    python tools/fuzz_metadata.py -max_total_time=300 -timeout=20 /tmp/hw-metadata
    python tools/fuzz_metadata.py --fix-checksums -max_total_time=300 /tmp/hw-metadata-fix
    python tools/fuzz_metadata.py crash-<sha1>          # replay one input

Generated seeds (every value tag, arrays of every element tag, unicode keys, NaN payloads)
go to ``$TMPDIR/hurray-wire-fuzz-metadata-seeds`` and are appended as a seed directory
whenever every positional argument is a directory.
"""

from __future__ import annotations

import random
import struct
import sys
from pathlib import Path
from typing import Any

try:
    import atheris  # type: ignore[import-untyped]
except ImportError:
    atheris = None

if atheris is not None and __name__ == "__main__":
    with atheris.instrument_imports(include=["hurray_wire"]):
        import _instrumented  # the lazy package: every module now, instrumented

        import hurray_wire as hw
        from hurray_wire.metadata import Int64, UInt64, decode_metadata, encode_metadata

        _instrumented.import_all()
else:
    import hurray_wire as hw
    from hurray_wire.metadata import Int64, UInt64, decode_metadata, encode_metadata

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_blob  # byte mutations, boundary values, the shared flags and seeding

SEED_DIRS: list[Path] = []
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")
_FIXED = {2: 8, 3: 8, 4: 8}  # int64, uint64, float64
_OFFSET = 7


def value_key(value: Any) -> Any:
    """A comparable form of a decoded value: type names the tag, floats by their bits."""
    if isinstance(value, list):
        return ("list", tuple(value_key(v) for v in value))
    if isinstance(value, float):
        return ("float", struct.pack("<d", value))
    return (type(value).__name__, value)


def metadata_key(metadata: Any) -> tuple[Any, ...]:
    """Entries in order, each value by ``value_key`` (NaN equals itself here)."""
    return tuple((k, value_key(v)) for k, v in metadata.items())


def has_empty_array(metadata: Any) -> bool:
    return any(isinstance(v, list) and not v for v in metadata.values())


def _decode(data: Any, base_offset: int = 0) -> tuple[Any, hw.HurrayWireError | None]:
    return fuzz_blob.outcome(lambda: decode_metadata(data, base_offset=base_offset))


def _same(what: str, a: tuple[Any, Any], b: tuple[Any, Any], shift: int = 0) -> None:
    (m1, e1), (m2, e2) = a, b
    if (e1 is None) != (e2 is None):
        raise AssertionError(f"{what}: {e1!r} vs {e2!r}")
    if e1 is None:
        if metadata_key(m1) != metadata_key(m2):
            raise AssertionError(f"{what}: different entries")
        return
    if type(e1) is not type(e2) or (e1.field, e1.section) != (e2.field, e2.section):
        raise AssertionError(f"{what}: {e1!r} vs {e2!r}")
    if e1.offset is not None and e2.offset != e1.offset + shift:
        raise AssertionError(f"{what}: offset {e2.offset} is not {e1.offset} + {shift}")


def check_metadata(data: bytes) -> None:
    """One fuzz case: every input path agrees; a good section re-encodes to its bytes."""
    original = bytes(data)
    plain = _decode(data)
    _same("bytes vs bytearray", plain, _decode(bytearray(data)))
    padded = bytearray(b"xyz" + data + b"!")
    _same("bytes vs memoryview at offset 3", plain, _decode(memoryview(padded)[3:-1]))
    _same("base_offset", plain, _decode(data, _OFFSET), _OFFSET)
    if data != original or padded[3:-1] != original:
        raise AssertionError("decode_metadata modified its input")
    metadata, error = plain
    if error is not None or has_empty_array(metadata):
        return
    try:
        again = encode_metadata(metadata)
    except hw.HurrayWireError as exc:
        raise AssertionError(f"encode_metadata refused what decode_metadata gave: {exc!r}") from exc
    if again != data:
        raise AssertionError("encode_metadata(decode_metadata(data)) != data")
    if metadata_key(decode_metadata(again)) != metadata_key(metadata):
        raise AssertionError("decode(encode(decode(data))) != decode(data)")


# -- the structure-aware mutator -------------------------------------------------------------
def metadata_fields(data: bytes, base: int = 0) -> list[tuple[int, int]]:
    """(offset, width) of every count, length and tag of a KV section, walked as the decoder
    walks it (up to the first field that does not fit)."""
    fields: list[tuple[int, int]] = []
    size = len(data)
    pos = base

    def fits(width: int) -> bool:
        return pos + width <= size

    if not fits(4):
        return fields
    fields.append((pos, 4))
    count = _U32.unpack_from(data, pos)[0]
    pos += 4
    for _ in range(min(count, 256)):
        if not fits(2):
            break
        fields.append((pos, 2))
        pos += 2 + _U16.unpack_from(data, pos)[0]
        if not fits(1):
            break
        fields.append((pos, 1))
        tag = data[pos]
        pos += 1
        items, element = 1, tag
        if tag == 7:
            if not fits(5):
                break
            fields += [(pos, 1), (pos + 1, 4)]
            element = data[pos]
            items = min(_U32.unpack_from(data, pos + 1)[0], 4096)
            pos += 5
        for _ in range(items):
            if element in (1, 6):
                if not fits(4):
                    return fields
                fields.append((pos, 4))
                pos += 4 + _U32.unpack_from(data, pos)[0]
            elif element in _FIXED:
                pos += 8
            elif element == 5:
                pos += 1
            else:
                return fields
            if pos > size:
                return fields
    return fields


def _value(rng: random.Random) -> Any:
    choice = rng.randrange(12)
    if choice == 0:
        return "s" * rng.randint(0, 20) + rng.choice(["", "\u00e9", "\U0001f600"])
    if choice == 1:
        return rng.choice([0, 1, -1, 2**63 - 1, -(2**63)])
    if choice == 2:
        return UInt64(rng.choice([0, 1, 2**63, 2**64 - 1]))
    if choice == 3:
        return rng.choice([0.0, -0.0, float("inf"), float("nan"), 1e-310, 1.5])
    if choice == 4:
        return rng.random() < 0.5
    if choice == 5:
        return rng.randbytes(rng.randint(0, 16))
    if choice == 6:
        return [rng.choice(["a", "", "\u00e9"]) for _ in range(rng.randint(1, 4))]
    if choice == 7:
        return [rng.randint(-5, 5) for _ in range(rng.randint(1, 4))]
    if choice == 8:
        return [UInt64(rng.choice([0, 2**64 - 1])) for _ in range(rng.randint(1, 3))]
    if choice == 9:
        return [rng.random() for _ in range(rng.randint(1, 3))]
    if choice == 10:
        return [rng.random() < 0.5 for _ in range(rng.randint(1, 5))]
    return [rng.randbytes(rng.randint(0, 4)) for _ in range(rng.randint(1, 3))]


def rebuild(data: bytes, rng: random.Random) -> bytes | None:
    try:
        entries = dict(decode_metadata(data))
    except hw.HurrayWireError:
        return None
    keys = list(entries)
    op = rng.randrange(5)
    if op == 0 or not keys:
        entries[rng.choice(["k", "model", "hurray.x", "\u00e9", "k" * rng.randint(1, 300)])] = (
            _value(rng)
        )
    elif op == 1:
        del entries[rng.choice(keys)]
    elif op == 2:
        entries[rng.choice(keys)] = _value(rng)
    elif op == 3:
        key = rng.choice(keys)
        entries = {(k + "x" if k == key else k): v for k, v in entries.items()}
    else:
        items = list(entries.items())
        rng.shuffle(items)
        entries = dict(items)
    entries = {k: v for k, v in entries.items() if not (isinstance(v, list) and not v)}
    try:
        return encode_metadata(entries)
    except hw.HurrayWireError:
        return None


def set_field(data: bytes, fields: list[tuple[int, int]], rng: random.Random) -> bytes:
    if not fields:
        return data
    offset, width = rng.choice(fields)
    buf = bytearray(data)
    current = int.from_bytes(buf[offset : offset + width], "little")
    if width == 1 and rng.random() < 0.5:
        value = rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 0xF0, 0xFE, 0xFF])
    else:
        value = fuzz_blob.interesting(rng, width, current)
    buf[offset : offset + width] = value.to_bytes(width, "little")
    return bytes(buf)


def _mutate(data: bytes, max_size: int, seed: int) -> bytes:
    rng = random.Random(seed)
    choice = rng.random()
    out: bytes | None = None
    if choice < 0.35:
        out = set_field(data, metadata_fields(data), rng)
    elif choice < 0.65:
        out = rebuild(data, rng)
    if out is None:
        out = fuzz_blob.libfuzzer_mutate(data, rng, max_size)
    return out[:max_size]


MUTATOR_ERRORS: list[str] = []


def mutate(data: bytes, max_size: int, seed: int) -> bytes:
    """The structure-aware mutator (``--fix-checksums``)."""
    return fuzz_blob.guarded_mutate(
        "fuzz_metadata", MUTATOR_ERRORS, _mutate, lambda d: d, data, max_size, seed
    )


# -- seeds -----------------------------------------------------------------------------------
def generated_seeds() -> dict[str, bytes]:
    """KV sections of every value tag and element tag."""
    rng = random.Random(11)
    seeds = {
        "gen-empty.kv": encode_metadata({}),
        "gen-scalars.kv": encode_metadata(
            {
                "model": "llama-\u00e9",
                "n": -3,
                "big": 2**64 - 1,
                "i64": Int64(5),
                "u64": UInt64(5),
                "nan": float("nan"),
                "flag": True,
                "raw": b"\x00\xff",
            }
        ),
        "gen-arrays.kv": encode_metadata(
            {
                "s": ["a", "\u00e9", ""],
                "i": [1, -2],
                "u": [UInt64(1), UInt64(2**64 - 1)],
                "f": [0.5, -0.0],
                "b": [True, False, True],
                "y": [b"", b"x"],
            }
        ),
        "gen-fuzz-blob.kv": fuzz_blob.random_metadata(rng),
    }
    for number in range(4):
        entries = {f"k{i}": _value(rng) for i in range(rng.randint(1, 6))}
        seeds[f"gen-random{number}.kv"] = encode_metadata(entries)
    return seeds


def seed_inputs() -> dict[str, bytes]:
    return generated_seeds()


def main() -> None:
    fix, argv = fuzz_blob.fix_mode(sys.argv)
    argv = fuzz_blob.seeded_argv(argv, "metadata", SEED_DIRS, generated_seeds)
    if fix:
        fuzz_blob._IN_LIBFUZZER.append(True)
        atheris.Setup(argv, check_metadata, custom_mutator=mutate)
    else:
        atheris.Setup(argv, check_metadata)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
