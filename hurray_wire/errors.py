"""The error tree: one base, so a caller can catch every input problem with one clause.

Every error carries the place it was found (``section``, ``field``, ``offset``) and what was
``expected`` versus ``found`` when known, and says all of it in its message.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "HurrayWireError",
    "ArgumentTypeError",
    "InvalidDescriptorError",
    "IndexBufferError",
    "QuantizationNotDefinedError",
    "UnsupportedLayoutError",
    "TruncatedError",
    "DescriptorTruncatedError",
    "InvalidBlobError",
    "BlobTruncatedError",
    "ChecksumError",
    "PaddingError",
    "SectionError",
    "DecompressionError",
    "LimitExceededError",
    "InvalidTensorError",
    "InvalidMetadataError",
    "InvalidContainerError",
    "ContainerTruncatedError",
    "InvalidStreamError",
    "StreamTruncatedError",
    "StreamBlobTruncatedError",
    "MissingTensorError",
    "ClosedContainerError",
    "TransportError",
    "InvalidTransferRecordError",
]

_UNSET: Any = object()


class HurrayWireError(Exception):
    """Base of every error hurray-wire raises on bad input or bad arguments."""

    def __init__(
        self,
        message: str,
        *,
        section: str | None = None,
        field: str | None = None,
        offset: int | None = None,
        expected: Any = _UNSET,
        found: Any = _UNSET,
    ) -> None:
        self.section = section
        self.field = field
        self.offset = offset
        self.expected = None if expected is _UNSET else expected
        self.found = None if found is _UNSET else found
        where = []
        if section is not None:
            where.append(f"section {section}")
        if field is not None:
            where.append(f"field {field}")
        if offset is not None:
            where.append(f"at byte offset {offset}")
        text = f"{', '.join(where)}: {message}" if where else message
        details = []
        if expected is not _UNSET:
            details.append(f"expected {expected}")
        if found is not _UNSET:
            details.append(f"found {found}")
        if details:
            text = f"{text} ({', '.join(details)})"
        self.message = message
        self._kwargs: dict[str, Any] = {
            "section": section,
            "field": field,
            "offset": offset,
            "expected": expected,
            "found": found,
        }
        super().__init__(text)

    def relocated(self, **changes: Any) -> HurrayWireError:
        """The same error with its place (section, field, offset) filled in or changed."""
        kwargs = {**self._kwargs, **changes}
        clone = type(self).__new__(type(self))
        clone.__dict__.update({k: v for k, v in self.__dict__.items() if k != "_kwargs"})
        HurrayWireError.__init__(clone, self.message, **kwargs)
        clone.__traceback__ = self.__traceback__
        return clone


class ArgumentTypeError(HurrayWireError, TypeError):
    """An argument of the wrong Python type (e.g. a str where bytes are needed)."""


class InvalidDescriptorError(HurrayWireError, ValueError):
    """A tensor descriptor, layout or quantization that breaks a rule of the spec."""


class IndexBufferError(InvalidDescriptorError):
    """block_table / seq_ptr / seq_lens contents that break the storage invariants.

    ``position`` is the index of the first offending element, when there is one.
    """

    def __init__(self, message: str, *, position: int | None = None, **kw: Any) -> None:
        self.position = position
        super().__init__(message, **kw)


class QuantizationNotDefinedError(InvalidDescriptorError):
    """A quantization scheme the spec does not define for block-paged (NF4, MXFP)."""


class UnsupportedLayoutError(HurrayWireError, ValueError):
    """A valid Hurray descriptor of a layout other than block-paged: not an input error."""

    def __init__(self, message: str, *, layout_tag: int, layout_name: str, **kw: Any) -> None:
        self.layout_tag = layout_tag
        self.layout_name = layout_name
        super().__init__(message, **kw)


class TruncatedError(HurrayWireError, ValueError):
    """The input ended before the structure it announces."""


class DescriptorTruncatedError(TruncatedError, InvalidDescriptorError):
    """A descriptor shorter than its own descriptor_length or its sections."""


class InvalidBlobError(HurrayWireError, ValueError):
    """A hurray-wire blob whose envelope breaks a rule of docs/wire-format.md."""


class BlobTruncatedError(TruncatedError, InvalidBlobError):
    """A blob shorter than its total_length, or a section outside the blob."""


class ChecksumError(InvalidBlobError):
    """A stored checksum that does not match the bytes it protects."""


class PaddingError(InvalidBlobError):
    """A padding byte that is not zero, or padding where none is allowed."""


class SectionError(InvalidBlobError):
    """A section entry that is out of bounds, overlapping, duplicated, missing or unknown."""


class DecompressionError(InvalidBlobError):
    """A compressed section that fails to decompress to exactly its declared raw size."""


class LimitExceededError(InvalidBlobError):
    """A blob that would make the decoder allocate or read more than its limits allow."""


class InvalidTensorError(HurrayWireError, ValueError):
    """Arrays passed to build a tensor that do not agree with each other or the layout."""


class InvalidMetadataError(HurrayWireError, ValueError):
    """Key/value metadata that cannot be encoded or decoded."""


class InvalidContainerError(HurrayWireError, ValueError):
    """A reference stream record or .hrry file that breaks docs of the containers."""


class ContainerTruncatedError(TruncatedError, InvalidContainerError):
    """A reference stream or .hrry file that ends inside a structure."""


class InvalidStreamError(HurrayWireError, ValueError):
    """A stream header, end record or record sequence that breaks docs/streaming.md."""


class StreamTruncatedError(TruncatedError, InvalidStreamError):
    """The stream ended, or its connection broke, before the stream was complete."""


class StreamBlobTruncatedError(StreamTruncatedError, BlobTruncatedError):
    """The stream was cut inside a blob: both a stream cut and a truncated blob."""


class MissingTensorError(HurrayWireError, KeyError):
    """A lookup by name or by {layer, role} that the container or stream does not hold."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class ClosedContainerError(HurrayWireError, ValueError):
    """Use of a container reader after ``close()`` (a ValueError, like a closed file)."""


class TransportError(HurrayWireError):
    """A transfer between two machines failed: the engine's error (as ``__cause__``), a bad
    or corrupted blob, an abort by the peer or a deadline passed. ``layer`` and ``role`` name
    the blob concerned, when one is."""

    def __init__(
        self, message: str, *, layer: int | None = None, role: str | None = None, **kw: Any
    ) -> None:
        self.layer = layer
        self.role = role
        if layer is not None or role is not None:
            message = f"layer {layer} {role}: {message}"
        super().__init__(message, **kw)


class InvalidTransferRecordError(TransportError, ValueError):
    """A transfer control record (docs/nixl.md § 3) that breaks its rules."""
