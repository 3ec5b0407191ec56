"""Documentation that shows real output must stay real."""

from __future__ import annotations

import sys

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import make_cli_doc


def test_cli_doc_is_the_real_output() -> None:
    assert make_cli_doc.main(["--check"]) == 0, "run: python tools/make_cli_doc.py"
