"""wire/ owns every byte layout: no struct format, item dtype or literal byte offset elsewhere.

Outside ``hurray_wire/wire/`` a module reads and writes bytes only through formats derived
from the construct structs (``wire.fast.derive``, ``item_struct``, ``item_dtype``,
``array_struct``). This test parses every module and refuses:

- a ``struct`` call (``Struct``, ``pack``, ``unpack``, ``pack_into``, ``unpack_from``,
  ``iter_unpack``, ``calcsize``) whose format is a literal or an f-string;
- a NumPy dtype literal of a little-endian item (``"<u8"``, ``"<i4"``, ...);
- a literal non-zero ``offset=`` in an error (an offset must come from the structs), or an
  ``offset=`` computed with a literal width (``offset=at + 8``), or a literal offset passed
  by position to an error (``_error(message, field, 6)``);
- a literal width or offset used on bytes: a slice of a byte buffer (``view[at : at + 8]``,
  ``src[:4]``), ``int.from_bytes(x[a:b])`` with a literal bound, ``.to_bytes(8, ...)``, a
  cursor moved by a literal (``pos + 4``, ``cursor.pos - 2``) and a table sized by one
  (``4 * count``);
- a literal width handed to a reader (``cursor.need(8, ...)``, ``read(4)``), a literal offset
  handed to an unpack (``unpack_from(view, 8)``, ``np.frombuffer(buf, dtype, n, 16)``), and
  a width or offset kept under a name (``_HEADER_SIZE = 64``, ``_WIDTH = {tag: 8}``,
  ``_COUNT_AT = 4``).

A literal here is an integer other than 0 and 1 (so -1 too) (a first byte, the next one and "to the
end" are not widths).

The exceptions below are listed with the reason each is not a restated layout.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hurray_wire"
#: Names a byte buffer goes by in this package (slices of them are byte ranges).
BUFFERS = {"view", "data", "raw", "buf", "buffer", "src", "dst", "blob", "header", "head",
           "body", "record", "payload", "tail", "chunk", "stored"}  # fmt: skip
#: Names a read position goes by (moving one by a literal steps over a literal width), as a
#: variable or an attribute (``cursor.pos``).
CURSORS = {"pos", "at", "offset", "start", "end", "stop"}
#: Readers that take a width (``need(8, ...)``) and unpacks that take an offset.
READERS = {"need", "read", "read_exact", "skip", "take"}
OFFSET_ARGS = {"unpack_from": 1, "pack_into": 1, "frombuffer": 3}  # call -> the offset's position
#: A module-level name that keeps a byte width or offset.
LAYOUT_NAME = re.compile(r"(^|_)(SIZE|SIZES|WIDTH|WIDTHS|AT|OFFSET)$")
STRUCT_CALLS = {"Struct", "pack", "unpack", "pack_into", "unpack_from", "iter_unpack", "calcsize"}
ITEM_DTYPE = re.compile(r"^<[uif][1248]$|^<[QIHBqihbdfL]$")

#: (module, what) -> why it is not a byte layout restated outside wire/.
EXCEPTIONS = {
    ("model/quantization.py", "<f"): "rounds a Python float to float32 (arithmetic, no bytes)",
    ("model/packing.py", "<u4"): "3 bytes of packed 6-bit codes as one integer (bit arithmetic)",
    ("adapters/_common.py", "<u4"): "an engine array's dtype checked as given (input, not wire)",
    ("adapters/_common.py", "<i4"): "an engine array's dtype checked as given (input, not wire)",
    ("model/packing.py", "4 * count"): "6-bit codes: 4 codes in 3 bytes (bit packing of "
    "elements, docs/spec § element types, not a record)",
    ("model/packing.py", "slice[3]"): "the same 4-codes-in-3-bytes packing",
    ("model/packing.py", "slice[4]"): "the same 4-codes-in-3-bytes packing",
    ("cli.py", "slice[16]"): "a hex dump's row of 16 bytes (display width)",
    ("transport/records.py", "slice[16]"): "the first 16 bytes of a bad reason, shown",
}


#: Literals in modules another branch owns, each as (module, what) -> "file:line on that
#: branch, what clears it": allowed here until the lead merges that branch, then removed.
#: Empty: the two the issue named (``codecs/chunked.py`` ~143, ``model/descriptor_codec.py``
#: ~652-656) are gone from main and from branch lean-core (15e0477), by this scan.
_PENDING_OTHER_BRANCH: dict[tuple[str, str], str] = {}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "wire" not in p.relative_to(PACKAGE).parts)


def _widths(node: ast.AST | None) -> list[int]:
    """The integer literals in ``node`` that can be a width or an offset (not 0, 1, -1)."""
    if node is None:
        return []
    return [
        n.value
        for n in ast.walk(node)  # -1 parses as a minus applied to 1
        if isinstance(n, ast.Constant) and type(n.value) is int and n.value not in (0, 1)
    ]


def _base(node: ast.AST) -> str:
    """The name an expression starts from (``view`` of ``view.obj[2:]``)."""
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def _slice_widths(node: ast.AST) -> list[int]:
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
        return _widths(node.slice.lower) + _widths(node.slice.upper)
    return []


def _call_findings(node: ast.Call) -> list[str]:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    owner = func.value if isinstance(func, ast.Attribute) else None
    found = []
    is_struct = name in STRUCT_CALLS and (
        (isinstance(owner, ast.Name) and owner.id == "struct") or name == "Struct"
    )
    if is_struct and node.args:
        fmt = node.args[0]
        if isinstance(fmt, ast.Constant) and isinstance(fmt.value, str):
            found.append(fmt.value)
        elif isinstance(fmt, ast.JoinedStr):
            found.append("f-string")
    for kw in node.keywords:
        value = kw.value
        if kw.arg == "offset" and isinstance(value, ast.Constant):
            if type(value.value) is int and value.value:
                found.append(f"offset={value.value}")
        elif kw.arg == "offset" and _widths(value):
            found.append(f"offset={ast.unparse(value)}")
    if name == "to_bytes" and node.args and _widths(node.args[0]):
        found.append(f"to_bytes({ast.unparse(node.args[0])})")
    if name == "from_bytes" and node.args and _slice_widths(node.args[0]):
        found.append(f"from_bytes({ast.unparse(node.args[0])})")
    if name.endswith(("Error", "_error", "_bad")):
        literals = [a for a in node.args[1:] if isinstance(a, ast.Constant)]
        found += [f"error offset {w}" for a in literals for w in _widths(a)]
    if name in READERS and node.args and isinstance(node.args[0], ast.Constant):
        found += [f"{name}({w})" for w in _widths(node.args[0])]
    at = OFFSET_ARGS.get(name)
    if at is not None and len(node.args) > at and _widths(node.args[at]):
        found.append(f"{name}(..., {ast.unparse(node.args[at])})")
    return found


def _cursor(node: ast.AST) -> str:
    """The cursor name of ``pos`` or ``cursor.pos``, else ""."""
    if isinstance(node, ast.Name) and node.id in CURSORS:
        return node.id
    if isinstance(node, ast.Attribute) and node.attr in CURSORS:
        return ast.unparse(node)
    return ""


def _named_layout(node: ast.Assign) -> list[str]:
    """A width or offset kept under a layout name at module level (``_HEADER_SIZE = 64``)."""
    names = [t.id for t in node.targets if isinstance(t, ast.Name) and LAYOUT_NAME.search(t.id)]
    value = node.value
    values = value.values if isinstance(value, ast.Dict) else [value]
    literal = [w for v in values if isinstance(v, ast.Constant) for w in _widths(v)]
    return [f"{n} = {w}" for n in names for w in literal]


def _findings(path: Path, root: Path = PACKAGE) -> list[tuple[str, str, int]]:
    """(module, what, line) of every layout literal in ``path``."""
    rel = path.relative_to(root).as_posix()
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        whats: list[str] = []
        if isinstance(node, ast.Call):
            whats += _call_findings(node)
        if isinstance(node, ast.Subscript) and _base(node.value) in BUFFERS:
            whats += [f"slice[{w}]" for w in _slice_widths(node)]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub):
            for a, b in ((node.left, node.right), (node.right, node.left)):
                if _cursor(b) and isinstance(a, ast.Constant):
                    whats += [f"{_cursor(b)} + {w}" for w in _widths(a)]
        if isinstance(node, ast.Assign) and node in tree.body:
            whats += _named_layout(node)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for a, b in ((node.left, node.right), (node.right, node.left)):
                if (
                    isinstance(a, ast.Constant)
                    and a.value in (2, 4, 8, 16)
                    and "count" in ast.unparse(b)
                ):
                    whats.append(f"{a.value} * count")
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and ITEM_DTYPE.match(node.value)
        ):
            whats.append(node.value)
        found += [(rel, what, getattr(node, "lineno", 0)) for what in whats]
    return found


def test_no_layout_is_restated_outside_wire() -> None:
    findings = [f for path in _modules() for f in _findings(path)]
    allowed = EXCEPTIONS.keys() | _PENDING_OTHER_BRANCH.keys()
    unexplained = sorted({f for f in findings if (f[0], f[1]) not in allowed})
    assert not unexplained, "byte layouts restated outside wire/ (derive them): " + str(unexplained)


def test_every_exception_is_still_needed() -> None:
    """An exception whose literal is gone must leave the list (it cannot hide a new one)."""
    seen = {(f[0], f[1]) for path in _modules() for f in _findings(path)}
    assert set(EXCEPTIONS) <= seen, sorted(set(EXCEPTIONS) - seen)


def test_the_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    """A control: the scanner sees each kind of literal it refuses."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import struct\nimport numpy as np\n"
        'A = struct.Struct("<Q")\nB = struct.unpack_from(f"<{3}I", b"")\n'
        'C = np.dtype("<u8")\nD = dict(offset=24)\n'
        "E = int.from_bytes(b[at : at + 8], 'little')\nF = (7).to_bytes(8, 'little')\n"
        "G = view[pos + 2 : stop]\nH = src[:4]\nI = pos + 4\nJ = 4 * count\n"
        "K = dict(offset=at + 8)\nL = _error('short', 'descriptor_length', 6)\n"
        "M = view[1:]\nN = data[:-1]\nO = other[:4]\nP = dict(offset=at)\n"
        "Q = cursor.pos - 2\nR = cursor.need(8, 'f', 'int64')\nS = s.unpack_from(view, 8)\n"
        "T = np.frombuffer(buf, np.uint8, 4, 16)\n_HEADER_SIZE = 64\n_WIDTH = {1: 4, 2: 1}\n"
        "U = cursor.need(width, 'f', 'x')\nV = s.unpack_from(view, at)\n_TABLE = {1: 4}\n"
    )
    whats = {f[1] for f in _findings(sample, tmp_path)}
    assert whats == {
        "<Q", "f-string", "<u8", "offset=24", "from_bytes(b[at:at + 8])", "to_bytes(8)",
        "slice[2]", "slice[4]", "pos + 2", "pos + 4", "at + 8", "4 * count", "offset=at + 8",
        "error offset 6", "cursor.pos + 2", "need(8)", "unpack_from(..., 8)",
        "frombuffer(..., 16)", "_HEADER_SIZE = 64", "_WIDTH = 4",
    }  # fmt: skip


def test_one_role_map() -> None:
    """The kv_role codes are the descriptor's, everywhere (streams, transfer records), and
    only wire/ reads them the other way (no module outside it inverts the map)."""
    from hurray_wire.transport.records import ROLE_CODES
    from hurray_wire.wire.descriptor import KV_ROLE_BY_CODE, KV_ROLES
    from hurray_wire.wire.stream import ROLE_BITS

    assert ROLE_CODES is KV_ROLES
    assert {KV_ROLES[name] for name in KV_ROLE_BY_CODE.values()} == set(KV_ROLE_BY_CODE)
    assert ROLE_BITS == {"key": 0x01, "value": 0x02, "fused": 0x04}
    restated = ('"fused": 2', "KV_ROLES.items()", "ROLE_BITS.items()}", "ROLE_CODES.items()")
    sources = [p for p in _modules() if any(text in p.read_text() for text in restated)]
    assert sources == [], sources


def test_one_seal() -> None:
    """Every record checksum field is the seal's item (wire/seal.py computes and places it)."""
    from hurray_wire.wire import blob, integrity, stream, transfer
    from hurray_wire.wire.fast import derive
    from hurray_wire.wire.seal import SEAL_SIZE, checksum_of, seal

    for struct in (
        blob.HEADER_CHECKSUM,
        stream.RECORD_CHECKSUM,
        integrity.KNOWN_PAGES_CHECKSUM,
        transfer.RECORD_CHECKSUM,
    ):
        assert derive(struct).struct.format == "<Q"
    assert derive(integrity.FINGERPRINT_HEADER).sizes["body_checksum"] == SEAL_SIZE
    sealed = seal(b"123456789")  # xxh3_64 (seed 0) of the check string, little-endian after it
    assert sealed == b"123456789" + bytes.fromhex("ff7da1678bb1dc72")
    assert checksum_of(b"123456789") == 0x72DCB18B67A17DFF != checksum_of(b"123456780")


def test_records_are_derived_once_in_wire() -> None:
    """A fixed record's fast struct (format, offsets, packing) is derived in wire/ only;
    every other module imports it (``ws.FAST_END_FOOTER``, ``wire.descriptor.FIXED``)."""
    calls = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            func = node.func if isinstance(node, ast.Call) else None
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "derive":
                calls.append((path.relative_to(PACKAGE).as_posix(), node.lineno))  # type: ignore[attr-defined]
    assert calls == [], calls


def test_digest_records_locate_their_items() -> None:
    """Head, runs and sizes of the integrity records, from wire/records.py."""
    import numpy as np

    from hurray_wire.wire.records import DIGEST_SECTION, KNOWN_PAGES, PAGE_REFS

    assert (DIGEST_SECTION.head.size, KNOWN_PAGES.head.size, PAGE_REFS.head.size) == (8, 16, 8)
    assert DIGEST_SECTION.item_at(4, 1) == 8 + 32 and PAGE_REFS.item_at(3, 1, 2) == 8 + 24 + 16
    assert [PAGE_REFS.count_of(n) for n in (7, 8, 16, 24, 56)] == [None, 0, None, 1, 3]
    packed = PAGE_REFS.pack(1, 1, 2, runs=(np.array([3, 5]), np.array([7, 9], np.uint64)))
    assert packed == bytes([1, 1, 0, 0, 2, 0, 0, 0]) + b"".join(
        v.to_bytes(8, "little") for v in (3, 5, 7, 9)
    )
    assert [r.tolist() for r in PAGE_REFS.runs(packed, 2)] == [[3, 5], [7, 9]]


def test_records_frame_seal_and_place_their_parts() -> None:
    """A wire Record frames its prefix (magic, major version, total_length, in that order),
    places every part of the record, closes it with its seal and checks the seal."""
    import pytest

    from hurray_wire.containers.records import StreamHeader, encode_end_record, encode_stream_header
    from hurray_wire.errors import InvalidStreamError, StreamTruncatedError
    from hurray_wire.wire import records as wr

    record = wr.STREAM_HEADER.raising(InvalidStreamError, StreamTruncatedError)
    data = encode_stream_header(StreamHeader(model="m"))
    assert record.frame(data) == len(data) == record.minimum == 64
    spans = record.spans(64, (("model_name", 1), ("metadata", 0)))
    assert spans == {"head": (0, 32), "model_name": (32, 33), "metadata": (33, 33),
                     "padding": (33, 56), "seal": (56, 64)}  # fmt: skip
    assert record.close(data[:33], 64) == data
    record.check_seal(data, 56)
    with pytest.raises(InvalidStreamError, match="stream header checksum mismatch") as info:
        record.check_seal(data[:40] + b"\1" + data[41:], 56)
    assert (info.value.field, info.value.offset) == ("checksum", 56)
    cases = [
        (b"HRW", StreamTruncatedError, None),
        (b"HRWX" + data[4:16], InvalidStreamError, "magic"),
        (data[:4] + b"\2" + data[5:16], InvalidStreamError, "version_major"),
        (data[:8] + (65).to_bytes(8, "little"), InvalidStreamError, "total_length"),
        (data[:8] + (0).to_bytes(8, "little"), InvalidStreamError, "total_length"),
    ]
    for prefix, error, field in cases:
        with pytest.raises(error) as caught:
            record.frame(prefix)
        assert caught.value.field == field
    end = encode_end_record([], 0)  # its footer: the seal, then total_length again
    assert wr.END_RECORD.spans(64)["seal"] == (48, 64) and end[56:] == (64).to_bytes(8, "little")
    assert wr.END_RECORD.close(end[:32]) == end
    with pytest.raises(ValueError, match="bad blob magic"):  # unbound: wire/ imports no errors
        wr.BLOB.frame(b"XXXX")


def test_seals_are_checked_by_their_records() -> None:
    """Outside wire/ no module unseals a record or hashes one to compare by hand: a record's
    Record checks its seal. What computes one, and why, is listed."""
    allowed = {
        "blob/envelope.py": "the blob header's checksum, its long message naming the ranges",
        "blob/encoder.py": "writes the header checksum into the encoder's output in place",
        "fingerprint.py": "the body checksum its head holds (written, and compared by the Record)",
    }
    users = {
        path.relative_to(PACKAGE).as_posix()
        for path in _modules()
        if re.search(r"\b(unseal|checksum_of)\b", path.read_text())
    }
    assert users == set(allowed), sorted(users ^ set(allowed))
