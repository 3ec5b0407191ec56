"""The README's Python examples run as written, in a temporary working directory (they
write files, e.g. ``model.hrws``, which must not land in the clone)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import ROOT


def test_readme_python_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)
    assert (tmp_path / "model.hrws").is_file()  # written here, not in the clone
