"""Imports point down the layers of docs/architecture.md and never up.

Every ``import hurray_wire.X`` / ``from hurray_wire.X import ...`` in the package, at module
level or inside a function, is checked against the layer table below: a module may import
its own package and any lower layer, nothing above and no other package of its own layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "hurray_wire"

# Lowest first. A module belongs to the longest prefix that names it.
LAYERS: list[tuple[str, ...]] = [
    ("errors", "_version", "_lazy"),
    ("wire", "buffers", "parallel", "memo"),
    ("dtypes", "crc32c"),
    ("model",),
    ("metadata",),
    ("kv_scale", "fingerprint", "_interop"),
    # transforms/ read a TensorCore and build through type(tensor).from_arrays; the
    # BlockPagedTensor's helper methods (tensor.py) call them, pointing down.
    ("tensor_core",),
    ("transforms",),
    ("tensor",),
    ("codecs",),
    # integrity/ (functions on tensors and record codecs, no framing) sits below blob/:
    # the blob encoder/decoder use its digests and section payload codecs.
    ("integrity",),
    ("blob",),
    ("containers",),
    ("adapters", "reference_api"),
    ("transport",),
    # hurray_wire.vllm imports vLLM: only an engine process imports it, never the core.
    ("vllm",),
    ("report",),
    ("testing",),
    ("cli_parser",),
    ("cli",),
    # The console script's entry: parses (cli_parser), then loads the commands (cli).
    ("cli_args",),
    ("__main__",),
    ("__init__",),
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def _top(module: str) -> str:
    """The first component below hurray_wire: the unit the layer table speaks of."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1] if len(parts) > 2 else [*parts[:-1], "__init__"]
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, int]]:
    """(imported hurray_wire module, line) for every import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.startswith("hurray_wire")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "hurray_wire":  # from hurray_wire import errors, dtypes
                found += [(f"hurray_wire.{a.name}", node.lineno) for a in node.names]
            elif node.module.startswith("hurray_wire."):
                found.append((node.module, node.lineno))
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer() -> None:
    missing = {_top(_module_name(p)) for p in MODULES} - set(RANK)
    assert not missing, f"add these to LAYERS (and docs/architecture.md): {sorted(missing)}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path: Path) -> None:
    me = _top(_module_name(path))
    wrong = []
    for target, line in _imports(path):
        other = _top(target)
        if other == me:
            continue
        if other not in RANK:
            wrong.append(f"line {line}: {target} is in no layer")
        elif RANK[other] >= RANK[me]:
            wrong.append(
                f"line {line}: {me} (layer {RANK[me]}) imports {target} (layer {RANK[other]})"
            )
    assert not wrong, "\n".join(wrong)


def test_wire_imports_nothing_but_construct() -> None:
    """The structs know no rules: wire/ imports no other part of the package."""
    for path in (PACKAGE / "wire").glob("*.py"):
        others = [t for t, _ in _imports(path) if not t.startswith("hurray_wire.wire")]
        assert not others, f"{path.name} imports {others}"


def test_the_checker_catches_an_upward_import(tmp_path: Path) -> None:
    """The rule itself: a model module importing the blob layer is reported."""
    fake = tmp_path / "bad.py"
    fake.write_text("from hurray_wire.blob import decode\n")
    ((target, _),) = _imports(fake)
    assert RANK[_top(target)] > RANK["model"]
