"""Shared paths and manifest loaders for the tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import settings

import hurray_wire as hw

#: Hypothesis's per-example deadline (200 ms by default) is a timed assertion: on a loaded or
#: slow machine a correct example fails it. Every property test runs without one; how long
#: a suite may take is its CI budget's concern.
settings.register_profile("no-deadline", deadline=None)
settings.load_profile("no-deadline")

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
CONFORMANCE = FIXTURES / "conformance"
BLOCK_PAGED = CONFORMANCE / "block_paged"
REFERENCE = CONFORMANCE / "reference"


#: A socket a unit test leaves open fails that test, instead of surfacing as one "unclosed
#: socket" line at the interpreter's exit, far from its cause (issue 28). Unclosed files
#: stay warnings.
SOCKETS_CLOSED = (
    pytest.mark.filterwarnings("error:unclosed <socket:ResourceWarning"),
    pytest.mark.filterwarnings(
        "error:Exception ignored.*<socket:pytest.PytestUnraisableExceptionWarning"
    ),
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(ROOT / "tests"):
            for mark in SOCKETS_CLOSED:
                item.add_marker(mark)


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


def random_pool(
    etype: hw.ElementType, shape: tuple[int, ...] = (5, 4, 2, 8), seed: int = 0
) -> np.ndarray:
    """Random bit patterns of ``etype`` (NaNs and all) in an array of ``shape``."""
    rng = np.random.default_rng(seed)
    count = int(np.prod(shape))
    if etype.is_packed:
        codes = rng.integers(0, 1 << etype.bit_width, count, dtype=np.uint8)
        return codes.view(etype.numpy_dtype).reshape(shape)
    raw = rng.integers(0, 256, count * etype.numpy_dtype.itemsize, dtype=np.uint8)
    return raw.view(etype.numpy_dtype).reshape(shape)
