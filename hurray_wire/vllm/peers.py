"""The NIXL endpoints of one vLLM worker (``hurray_wire.transport.nixl``), one per peer.

A ``NixlSender`` or ``NixlReceiver`` has exactly one peer, so a prefill worker keeps a sender
per decode agent and a decode worker a receiver per prefill worker; the agents' metadata
travels on the pull's control lines (``hurray_wire.vllm.transfer``), base64. NIXL is
imported only when the first endpoint is made.
"""

from __future__ import annotations

import base64
import contextlib
import threading
from collections.abc import Mapping
from typing import Any

from hurray_wire.errors import HurrayWireError, TransportError

__all__ = ["NixlPeers", "agent_metadata"]


def agent_metadata(text: str) -> bytes:
    """A peer's NIXL agent metadata from its base64 on a control line; anything that is
    not base64 raises ``TransportError`` naming the field."""
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error, and non-ASCII text
        raise TransportError("agent_metadata is not base64", field="agent_metadata",
                             found=text[:40]) from None  # fmt: skip


class NixlPeers:
    """NIXL endpoints of one worker, one per peer (an endpoint has one peer): the prefill
    worker's senders by the decode agent's name, the decode worker's receivers by the
    prefill worker's address. Agent metadata travels on the pull's control lines, base64."""

    def __init__(self, name: str, *, timeout: float = 30.0, arena_bytes: int = 64 << 20):
        self.name = name
        self.timeout = timeout
        self._arena = arena_bytes
        self._senders: dict[str, Any] = {}
        self._receivers: dict[tuple[str, int], Any] = {}
        self._locks: dict[tuple[str, int], threading.Lock] = {}
        self._peered: set[tuple[str, int]] = set()
        self._lock = threading.Lock()

    def sender(self, ask: Mapping[str, Any]) -> tuple[Any, str | None]:
        """The sender for the asking agent, and this side's metadata if it is new."""
        from hurray_wire.transport.nixl import NixlSender

        agent = ask.get("agent")
        if not isinstance(agent, str):
            raise TransportError("a NIXL pull names no agent", field="agent")
        if agent in self._senders:
            return self._senders[agent], None
        peer = ask.get("agent_metadata")
        if not isinstance(peer, str):
            raise TransportError("a NIXL pull from a new agent carries no metadata")
        sender = NixlSender(f"{self.name}-to-{agent}", ucx_error_handling_mode="none",
                            arena_bytes=self._arena)  # fmt: skip
        mine = base64.b64encode(sender.metadata()).decode()
        sender.add_peer(agent_metadata(peer))
        self._senders[agent] = sender
        return sender, mine

    def lock(self, host: str, port: int) -> threading.Lock:
        """The lock that serialises pulls from one prefill worker."""
        with self._lock:
            return self._locks.setdefault((host, port), threading.Lock())

    def receiver(self, host: str, port: int) -> tuple[Any, str | None]:
        """The receiver for a prefill worker, and its metadata while it has no peer."""
        from hurray_wire.transport.nixl import NixlReceiver

        with self._lock:
            if (host, port) not in self._receivers:
                agent = f"{self.name}-{len(self._receivers)}"
                self._receivers[(host, port)] = NixlReceiver(
                    agent, ucx_error_handling_mode="none", arena_bytes=self._arena
                )
            receiver = self._receivers[(host, port)]
            if (host, port) in self._peered:
                return receiver, None
            return receiver, base64.b64encode(receiver.metadata()).decode()

    def peered(self, host: str, port: int) -> None:
        """The receiver for ``host:port`` has its peer: later pulls send no metadata."""
        with self._lock:
            self._peered.add((host, port))

    def close(self) -> None:
        for endpoint in [*self._senders.values(), *self._receivers.values()]:
            with contextlib.suppress(HurrayWireError):
                endpoint.close()
        self._senders.clear()
        self._receivers.clear()
