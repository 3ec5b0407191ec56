"""What a user installs: the wheel carries the license texts pyproject declares and the JSON
Schema ``dump --json --help`` points at (issue 32)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import pytest

from hurray_wire import cli_args, cli_parser
from tests.conftest import ROOT


def test_the_licenses_match_the_declared_expression() -> None:
    project = (ROOT / "pyproject.toml").read_text(encoding="utf-8")  # (no tomllib on 3.10)
    assert '\nlicense = "MIT OR Apache-2.0"\n' in project
    assert '\nlicense-files = ["LICENSE-MIT", "LICENSE-APACHE"]\n' in project
    mit = (ROOT / "LICENSE-MIT").read_text(encoding="utf-8")
    assert mit.startswith("MIT License\n\nCopyright (c) the hurray-wire authors\n")
    assert "WITHOUT WARRANTY OF ANY KIND" in mit
    apache = (ROOT / "LICENSE-APACHE").read_text(encoding="utf-8")
    assert "Apache License\n                           Version 2.0, January 2004" in apache
    assert "END OF TERMS AND CONDITIONS" in apache


def test_the_help_points_at_the_installed_schema(capsys: pytest.CaptureFixture[str]) -> None:
    schema = Path(cli_parser.DUMP_SCHEMA)
    assert schema == ROOT / "hurray_wire" / "schemas" / "dump.schema.json"
    jsonschema.Draft202012Validator.check_schema(json.loads(schema.read_text(encoding="utf-8")))
    with pytest.raises(SystemExit):
        cli_args.main(["dump", "--json", "--help"])
    assert "".join(str(schema).split()) in "".join(capsys.readouterr().out.split())  # wrapped


def test_the_wheel_carries_the_schema_and_the_licenses(tmp_path: Path) -> None:
    """``pip wheel .`` as a user would build it (about 2 s)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
         "-q", "-w", str(tmp_path)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("hurray_wire-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        shipped = archive.read("hurray_wire/schemas/dump.schema.json")
    assert shipped == (ROOT / "hurray_wire/schemas/dump.schema.json").read_bytes()
    licenses = {Path(n).name for n in names if ".dist-info/licenses/" in n}
    assert licenses == {"LICENSE-MIT", "LICENSE-APACHE"}
