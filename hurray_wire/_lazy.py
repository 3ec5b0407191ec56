"""Packages that re-export their modules' names and load each module on first use.

``from hurray_wire import decode`` then loads the decoder and what it imports, not every
module its package lists (issue 31: the decode path's start-up, docs/performance.md).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["exports"]


def exports(
    package: str, table: dict[str, str], other: Callable[[str], Any] | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` for ``table``: each module -> the names
    it gives, space-separated. A name is looked up once, then kept in the package; a name
    not in the table is ``other``'s (an AttributeError without it)."""
    owner = {name: module for module, names in table.items() for name in names.split()}

    def attribute(name: str) -> Any:
        module = owner.get(name)
        if module is None:
            if other is not None:
                return other(name)
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def listing() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(owner))

    return attribute, listing
