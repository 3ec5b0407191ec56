"""The one way hurray-wire writes a file (``atomic_output``), because ``open(path, "wb")``
truncates first: SIGBUS and a lost input when the output is an input, a partial file on
failure (docs/cli.md, "atomic output"); typed access errors."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from typing import BinaryIO

from hurray_wire.errors import FileAccessError

__all__ = ["atomic_output", "check_not_input", "file_access_error", "reading"]

PathLike = str | os.PathLike[str]


def file_access_error(exc: OSError, path: PathLike, action: str) -> FileAccessError:
    """``exc`` (from opening ``path`` to ``action``) as a ``FileAccessError`` naming both."""
    reason = exc.strerror or str(exc)
    return FileAccessError(f"{os.fspath(path)}: cannot {action} ({reason})", cause=exc)


@contextlib.contextmanager
def reading(path: PathLike, action: str = "open for reading") -> Iterator[None]:
    """Wrap the ``OSError`` of ``action`` on ``path`` into a ``FileAccessError``."""
    try:
        yield
    except FileAccessError:
        raise
    except OSError as exc:
        raise file_access_error(exc, path, action) from exc


def check_not_input(path: PathLike, inputs: Iterable[PathLike]) -> None:
    """Refuse to write ``path`` if it is, or names the same file as, one of ``inputs``."""
    for source in inputs:
        same = os.path.abspath(path) == os.path.abspath(source)
        with contextlib.suppress(OSError):  # one of them does not exist (yet): not the same
            same = same or os.path.samefile(path, source)  # hard links and symlinks too
        if same:
            raise FileAccessError(
                f"{os.fspath(path)}: refusing to write onto the input {os.fspath(source)!r} "
                "(the same file); write to another path, then rename"
            )


@contextlib.contextmanager
def atomic_output(path: PathLike, *, inputs: Iterable[PathLike] = ()) -> Iterator[BinaryIO]:
    """A binary file that becomes ``path`` only if the ``with`` block ends normally, never
    onto one of ``inputs``; file-system errors are ``FileAccessError``."""
    check_not_input(path, inputs)
    target = os.path.realpath(path)  # follow a symlink: replace the file, keep the link
    if os.path.isdir(target):
        raise file_access_error(IsADirectoryError(21, "Is a directory", target), path, "write")
    try:
        mode = os.stat(target).st_mode
    except OSError:
        mode = None  # absent (or unreachable: mkstemp below says why)
    if mode is not None and not stat.S_ISREG(mode):
        with _streamed(path, target, mode) as handle:
            yield handle
        return
    if mode is not None and (not mode & 0o222 or not os.access(target, os.W_OK)):
        raise FileAccessError(
            f"{os.fspath(path)}: refusing to replace a read-only file (mode "
            f"{stat.S_IMODE(mode):04o}); make it writable or remove it first"
        )
    directory, name = os.path.split(target)
    try:
        fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise file_access_error(exc, path, "create a file in its directory") from exc
    handle = os.fdopen(fd, "wb")
    if mode is None:  # what ``open`` gives a new file: 0o666 under the process umask
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    try:
        os.fchmod(fd, stat.S_IMODE(mode))
        yield handle
        try:
            handle.flush()
            os.fsync(fd)
            handle.close()
            os.replace(temporary, target)
        except OSError as exc:
            raise file_access_error(exc, path, "write") from exc
    except BaseException:
        handle.close()
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise
    with contextlib.suppress(OSError, AttributeError):  # the rename made durable, if it can be
        fd = os.open(directory or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def _streamed(path: PathLike, target: str, mode: int) -> Iterator[BinaryIO]:
    """Write into an existing FIFO or character device (never replaced by a file)."""
    if not (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
        raise FileAccessError(
            f"{os.fspath(path)}: refusing to write: not a regular file, FIFO or character "
            "device (a block device or a socket is never an output)"
        )
    flags = os.O_WRONLY | getattr(os, "O_NOCTTY", 0)
    if stat.S_ISFIFO(mode):  # without a reader: ENXIO at once, not a hang
        flags |= getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(target, flags)
        os.set_blocking(fd, True)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise FileAccessError(
                f"{os.fspath(path)}: no process is reading this FIFO; start the reader first",
                cause=exc,
            ) from exc
        raise file_access_error(exc, path, "open for writing") from exc
    with os.fdopen(fd, "wb") as handle:
        yield handle
        try:
            handle.flush()
        except OSError as exc:
            raise file_access_error(exc, path, "write") from exc
