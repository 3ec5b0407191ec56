"""``struct.Struct`` formats and byte offsets derived from the construct definitions.

construct stays the single source of truth: ``derive`` walks a fixed-size construct
``Struct`` (nested fixed-size structs and arrays included) and produces the equivalent
``struct.Struct`` plus the byte offset of every field, so no module outside ``wire/`` needs
to restate an offset or a size. ``Const`` bytes become ``Ns`` fields whose expected value is
kept in ``consts``. Tests prove both parse the same bytes to the same values. Parsing with
plain construct costs tens of microseconds per section; an unpack costs well under one.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from struct import Struct
from typing import Any

import construct as c


def align(value: int, alignment: int) -> int:
    """``value`` rounded up to a multiple of ``alignment`` (a positive integer)."""
    return -(-value // alignment) * alignment


@dataclass(frozen=True)
class FastStruct:
    """A derived struct: leaf names in unpack order (unique; a nested struct's keep their own,
    array items are ``name[i]``), their offsets (every nested struct or array's start too) and
    Const expectations."""

    struct: struct.Struct
    names: tuple[str, ...]
    consts: tuple[tuple[int, bytes], ...]  # (position in the unpacked tuple, expected bytes)
    offsets: Mapping[str, int]
    sizes: Mapping[str, int]  # bytes of each leaf
    #: Packs the non-Const fields: zero Consts are pad bytes, others lead (the magic).
    packer: Struct | None = None
    leading: tuple[bytes, ...] = ()

    @property
    def fields(self) -> tuple[tuple[int, int, str], ...]:
        """``(offset, size, name)`` of every leaf, in wire order (for annotated dumps)."""
        return tuple((self.offsets[n], self.sizes[n], n) for n in self.names)

    @property
    def size(self) -> int:
        return self.struct.size

    def limit(self, name: str) -> int:
        """The largest value unsigned field ``name`` holds (a length or count's maximum)."""
        return (1 << 8 * self.sizes[name]) - 1

    def unpack_dict(self, buffer: Any, offset: int = 0) -> dict[str, Any]:
        """The fields at ``offset`` by name (for cold paths: dumps, reports)."""
        return dict(zip(self.names, self.struct.unpack_from(buffer, offset), strict=True))

    def pack(self, *values: Any, **fields: Any) -> bytes:
        """Pack the non-Const fields, in order or by name (not both); Const fields (magic,
        reserved bytes) fill themselves in, so no caller restates their bytes."""
        if fields:
            if values:
                raise TypeError("pack takes the fields in order or by name, not both")
            skip = dict(self.consts)
            values = tuple(fields.get(name) for i, name in enumerate(self.names) if i not in skip)
        if self.packer is not None:
            packed: bytes = self.packer.pack(*self.leading, *values)
            return packed
        full = list(values)
        for position, expected in self.consts:
            full.insert(position, expected)
        return self.struct.pack(*full)


def _unwrap(con: Any) -> Any:
    while isinstance(con, c.Renamed):
        con = con.subcon
    return con


def _leaf(con: Any) -> tuple[str, bytes | None]:
    """The format code of one leaf subcon, and its expected bytes if it is a Const."""
    con = _unwrap(con)
    if isinstance(con, c.Const):
        return f"{len(con.value)}s", con.value
    if isinstance(con, c.FormatField):
        return con.fmtstr[1:], None
    if isinstance(con, (c.Adapter, c.Rebuild)):  # Mapping, _LayerIndex, a length field
        return _leaf(con.subcon)  # the same bytes as their subcon
    if isinstance(con, c.Bytes) and isinstance(con.length, int):
        return f"{con.length}s", None
    raise TypeError(f"cannot derive a struct format from {con!r}")


def derive(definition: Any) -> FastStruct:
    """Derive the little-endian ``struct.Struct`` of a fixed-size construct ``Struct``."""
    codes: list[str] = []
    names: list[str] = []
    consts: list[tuple[int, bytes]] = []  # Const bytes by position in the unpacked tuple
    offsets: dict[str, int] = {}
    sizes: dict[str, int] = {}

    def add(name: str, sub: Any, at: int) -> int:
        if name in names:
            raise TypeError(f"field name {name!r} appears twice: offsets would be ambiguous")
        code, const = _leaf(sub)
        if const is not None:
            consts.append((len(names), const))
        codes.append(code)
        names.append(name)
        offsets[name] = at
        sizes[name] = struct.calcsize("<" + code)
        return at + sizes[name]

    def walk(parent: Any, at: int) -> int:
        for sub in parent.subcons:
            inner = _unwrap(sub)
            if sub.name is not None:
                offsets.setdefault(sub.name, at)
            if isinstance(inner, c.Struct):
                at = walk(inner, at)
            elif isinstance(inner, c.Array) and isinstance(inner.count, int):
                for item in range(inner.count):
                    at = add(f"{sub.name}[{item}]", inner.subcon, at)
            else:
                at = add(sub.name, inner, at)
        return at

    end = walk(definition, 0)
    compiled = struct.Struct("<" + "".join(codes))
    if compiled.size != definition.sizeof() or end != compiled.size:
        raise TypeError("derived size differs from the construct size")
    # A packer of the non-Const fields: zero Consts become pad bytes (which ``struct`` writes
    # as zeros), non-zero ones (a magic) are passed first; none when such a one is not leading.
    leading: list[bytes] = []
    fmt = list(codes)
    for position, expected in consts:
        if not any(expected):
            fmt[position] = f"{len(expected)}x"
        elif position == len(leading):
            leading.append(expected)
        else:
            fmt, leading = [], []
            break
    packer = struct.Struct("<" + "".join(fmt)) if fmt else None
    return FastStruct(compiled, tuple(names), tuple(consts), offsets, sizes, packer, tuple(leading))


def offset_of(definition: Any, name: str) -> int:
    """Byte offset of field ``name`` in a construct ``Struct`` whose fields before it are
    fixed-size (the later ones may vary: index entries, KV entries), for error messages."""
    offset = 0
    for sub in definition.subcons:
        if sub.name == name:
            return offset
        offset += sub.sizeof()
    raise KeyError(name)


#: NumPy's name of each little-endian integer / float struct code.
_NUMPY = {"B": "u1", "H": "u2", "I": "u4", "L": "u4", "Q": "u8", "b": "i1", "h": "i2",
          "i": "i4", "l": "i4", "q": "i8", "f": "f4", "d": "f8"}  # fmt: skip


def item_struct(item: Any) -> Struct:
    """The ``struct.Struct`` of one wire item (``c.Int64ul``, or a struct's field)."""
    return Struct("<" + _leaf(item)[0])


def item_dtype(item: Any) -> str:
    """The NumPy dtype (``"<u8"``) of a wire item, for arrays of it (seq_lens, digests,
    frame sizes): a layout read as an array is still the wire's."""
    return "<" + _NUMPY[_leaf(item)[0]]


@lru_cache(maxsize=64)
def array_struct(item: Any, count: int) -> Struct:
    """A struct of ``count`` consecutive ``item``s (small tables unpacked in one call);
    the formats of the 64 most recent counts are kept."""
    return Struct(f"<{count}{_leaf(item)[0]}")
