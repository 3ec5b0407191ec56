"""A fault-injecting TCP relay between a decode engine and a prefill engine's listener.

The load test's proxy rewrites a chosen request's ``remote_host`` / ``remote_port`` to a
relay; the relay forwards the decode side's ask unchanged and damages what comes back, the
same way for every connection: ``flip`` one byte at ``offset`` of the answer, ``cut`` it at
``offset`` (an orderly close), ``stall`` after ``offset`` bytes (nothing more, the
connection left open), ``reset`` at ``offset`` (an RST: the connection killed). Every
connection ends within ``hold`` seconds; ``close()`` stops the relay and its threads.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

FAULTS = ("flip", "cut", "stall", "reset")


class Relay:
    def __init__(
        self, target: tuple[str, int], fault: str, *, offset: int = 4096, hold: float = 60.0
    ) -> None:
        assert fault in FAULTS, fault
        self.target, self.fault, self.offset, self.hold = target, fault, offset, hold
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.5)
        self.address = self.listener.getsockname()[:2]
        self.connections = 0
        self.damaged = 0  # connections whose answer reached ``offset`` and was damaged
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
            t = threading.Thread(target=self._relay, args=(client,), daemon=True)
            t.start()
            self._threads.append(t)

    def _relay(self, client: socket.socket) -> None:
        deadline = time.monotonic() + self.hold
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            client.close()
            return
        up = threading.Thread(target=self._pump_up, args=(client, upstream, deadline),
                              daemon=True)  # fmt: skip
        up.start()
        seen = 0
        try:
            upstream.settimeout(0.5)
            while time.monotonic() < deadline and not self._stop.is_set():
                try:
                    data = upstream.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    break
                if seen <= self.offset < seen + len(data):
                    self._count()
                    cut = self.offset - seen
                    if self.fault == "flip":
                        data = data[:cut] + bytes([data[cut] ^ 0x40]) + data[cut + 1 :]
                    else:
                        client.sendall(data[:cut])
                        if self.fault == "reset":
                            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                              struct.pack("ii", 1, 0))  # fmt: skip
                        if self.fault == "stall":
                            self._stop.wait(max(0.0, deadline - time.monotonic()))
                        break
                seen += len(data)
                client.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.close()
            up.join(timeout=5)

    def _count(self) -> None:
        with self._lock:
            self.damaged += 1

    def _pump_up(self, client: socket.socket, upstream: socket.socket, deadline: float) -> None:
        client.settimeout(0.5)
        with contextlib.suppress(OSError):
            while time.monotonic() < deadline and not self._stop.is_set():
                try:
                    data = client.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    return
                upstream.sendall(data)

    def close(self) -> None:
        self._stop.set()
        self.listener.close()
        self._accept.join(timeout=5)
        for t in self._threads:
            t.join(timeout=5)
