"""Every fenced Python and shell block of README.md and docs/*.md runs as written.

Each page runs on its own, in a fresh temporary directory, in a fresh interpreter: its
Python blocks in order in one namespace (a later block may use what an earlier one
defined), its ``sh`` / ``bash`` blocks with bash (``-e -o pipefail``), its ``console``
blocks command by command (each ``$ `` line must exit with 0 or with the code the page states
after the block as ``(exit code N)``, and the last one with that code). Whatever a page needs is
set up on the page itself; the only things given are the repository's ``fixtures/``,
``tools/`` and ``schemas/`` (as links in the directory, as in a clone) and ``hurray-wire``
on ``PATH``. Blocks in other languages (``text``, plain fences) are not run.

``SKIP`` names the few blocks that cannot run here, each with the reason: blocks that
install the project itself (the environment this test runs in is that installation) and
the benchmark run (minutes per benchmark, peers in other processes).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = {"python": "python", "py": "python", "sh": "sh", "bash": "sh", "shell": "sh",
             "console": "console"}  # fmt: skip
FENCE = re.compile(r"^```([A-Za-z]*)[^\n]*\n(.*?)^```[ \t]*\n(\n\(exit code (\d+)\))?", re.M | re.S)
TIMEOUT = 600  # seconds per page

#: (page, text the block starts with) -> why it does not run here.
SKIP: dict[tuple[str, str], str] = {
    ("README.md", "pip install ."): "installs the package, then `bash .ci/run` is the whole CI "
    "(this test included)",
    ("docs/nixl.md", "python3 -m venv .venv"): "creates a venv and installs NIXL from the "
    "network: .ci/run does exactly this before the tests",
    ("docs/performance.md", 'pip install -e ".[bench]"'): "installs the bench extra, then runs "
    "every benchmark (minutes each, a 2 GiB cache, NIXL peers in other processes): "
    "measurements taken by hand, not a test",
}  # fmt: skip


@dataclass
class Block:
    language: str
    code: str
    exit_code: int
    line: int


def blocks(page: Path) -> list[Block]:
    """The runnable blocks of ``page`` in order (skipped ones left out)."""
    text = page.read_text(encoding="utf-8")
    name = str(page.relative_to(ROOT))
    out = []
    for match in FENCE.finditer(text):
        language = LANGUAGES.get(match.group(1).lower())
        code = match.group(2)
        if language is None or any(
            page_name == name and code.lstrip().startswith(start) for page_name, start in SKIP
        ):
            continue
        line = text.count("\n", 0, match.start()) + 1
        out.append(Block(language, code, int(match.group(4) or 0), line))
    return out


DRIVER = textwrap.dedent(
    """
    import json, subprocess, sys
    page, blocks = sys.argv[1], json.load(open(sys.argv[2]))
    namespace = {"__name__": "__main__"}
    for block in blocks:
        where = f"{page}:{block['line']}"
        if block["language"] == "python":
            exec(compile(block["code"], where, "exec"), namespace)
            continue
        stated = block["exit_code"]
        if block["language"] == "sh":
            commands = [(block["code"], {0})]
        else:
            lines = [l[2:] for l in block["code"].splitlines() if l.startswith("$ ")]
            commands = [(l, {0, stated}) for l in lines[:-1]] + [(lines[-1], {stated})]
        for command, expected in commands:
            done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", command])
            if done.returncode not in expected:
                sys.exit(f"{where}: exit {done.returncode}, expected {expected}: {command}")
    """
)


def _environment(directory: Path) -> dict[str, str]:
    shims = directory / ".shims"
    shims.mkdir()
    shim = shims / "hurray-wire"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m hurray_wire "$@"\n')
    shim.chmod(0o755)
    for name in ("fixtures", "tools", "schemas"):
        (directory / name).symlink_to(ROOT / name)
    path = os.pathsep.join([str(shims), str(Path(sys.executable).parent), os.environ["PATH"]])
    return {**os.environ, "PATH": path, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_runs_as_written(page: Path, tmp_path: Path) -> None:
    found = blocks(page)
    if not found:
        pytest.skip("no Python or shell blocks")
    env = _environment(tmp_path)
    listing = tmp_path / ".blocks.json"
    listing.write_text(json.dumps([vars(b) for b in found]))
    driver = tmp_path / ".driver.py"
    driver.write_text(DRIVER)
    done = subprocess.run(
        [sys.executable, str(driver), str(page.relative_to(ROOT)), str(listing)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout[-3000:] + "\n" + done.stderr[-5000:]).strip()


def test_the_skip_list_names_blocks_that_exist() -> None:
    """A skip entry whose block was edited away is stale: remove it."""
    for page_name, start in SKIP:
        text = (ROOT / page_name).read_text(encoding="utf-8")
        assert any(m.group(2).lstrip().startswith(start) for m in FENCE.finditer(text)), start
