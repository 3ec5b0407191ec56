"""The integrity arguments every decoding entry point takes, checked in one place."""

from __future__ import annotations

from hurray_wire.errors import ArgumentTypeError
from hurray_wire.fingerprint import EngineFingerprint
from hurray_wire.integrity.page_store import PageStore

__all__ = ["check_integrity_arguments"]


def check_integrity_arguments(page_store: object, expect_fingerprint: object) -> None:
    """``page_store`` is a PageStore or None, ``expect_fingerprint`` an EngineFingerprint
    or None (decode, the stream readers, the NIXL receiver)."""
    if page_store is not None and not isinstance(page_store, PageStore):
        raise ArgumentTypeError(
            "page_store must be a PageStore or None",
            field="page_store",
            found=type(page_store).__name__,
        )
    if expect_fingerprint is not None and not isinstance(expect_fingerprint, EngineFingerprint):
        raise ArgumentTypeError(
            "expect_fingerprint must be an EngineFingerprint or None",
            field="expect_fingerprint",
            found=type(expect_fingerprint).__name__,
        )
