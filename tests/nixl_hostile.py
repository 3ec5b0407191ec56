"""A hostile decode agent for the NIXL listener tests (tests/test_vllm_nixl_peers.py,
engine_tests/vllm_cpu/test_faults.py): it asks a prefill worker for a transfer over NIXL,
pairs with the sender it is given, and never reads a blob."""

from __future__ import annotations

import base64
import json
import socket

from hurray_wire.vllm.params import TransferParams
from hurray_wire.vllm.transfer import _read_line

LONG = 60.0  # seconds a socket wait may take before the test fails


class Hostile:
    """A decode agent that asks for a transfer over NIXL, pairs, and never reads a blob."""

    def __init__(self, name: str, params: TransferParams) -> None:
        from hurray_wire.transport.nixl import NixlReceiver

        self.name = name
        self.receiver = NixlReceiver(name, ucx_error_handling_mode="none", arena_bytes=1 << 20)
        self.sock = socket.create_connection((params.host, params.port), timeout=LONG)
        ask = {
            "transfer_id": params.transfer_id, "request_id": params.request_id,
            "prompt_digest": params.prompt_digest, "block_ids": list(params.block_ids),
            "transport": "nixl", "agent": name,
            "agent_metadata": base64.b64encode(self.receiver.metadata()).decode(),
        }  # fmt: skip
        self.sock.sendall(json.dumps(ask).encode() + b"\n")
        self.answer = _read_line(self.sock)
        if self.answer.get("ok"):
            self.receiver.add_peer(base64.b64decode(self.answer["agent_metadata"]))

    def still_served(self) -> bool:
        """Whether the prefill side still holds this pull open (no "done", no close)."""
        self.sock.setblocking(False)
        try:
            self.sock.recv(1, socket.MSG_PEEK)  # a line or the close: the pull ended
        except BlockingIOError:
            return True
        finally:
            self.sock.setblocking(True)
        return False

    def ended(self) -> bytes:
        """What the prefill side sent before closing the pull (waits for the close)."""
        self.sock.settimeout(2 * LONG)
        data = b""
        while chunk := self.sock.recv(4096):
            data += chunk
        return data

    def poison(self) -> None:
        """A notification that is no transfer record: the sender's wait fails on it."""
        self.receiver.agent.send_notif(self.receiver.peer, b"not a record")

    def close(self) -> None:
        self.sock.close()
        self.receiver.close()
