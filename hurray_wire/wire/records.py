"""Whole records: each record type frames itself, places and checks its seal, and says where
every part of it sits; the modules that hold the rules bind it to their error classes
(``Record.raising``: wire/ imports nothing of the package) and read every byte position
from it (a transfer record's is ``wire.transfer.TRANSFER``: decoding loads no transfer code).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt

from hurray_wire.wire import (
    blob as wb,
    containers as wc,
    descriptor as wd,
    integrity as wi,
    stream as ws,
)
from hurray_wire.wire.fast import FastStruct, align, derive, item_dtype
from hurray_wire.wire.seal import checksum_of, seal

Spans = dict[str, tuple[int, int]]  # part name -> [start, stop)
PREFIX = ws.FAST_RECORD_PREFIX  # the 16 bytes every stream record and blob starts with
ITEM_DTYPE = item_dtype(wi.DIGEST_ITEM)  # one digest or page id on the wire
ITEM_SIZE: int = wi.DIGEST_ITEM.sizeof()
_ITEM = np.dtype(ITEM_DTYPE)


def _fault(message: str, **details: Any) -> Exception:
    """What a record raises before a module binds its own error classes to it."""
    return ValueError(message, details)


@dataclass(frozen=True)
class Record:
    """One record type: its fixed ``head``, the ``tail`` that closes it (its seal, or a footer
    that starts with one), the magic and smallest length a reader frames it by; ``what``
    names it in errors, raised as the ``invalid`` / ``truncated`` classes bound to it."""

    what: str
    head: FastStruct
    tail: FastStruct | None = None
    magic: bytes = b""
    alignment: int = 1
    section: str = ""
    hints: Mapping[bytes, str] = field(default_factory=dict)  # a wrong magic that is known
    checks: tuple[tuple[str, Any, str], ...] = ()  # (field, value, message): ``read_head``'s
    arrays: int = 0  # runs of ``count`` u64 after the head (digests, page ids)
    invalid: Callable[..., Exception] = _fault
    truncated: Callable[..., Exception] = _fault
    tail_size: int = field(init=False)
    minimum: int = field(init=False)  # the smallest total_length: head and tail, aligned

    def __post_init__(self) -> None:
        tail = 0 if self.tail is None else self.tail.size
        object.__setattr__(self, "tail_size", tail)
        object.__setattr__(self, "minimum", align(self.head.size + tail, self.alignment))

    def raising(
        self, invalid: Callable[..., Exception], truncated: Callable[..., Exception]
    ) -> Record:
        """This record bound to a module's error classes."""
        return replace(self, invalid=invalid, truncated=truncated)

    def expecting(self, name: str, value: Any, message: str) -> Record:
        """This record with ``name``'s check (in its place in ``checks``) replaced."""
        checks = tuple((name, value, message) if c[0] == name else c for c in self.checks)
        return replace(self, checks=checks)

    def total_for(self, runs: int) -> int:
        """total_length of a record whose variable runs take ``runs`` bytes."""
        size = self.head.size + runs + self.tail_size
        return size if self.alignment == 1 else align(size, self.alignment)

    def at(self, name: str) -> int:
        """Byte offset of a field of the head."""
        return self.head.offsets[name]

    def item_at(self, count: int, array: int = 0, item: int = 0) -> int:
        """Byte offset of ``item`` of run ``array`` in a record of ``count`` items a run
        (``item_at(count, arrays)`` is where the runs end)."""
        return self.head.size + ITEM_SIZE * (array * count + item)

    def count_of(self, size: int) -> int | None:
        """The ``count`` of a record of ``size`` bytes (None: no whole number of items)."""
        run = ITEM_SIZE * self.arrays
        if size < self.head.size or (size - self.head.size) % run:
            return None
        return (size - self.head.size) // run

    def pack(self, *head: Any, runs: Sequence[npt.NDArray[Any]] = (), **fields: Any) -> bytes:
        """The head (its non-Const fields in order, or by name: those ``checks`` fix are
        their expected values), then each run as little-endian u64 (at most a u32 ``count``)."""
        if runs and runs[0].size > self.head.limit("count"):
            msg = "too many digests for a u32 count"
            raise self.invalid(msg, section=self.what, field="count", found=runs[0].size)
        named = {name: value for name, value, _ in self.checks} | fields
        packed = self.head.pack(*head) if head else self.head.pack(**named)
        return packed + b"".join(run.astype(_ITEM, copy=False).tobytes() for run in runs)

    def runs(self, view: Any, count: int) -> list[npt.NDArray[np.uint64]]:
        """Read-only views of the runs (the caller has checked that the bytes are there)."""
        at = self.item_at(count)
        step = ITEM_SIZE * count
        return [np.frombuffer(view, _ITEM, count, at + step * i) for i in range(self.arrays)]

    def error(
        self, name: str | None, message: str, at: int | None = None, base: int = 0, **details: Any
    ) -> Exception:
        """``invalid`` naming field ``name`` of the head (at ``base`` + its offset unless
        ``at``: ``base`` is where the head sits in the input)."""
        offset = base + self.head.offsets[name] if at is None and name is not None else at
        section = self.section or self.what
        return self.invalid(message, section=section, field=name, offset=offset, **details)

    def read_head(
        self,
        view: Any,
        expected: Sequence[tuple[str, Any, str]] | None = None,
        *,
        at: int = 0,
        base: int = 0,
        what: str = "record shorter than its head",
    ) -> dict[str, Any]:
        """The head's fields at ``view[at]``, each ``(name, value, message)`` of
        ``expected`` (by default ``checks``) checked in order (magic, versions, reserved
        bytes), refused naming the field and its offset (``base``: where ``view`` sits in the
        input); ``truncated`` when the head itself is cut."""
        if len(view) < at + self.head.size:
            raise self.truncated(
                what,
                section=self.section or self.what,
                offset=base + len(view),
                found=len(view),
                expected=f">= {at + self.head.size} bytes",
            )
        fields = self.head.unpack_dict(view, at)
        for name, value, message in self.checks if expected is None else expected:
            found = fields[name]
            if found != value:
                shown = (found.hex(), value.hex()) if isinstance(value, bytes) else (found, value)
                offset = base + at + self.head.offsets[name]
                raise self.error(name, message, offset, found=shown[0], expected=shown[1])
        return fields

    def exact(self, view: Any, size: int, *, base: int = 0, what: str = "body") -> None:
        """A record that must fill ``view``: shorter than ``size`` is cut inside ``what``,
        longer has trailing bytes (``base``: where ``view`` sits in the input)."""
        if len(view) != size:
            cut = len(view) < size
            raise (self.truncated if cut else self.invalid)(
                f"record ends inside its {what}" if cut else "trailing bytes after the record",
                section=self.section or self.what,
                offset=base + min(len(view), size),
                found=len(view),
                expected=size,
            )

    def frame(self, view: Any) -> int:
        """total_length of the record whose 16-byte prefix starts ``view``: magic, major
        version 1 and an aligned length of at least ``minimum``, checked in that order."""
        if len(view) >= PREFIX.size:  # the common case in one unpack
            magic, major, _, _, total = PREFIX.struct.unpack_from(view, 0)
            if magic == self.magic and major == 1 and self.minimum <= total:
                return int(total) if not total % self.alignment else self._length_error(total)
        head = bytes(view[: PREFIX.sizes["magic"]])
        if head != self.magic[: len(head)]:
            raise self.error(
                "magic", self.hints.get(head, f"bad {self.what} magic"),
                expected=self.magic.hex(" "), found=head.hex(" "),
            )  # fmt: skip
        if len(view) < PREFIX.size:
            raise self.truncated(
                ("empty input (0 bytes): no " if not len(view) else "input ends inside the ")
                + f"{self.what} prefix",
                section=self.section or self.what,
                offset=len(view),
                expected=PREFIX.size,
                found=len(view),
            )
        _, major, _, _, total = PREFIX.struct.unpack_from(view, 0)
        if major != 1:
            raise self.error(
                "version_major", f"unsupported {self.what} major version", expected=1, found=major
            )
        if total < self.minimum or total % self.alignment:
            self._length_error(total)
        return int(total)

    def _length_error(self, total: int) -> NoReturn:
        raise self.error(
            "total_length",
            f"total_length is not a valid {self.what} length",
            expected=f"a multiple of {self.alignment}, >= {self.minimum}",
            found=total,
        )

    def whole(self, view: Any, total: int, size: int | None = None) -> Any:
        """The record's ``total`` bytes of ``view``, or the truncation error (which, with
        ``size``, is said of the first ``size`` bytes: a blob's fixed header)."""
        if len(view) < (total if size is None else size):
            cut = self.what if size is None else f"{self.what} header"
            raise self.truncated(
                f"input ends inside the {cut}",
                section=self.section or self.what,
                field=None if size is not None else "total_length",
                offset=len(view),
                expected=total if size is None else size,
                found=len(view),
            )
        return view[:total]

    def spans(self, total: int, runs: Sequence[tuple[str, int]] = ()) -> Spans:
        """Where each part of a ``total``-byte record sits: ``head``, the variable ``runs``
        (name, size) in order, ``padding`` up to the tail, and the tail as ``seal`` (a
        seal, or a footer that starts with one)."""
        at = self.head.size
        out: Spans = {"head": (0, at)}
        for name, size in runs:
            out[name] = (at, at + size)
            at += size
        end = total - self.tail_size
        out["padding"] = (at, end)
        out["seal"] = (end, total)
        return out

    def close(self, body: bytes, total: int | None = None) -> bytes:
        """``body`` (head and runs) zero-padded to the tail (to ``total`` bytes, by default
        the fewest), then the tail: the seal of every byte before it (a footer also repeats
        ``total``)."""
        assert self.tail is not None
        if total is None:
            if self.alignment == 1 and len(self.tail.names) == 1:
                return seal(body)
            total = self.total_for(len(body) - self.head.size)
        padded = body + bytes(total - self.tail_size - len(body))
        values = (checksum_of(padded), total)[: len(self.tail.names)]
        return padded + self.tail.pack(*values)

    def sealed(self, view: Any, end: int, what: str = "body/checksum") -> None:
        """A record that is exactly ``end`` bytes and its tail, whose seal matches."""
        self.exact(view, end + self.tail_size, what=what)
        self.check_seal(view, end)

    def check_seal(self, view: Any, end: int) -> None:
        """The seal at byte ``end`` (the tail's first field) must be that of ``view[:end]``."""
        assert self.tail is not None
        stored = self.tail.struct.unpack_from(view, end)[0]
        self.check_checksum(stored, checksum_of(view[:end]), "checksum", end)

    def check_checksum(self, stored: int, computed: int, name: str, at: int) -> None:
        if stored != computed:
            raise self.error(
                name, f"{self.what} checksum mismatch", at,
                expected=f"0x{computed:016x}", found=f"0x{stored:016x}",
            )  # fmt: skip

    def check_consts(self, fields: Sequence[Any], skip: int = 0) -> None:
        """The head's Const fields (magic, reserved bytes) past the first ``skip`` of them,
        from its unpacked ``fields``: the first that differs is refused."""
        for position, expected in self.head.consts[skip:]:
            if fields[position] != expected:
                name = self.head.names[position]
                magic = name == "magic"
                raise self.error(
                    "magic" if magic else "_reserved",
                    "bad magic" if magic else "reserved bytes must be zero",
                    self.head.offsets[name],
                    found=fields[position].hex(" "),
                )


#: The blob as a record: framed by its prefix; its seal (``HEADER_CHECKSUM``) follows the
#: header, whose length the fixed header says.
BLOB = Record(
    "blob",
    wb.FAST_BLOB_HEADER,
    wb.FAST_HEADER_CHECKSUM,
    wb.BLOB_MAGIC,
    wb.BLOB_ALIGNMENT,
    section="header",
    hints={
        ws.STREAM_MAGIC: "this is a blob stream (its header record), not one blob: read it with "
        "StreamReader or StreamFile",
        ws.END_MAGIC: "this is a blob stream's end record, not a blob: read the stream with "
        "StreamReader or StreamFile",
        wd.MAGIC: "this is a bare descriptor or a .hrry file, not a blob: use decode_descriptor, "
        "HrryFile or read_file",
    },
)
STREAM_HEADER = Record(
    "stream header",
    ws.FAST_STREAM_HEADER,
    ws.FAST_RECORD_CHECKSUM,
    ws.STREAM_MAGIC,
    ws.RECORD_ALIGNMENT,
)
END_RECORD = Record(
    "end record", ws.FAST_END_RECORD, ws.FAST_END_FOOTER, ws.END_MAGIC, ws.RECORD_ALIGNMENT
)
HRRY_HEADER = Record("header", wc.FAST_HRRY_HEADER)  # the .hrry file's first 64 bytes
HRRY_TRAILER = Record("trailer", wc.FAST_HRRY_TRAILER)  # and its last 40
_ALGORITHM = ("algorithm", wi.DIGEST_ALGORITHM_XXH3_64, "unsupported algorithm")
_ZERO = "reserved bytes must be zero"
_VERSION = ("version", wi.DIGEST_SECTION_VERSION, "unsupported version")
_DIGEST_HEAD = (_VERSION, _ALGORITHM, ("_reserved", bytes(2), _ZERO))
#: The integrity records (docs/integrity.md): a head, then ``arrays`` runs of ``count`` u64:
#: the page-digest section payload one (digests), page refs two (page ids, then digests),
#: the sorted known-pages record one (then its seal).
DIGEST_SECTION = Record(
    "page_digests", derive(wi.DIGEST_SECTION_HEADER), checks=_DIGEST_HEAD, arrays=1
)
PAGE_REFS = Record(
    "page_refs", derive(wi.PAGE_REFS_HEADER), checks=_DIGEST_HEAD, arrays=2
).expecting("version", wi.PAGE_REFS_VERSION, "unsupported version")
BLOOM_PARAMS = Record(  # after the known-pages head
    "known_pages", derive(wi.BLOOM_PARAMS), checks=(("_reserved", bytes(6), _ZERO),)
)
_BLOOM_HINT = "Bloom records: decode_known_pages_bloom"
#: Checked as the sorted form; ``expecting("form", ...)`` makes the Bloom form's.
KNOWN_PAGES = Record(
    "known_pages",
    derive(wi.KNOWN_PAGES_HEADER),
    derive(wi.KNOWN_PAGES_CHECKSUM),
    arrays=1,
    checks=(
        ("magic", wi.KNOWN_PAGES_MAGIC, "bad magic"),
        ("_reserved0", b"\0", "bad reserved0"),
        ("_reserved1", bytes(4), "bad reserved1"),
        ("version", wi.KNOWN_PAGES_VERSION, "unsupported version"),
        ("form", wi.KNOWN_PAGES_FORM_SORTED, f"unsupported form ({_BLOOM_HINT})"),
        _ALGORITHM,
    ),
)
FINGERPRINT = Record(
    "engine_fingerprint",
    derive(wi.FINGERPRINT_HEADER),
    checks=(
        ("magic", wi.FINGERPRINT_MAGIC, "bad magic"),
        ("_reserved0", bytes(3), "bad reserved0"),
        ("_reserved1", bytes(4), "bad reserved1"),
        ("version", wi.FINGERPRINT_VERSION, "unsupported fingerprint version"),
    ),
)
#: The records a stream holds, by magic (what frames each one).
RECORDS_BY_MAGIC = {r.magic: r for r in (BLOB, STREAM_HEADER, END_RECORD)}
