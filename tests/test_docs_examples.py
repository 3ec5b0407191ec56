"""Every fenced Python and shell block of README.md and docs/*.md runs as written.

Each page runs on its own, in a fresh temporary directory, in a fresh interpreter: its
Python blocks in order in one namespace (a later block may use what an earlier one
defined), its ``sh`` / ``bash`` blocks with bash (``-e -o pipefail``), its ``console``
blocks command by command (each ``$ `` line must exit with 0 or with the code the page states
after the block as ``(exit code N)``, and the last one with that code). Whatever a page needs is
set up on the page itself; the only things given are the repository's ``fixtures/``,
``tools/`` and ``schemas/`` (as links in the directory, as in a clone) and ``hurray-wire``
on ``PATH``. Blocks in other languages (``text``, plain fences) are not run.

Pages in ``FRESH_MACHINE`` install the project the way a user does (``pip install .``, a
``.venv`` of their own): they run in a copy of the repository, with a fresh venv first on
``PATH`` standing for a fresh machine and no ``PYTHONPATH`` in their shell commands, so the
install, its dependencies and the console script are what is tested. Benchmarks run at a
smoke scale (``HURRAY_BENCH_SMOKE=1``, which docs/performance.md states): the commands as
written, seconds instead of minutes. ``SKIP`` names the one block that cannot run inside
this test: README's ``bash .ci/run``, which is CI itself (the command that runs this test).
"""

from __future__ import annotations

import json
import os
import re
import shutil
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
TIMEOUT = 1200  # seconds per page (a fresh-machine page installs torch: minutes under load)

#: (page, text the block starts with) -> why it does not run here.
SKIP: dict[tuple[str, str], str] = {
    ("README.md", "bash .ci/run"): "is CI itself: the command that runs this test",
}  # fmt: skip

#: Pages that install the project themselves -> why (they run as on a fresh machine).
FRESH_MACHINE: dict[str, str] = {
    "README.md": "its first command is `pip install .` on a fresh machine",
    "docs/nixl.md": "section 1 makes a .venv and installs the project and NIXL into it",
    "docs/performance.md": "makes a venv with the test and bench extras and NIXL, then runs "
    "every benchmark (at the smoke scale here)",
}
#: What the shell commands of a fresh-machine page must not inherit from this test's venv.
FRESH_UNSET = ("PYTHONPATH", "VIRTUAL_ENV")


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
    import os
    unset = os.environ.get("HW_DOCS_SHELL_UNSET", "").split()
    shell_env = {k: v for k, v in os.environ.items() if k not in unset}
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
            done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", command], env=shell_env)
            if done.returncode not in expected:
                sys.exit(f"{where}: exit {done.returncode}, expected {expected}: {command}")
    """
)


def _copy_of_the_repository(directory: Path) -> None:
    """The files a clone has (tracked and new, not ignored), copied: a page may write there."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, directory / name)


def _fresh_machine(directory: Path) -> Path:
    """Where a fresh-machine page's venv goes: beside its directory (out of the page's sight),
    removed after the test, pass or fail (1.6 GB with torch)."""
    return directory.parent / f"{directory.name}-fresh-machine"


def _environment(directory: Path, *, fresh: bool) -> dict[str, str]:
    shims = directory / ".shims"
    shims.mkdir()
    scratch = directory / ".tmp"  # the page's mkdtemp / mktemp -d: gone with tmp_path
    scratch.mkdir()
    shim = shims / "hurray-wire"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m hurray_wire "$@"\n')
    shim.chmod(0o755)
    first = [str(shims)]
    extra = {}
    if fresh:
        _copy_of_the_repository(directory)
        machine = _fresh_machine(directory)
        subprocess.run([sys.executable, "-m", "venv", str(machine)], check=True)
        first = [str(machine / "bin"), *first]
        extra = {"HW_DOCS_SHELL_UNSET": " ".join(FRESH_UNSET)}
    else:
        for name in ("fixtures", "tools", "schemas"):
            (directory / name).symlink_to(ROOT / name)
    path = os.pathsep.join([*first, str(Path(sys.executable).parent), os.environ["PATH"]])
    return {
        **os.environ, "PATH": path, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
        "HURRAY_BENCH_SMOKE": "1", "TMPDIR": str(scratch), **extra,
    }  # fmt: skip


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_runs_as_written(page: Path, tmp_path: Path) -> None:
    found = blocks(page)
    if not found:
        pytest.skip("no Python or shell blocks")
    env = _environment(tmp_path, fresh=str(page.relative_to(ROOT)) in FRESH_MACHINE)
    listing = tmp_path / ".blocks.json"
    listing.write_text(json.dumps([vars(b) for b in found]))
    driver = tmp_path / ".driver.py"
    driver.write_text(DRIVER)
    try:
        done = subprocess.run(
            [sys.executable, str(driver), str(page.relative_to(ROOT)), str(listing)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT,
        )  # fmt: skip
    finally:
        shutil.rmtree(_fresh_machine(tmp_path), ignore_errors=True)
    assert done.returncode == 0, (done.stdout[-3000:] + "\n" + done.stderr[-5000:]).strip()


def test_the_skip_list_names_blocks_that_exist() -> None:
    """A skip entry whose block was edited away is stale: remove it."""
    for page_name, start in SKIP:
        text = (ROOT / page_name).read_text(encoding="utf-8")
        assert any(m.group(2).lstrip().startswith(start) for m in FENCE.finditer(text)), start


def test_fresh_machine_pages_exist_and_install() -> None:
    """A fresh-machine entry must name a page that still installs the project."""
    for page_name in FRESH_MACHINE:
        text = (ROOT / page_name).read_text(encoding="utf-8")
        assert "pip install" in text, page_name


def test_the_readme_test_command_is_what_ci_runs() -> None:
    """The one skipped block is README's test command, and it is the CI entry point."""
    assert (ROOT / ".ci" / "run").is_file()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first_blocks = [m.group(2).strip() for m in FENCE.finditer(readme)][:2]
    assert first_blocks[1] == "bash .ci/run", first_blocks
    assert first_blocks[0].startswith("pip install . && hurray-wire "), first_blocks
