"""DecodeLimits: caps on what one blob may make the decoder allocate or parse."""

from __future__ import annotations

from dataclasses import dataclass, fields

from hurray_wire.errors import ArgumentTypeError

__all__ = ["DEFAULT_LIMITS", "DecodeLimits", "check_limits_argument"]


@dataclass(frozen=True)
class DecodeLimits:
    """Caps on what a blob may make the decoder allocate or parse (docs/security.md says
    how to lower them for an untrusted peer)."""

    max_descriptor_length: int = 16 << 20
    max_sections: int = 1024
    max_decompressed_bytes: int = 16 << 30  # sum of raw sizes of compressed sections
    max_metadata_bytes: int = 16 << 20

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
    if type(limits) is DecodeLimits or isinstance(limits, DecodeLimits):
        return limits
    raise ArgumentTypeError(
        "limits must be a hurray_wire.DecodeLimits (or None for the defaults)",
        field="limits",
        found=type(limits).__name__,
    )
