"""Sinks and sources, once, for every container (sockets, files, pipes, bytes, ``mmap``), so
that they agree on every edge case: a sink that makes no progress is an ``ArgumentTypeError``,
never a busy loop; an ``OSError`` while reading is the *cause* of the container's truncation
error."""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import select
import socket
import ssl
import stat
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from hurray_wire.buffers import byte_view
from hurray_wire.containers.atomic import atomic_output, reading
from hurray_wire.errors import (
    ArgumentTypeError,
    ClosedContainerError,
    FileAccessError,
    HurrayWireError,
    LimitExceededError,
)

_IOV_MAX = 1024  # pieces per sendmsg call
_READ_CHUNK = 1 << 20  # for sources that only have read(): bounds the temporary copy
_EAGER_READ = 64 << 20  # read_array allocates at most this much before bytes arrive
_BYTES_LIKE = (bytes, bytearray, memoryview, mmap.mmap, np.ndarray)

Array = npt.NDArray[np.uint8]


def _check_binary_open(stream: Any, name: str) -> None:
    """A sink or source passed in must be in binary mode and not closed."""
    if isinstance(stream, io.TextIOBase):
        raise ArgumentTypeError(
            f"{name} must be opened in binary mode",
            field=name,
            expected="a binary file (mode 'wb' / 'rb'), a socket or a path",
            found=type(stream).__name__,
        )
    if getattr(stream, "closed", False) is True:
        raise ClosedContainerError(f"{name} is closed", field=name, found=type(stream).__name__)


def _progress(name: str, result: object) -> int:
    """The byte count a sink's write / sendmsg returned, refused unless positive."""
    if isinstance(result, bool) or not isinstance(result, int) or result <= 0:
        raise ArgumentTypeError(
            f"{name} made no progress (a non-blocking or broken sink?)",
            field=name,
            expected="a positive byte count or None",
            found=repr(result),
        )
    return result


# -- sinks -----------------------------------------------------------------------------------
class Sink:
    """Writes every byte of a list of pieces to a socket, a binary file-like or a path (written
    atomically: renamed into place at :meth:`close`); a sink passed in is never closed."""

    def __init__(self, send: Callable[[Sequence[memoryview]], None], sink: Any, owned: Any):
        self._send = send
        self._flush: Callable[[], Any] | None = getattr(sink, "flush", None)
        self._owned = owned

    def write(self, parts: Sequence[memoryview]) -> int:
        """Send ``parts`` whole and flush them (a record reaches the reader at once)."""
        self._send(parts)
        if self._flush is not None:
            self._flush()
        return sum(p.nbytes for p in parts)

    def close(self, abort: bool = False) -> None:
        """Finish the file this sink opened (a path: renamed into place; with ``abort``,
        removed and the target left as it was); a caller's sink stays open."""
        owned, self._owned = self._owned, None
        if owned is not None:
            reason = _AbortedError("writer aborted") if abort else None
            owned.__exit__(None if reason is None else _AbortedError, reason, None)


class _AbortedError(Exception):
    """Thrown into an owned ``atomic_output`` to make it remove its temporary file."""


def open_sink(sink: Any, *, allow_path: bool = True) -> Sink:
    """A :class:`Sink` for ``sink``: a path (if allowed), a socket or a binary file-like."""
    if allow_path and isinstance(sink, (str, os.PathLike)):
        output = atomic_output(sink)  # finished by Sink.close, dropped by close(abort=True)
        handle = output.__enter__()
        return Sink(_write_sender(handle.write), handle, output)
    _check_binary_open(sink, "sink")
    sendmsg = getattr(sink, "sendmsg", None)
    if callable(sendmsg) and not isinstance(sink, ssl.SSLSocket):  # TLS has no sendmsg
        return Sink(_sendmsg_sender(sendmsg), sink, None)
    write = getattr(sink, "sendall", None)  # returns None: all sent, as write's None
    if not callable(write):
        write = getattr(sink, "write", None)
    if not callable(write):
        raise ArgumentTypeError(
            "sink must be a path, a socket or a binary file-like object"
            if allow_path
            else "sink must have .write (binary file-like) or .sendall / .sendmsg (socket)",
            field="sink",
            found=type(sink).__name__,
        )
    return Sink(_write_sender(write), sink, None)


def _write_sender(write: Callable[[memoryview], Any]) -> Callable[[Sequence[memoryview]], None]:
    def send(parts: Sequence[memoryview]) -> None:
        for part in parts:
            while len(part):
                written = write(part)
                if written is None:  # a file-like that returns nothing took it all
                    break
                part = part[_progress("sink.write", written) :]

    return send


def _sendmsg_sender(sendmsg: Callable[[list[memoryview]], int]) -> Callable[..., None]:
    def send(parts: Sequence[memoryview]) -> None:
        pending = [p for p in parts if len(p)]
        first = 0
        while first < len(pending):
            sent = _progress("sink.sendmsg", sendmsg(pending[first : first + _IOV_MAX]))
            while sent:  # a partial send ends anywhere: drop what went, trim the next piece
                size = len(pending[first])
                if sent >= size:
                    sent -= size
                    first += 1
                else:
                    pending[first] = pending[first][sent:]
                    sent = 0

    return send


# -- sources ---------------------------------------------------------------------------------
class FileShrankError(OSError):
    """A mapped file is now shorter than when it was mapped: touching its missing pages would
    be SIGBUS, so the reader stops before, with this as its truncation error's cause."""


def open_memory(source: Any, *, use_mmap: bool = True, name: str = "source") -> MemorySource:
    """A :class:`MemorySource` over a bytes-like object or the file at a path: mapped (its
    descriptor kept open to check each access against a truncation) or read into memory."""
    if not isinstance(source, (str, os.PathLike)):
        return MemorySource(byte_view(source, name))
    with reading(source):
        handle = open(source, "rb")  # noqa: SIM115 - kept open by the MemorySource
    try:
        if not use_mmap or os.fstat(handle.fileno()).st_size == 0:
            with handle:
                return MemorySource(memoryview(handle.read()))
        mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except BaseException:
        handle.close()
        raise
    return MemorySource(memoryview(mapping), handle, mapping)


#: Bytes the CLI reads from an input that is not a regular file (stdin, a pipe, a FIFO, a
#: character device) before it refuses it: such an input is read into memory whole, and
#: ``/dev/zero`` never ends (``--max-input-bytes``).
DEFAULT_MAX_INPUT_BYTES = 1 << 30
#: Seconds such an input may go without a byte (a FIFO nobody writes, a stalled writer)
#: before it is refused (``--input-timeout``).
DEFAULT_INPUT_IDLE = 30.0


def read_input(
    path: Any,
    *,
    max_bytes: int = DEFAULT_MAX_INPUT_BYTES,
    idle_timeout: float | None = DEFAULT_INPUT_IDLE,
    head_ok: Callable[[bytes], bool] | None = None,
    head_size: int = 16,
) -> Any:
    """The bytes of an input path, a file descriptor (stdin's) or a binary file-like.

    A regular file is mapped (its size is known). Anything else (a pipe, a FIFO, a device)
    is read whole, bounded: more than ``max_bytes``, or ``idle_timeout`` seconds without a
    byte, is a ``FileAccessError``; when ``head_ok`` refuses the first ``head_size`` bytes
    (``/dev/urandom``), reading stops there and the caller refuses them.
    """
    if not isinstance(path, (int, str, os.PathLike)):  # a file-like without a descriptor
        data = path.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise FileAccessError(f"-: more than {max_bytes} bytes; --max-input-bytes")
        return data
    if isinstance(path, int):
        name, fd = "-", path
    else:
        name = os.fspath(path)
        with reading(name):  # without blocking: a FIFO with no writer yet is polled below
            fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    blocking = None
    try:
        with reading(name, "read"):
            info = os.fstat(fd)
            if stat.S_ISREG(info.st_mode):
                return mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if info.st_size else b""
            if stat.S_ISDIR(info.st_mode):
                raise FileAccessError(f"{name}: cannot read (Is a directory)")
            # a pipe, FIFO or device: polled before every read (a FIFO that no writer has
            # opened yet waits for one, within idle_timeout, instead of reading as empty)
            blocking = os.get_blocking(fd)
            os.set_blocking(fd, False)
            poller = select.poll()
            poller.register(fd, select.POLLIN | select.POLLPRI)
            data = bytearray()
            wait_ms = None if idle_timeout is None else max(1, int(idle_timeout * 1000))
            while True:
                if not poller.poll(wait_ms):
                    raise FileAccessError(
                        f"{name}: no input for {idle_timeout:g} s (a stalled writer, or a FIFO "
                        f"nobody writes); --input-timeout changes the limit"
                    )
                try:
                    piece = os.read(fd, min(_READ_CHUNK, max_bytes + 1 - len(data)))
                except BlockingIOError:  # woken, but nothing to read yet
                    continue
                if not piece:
                    return bytes(data)
                data += piece
                if len(data) > max_bytes:
                    raise FileAccessError(
                        f"{name}: more than {max_bytes} bytes from a pipe or device (read "
                        "whole into memory); --max-input-bytes changes the limit"
                    )
                if head_ok is not None and len(data) >= head_size:
                    if not head_ok(bytes(data[:head_size])):
                        return bytes(data)
                    head_ok = None
    finally:
        if blocking is not None:
            with contextlib.suppress(OSError):
                os.set_blocking(fd, blocking)
        if not isinstance(path, int):
            os.close(fd)


class MemorySource:
    """Reads are slices of one read-only view (bytes, a mapped file): nothing is copied; a
    mapped file is ``os.fstat``-checked first (``FileShrankError``, not SIGBUS)."""

    def __init__(
        self, view: memoryview, handle: Any = None, mapping: mmap.mmap | None = None
    ) -> None:
        self.view = view
        self.mapping = mapping
        self._handle = handle
        self.offset = 0  # bytes consumed

    def _available(self, stop: int) -> tuple[int, FileShrankError | None]:
        """``stop``, or where a mapped file now ends if another process truncated it (with
        the ``FileShrankError`` saying so)."""
        now = len(self.view)
        if self._handle is not None:
            with contextlib.suppress(OSError, ValueError):
                now = os.fstat(self._handle.fileno()).st_size
        if now >= stop:
            return stop, None
        return max(self.offset, now), FileShrankError(
            f"the file shrank from {len(self.view)} to {now} bytes since it was mapped "
            "(truncated by another process?): its missing pages cannot be read"
        )

    def will_need(self, start: int, length: int) -> None:
        """Ask the kernel to read a record's pages ahead: it is about to be checked in full."""
        advice, mapping = getattr(mmap, "MADV_WILLNEED", None), self.mapping
        if mapping is None or advice is None or length <= 0:
            return
        first = start - start % mmap.PAGESIZE
        with contextlib.suppress(OSError, ValueError):  # advice only
            mapping.madvise(advice, first, min(length + start - first, len(mapping) - first))

    def require(self, needed: int, error: type[HurrayWireError], section: str) -> None:
        """The container's truncation ``error`` if the file no longer holds ``needed`` bytes."""
        now, shrank = self._available(needed)
        if shrank is not None:
            raise error(
                f"the file no longer holds {section}: {shrank}",
                section=section,
                offset=now,
                expected=f"{needed} bytes",
            ) from shrank

    def begin_record(self) -> None:
        """Nothing to time: the bytes are all here."""

    def read(self, count: int) -> tuple[memoryview, BaseException | None]:
        """Up to ``count`` bytes (fewer only at the end of input, or of a mapped file that
        shrank: then its cause)."""
        stop, cause = self._available(min(self.offset + count, len(self.view)))
        chunk = self.view[self.offset : stop]
        self.offset += len(chunk)
        return chunk, cause

    def read_record(self, prefix: memoryview, total: int) -> tuple[Any, int, BaseException | None]:
        """The record whose ``prefix`` was just read, ``total`` bytes long: (view, got, None)."""
        start = self.offset - len(prefix)
        stop, cause = self._available(min(start + total, len(self.view)))
        self.will_need(start, stop - start)
        self.offset = stop
        return self.view[start:stop], stop - start, cause

    def read_array(self, size: int) -> tuple[Array, int, BaseException | None]:
        """Up to ``size`` bytes as a uint8 view of the input, how many, and no cause."""
        chunk, cause = self.read(max(0, size))
        return np.frombuffer(chunk, np.uint8), len(chunk), cause

    def close(self) -> None:
        """Release the view and the mapping (which tensors still viewing it keep alive)."""
        self.view.release()
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.close()
        if self.mapping is not None:
            with contextlib.suppress(BufferError):  # tensors still view it: unmapped later
                self.mapping.close()


#: Seconds a stream reader allows for one record from a socket or file-like, plus
#: ``DEADLINE_MIN_RATE`` per byte of it, unless told otherwise (``record_deadline=``).
#: The timeout of a socket bounds each ``recv``; a peer that sends a byte a second never
#: trips it, and this deadline is what cuts such a peer.
DEFAULT_RECORD_DEADLINE = 30.0
#: Bytes per second a record must at least arrive at, on top of the deadline: a 4 GiB
#: blob gets 30 s + 512 s, a slowloris peer at 1 byte/s is cut after 30 s.
DEADLINE_MIN_RATE = 8 << 20
_MAX_DEADLINE = 1e9  # seconds: beyond, socket timeouts overflow (use None for no deadline)


def check_record_deadline(value: object) -> float | None:
    """``record_deadline``: None (no deadline) or a positive number of seconds."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        with contextlib.suppress(OverflowError):  # an int beyond float: refused below
            if 0 < float(value) < _MAX_DEADLINE:  # NaN fails too
                return float(value)
    raise ArgumentTypeError(
        "record_deadline must be a positive, finite number of seconds (< 1e9) or None",
        field="record_deadline",
        found=repr(value),
    )


def check_limit(name: str, value: object, minimum: int) -> None:
    """A reader limit argument: an int (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ArgumentTypeError(f"{name} must be an int >= {minimum}", found=repr(value))


class RecordDeadlineError(TimeoutError):
    """The cause handed back when a record's deadline passed (a ``TimeoutError``); the
    container raises its truncation error naming the record, with this as ``__cause__``."""


class IOSource:
    """Exact reads from a socket or file-like, each record into a new buffer of its own.

    The one place a broken connection is caught: an ``OSError``, a ``ValueError`` (a file
    closed under the reader) or a passed record deadline (``begin_record`` starts one) ends
    the read and is returned as the cause of the container's truncation error. A socket's
    timeout is lowered to the time left before each ``recv``, so a silent peer is cut too.
    """

    def __init__(
        self,
        read_into: Callable[[memoryview], int | None],
        *,
        deadline: float | None = None,
        sock: Any = None,
        owned: Any = None,
    ) -> None:
        self._read_into = read_into
        self._owned = owned  # a file this source opened, closed by close()
        self.offset = 0  # bytes consumed
        self._deadline = deadline
        self._sock = sock
        self.begin_record()  # the readers begin each record; this one until they do

    def begin_record(self) -> None:
        """Start the deadline of the next record (its prefix is about to be read)."""
        self._record_start = time.monotonic()
        self._record_bytes = 0

    def fill(self, view: memoryview) -> tuple[int, BaseException | None]:
        """Read into ``view`` until it is full, the input ends, the connection breaks or
        the record's deadline passes."""
        deadline_at = None
        if self._deadline is not None:  # the record's deadline grows with its bytes
            self._record_bytes += len(view)
            rate = self._record_bytes / DEADLINE_MIN_RATE
            deadline_at = self._record_start + self._deadline + rate
        sock = self._sock if deadline_at is not None else None
        original = sock.gettimeout() if sock is not None else None
        got = 0
        try:
            while got < len(view):
                if deadline_at is not None:
                    left = deadline_at - time.monotonic()
                    if left <= 0:
                        self.offset += got
                        return got, RecordDeadlineError(
                            f"record deadline passed: {got} of {len(view)} bytes arrived "
                            f"(record_deadline={self._deadline} s + "
                            f"{DEADLINE_MIN_RATE} bytes/s)"
                        )
                    if sock is not None:
                        sock.settimeout(left if original is None else min(original, left))
                try:
                    count = self._read_into(view[got:])
                except (OSError, ValueError) as exc:  # reset, timeout, closed file: a cut
                    ours = deadline_at is not None and time.monotonic() >= deadline_at
                    if isinstance(exc, TimeoutError) and ours:
                        continue  # the deadline, not the socket's timeout: said above
                    self.offset += got
                    return got, exc
                if count is None:
                    raise ArgumentTypeError(
                        "non-blocking sources are not supported (no data ready)", field="source"
                    )
                if count == 0:
                    break
                got += count
        finally:
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.settimeout(original)
        self.offset += got
        return got, None

    def read(self, count: int) -> tuple[memoryview, BaseException | None]:
        buffer = memoryview(bytearray(count))
        got, cause = self.fill(buffer)
        return buffer[:got], cause

    def read_record(self, prefix: memoryview, total: int) -> tuple[Any, int, BaseException | None]:
        """The whole record in one new array (the caller checked ``total`` against its limit)."""
        try:
            buffer = np.empty(total, np.uint8)
        except (MemoryError, ValueError):
            raise LimitExceededError("cannot allocate the record buffer", found=total) from None
        buffer[: len(prefix)] = np.frombuffer(prefix, np.uint8)
        got, cause = self.fill(memoryview(buffer.data)[len(prefix) :])  # one call per record
        return buffer, len(prefix) + got, cause

    def read_array(self, size: int) -> tuple[Array, int, BaseException | None]:
        """Up to ``size`` bytes as a new uint8 array, how many arrived, and why it stopped;
        memory grows with the bytes that arrive, so a huge claimed buffer allocates little."""
        capacity = min(size, _EAGER_READ)
        out = np.empty(capacity, np.uint8)
        filled, cause = self.fill(memoryview(out.data))
        while cause is None and filled == capacity < size:
            capacity = min(size, capacity * 2)
            grown = np.empty(capacity, np.uint8)
            grown[:filled] = out[:filled]
            out = grown
            more, cause = self.fill(memoryview(out.data)[filled:])
            filled += more
        return out, filled, cause

    def close(self) -> None:
        owned, self._owned = self._owned, None
        if owned is not None:
            owned.close()


Source = MemorySource | IOSource


def _chunked_read(read: Callable[[int], Any]) -> Callable[[memoryview], int | None]:
    """``readinto`` for a source that only has ``read()``: bounded chunks, bytes checked."""

    def read_into(view: memoryview) -> int | None:
        data = read(min(len(view), _READ_CHUNK))
        if data is None:  # a non-blocking source with nothing ready
            return None
        if isinstance(data, str):
            raise ArgumentTypeError("source must be opened in binary mode", field="source")
        try:
            view[: len(data)] = data
        except (TypeError, ValueError):
            raise ArgumentTypeError(
                "source.read() must return bytes", field="source", found=type(data).__name__
            ) from None
        return len(data)

    return read_into


def open_source(
    source: Any,
    *,
    allow_path: bool = True,
    record_deadline: object = DEFAULT_RECORD_DEADLINE,
    use_mmap: bool = True,
) -> Source:
    """A :class:`Source` for a path (if allowed; mapped unless ``use_mmap=False``), a
    bytes-like, a socket or a file; ``record_deadline`` bounds each record read from those."""
    deadline = check_record_deadline(record_deadline)
    path = isinstance(source, (str, os.PathLike))
    if path and not allow_path:
        raise ArgumentTypeError(
            "source must be bytes-like or a binary file-like object / socket",
            field="source",
            found=type(source).__name__,
        )
    if path and not use_mmap:  # read as a stream: no mapping to be cut under us
        with reading(source):
            handle = open(source, "rb")  # noqa: SIM115 - closed by IOSource.close
        return IOSource(handle.readinto, deadline=deadline, owned=handle)
    if path or isinstance(source, _BYTES_LIKE):
        return open_memory(source)
    _check_binary_open(source, "source")
    recv_into = getattr(source, "recv_into", None)
    if callable(recv_into):
        # an SSLSocket takes no flags: its recv_into returns what one TLS record holds
        flags = 0 if isinstance(source, ssl.SSLSocket) else getattr(socket, "MSG_WAITALL", 0)
        timed = source if callable(getattr(source, "settimeout", None)) else None
        return IOSource(
            lambda view: recv_into(view, len(view), flags), deadline=deadline, sock=timed
        )
    readinto = getattr(source, "readinto", None)
    if callable(readinto):
        return IOSource(readinto, deadline=deadline)
    read = getattr(source, "read", None)
    if callable(read):
        return IOSource(_chunked_read(read), deadline=deadline)
    try:
        return MemorySource(byte_view(source, "source"))
    except ArgumentTypeError:
        raise ArgumentTypeError(
            "source must be a path, a bytes-like object, a binary file-like object or a socket",
            field="source",
            found=type(source).__name__,
        ) from None


_C = TypeVar("_C", bound="ClosesOnExit")


class ClosesOnExit:
    """``with reader: ...`` closes the reader, however the block ends (readers, files and
    endpoints all release what they hold the same way)."""

    close: Callable[[], None]  # each class's own: sets ``_closed``
    _closed = False
    _section = "stream"  # what a ClosedContainerError names

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedContainerError(
                f"I/O operation on a closed {type(self).__name__}", section=self._section
            )

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
