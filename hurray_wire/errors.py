"""The error tree: one base, so one clause catches every input problem; each error names
its place (``section``, ``field``, ``offset``), ``expected`` and ``found``, in its message."""

from __future__ import annotations

from typing import Any, TypeVar

_UNSET: Any = object()
_T = TypeVar("_T")


class HurrayWireError(Exception):
    """Base of every error hurray-wire raises on bad input or bad arguments. In a stream it is
    also ``located`` (``blob``, ``blob_offset``, ``layer``, ``role``, ``file_offset``: the
    bad byte in the input; ``offset`` counts in the blob); ``details()`` gives it as data."""

    blob: int | None = None
    blob_offset: int | None = None
    file_offset: int | None = None
    layer: int | None = None
    role: str | None = None
    pages: tuple[int, ...] = ()

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
        self.message = message
        self._expected = expected
        self._found = found
        self.expected = None if expected is _UNSET else expected
        self.found = None if found is _UNSET else found
        self.section = section
        self.field = field
        self.offset = offset
        super().__init__(self._text())

    def __str__(self) -> str:  # the text (KeyError would repr() it, OSError show errno)
        return str(self.args[0]) if self.args else ""

    def _text(self) -> str:
        where = []
        if self.section is not None:
            where.append(f"section {self.section}")
        if self.field is not None:
            where.append(f"field {self.field}")
        if self.file_offset is not None:
            inside = self.offset is not None and self.offset != self.file_offset
            where.append(f"at file offset {self.file_offset}"
                         + (f" (byte {self.offset} of the blob)" if inside else ""))  # fmt: skip
        elif self.offset is not None:
            where.append(f"at byte offset {self.offset}")
        text = f"{', '.join(where)}: {self.message}" if where else self.message
        if self.blob is not None:
            what = f"blob {self.blob}"
            if self.layer is not None or self.role is not None:
                what += f" (layer {self.layer} {self.role})"
            text = f"{what} at stream offset {self.blob_offset}: {text}"
        given = (("expected", self._expected), ("found", self._found))
        details = [f"{name} {value}" for name, value in given if value is not _UNSET]
        if details:
            text = f"{text} ({', '.join(details)})"
        return text

    def relocated(
        self,
        *,
        section: str | None = None,
        field: str | None = None,
        offset: int | None = None,
    ) -> HurrayWireError:
        """This error (updated in place, to be raised), its place filled in by the caller that
        knows where the bytes sit: a model constructor knows the field, its decoder the offset."""
        for name, value in (("section", section), ("field", field), ("offset", offset)):
            if value is not None:
                setattr(self, name, value)
        self.args = (self._text(), *self.args[1:])
        return self

    def located(
        self,
        *,
        blob: int,
        blob_offset: int,
        layer: int | None = None,
        role: str | None = None,
        file_offset: int | None = None,
    ) -> HurrayWireError:
        """This error (updated in place, to be raised) placed in a stream: blob ``blob`` at
        ``blob_offset``, its ``offset`` counted from there unless ``file_offset`` is given.
        A second call changes nothing: the innermost reader knew best."""
        if self.blob is not None:
            return self
        self.blob, self.blob_offset = blob, blob_offset
        self.layer = self.layer if layer is None else layer
        self.role = self.role if role is None else role
        if file_offset is None and self.offset is not None:
            file_offset = blob_offset + self.offset
        self.file_offset = file_offset
        return self.relocated()

    def details(self) -> dict[str, Any]:
        """What the error says, as JSON-able data (``dump --json`` / ``validate --json``):
        its class, message and every place field that is known."""
        out: dict[str, Any] = {"type": type(self).__name__, "message": self.message}
        for name in ("section", "field", "offset", "file_offset", "blob", "blob_offset",
                     "layer", "role"):  # fmt: skip
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.pages:
            out["pages"] = [int(page) for page in self.pages]
        for name, value in (("expected", self._expected), ("found", self._found)):
            if value is not _UNSET:
                out[name] = value if isinstance(value, (int, str)) or value is None else str(value)
        return out


class ArgumentTypeError(HurrayWireError, TypeError): ...  # e.g. a str where bytes are needed


def flag(value: object, name: str) -> bool:
    """``value`` if it is True or False (not 1, not None), else an ``ArgumentTypeError``."""
    if type(value) is not bool:
        raise ArgumentTypeError(f"{name} must be True or False", field=name, found=repr(value))
    return value


def instance(value: object, cls: type[_T], name: str) -> _T:
    """``value`` if it is a ``cls``, else an ``ArgumentTypeError`` naming ``name``."""
    if not isinstance(value, cls):
        article = "an" if cls.__name__[0] in "AEIOU" else "a"
        raise ArgumentTypeError(
            f"expected {article} {cls.__name__}", field=name, found=type(value).__name__
        )
    return value


def non_negative(value: object, name: str) -> int:
    """``value`` if it is an int >= 0 (not a bool), else an ``ArgumentTypeError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ArgumentTypeError(f"{name} must be an int >= 0", field=name, found=repr(value))
    return value


def cut_inside(what: str, size: int) -> str:
    """The message of an input of ``size`` bytes cut inside ``what``: an empty input is
    called empty (a user's first mistake: a file that was never written)."""
    return f"empty input (0 bytes): no {what}" if size == 0 else f"input ends inside the {what}"


# The families: each names the structure whose rules the input breaks; a truncation is also a
# ``TruncatedError`` (the input ended before the structure it announces).
class TruncatedError(HurrayWireError, ValueError): ...


class CodecConfigError(HurrayWireError, ValueError): ...  # a bad compression spec or argument


class InvalidDescriptorError(HurrayWireError, ValueError): ...  # descriptor, layout, scheme


class DescriptorTruncatedError(TruncatedError, InvalidDescriptorError): ...


class QuantizationNotDefinedError(InvalidDescriptorError): ...  # NF4, MXFP on block-paged


class IndexBufferError(InvalidDescriptorError):
    """block_table / seq_ptr / seq_lens contents that break the storage invariants;
    ``position``: the first offending element's index, when there is one."""

    def __init__(self, message: str, *, position: int | None = None, **kw: Any) -> None:
        self.position = position
        super().__init__(message, **kw)


class UnsupportedLayoutError(HurrayWireError, ValueError):
    """A valid Hurray descriptor of a layout other than block-paged: not an input error."""

    def __init__(self, message: str, *, layout_tag: int, layout_name: str, **kw: Any) -> None:
        self.layout_tag = layout_tag
        self.layout_name = layout_name
        super().__init__(message, **kw)


# A blob's envelope (docs/wire-format.md): its checksums, padding, sections, compressed
# payloads and the decoder's limits.
class InvalidBlobError(HurrayWireError, ValueError): ...


class BlobTruncatedError(TruncatedError, InvalidBlobError): ...  # or a section outside it


class ChecksumError(InvalidBlobError): ...


class PaddingError(InvalidBlobError): ...  # a non-zero byte, or padding where none is allowed


class SectionError(InvalidBlobError): ...  # out of bounds, overlapping, duplicated, unknown


class DecompressionError(InvalidBlobError): ...  # not exactly the declared raw size


class LimitExceededError(InvalidBlobError): ...  # more than the decoder's limits allow


class InvalidTensorError(HurrayWireError, ValueError): ...  # arrays that disagree


class InvalidMetadataError(HurrayWireError, ValueError): ...  # key/value metadata


# A reference stream record or .hrry file; a stream of blobs (docs/streaming.md), a cut
# inside one of its blobs being both.
class InvalidContainerError(HurrayWireError, ValueError): ...


class ContainerTruncatedError(TruncatedError, InvalidContainerError): ...


class InvalidStreamError(HurrayWireError, ValueError): ...


class StreamTruncatedError(TruncatedError, InvalidStreamError): ...  # or its connection broke


class StreamBlobTruncatedError(StreamTruncatedError, BlobTruncatedError): ...


class MissingTensorError(HurrayWireError, KeyError): ...  # by name or by {layer, role}


class ClosedContainerError(HurrayWireError, ValueError): ...  # used after close(), as a file


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


class InvalidTransferRecordError(TransportError, ValueError): ...  # docs/nixl.md § 3


class TransferRefusedError(TransportError, ValueError):
    """A KV transfer one side refused before any page moved: an unknown or already consumed
    transfer id, a request or prompt that is not the one the transfer carries, block ids
    that are not the transfer's. ``reason`` is the short machine-readable cause."""

    def __init__(self, message: str, *, reason: str, **kw: Any) -> None:
        self.reason = reason
        super().__init__(message, **kw)


# docs/integrity.md: a page digest, page store, delta record or engine fingerprint check that
# failed; a record's bytes that break its rules (version, count, order, checksum, limits).
class IntegrityError(HurrayWireError, ValueError): ...


class InvalidIntegrityRecordError(IntegrityError): ...


class IntegrityRecordTruncatedError(TruncatedError, InvalidIntegrityRecordError): ...


class PageStoreError(IntegrityError): ...  # a page larger than the store, a bad digest key


class PageDigestError(IntegrityError, InvalidBlobError):
    """Pages whose bytes do not match their digest (also an ``InvalidBlobError``, as a
    checksum mismatch is): ``pages``, the physical page ids; ``positions``, their
    ``(sequence, page_in_sequence)`` when a block table was known."""

    def __init__(
        self,
        message: str,
        *,
        pages: tuple[int, ...] = (),
        positions: tuple[tuple[int, int], ...] = (),
        **kw: Any,
    ) -> None:
        self.pages = pages
        self.positions = positions
        super().__init__(message, **kw)


class PageStoreMissError(PageDigestError): ...  # pages whose digest the page store lacks


class IncompatibleFingerprintError(IntegrityError):
    """Two engine fingerprints that differ; ``differences`` maps each differing field to
    its ``(ours, theirs)`` values."""

    def __init__(self, message: str, *, differences: dict[str, tuple[Any, Any]], **kw: Any) -> None:
        self.differences = differences
        super().__init__(message, **kw)


class FileAccessError(HurrayWireError, OSError):
    """A path the file system refused to open, create or replace (or an output that is an
    input), the ``OSError`` as ``__cause__``; also an ``OSError`` with its ``errno``,
    ``strerror`` and ``filename``, so ``except OSError`` keeps working."""

    def __init__(self, message: str, *, cause: OSError | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        if cause is not None:
            self.errno = cause.errno
            self.strerror = cause.strerror
            self.filename = cause.filename
            self.__cause__ = cause


__all__ = sorted(
    n for n, v in globals().items() if isinstance(v, type) and issubclass(v, HurrayWireError)
)
