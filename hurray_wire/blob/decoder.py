"""Decoding: validate one blob, then hand back its tensor (NumPy views of the input).

A :class:`Decoder` holds the options, checked once, and one plan cache (msgspec's
``Decoder``, pyarrow's ``IpcReadOptions``); ``decode`` and the other module functions are
thin calls on a default instance. The checks themselves are one pipeline,
blob/pipeline.py's :func:`~hurray_wire.blob.pipeline.run`; where the pool lands in caller
memory is a target value (blob/landing/).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from hurray_wire.blob.envelope import (
    HEADER,
    I_SECTION_COUNT,
    checked_header,
    embedded_descriptor,
    entry_at,
    total_length,
)
from hurray_wire.blob.limits import DEFAULT_LIMITS, DecodeLimits, check_limits_argument
from hurray_wire.blob.pages import DecodeReport
from hurray_wire.blob.pipeline import Accept, new_plan_cache, run
from hurray_wire.buffers import U8Array, byte_view
from hurray_wire.codecs import check_threads
from hurray_wire.errors import ArgumentTypeError, flag, instance
from hurray_wire.integrity import EngineFingerprint, PageStore, check_integrity_arguments
from hurray_wire.memo import BoundedMemo, weight
from hurray_wire.model.descriptor import TensorDescriptor
from hurray_wire.tensor import BlockPagedTensor

__all__ = [
    "DEFAULT_DECODER",
    "DecodeReport",
    "Decoder",
    "Landing",
    "decode",
    "decode_options",
    "decode_report",
    "landing_target",
    "peek_descriptor",
]


def peek_descriptor(data: Any, *, limits: DecodeLimits | None = None) -> TensorDescriptor:
    """The descriptor of the blob at the start of ``data``, after checking the blob's header
    and header checksum, without reading its sections (``data`` may end after the header)."""
    return decode_options(limits=limits).peek_descriptor(data)


@dataclass(frozen=True, eq=False)
class Decoder:
    """Decode options (as for :func:`decode`), checked once, and one plan cache (``plans``:
    a new one unless given), safe to share between threads: ``Decoder(verify=False)`` then
    ``.decode(blob)`` per blob. Every route into memory (the module functions, the stream
    readers, the NIXL receiver) hands one to :func:`run`; the module functions use
    :data:`DEFAULT_DECODER` (or one sharing its cache, for other options).
    """

    verify: bool = True
    limits: DecodeLimits = DEFAULT_LIMITS
    threads: int = -1
    page_store: PageStore | None = None
    expect_fingerprint: EngineFingerprint | None = None
    plans: BoundedMemo[Any] = field(default_factory=new_plan_cache, repr=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise the checked options once, here
        set_(self, "verify", flag(self.verify, "verify"))
        set_(self, "limits", check_limits_argument(self.limits))
        if self.threads != -1:
            set_(self, "threads", check_threads(self.threads))
        check_integrity_arguments(self.page_store, self.expect_fingerprint)
        instance(self.plans, BoundedMemo, "plans")

    def decode(self, data: Any, *, into: object = None) -> BlockPagedTensor:
        """Validate one blob at the start of ``data`` and return its tensor (:func:`decode`)."""
        return self._run(data, into, False)[0]

    def decode_report(self, data: Any, *, into: object = None) -> DecodeReport:
        """As :meth:`decode`, but failed pages reported, not raised (:func:`decode_report`)."""
        report = self._run(data, into, True)[1]
        assert report is not None  # run reports whenever asked to
        return report

    def _run(
        self, data: Any, into: object, report: bool
    ) -> tuple[BlockPagedTensor, DecodeReport | None]:
        """The pipeline, with the landing target's last step when there is one."""
        if into is None:
            return run(byte_view(data), self, report=report)
        return landing_target(into).land(byte_view(data), self, report=report)

    def peek_descriptor(self, data: Any) -> TensorDescriptor:
        """The descriptor of the blob at the start of ``data`` (:func:`peek_descriptor`)."""
        view = byte_view(data)
        total = total_length(view, whole=False)
        head = HEADER.struct.unpack_from(view, 0)
        end = min(total, len(view))
        header = checked_header(view, head, end, self.limits)
        start = entry_at(head[I_SECTION_COUNT])
        key = header[start:]  # bytes: no plan key is
        found: TensorDescriptor | None = self.plans.get(key)
        if found is None:
            found = self.plans.put(key, embedded_descriptor(header, start), weight(len(key)))
        return found


#: The decoder the module functions use (and whose plan cache the others share).
DEFAULT_DECODER = Decoder()
_NO_VERIFY = Decoder(verify=False, plans=DEFAULT_DECODER.plans)


def decode_options(
    verify: object = True,
    limits: DecodeLimits | None = None,
    threads: int = -1,
    page_store: PageStore | None = None,
    expect_fingerprint: EngineFingerprint | None = None,
) -> Decoder:
    """The decoder for these options, checked (typed errors naming the argument), sharing
    the default decoder's plan cache."""
    default_limits = limits is None or limits is DEFAULT_LIMITS
    if default_limits and threads == -1 and page_store is None and expect_fingerprint is None:
        if verify is True:
            return DEFAULT_DECODER
        if verify is False:
            return _NO_VERIFY
    return Decoder(
        verify,  # type: ignore[arg-type]  # checked by Decoder
        DEFAULT_LIMITS if limits is None else limits,
        threads,
        page_store,
        expect_fingerprint,
        DEFAULT_DECODER.plans,
    )


class Landing(Protocol):
    """Where a blob's pool lands in caller memory (``blob.landing``: ``IntoArray``,
    ``IntoPages``, ``InPlace``): checked against the blob's header, then :func:`run`, then
    written as the last step. ``pool`` / ``placed``: buffer 0 landed apart (NIXL)."""

    def land(
        self, view: memoryview, opts: Decoder, *, report: bool = False,
        accept: Accept | None = None, pool: U8Array | None = None, placed: bool = False,
    ) -> tuple[BlockPagedTensor, DecodeReport | None]: ...  # fmt: skip


def landing_target(into: object, kinds: tuple[type, ...] = ()) -> Landing:
    """``into`` checked to be a landing target (``decode(into=)``, the stream readers;
    ``kinds``: only these, NIXL's receiver)."""
    if not callable(getattr(into, "land", None)) or (kinds and not isinstance(into, kinds)):
        raise ArgumentTypeError(
            "into must be a landing target: IntoArray(engine_array), IntoPages or InPlace",
            field="into",
            found=type(into).__name__,
        )
    return into  # type: ignore[return-value]  # checked: it lands


def decode(
    data: Any,
    *,
    verify: bool = True,
    limits: DecodeLimits | None = None,
    threads: int = -1,
    page_store: PageStore | None = None,
    expect_fingerprint: EngineFingerprint | None = None,
    into: object = None,
) -> BlockPagedTensor:
    """Validate one blob at the start of ``data`` and return its tensor.

    Uncompressed buffers are views of ``data``; every array is read-only exactly when
    ``data`` is. ``verify=False`` skips section checksums and page digests, nothing else.
    ``limits`` caps what a blob may make the decoder do (None: the defaults).
    ``threads`` (-1 every usable core, 0 the caller only) decompress chunked sections.
    ``page_store`` fills (and re-hashes) the pages of a delta blob; ``expect_fingerprint``
    refuses another or a missing engine fingerprint (docs/integrity.md);
    :func:`decode_report` reports failed pages instead of raising. :class:`Decoder` holds
    the options for many blobs.

    ``into``: where the pool lands in caller memory (``blob.landing``): an engine array
    (``IntoArray``), ``IntoPages(pool, page_ids)``, ``InPlace(pool_store, free_pages)``;
    checked against the blob's header, written after every check (untouched on refusal).
    """
    opts = decode_options(verify, limits, threads, page_store, expect_fingerprint)
    return opts.decode(data, into=into)


def decode_report(
    data: Any,
    *,
    verify: bool = True,
    limits: DecodeLimits | None = None,
    threads: int = -1,
    page_store: PageStore | None = None,
    expect_fingerprint: EngineFingerprint | None = None,
    into: object = None,
) -> DecodeReport:
    """As :func:`decode`, but pages that fail their digest, or that the page store lacks or
    holds corrupt, are reported (``DecodeReport.pages`` / ``.positions``) rather than raised
    (docs/integrity.md § 7.2; a stream reader takes ``report=True``). With page digests present, a
    checksum mismatch of a page-row buffer (the pool, per-block scales / zero points) does
    not abort: the digests say which pages are bad. Every other check still raises.
    ``into=InPlace(...)`` returns an ``InPlaceReport`` (engine page ids)."""
    opts = decode_options(verify, limits, threads, page_store, expect_fingerprint)
    return opts.decode_report(data, into=into)
