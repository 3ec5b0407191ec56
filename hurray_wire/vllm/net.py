"""The HurrayConnector's sockets (docs/vllm.md § trust): optional TLS, the one way to connect
and listen, and a whole-connection :class:`Deadline` (a socket timeout bounds one ``recv``,
never a peer that drips a byte a second): when it passes or is cancelled, every socket
attached to it is shut down, which wakes any thread blocked on it.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hurray_wire.errors import ArgumentTypeError, HurrayWireError, TransportError
from hurray_wire.vllm.params import check_host

__all__ = ["Deadline", "Tls", "connect", "endpoint", "listen"]


def _shut(sock: socket.socket) -> None:
    # the plain socket's shutdown, also for an SSLSocket (whose own drops its TLS state
    # under a thread that may be reading it)
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class Deadline:
    """``seconds`` from now, one connection (or one pull of several) must be over."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.reason: str | None = None  # why it ended early: "cancelled" or "deadline"
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self.closed = False  # ended by itself: the reaper drops it
        _REAPER.add(self)

    def left(self) -> float:
        """Seconds left; ``TransportError`` once passed or cancelled."""
        now = time.monotonic()
        if self._ended(now):
            raise self.error()
        return self.at - now

    def _ended(self, now: float) -> bool:
        if self.reason is None and now >= self.at:
            self.expire()
        return self.reason is not None

    def error(self) -> TransportError:
        what = "was cancelled" if self.reason == "cancelled" else f"took over {self.seconds} s"
        return TransportError(f"the transfer {what}", field="timeout", found=self.seconds)

    def typed(self, exc: BaseException) -> HurrayWireError:
        """What ended a connection: the deadline's (or the cancel's) error once it has passed,
        whatever surfaced first; ``exc`` itself if it is one of ours; else a TransportError."""
        if self._ended(time.monotonic()):
            return self.error()
        if isinstance(exc, HurrayWireError):
            return exc
        error = TransportError(f"{type(exc).__name__}: {exc}")
        error.__cause__ = exc
        return error

    def attach(self, sock: socket.socket) -> None:
        """Shut ``sock`` down when this deadline passes or is cancelled."""
        with self._lock:
            if self.reason is None:
                self._socks.append(sock)
                return
        _shut(sock)

    def cancel(self) -> None:
        self._end("cancelled")

    def expire(self) -> None:
        self._end("deadline")

    def _end(self, reason: str) -> None:
        with self._lock:
            if self.reason is not None:
                return
            self.reason = reason
            socks, self._socks = self._socks, []
        for sock in socks:
            _shut(sock)

    def close(self) -> None:
        """The connection ended by itself: forget its sockets (they are the caller's)."""
        with self._lock:
            self._socks = []
        self.closed = True


class _Reaper:
    """One daemon thread expiring deadlines in time order (started on first use); a closed
    deadline leaves the heap when it reaches the top."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Deadline]] = []
        self._count = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, deadline: Deadline) -> None:
        with self._wake:
            heapq.heappush(self._heap, (deadline.at, next(self._count), deadline))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="hurray-deadlines",
                                                daemon=True)  # fmt: skip
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                now = time.monotonic()
                due = []
                while self._heap and (self._heap[0][0] <= now or self._heap[0][2].closed):
                    due.append(heapq.heappop(self._heap)[2])
                wait = self._heap[0][0] - now if self._heap else 60.0
                if not due:
                    self._wake.wait(timeout=min(wait, 60.0))
            for deadline in due:
                if not deadline.closed:
                    with contextlib.suppress(Exception):  # nothing may end this thread
                        deadline.expire()


_REAPER = _Reaper()


@dataclass(frozen=True)
class Tls:
    """TLS for the socket transport: ``cert``/``key`` are this side's own; ``ca`` verifies the
    peer's (the prefill side then requires decode workers to present one)."""

    cert: str | None = None
    key: str | None = None
    ca: str | None = None

    def server_context(self) -> ssl.SSLContext:
        if self.cert is None:
            raise ArgumentTypeError("TLS on the prefill side needs tls_cert", field="tls_cert")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        if self.ca is not None:
            context.load_verify_locations(self.ca)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def client_context(self) -> ssl.SSLContext:
        if self.ca is None:
            raise ArgumentTypeError("TLS on the decode side needs tls_ca", field="tls_ca")
        context = ssl.create_default_context(cafile=self.ca)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert is not None:
            context.load_cert_chain(self.cert, self.key)
        return context


def connect(host: str, port: int, deadline: Deadline, tls: Tls | None = None) -> socket.socket:
    """A connection to ``host:port`` bounded by ``deadline`` (TLS handshake included)."""
    sock = socket.create_connection((host, port), timeout=deadline.left())
    try:
        deadline.attach(sock)
        if tls is not None:
            sock.settimeout(deadline.left())
            sock = tls.client_context().wrap_socket(sock, server_hostname=host)
            deadline.attach(sock)
        sock.settimeout(deadline.left())
    except BaseException:
        sock.close()
        raise
    return sock


def listen(host: str, port: int) -> socket.socket:
    """The prefill worker's listening socket on ``host:port`` (``0.0.0.0`` or ``::`` for
    every interface); a taken port raises ``TransportError`` naming it."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        return socket.create_server((host, port), family=family, backlog=64)
    except (OSError, OverflowError, UnicodeError) as exc:
        raise TransportError(f"cannot listen on {host}:{port}: {exc}", field="port") from exc


def endpoint(options: Mapping[str, Any]) -> tuple[str, Tls | None]:
    """The bind address and TLS settings (None: plain TCP) of the connector's checked network
    options: ``host`` is handed to the decode side (never ``0.0.0.0``), ``bind_host``
    (``host`` unless set) is listened on."""
    host = check_host(options["host"], "host")
    bind = check_host(options["bind_host"] or host, "bind_host", bind=True)
    for name in ("max_connections", "nixl_max_peers"):
        count = options[name]
        if type(count) is not int or not 1 <= count <= 4096:
            raise ArgumentTypeError(f"{name} must be an int in 1..4096", field=name,
                                    found=repr(count))  # fmt: skip
    files = {name: options[name] for name in ("tls_cert", "tls_key", "tls_ca")}
    for name, path in files.items():
        if path is not None and not os.path.isfile(path):
            raise ArgumentTypeError(f"{name} must name a file", field=name, found=path)
    if not any(files.values()):
        return bind, None
    return bind, Tls(files["tls_cert"], files["tls_key"], files["tls_ca"])
