"""Issue 29 without vLLM: hostile params, hostile prefill peers, hostile decode clients,
cancelled and overdue pulls, TLS. Every case ends with a typed error, and the listener
keeps serving a good client while the hostile ones are still connected."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hurray_wire.errors import (
    ArgumentTypeError,
    HurrayWireError,
    InvalidStreamError,
    LimitExceededError,
    TransferRefusedError,
    TransportError,
)
from hurray_wire.vllm import net, pulls, receive as rc, transfer as tr
from hurray_wire.vllm.params import check_host, request_kind
from hurray_wire.vllm.peers import agent_metadata
from tests.test_vllm_transfer import FP, LAYERS, PROMPT, fake_peer, producer

GOOD = tr.TransferParams(
    "0" * 32, "req-1", "127.0.0.1", 9, (5, 9, 2), len(PROMPT), FP.block_size,
    tr.prompt_digest(PROMPT),
).to_params()  # fmt: skip
NESTED = "[" * 100_000 + "]" * 100_000


# -- params ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"remote_host": "a" * 64 + ".example"}, "remote_host"),  # a label over 63: UnicodeError
        ({"remote_host": "x." * 127 + "com"}, "remote_host"),  # over 253
        ({"remote_host": "bücher.example"}, "remote_host"),  # not ASCII
        ({"remote_host": "0.0.0.0"}, "remote_host"),  # names no peer
        ({"remote_host": "-a.example"}, "remote_host"),
        ({"remote_host": 7}, "remote_host"),
        ({"remote_block_ids": [5, 9, int("9" * 4300)]}, "remote_block_ids"),  # 4,300 digits
        ({"remote_block_ids": [5, 9, 1 << 31]}, "remote_block_ids"),
        ({"remote_block_ids": [5, 9, True]}, "remote_block_ids"),  # bool is not an int
        ({"remote_block_ids": [5, 9]}, "remote_block_ids"),  # fewer than the tokens need
        ({"remote_block_ids": {"0": 5}}, "remote_block_ids"),
        ({"remote_port": True}, "remote_port"),
        ({"remote_port": 70000}, "remote_port"),
        ({"remote_num_tokens": 1 << 40}, "remote_num_tokens"),
        ({"remote_tp_size": 0}, "remote_tp_size"),
        ({"remote_request_id": "r" * 257}, "remote_request_id"),
        ({"remote_request_id": "a b"}, "remote_request_id"),
        ({"hurray_transfer_id": "../x\n"}, "hurray_transfer_id"),
        ({"prompt_digest": "Z" * 32}, "prompt_digest"),
        ({"prompt_digest": None}, "prompt_digest"),
        ({"do_remote_decode": True}, "do_remote_decode"),  # contradictory
    ],
)
def test_params_refused_by_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ArgumentTypeError) as info:
        tr.TransferParams.from_params({**GOOD, **change})
    assert info.value.field == field


@pytest.mark.parametrize("params", [None, [], [1, 2], "params", 7])
def test_params_that_are_not_a_mapping(params: Any) -> None:
    with pytest.raises(ArgumentTypeError):
        tr.TransferParams.from_params(params)


def test_missing_fields_each_refused() -> None:
    for name in [k for k in GOOD if k != "do_remote_decode"]:
        with pytest.raises(ArgumentTypeError):
            tr.TransferParams.from_params({k: v for k, v in GOOD.items() if k != name})


@pytest.mark.parametrize(
    ("params", "kind"),
    [
        (None, "local"),
        ({}, "local"),
        ({"do_remote_decode": True}, "save"),
        ({"do_remote_prefill": False, "do_remote_decode": False}, "local"),
        (GOOD, "load"),
        ({**GOOD, "do_remote_decode": True}, None),  # both: contradictory
        ({"do_remote_prefill": 1}, None),  # not a bool
        ({"do_remote_prefill": "yes"}, None),
        ({"do_remote_prefill": True}, None),  # a pull with nothing to pull
        ([GOOD], None),  # not a mapping
    ],
)
def test_request_kind(params: Any, kind: str | None) -> None:
    if kind is None:
        with pytest.raises(ArgumentTypeError):
            request_kind(params)
    else:
        assert request_kind(params) == kind


def test_hosts() -> None:
    for ok in ("127.0.0.1", "::1", "prefill-0.pods.local", "prefill_1", "a" * 63 + ".b"):
        assert check_host(ok, "host") == ok
    assert check_host("0.0.0.0", "bind_host", bind=True) == "0.0.0.0"
    base = {"host": "10.1.2.3", "bind_host": None, "max_connections": 4, "nixl_max_peers": 4,
            "tls_cert": None, "tls_key": None, "tls_ca": None}  # fmt: skip
    with pytest.raises(ArgumentTypeError, match="host"):
        net.endpoint({**base, "host": "0.0.0.0"})
    assert net.endpoint({**base, "bind_host": "0.0.0.0"}) == ("0.0.0.0", None)
    with pytest.raises(ArgumentTypeError, match="tls_ca"):
        net.endpoint({**base, "tls_ca": "/nonexistent"})
    for name in ("max_connections", "nixl_max_peers"):
        for bad in (0, 4097, True, 2.0):
            with pytest.raises(ArgumentTypeError, match=name) as info:
                net.endpoint({**base, name: bad})
            assert info.value.field == name


def test_agent_metadata_that_is_not_base64() -> None:
    assert agent_metadata("aGk=") == b"hi"
    for bad in ("not base64!", "aGk", "é"):
        with pytest.raises(TransportError, match="agent_metadata"):
            agent_metadata(bad)


# -- hostile prefill peers (the decode side's pull) --------------------------------------------
Script = Callable[[socket.socket], None]


def _silent(conn: socket.socket) -> None:
    conn.recv(1 << 16)
    conn.settimeout(30)
    while conn.recv(1 << 16):  # nothing sent, until the puller goes
        pass


def _drip(prefix: bytes) -> Script:
    def run(conn: socket.socket) -> None:
        conn.recv(1 << 16)
        conn.sendall(prefix)
        for _ in range(300):
            conn.sendall(b" ")
            time.sleep(0.1)

    return run


def _answer(data: bytes) -> Script:
    def run(conn: socket.socket) -> None:
        conn.recv(1 << 16)
        conn.sendall(data)

    return run


def _real_then_cut(at: int) -> Callable[[int], Script]:
    """Forward the real prefill worker's answer, cut after ``at`` bytes (killed mid-stream)."""

    def make(port: int) -> Script:
        def run(conn: socket.socket) -> None:
            ask = conn.recv(1 << 16)
            with socket.create_connection(("127.0.0.1", port), timeout=5) as up:
                up.sendall(ask)
                data = b""
                while len(data) < at and (chunk := up.recv(1 << 16)):
                    data += chunk
            conn.sendall(data[:at])
            conn.shutdown(socket.SHUT_RDWR)

        return run

    return make


def _fixed(script: Script) -> Callable[[int], Script]:
    return lambda port: script


#: Each a maker of the peer's script, given the port of a real prefill worker.
PEERS: dict[str, Callable[[int], Script]] = {
    "accepts, never answers": _fixed(_silent),
    "drips its answer line": _fixed(_drip(b'{"ok":')),
    "answers, then drips the stream": _fixed(_drip(b'{"ok":true}\nHRWS')),
    "a 100k-deep answer": _fixed(_answer(NESTED.encode() + b"\n")),
    "a 900-deep answer": _fixed(_answer(b'{"ok":' + b"[" * 900 + b"]" * 900 + b"}\n")),
    "an answer that is not JSON": _fixed(_answer(b"\xff\xfe\n")),
    "NaN in the answer": _fixed(_answer(b'{"ok":NaN}\n')),
    "an int of 5,000 digits": _fixed(_answer(b'{"ok":' + b"9" * 5000 + b"}\n")),
    "refuses with a dict as reason": _fixed(_answer(b'{"ok":false,"reason":{"a":[1]}}\n')),
    "garbage after ok": _fixed(_answer(b'{"ok":true}\n' + b"\x00" * 4096)),
    "closes at once": _fixed(_answer(b"")),
    "killed after the header": _real_then_cut(300),
    "killed mid-page": _real_then_cut(2000),
}


@pytest.mark.parametrize("name", list(PEERS))
def test_a_hostile_prefill_peer_ends_the_pull_with_a_typed_error(name: str) -> None:
    """Each case ends with a ``HurrayWireError`` (the bound: ``timeout``, 2 s here; no
    time is asserted); the pull never raises."""
    with producer() as (_, params, _layers), fake_peer(PEERS[name](params.port)) as port:
        result = rc.pull(replace(params, port=port), FP, LAYERS, timeout=2, first_block=1)
    assert result.pages is None and result.failed_from == 1
    assert isinstance(result.error, HurrayWireError), result.error


def test_a_pull_cancelled_midway_ends_at_once() -> None:
    with fake_peer(_silent) as port:
        params = replace(tr.TransferParams.from_params(GOOD), port=port)
        deadline = net.Deadline(120)
        threading.Timer(0.3, deadline.cancel).start()
        result = rc.pull(params, FP, LAYERS, deadline=deadline)
        deadline.close()
    assert isinstance(result.error, TransportError) and "cancelled" in str(result.error)


def test_pages_of_another_dtype_or_head_shape_are_refused_at_pull() -> None:
    store = tr.TransferStore(FP, "m", 1)
    server = tr.TransferServer(store, "127.0.0.1", 0, timeout=5)
    try:
        key = np.zeros((3, FP.block_size, 2, 8), np.float16)  # the fingerprint says float32
        params = tr.TransferParams("t1", "r", "127.0.0.1", server.port, (1, 2, 3), len(PROMPT),
                                   FP.block_size, tr.prompt_digest(PROMPT))  # fmt: skip
        store.begin("t1", "r", params.block_ids, len(PROMPT), params.prompt_digest)
        store.add_layer("t1", 0, key, key)
        result = rc.pull(params, FP, 1, timeout=5)
        assert isinstance(result.error, TransferRefusedError)
        assert result.error.reason == "geometry"
        params = replace(params, transfer_id="t2")
        store.begin("t2", "r", params.block_ids, len(PROMPT), params.prompt_digest)
        store.add_layer("t2", 0, key.astype(np.float32), key.astype(np.float32))
        result = rc.pull(params, FP, 1, timeout=5, num_kv_heads=4, head_dim=8)  # 2 heads sent
        assert isinstance(result.error, TransferRefusedError)
        assert result.error.reason == "geometry"
    finally:
        server.close()


# -- hostile decode clients (the prefill listener) ---------------------------------------------
def _ask(**change: Any) -> bytes:
    ask = {"transfer_id": "x", "request_id": "r", "prompt_digest": "d", "block_ids": [1]}
    return json.dumps({**ask, **change}).encode() + b"\n"


CLIENTS: dict[str, bytes | None] = {
    "connects, sends nothing": None,
    "drips an ask": b'{"transfer_id":',  # then a byte every 0.1 s
    "a 100k-deep line": NESTED.encode() + b"\n",
    "held_pages 900 deep": _ask(held_pages=json.loads("[" * 900 + "]" * 900)),
    "decode_rank a list": _ask(decode_rank=[0]),
    "decode_rank a dict": _ask(decode_rank={"a": 0}),
    "decode_tp_size a bool": _ask(decode_tp_size=True),
    "block_ids of strings": _ask(block_ids=["a"]),
    "a huge int": b'{"first_page":' + b"9" * 5000 + b"}\n",
    "a line over MAX_LINE": b"{" + b" " * (tr.MAX_LINE + 8),
    "binary": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" * 8 + b"\n",
    "agent_metadata not base64": _ask(transport="nixl", agent="a", agent_metadata="!!"),
}


def _hostile(port: int, data: bytes | None, stop: threading.Event) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    if data is not None:
        sock.sendall(data)
    if data is not None and not data.endswith(b"\n") and len(data) < 100:

        def drip() -> None:
            with contextlib.suppress(OSError):
                while not stop.wait(0.1):
                    sock.sendall(b" ")

        threading.Thread(target=drip, daemon=True).start()
    return sock


def test_hostile_clients_neither_kill_nor_delay_the_listener() -> None:
    """All the hostile clients connect first and stay; a good pull is then served while
    they are still connected (the listener is concurrent); each hostile connection is
    answered with a refusal or cut at its deadline; the listener serves afterwards."""
    stop = threading.Event()
    with producer() as (server, params, layers):
        server._timeout = 3.0  # the whole-connection deadline of every hostile client
        socks = {name: _hostile(params.port, data, stop) for name, data in CLIENTS.items()}
        try:
            result = rc.pull(params, FP, LAYERS, timeout=30)
            assert result.error is None and result.pages is not None
            np.testing.assert_array_equal(result.pages.layers[1][0], layers[1][0])
            for name, sock in socks.items():
                sock.settimeout(60)  # generous: the server ends each within its 3 s
                got = b""
                with contextlib.suppress(ConnectionError):
                    while chunk := sock.recv(1 << 16):
                        got += chunk
                if got:  # a refusal, never pages
                    assert json.loads(got.split(b"\n")[0])["ok"] is False, name
        finally:
            stop.set()
            for sock in socks.values():
                sock.close()
        assert server._thread.is_alive()
        again = tr.TransferParams.from_params(GOOD)
        assert rc.pull(replace(again, port=params.port), FP, LAYERS, timeout=5).error is not None
        assert all(isinstance(e, HurrayWireError) for e in server.errors), server.errors


def test_connections_over_the_bound_are_refused_as_busy() -> None:
    with producer() as (server, params, _layers):
        server._slots = threading.BoundedSemaphore(1)
        server._timeout = 2.0
        with socket.create_connection(("127.0.0.1", params.port), timeout=10):
            time.sleep(0.3)  # the listener took it
            result = rc.pull(params, FP, LAYERS, timeout=5)
            assert isinstance(result.error, TransferRefusedError)
            assert result.error.reason == "busy"
        for _ in range(100):  # the idle one is cut at its deadline; the slot comes back
            result = rc.pull(params, FP, LAYERS, timeout=5)
            if result.error is None:
                break
            time.sleep(0.2)
        assert result.error is None


def test_expired_transfers_are_dropped_without_a_new_pull() -> None:
    with producer() as (server, _params, _layers):
        server.store.ttl = 0.2
        for _ in range(100):
            if not server.store._live:
                break
            time.sleep(0.1)
        assert not server.store._live and set(server.store._gone.values()) == {"expired"}


# -- the engine thread's bound ------------------------------------------------------------------
def test_pulls_end_overdue_and_aborted() -> None:
    box = pulls.Pulls(timeout=0.2, slack=0.2)
    release = threading.Event()

    def stuck(deadline: net.Deadline) -> rc.LoadResult:
        release.wait(30)  # blocked where no socket can wake it
        return rc.LoadResult(None, failed_from=0)

    def boom(deadline: net.Deadline) -> rc.LoadResult:
        raise KeyError("not ours")

    box.start("stuck", stuck, 3)
    box.start("aborted", stuck, 0)
    box.start("boom", boom, 1)
    done, aborted = box.collect({"aborted"})
    assert aborted == {"aborted"}
    for _ in range(100):
        if {key for key, _, _ in done} >= {"stuck", "boom"}:
            break
        time.sleep(0.05)
        more, _ = box.collect()
        done += more
    errors = {key: result for key, result, _ in done}
    assert errors["stuck"].failed_from == 3 and isinstance(errors["stuck"].error, TransportError)
    assert isinstance(errors["boom"].error, TransportError) and "KeyError" in str(
        errors["boom"].error
    )
    release.set()
    assert box.pending() == 0
    box.close()


# -- TLS ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1, made with the openssl CLI (the test venv
    has no ``cryptography``)."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj",
         "/CN=hurray-test", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return str(cert), str(key)


def test_tls_pull_and_its_refusals(certificate: tuple[str, str]) -> None:
    cert, key = certificate
    tls = net.Tls(cert=cert, key=key, ca=cert)  # mutual: each side presents the one cert
    with producer() as (server, params, layers):
        server._tls = tls.server_context()
        result = rc.pull(params, FP, LAYERS, timeout=10, tls=tls)
        assert result.error is None and result.pages is not None
        np.testing.assert_array_equal(result.pages.layers[0][1], layers[0][1])
        plain = rc.pull(replace(params, transfer_id="t"), FP, LAYERS, timeout=5)
        assert isinstance(plain.error, TransportError)  # plain TCP to a TLS listener
        no_cert = net.Tls(ca=cert)  # the listener asks for a client certificate
        refused = rc.pull(replace(params, transfer_id="t"), FP, LAYERS, timeout=5, tls=no_cert)
        assert isinstance(refused.error, TransportError)
        assert server._thread.is_alive()
    with producer() as (_server, params, _layers):  # TLS to a plain listener
        result = rc.pull(params, FP, LAYERS, timeout=5, tls=tls)
        assert isinstance(result.error, TransportError)


# -- model_cache ----------------------------------------------------------------------------------
def test_load_cache_claiming_2_24_layers_is_a_typed_error(tmp_path: Path) -> None:
    from hurray_wire.containers import StreamHeader, StreamWriter, load_cache
    from hurray_wire.vllm.params import one_sequence

    path = tmp_path / "claims.hrws"
    header = StreamHeader(model="m", num_layers=1 << 24, kv_roles=("key", "value"))
    with StreamWriter(str(path), header) as writer:
        for role in ("key", "value"):
            pool = np.zeros((1, 4, 1, 8), np.float32)
            writer.write(one_sequence(pool, 4, kv_role=role, layer_index=0))
    assert path.stat().st_size < 4096
    with pytest.raises(InvalidStreamError, match="missing layer 1 key"):
        load_cache(str(path))


def test_a_blob_over_what_the_transfer_needs_is_refused_before_it_is_read() -> None:
    """The decode side bounds each blob by the pages it asked for (``receive._blob_bound``):
    a peer's blob of 3 MB for a transfer of 2 heads x 8 dims is refused unread."""
    store = tr.TransferStore(FP, "m", 1)
    server = tr.TransferServer(store, "127.0.0.1", 0, timeout=5)
    try:
        big = np.zeros((3, FP.block_size, 2, 1 << 15), np.float32)
        params = tr.TransferParams("t1", "r", "127.0.0.1", server.port, (1, 2, 3), len(PROMPT),
                                   FP.block_size, tr.prompt_digest(PROMPT))  # fmt: skip
        store.begin("t1", "r", params.block_ids, len(PROMPT), params.prompt_digest)
        store.add_layer("t1", 0, big, big)
        result = rc.pull(params, FP, 1, timeout=5, num_kv_heads=2, head_dim=8)
        assert isinstance(result.error, LimitExceededError), result.error
    finally:
        server.close()
