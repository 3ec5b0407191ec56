"""docs/vllm.md's Python and shell blocks run as written (one namespace, in order); its
option table names exactly the connector's options."""

from __future__ import annotations

import re

from tests.conftest import ROOT

TEXT = (ROOT / "docs" / "vllm.md").read_text(encoding="utf-8")


def test_vllm_doc_python_blocks_run(capsys: object) -> None:
    blocks = re.findall(r"```python\n(.*?)```", TEXT, flags=re.S)
    assert blocks
    assert not re.findall(r"```(?:sh|bash|shell)\n", TEXT)  # server commands are text
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, "docs/vllm.md", "exec"), namespace)


def test_vllm_doc_lists_every_option() -> None:
    rows = set(re.findall(r"^\| `(\w+)` \| ", TEXT, flags=re.M))
    source = (ROOT / "hurray_wire" / "vllm" / "connector.py").read_text(encoding="utf-8")
    table = source[source.index("OPTIONS: dict") : source.index("}\n", source.index("OPTIONS"))]
    options = set(re.findall(r'^    "(\w+)":', table, flags=re.M))
    assert options and options <= rows, options - rows
