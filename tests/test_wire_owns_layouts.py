"""wire/ owns every byte layout: no struct format, item dtype or literal byte offset elsewhere.

Outside ``hurray_wire/wire/`` a module reads and writes bytes only through formats derived
from the construct structs (``wire.fast.derive``, ``item_struct``, ``item_dtype``,
``array_struct``). This test parses every module and refuses:

- a ``struct`` call (``Struct``, ``pack``, ``unpack``, ``pack_into``, ``unpack_from``,
  ``iter_unpack``, ``calcsize``) whose format is a literal or an f-string;
- a NumPy dtype literal of a little-endian item (``"<u8"``, ``"<i4"``, ...);
- a literal non-zero ``offset=`` in an error (an offset must come from the structs).

The exceptions below are listed with the reason each is not a restated layout.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hurray_wire"
STRUCT_CALLS = {"Struct", "pack", "unpack", "pack_into", "unpack_from", "iter_unpack", "calcsize"}
ITEM_DTYPE = re.compile(r"^<[uif][1248]$|^<[QIHBqihbdfL]$")

#: (module, what) -> why it is not a byte layout restated outside wire/.
EXCEPTIONS = {
    ("model/quantization.py", "<f"): "rounds a Python float to float32 (arithmetic, no bytes)",
    ("model/packing.py", "<u4"): "3 bytes of packed 6-bit codes as one integer (bit arithmetic)",
    ("adapters/_common.py", "<u4"): "an engine array's dtype checked as given (input, not wire)",
    ("adapters/_common.py", "<i4"): "an engine array's dtype checked as given (input, not wire)",
    ("tensor.py", "<f4"): "the default scale element type (float32) of a built quantization",
    ("containers/hrry.py", "<u8"): "seq_lens of the reference's .hrry files (issue 22's module "
    "this round; to derive from wire.blob.SEQ_LENS_ITEM)",
    ("blob/decoder.py", ""): "the empty placeholder struct of a plan's derived fields",
}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "wire" not in p.relative_to(PACKAGE).parts)


def _findings(path: Path, root: Path = PACKAGE) -> list[tuple[str, str, int]]:
    """(module, what, line) of every layout literal in ``path``."""
    rel = path.relative_to(root).as_posix()
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            owner = func.value if isinstance(func, ast.Attribute) else None
            is_struct = name in STRUCT_CALLS and (
                (isinstance(owner, ast.Name) and owner.id == "struct") or name == "Struct"
            )
            if is_struct and node.args:
                fmt = node.args[0]
                if isinstance(fmt, ast.Constant) and isinstance(fmt.value, str):
                    found.append((rel, fmt.value, node.lineno))
                elif isinstance(fmt, ast.JoinedStr):
                    found.append((rel, "f-string", node.lineno))
            for kw in node.keywords:
                value = kw.value
                if (
                    kw.arg == "offset"
                    and isinstance(value, ast.Constant)
                    and isinstance(value.value, int)
                    and value.value
                ):
                    found.append((rel, f"offset={value.value}", node.lineno))
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and ITEM_DTYPE.match(node.value)
        ):
            found.append((rel, node.value, node.lineno))
    return found


def test_no_layout_is_restated_outside_wire() -> None:
    findings = [f for path in _modules() for f in _findings(path)]
    unexplained = sorted({f for f in findings if (f[0], f[1]) not in EXCEPTIONS})
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
    )
    whats = {f[1] for f in _findings(sample, tmp_path)}
    assert whats == {"<Q", "f-string", "<u8", "offset=24"}


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
    from hurray_wire.wire.seal import SEAL_SIZE, seal, unseal

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
    assert unseal(sealed, 9) == (0x72DCB18B67A17DFF, 0x72DCB18B67A17DFF)
    assert unseal(b"123456780" + sealed[9:], 9)[0] != unseal(b"123456780" + sealed[9:], 9)[1]
