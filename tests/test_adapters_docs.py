"""docs/adapters.md's Python examples run as written (one namespace, in order)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT


def test_adapters_doc_python_blocks_run() -> None:
    pytest.importorskip("torch")
    text = (ROOT / "docs" / "adapters.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 5
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, "docs/adapters.md", "exec"), namespace)
