"""DecodeLimits: caps on what one blob may make the decoder allocate or parse."""

from __future__ import annotations

from dataclasses import dataclass, fields

from hurray_wire.errors import ArgumentTypeError
from hurray_wire.integrity.digests import MAX_EMPTY_PAGES

__all__ = ["DEFAULT_LIMITS", "DecodeLimits", "check_limits_argument"]


@dataclass(frozen=True)
class DecodeLimits:
    """Caps on what a blob may make the decoder allocate or parse (docs/security.md says
    how to lower them for an untrusted peer)."""

    max_descriptor_length: int = 16 << 20
    max_sections: int = 1024
    max_decompressed_bytes: int = 16 << 30  # sum of raw sizes of compressed sections
    max_metadata_bytes: int = 16 << 20
    """A blob's metadata section, and a stream header's metadata, in bytes."""
    max_metadata_entries: int = 65536
    """Entries of one metadata section (blob or stream header): a decoded entry costs
    ~150 bytes of Python objects however small it is on the wire, so 16 MiB of 7-byte
    entries would cost ~360 MiB without this cap (65536 entries: ~10 MiB)."""
    max_stream_entries: int = 1 << 20
    """Index entries of a stream's end record (one per blob): 1 M blobs is ~2,000 requests
    of 256 layers x 2 roles; each entry becomes a ``StreamEntry`` object (~200 bytes)."""
    max_empty_pages: int = MAX_EMPTY_PAGES
    """Pages sent as bytes whose record is 0 bytes (``num_heads`` or ``head_dim`` 0): the
    blob pays nothing for them, yet each costs the decoder work (a delta blob of 576 bytes
    could claim 2^33 of them). Every other page is paid for by at least one byte of a
    section's raw size (bounded by the blob's length and ``max_decompressed_bytes``)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ArgumentTypeError(
                    "a decode limit must be a non-negative int",
                    field=f.name,
                    found=repr(value),
                )


DEFAULT_LIMITS = DecodeLimits()


def check_limits_argument(limits: object) -> DecodeLimits:
    """``limits`` as given (a DecodeLimits) or the defaults (None); anything else refused."""
    if limits is None:
        return DEFAULT_LIMITS
    if isinstance(limits, DecodeLimits):
        return limits
    raise ArgumentTypeError(
        "limits must be a hurray_wire.DecodeLimits (or None for the defaults)",
        field="limits",
        found=type(limits).__name__,
    )
