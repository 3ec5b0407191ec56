"""docs/security.md's examples run as written: the Python blocks in one namespace, in
order, and each shell block in bash (with this tree's package first on the path)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

TEXT = (ROOT / "docs" / "security.md").read_text(encoding="utf-8")


def test_security_doc_python_blocks_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", TEXT, flags=re.S)
    assert blocks
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, "docs/security.md", "exec"), namespace)


def test_security_doc_shell_blocks_run(tmp_path: Path) -> None:
    blocks = re.findall(r"```sh\n(.*?)```", TEXT, flags=re.S)
    assert blocks
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "python"  # this interpreter (a venv's, kept by exec) as `python`
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "TMPDIR": str(tmp_path)}  # the blocks' mktemp -d: gone with tmp_path  # fmt: skip
    for block in blocks:
        done = subprocess.run(["bash", "-c", block], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300, check=False)  # fmt: skip
        assert done.returncode == 0, (block, done.stdout[-2000:], done.stderr[-2000:])
