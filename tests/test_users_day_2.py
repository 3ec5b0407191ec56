"""Issue 32, a user's day part two: damaged caches located, safetensors-like save/load,
a clean repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import hurray_wire as hw
from hurray_wire import cli
from tests.conftest import FIXTURES, ROOT

STREAM = FIXTURES / "streams/whole_cache_2_layers.hrws"


@pytest.mark.parametrize("to", ["hrws", ".hrws", "blob-stream"])
def test_to_takes_the_extensions_too(tmp_path: Path, to: str) -> None:
    out = tmp_path / "out.bin"
    assert cli.main(["convert", "-q", "--to", to, str(STREAM), str(out)]) == 0
    assert out.read_bytes()[:4] == STREAM.read_bytes()[:4]


def test_to_refuses_an_unknown_format(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["convert", "--to", "hrwx", str(STREAM), "-"])
    assert info.value.code == 2 and "invalid choice: 'hrwx'" in capsys.readouterr().err


def test_every_doc_imports_engine_fingerprint_one_way() -> None:
    """``hw.EngineFingerprint`` or ``from hurray_wire import EngineFingerprint``, nothing
    else, in every page users read."""
    assert hw.EngineFingerprint is hw.integrity.EngineFingerprint
    assert "EngineFingerprint" in hw.__all__
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for block in re.findall(r"```python\n(.*?)```", text, flags=re.S):
            statements = re.findall(r"^from (\S+) import (\([^)]*\)|[^\n]*)", block, flags=re.M)
            for module, names in statements:
                if re.search(r"\bEngineFingerprint\b", names):
                    assert module == "hurray_wire", (page.name, module)
