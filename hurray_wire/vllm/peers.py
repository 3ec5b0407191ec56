"""The NIXL endpoints of one vLLM worker, one per peer (an endpoint has one peer and one
driving thread), each leased to one pull at a time, so one slow peer delays only its own
pulls. At most ``max_peers`` are kept: a new peer closes the least recently used idle one,
or is refused (``busy``); an endpoint whose pull failed is closed, never reused (docs/vllm.md § 9).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from hurray_wire.errors import HurrayWireError, TransferRefusedError
from hurray_wire.vllm.net import Deadline

__all__ = ["NixlPeers", "Peer", "agent_metadata"]


def agent_metadata(text: str) -> bytes:
    """A peer's NIXL agent metadata from its base64 on a control line (else ``malformed``)."""
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error, and non-ASCII text
        raise TransferRefusedError("agent_metadata is not base64", reason="malformed",
                                   field="agent_metadata", found=text[:40]) from None  # fmt: skip


@dataclass
class Peer:
    """One peer's endpoint, leased to one pull. ``metadata``: the peer's, sent with this pull
    (the endpoint is made afresh); ``used``: a failure leaves the endpoint in an unknown state."""

    key: Hashable
    endpoint: Any = None
    peered: bool = False
    metadata: bytes | None = None
    used: bool = False


def _close(peers: list[Peer]) -> None:
    """Close the peers' endpoints (outside any lock: a close waits for NIXL)."""
    for peer in peers:
        if peer.endpoint is not None:
            with contextlib.suppress(HurrayWireError):
                peer.endpoint.close()


K = TypeVar("K", bound=Hashable)


class _Bounded(Generic[K]):
    """At most ``limit`` peers' endpoints, least recently used first; a second pull with the
    same peer waits for the first (until its deadline)."""

    def __init__(self, limit: int, field: str) -> None:
        self.limit = limit
        self._field = field
        self._peers: OrderedDict[K, Peer] = OrderedDict()
        self._busy: set[K] = set()
        self._cond = threading.Condition()
        self._closed = False

    @contextlib.contextmanager
    def lease(self, key: K, deadline: Deadline) -> Iterator[Peer]:
        """``key``'s endpoint for one pull; on an exception after ``used`` it is closed."""
        stale: list[Peer] = []
        with self._cond:
            while key in self._busy:  # its previous pull ends by that pull's own deadline
                self._cond.wait(timeout=deadline.left())  # raises once this one's passed
            peer = self._peers.get(key)
            if self._closed:
                raise TransferRefusedError("this worker's NIXL endpoints are closed",
                                           reason="busy", field=self._field)  # fmt: skip
            if peer is None:
                if len(self._peers) >= self.limit:
                    idle = next((k for k in self._peers if k not in self._busy), None)
                    if idle is None:
                        raise TransferRefusedError(
                            f"all {self.limit} NIXL peers are in use", reason="busy",
                            field=self._field, expected=f"at most {self.limit} peers",
                        )  # fmt: skip
                    stale.append(self._peers.pop(idle))
                peer = self._peers[key] = Peer(key)
            self._peers.move_to_end(key)
            self._busy.add(key)
            peer.metadata, peer.used = None, False
        _close(stale)
        failed = True
        try:
            yield peer
            failed = False
        finally:
            stale = []
            with self._cond:
                self._busy.discard(key)
                if (failed and peer.used) or peer.endpoint is None or self._closed:
                    self._peers.pop(key, None)
                    stale = [peer]
                self._cond.notify_all()
            _close(stale)

    def keys(self) -> list[K]:
        """The peers held, least recently used first."""
        with self._cond:
            return list(self._peers)

    def close(self) -> None:
        """Close the idle endpoints now, those in use when their pull ends."""
        with self._cond:
            self._closed = True
            idle = [k for k in self._peers if k not in self._busy]
            peers = [self._peers.pop(k) for k in idle]
        _close(peers)


class NixlPeers:
    """The prefill worker's senders by the decode agent's name, the decode worker's receivers
    by the prefill worker's address; at most ``max_peers`` of each."""

    def __init__(
        self,
        name: str,
        *,
        timeout: float = 30.0,
        arena_bytes: int = 64 << 20,
        max_peers: int = 32,
    ):
        self.name = name
        self.timeout = timeout
        self._arena = arena_bytes
        self._names = itertools.count()
        self._senders = _Bounded[str](max_peers, "agent")
        self._receivers = _Bounded[tuple[str, int]](max_peers, "remote_host")

    @contextlib.contextmanager
    def sending(self, ask: Mapping[str, Any], deadline: Deadline) -> Iterator[Peer]:
        """The asking agent's sender for one pull (``sender`` makes it); an agent unknown here
        without its metadata is refused (``agent``: the decode side then pairs afresh)."""
        agent = ask.get("agent")
        if not isinstance(agent, str):
            raise TransferRefusedError("a NIXL pull names no agent", reason="malformed",
                                       field="agent")  # fmt: skip
        text = ask.get("agent_metadata")
        metadata = None if text is None else agent_metadata(text)
        with self._senders.lease(agent, deadline) as peer:
            if peer.endpoint is None and metadata is None:
                raise TransferRefusedError(
                    f"no NIXL sender for agent {agent!r} here: send agent_metadata",
                    reason="agent", field="agent_metadata",
                )  # fmt: skip
            peer.metadata = metadata
            yield peer

    def sender(self, peer: Peer) -> tuple[Any, str | None]:
        """The leased sender, made afresh and paired (with this side's metadata) when the ask
        carried the agent's."""
        from hurray_wire.transport.nixl import NixlSender

        peer.used = True
        if peer.metadata is None:
            return peer.endpoint, None
        old = Peer(peer.key, peer.endpoint)  # an agent pairing afresh: its old sender goes
        peer.endpoint = None
        _close([old])
        peer.endpoint = NixlSender(f"{self.name}-s{next(self._names)}", arena_bytes=self._arena,
                                   ucx_error_handling_mode="none")  # fmt: skip
        mine = base64.b64encode(peer.endpoint.metadata()).decode()
        peer.endpoint.add_peer(peer.metadata)
        peer.peered = True
        return peer.endpoint, mine

    def receiving(
        self, host: str, port: int, deadline: Deadline
    ) -> contextlib.AbstractContextManager[Peer]:
        """The receiver for a prefill worker, leased for one pull (``receiver`` makes it)."""
        return self._receivers.lease((host, port), deadline)

    def receiver(self, peer: Peer) -> tuple[Any, str | None]:
        """The leased receiver, and its metadata while it has no peer."""
        from hurray_wire.transport.nixl import NixlReceiver

        if peer.endpoint is None:
            peer.endpoint = NixlReceiver(f"{self.name}-r{next(self._names)}",
                                         ucx_error_handling_mode="none",
                                         arena_bytes=self._arena)  # fmt: skip
        if peer.peered:
            return peer.endpoint, None
        return peer.endpoint, base64.b64encode(peer.endpoint.metadata()).decode()

    def pair(self, peer: Peer, text: object) -> None:
        """The leased receiver paired with the sender whose metadata the answer carried."""
        if not isinstance(text, str):
            raise TransferRefusedError("the prefill worker sent no NIXL metadata",
                                       reason="malformed", field="agent_metadata")  # fmt: skip
        peer.endpoint.add_peer(agent_metadata(text))
        peer.peered = True

    def senders(self) -> list[str]:
        """The decode agents this side holds a sender for, least recently used first."""
        return self._senders.keys()

    def receivers(self) -> list[tuple[str, int]]:
        """The prefill addresses this side holds a receiver for, least recently used first."""
        return self._receivers.keys()

    def close(self) -> None:
        self._senders.close()
        self._receivers.close()
