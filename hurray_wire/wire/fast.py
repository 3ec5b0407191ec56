"""``struct.Struct`` formats derived from the construct definitions, for the hot path.

construct stays the single source of truth: ``derive`` walks a fixed-size construct
``Struct`` and produces the equivalent ``struct.Struct`` (``Const`` bytes become ``Ns``
fields whose expected value is kept in ``consts``). Tests prove both parse the same bytes
to the same values. Parsing with plain construct costs tens of microseconds per section;
an unpack costs well under one.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import construct as c

__all__ = ["FastStruct", "derive", "offset_of"]


@dataclass(frozen=True)
class FastStruct:
    """A derived struct: field names in order, and the expected bytes of Const fields."""

    struct: struct.Struct
    names: tuple[str, ...]
    consts: tuple[tuple[int, bytes], ...]  # (position in the unpacked tuple, expected bytes)

    @property
    def size(self) -> int:
        return self.struct.size

    def index(self, name: str) -> int:
        """Position of ``name`` in the unpacked tuple."""
        return self.names.index(name)

    def pack(self, **fields: Any) -> bytes:
        """Pack by field name; ``Const`` fields (magic, reserved bytes) fill themselves in."""
        values: list[Any] = [fields.get(name) for name in self.names]
        for position, expected in self.consts:
            values[position] = expected
        return self.struct.pack(*values)


def _leaf(con: Any) -> tuple[str, bytes | None]:
    """The format code of one subcon, and its expected bytes if it is a Const."""
    while isinstance(con, c.Renamed):
        con = con.subcon
    if isinstance(con, c.Const):
        return f"{len(con.value)}s", con.value
    if isinstance(con, c.FormatField):
        return con.fmtstr[1:], None
    if isinstance(con, c.Adapter):  # Mapping, _LayerIndex: same bytes as their subcon
        return _leaf(con.subcon)
    if isinstance(con, c.Rebuild):  # a length field: same bytes as its subcon
        return _leaf(con.subcon)
    if isinstance(con, c.Bytes) and isinstance(con.length, int):
        return f"{con.length}s", None
    raise TypeError(f"cannot derive a struct format from {con!r}")


def derive(definition: Any) -> FastStruct:
    """Derive the little-endian ``struct.Struct`` of a fixed-size construct ``Struct``."""
    codes = []
    names = []
    consts = []
    for position, sub in enumerate(definition.subcons):
        code, const = _leaf(sub)
        codes.append(code)
        names.append(sub.name)
        if const is not None:
            consts.append((position, const))
    compiled = struct.Struct("<" + "".join(codes))
    if compiled.size != definition.sizeof():
        raise TypeError("derived size differs from the construct size")
    return FastStruct(compiled, tuple(names), tuple(consts))


def offset_of(definition: Any, name: str) -> int:
    """Byte offset of field ``name`` in a construct ``Struct`` (the fields before it are fixed).

    Error messages and readers name where a field sits without restating the layout.
    """
    offset = 0
    for sub in definition.subcons:
        if sub.name == name:
            return offset
        offset += sub.sizeof()
    raise KeyError(name)
