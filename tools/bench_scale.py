"""The benchmarks' smoke scale: ``HURRAY_BENCH_SMOKE=1`` runs every benchmark at a toy size.

The docs test (tests/test_docs_examples.py) sets it to check that docs/performance.md's
commands run as written in seconds; figures are only ever taken without it.
"""

from __future__ import annotations

import os

SMOKE = os.environ.get("HURRAY_BENCH_SMOKE", "") not in ("", "0")


def scaled(full: int, smoke: int) -> int:
    """``full`` for a measurement, ``smoke`` when only checking that the command runs."""
    return smoke if SMOKE else full
