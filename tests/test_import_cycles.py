"""No import circles among hurray_wire's modules (issue 31).

The graph has an edge a -> b for each ``import hurray_wire.b`` / ``from hurray_wire.b import
...`` in module a (``from hurray_wire.pkg import name`` names the submodule when ``name`` is
one, else the package). Three graphs, each stricter about which imports count:

- run time: module-level imports, without ``if TYPE_CHECKING:`` blocks and imports inside
  functions: a circle here is a partly initialised module at import time; none is allowed;
- types: the same plus ``TYPE_CHECKING`` imports (what mypy follows): none is allowed (the
  codecs' circle through the ``Compression`` config was one: codecs now type against the
  ``codecs.base.Settings`` protocol);
- everything, imports inside functions too: none is allowed (``tensor`` <-> ``transforms``
  was one: the transforms now read a ``tensor_core.TensorCore`` and build through
  ``type(tensor).from_arrays``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "hurray_wire"
BLOCKS = (ast.With, ast.For, ast.While)
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def graph(root: Path, *, types: bool = False, functions: bool = False) -> dict[str, set[str]]:
    """module -> the package modules it imports, counting the imports the flags ask for."""
    modules = {_name(p, root): p for p in root.rglob("*.py")}
    top = root.name

    def target(name: str) -> str:
        while name not in modules and "." in name:
            name = name.rpartition(".")[0]
        return name

    def imports(body: list[ast.stmt]) -> set[str]:
        found: set[str] = set()
        for node in body:
            if isinstance(node, ast.Import):
                found |= {target(a.name) for a in node.names if a.name.split(".")[0] == top}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.split(".")[0] == top:
                    for a in node.names:
                        full = f"{node.module}.{a.name}"
                        found.add(full if full in modules else target(node.module))
            elif isinstance(node, ast.If):
                if not _is_type_checking(node) or types:
                    found |= imports(node.body)
                found |= imports(node.orelse)
            elif isinstance(node, ast.Try):
                for handler in node.handlers:
                    found |= imports(handler.body)
                found |= imports([*node.body, *node.orelse, *node.finalbody])
            elif isinstance(node, BLOCKS) or (functions and isinstance(node, DEFINITIONS)):
                found |= imports(node.body)
        return found

    return {
        name: imports(ast.parse(path.read_text(), str(path)).body) - {name}
        for name, path in modules.items()
    }


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


@pytest.mark.parametrize(
    ("types", "functions"),
    [(False, False), (True, False), (True, True)],
    ids=["run time", "with TYPE_CHECKING", "with imports inside functions"],
)
def test_no_import_circle(types: bool, functions: bool) -> None:
    assert circles(graph(PACKAGE, types=types, functions=functions)) == []


@pytest.mark.parametrize(
    ("files", "types", "functions", "expected"),
    [
        ({"a": "from hw import b\n", "b": "import hw.a\n"}, False, False, [["hw.a", "hw.b"]]),
        ({"a": "from hw.b import x\n", "b": "from hw import a as c\n"}, False, False,
         [["hw.a", "hw.b"]]),
        ({"a": "from hw import b\n", "b": "if TYPE_CHECKING:\n    import hw.a\n"}, False, False,
         []),
        ({"a": "from hw import b\n", "b": "if TYPE_CHECKING:\n    import hw.a\n"}, True, False,
         [["hw.a", "hw.b"]]),
        ({"a": "from hw import b\n", "b": "def f():\n    import hw.a\n"}, True, False, []),
        ({"a": "from hw import b\n", "b": "def f():\n    import hw.a\n"}, True, True,
         [["hw.a", "hw.b"]]),
        ({"a": "from hw import b\n", "b": "import hw.c\n", "c": "import hw.a\n"}, False, False,
         [["hw.a", "hw.b", "hw.c"]]),
        ({"a": "from hw import b\n", "b": "import numpy\n"}, False, False, []),
    ],
)  # fmt: skip
def test_the_checker_finds_a_planted_circle(
    tmp_path: Path, files: dict[str, str], types: bool, functions: bool, expected: list[list[str]]
) -> None:
    """The checker itself, on a made-up package ``hw``: each kind of import it counts."""
    root = tmp_path / "hw"
    root.mkdir()
    (root / "__init__.py").write_text("")
    for name, text in files.items():
        (root / f"{name}.py").write_text(text)
    assert circles(graph(root, types=types, functions=functions)) == expected
