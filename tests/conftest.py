"""Shared paths and manifest loaders for the tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
CONFORMANCE = FIXTURES / "conformance"
BLOCK_PAGED = CONFORMANCE / "block_paged"
REFERENCE = CONFORMANCE / "reference"


def load_manifest(folder: Path) -> dict[str, Any]:
    with open(folder / "manifest.json", encoding="utf-8") as handle:
        data: dict[str, Any] = json.load(handle)
    return data


@pytest.fixture(scope="session")
def block_paged_manifest() -> dict[str, Any]:
    return load_manifest(BLOCK_PAGED)


@pytest.fixture(scope="session")
def reference_manifest() -> dict[str, Any]:
    return load_manifest(REFERENCE)
