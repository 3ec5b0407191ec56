"""hurray_wire.vllm.transfer without vLLM: a prefill store served over a loopback socket and
pulled, and every way a pull is refused before a page could land (vLLM #52234's cases, a
flipped byte, a foreign engine, a stream that is not the transfer asked for)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from hurray_wire.errors import (
    ArgumentTypeError,
    IncompatibleFingerprintError,
    PageDigestError,
    TransferRefusedError,
    TransportError,
)
from hurray_wire.fingerprint import EngineFingerprint
from hurray_wire.integrity.digests import page_digests
from hurray_wire.vllm import receive as rc, transfer as tr
from hurray_wire.vllm.params import one_sequence
from hurray_wire.vllm.peers import NixlPeers

B, H, D, LAYERS = 4, 2, 8, 2
FP = EngineFingerprint(
    model_id="m",
    engine="vllm",
    engine_version="0.32.0",
    kv_cache_layout="CPU_ATTN/vec",
    cache_dtype="float32",
    block_size=B,
    tp_rank=0,
    tp_size=1,
)
PROMPT = list(range(10, 20))  # 10 tokens: 3 pages of 4, the last partial


def pages(seed: int, count: int = 3) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((count, B, H, D)).astype(np.float32),
        rng.standard_normal((count, B, H, D)).astype(np.float32),
    )


@contextmanager
def producer(
    fp: EngineFingerprint = FP, *, complete: bool = True
) -> Iterator[tuple[tr.TransferServer, tr.TransferParams, list[Any]]]:
    store = tr.TransferStore(fp, "m", LAYERS)
    server = tr.TransferServer(store, "127.0.0.1", 0, timeout=5)
    tid = store.new_id()
    params = tr.TransferParams(
        tid, "req-1", "127.0.0.1", server.port, (5, 9, 2), len(PROMPT), fp.block_size,
        tr.prompt_digest(PROMPT),
    )  # fmt: skip
    store.begin(tid, "req-1", params.block_ids, len(PROMPT), params.prompt_digest)
    layers = [pages(layer) for layer in range(LAYERS)]
    for layer, (key, value) in enumerate(layers[: LAYERS if complete else 1]):
        store.add_layer(tid, layer, key, value)
    try:
        yield server, params, layers
    finally:
        server.close()


def test_pull_returns_the_stored_pages_and_counts_bytes() -> None:
    with producer() as (server, params, layers):
        result = rc.pull(params, FP, LAYERS, expect_digest=tr.prompt_digest(PROMPT), timeout=5)
    assert result.error is None and result.pages is not None
    for (key, value), (k, v) in zip(result.pages.layers, layers, strict=True):
        np.testing.assert_array_equal(key, k)
        np.testing.assert_array_equal(value, v)
    assert result.pages.num_tokens == len(PROMPT)
    assert result.pages.wire_bytes == server.sent_bytes > 2 * LAYERS * k.nbytes


def test_params_round_trip_and_bad_params() -> None:
    with producer() as (_, params, _layers):
        assert tr.TransferParams.from_params(params.to_params()) == params
        good = params.to_params()
    for key, value in [
        ("remote_port", 0),
        ("remote_port", "80"),
        ("remote_block_ids", [1, -2]),
        ("remote_block_size", 0),
        ("hurray_transfer_id", None),
    ]:
        with pytest.raises(ArgumentTypeError, match=key):
            tr.TransferParams.from_params({**good, key: value})


def test_prefix_pages_held_are_not_sent() -> None:
    with producer() as (_, params, layers):
        full = rc.pull(params, FP, LAYERS, timeout=5)
    with producer() as (_, params, layers):
        delta = rc.pull(params, FP, LAYERS, first_block=2, timeout=5)
    assert full.pages is not None and delta.pages is not None
    # two pages fewer in each of the 4 blobs (the padded digest section keeps its size)
    saved = full.pages.wire_bytes - delta.pages.wire_bytes
    assert saved == 2 * len(tr.ROLES) * LAYERS * (B * H * D * 4)
    np.testing.assert_array_equal(delta.pages.layers[1][0], layers[1][0][2:])
    assert delta.pages.num_tokens == len(PROMPT) - 2 * B


def test_other_block_size_is_repaged() -> None:
    ours = replace(FP, block_size=8)
    with producer() as (_, params, layers):
        result = rc.pull(params, ours, LAYERS, timeout=5)
    assert result.pages is not None and result.pages.converted == ("block_size",)
    key = result.pages.layers[0][0]
    assert key.shape == (2, 8, H, D)
    tokens = layers[0][0].reshape(-1, H, D)[: len(PROMPT)]
    np.testing.assert_array_equal(key.reshape(-1, H, D)[: len(PROMPT)], tokens)


@pytest.mark.parametrize(
    ("field", "value"),
    [("model_id", "other"), ("cache_dtype", "bfloat16"),
     ("kv_cache_layout", "FLASHMLA/LBNHC/kernel64")],
)  # fmt: skip
def test_foreign_engine_is_refused_naming_the_field(field: str, value: Any) -> None:
    with producer() as (_, params, _layers):
        result = rc.pull(params, replace(FP, **{field: value}), LAYERS, timeout=5)
    assert result.pages is None and result.failed_from == 0
    assert isinstance(result.error, IncompatibleFingerprintError)
    assert field in result.error.differences and field in str(result.error)


@pytest.mark.parametrize("layout", ["CPU_ATTN/LBHNC/kernel32/amx", "FLASHINFER/LBNHC/kernel16"])
def test_another_backend_or_layout_converts(layout: str) -> None:
    """Pages travel backend-free: another backend, layout or kernel block (same roles)
    takes them as they are; an MLA engine (one fused role) does not (above)."""
    with producer() as (_, params, layers):
        result = rc.pull(params, replace(FP, kv_cache_layout=layout), LAYERS, timeout=5)
    assert result.pages is not None
    np.testing.assert_array_equal(result.pages.layers[1][1], layers[1][1])


def refused(params: tr.TransferParams, **kw: Any) -> TransferRefusedError:
    result = rc.pull(params, FP, LAYERS, timeout=5, **kw)
    assert result.pages is None
    assert isinstance(result.error, TransferRefusedError), result.error
    return result.error


def test_52234_consumed_reference_reused() -> None:
    with producer() as (_, params, _layers):
        assert rc.pull(params, FP, LAYERS, timeout=5).pages is not None
        assert refused(params).reason == "consumed"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"block_ids": (5, 9, 3)}, "block_ids"),  # not the transfer's blocks
        ({"block_ids": (5, 9, 200000)}, "block_ids"),  # out of range
        ({"block_ids": (5, 9)}, "block_ids"),  # do not cover the tokens
        ({"request_id": "req-2"}, "stale_request"),
        ({"prompt_digest": tr.prompt_digest([1, 2, 3])}, "stale_content"),
        ({"transfer_id": "0" * 32}, "unknown"),
    ],
)
def test_52234_references_that_are_not_the_transfer(change: dict[str, Any], reason: str) -> None:
    with producer() as (_, params, _layers):
        assert refused(replace(params, **change)).reason == reason
        # the refused pull did not consume it
        assert rc.pull(params, FP, LAYERS, timeout=5).pages is not None


def test_52234_stale_reference_for_another_prompt() -> None:
    """Params of an earlier prompt attached to a new prompt: refused by the decode side
    before anything is asked (the previous prompt's answer is never served)."""
    with producer() as (_, params, _layers):
        error = refused(params, expect_digest=tr.prompt_digest([7] * 10))
    assert error.reason == "stale_content" and error.field == "prompt_digest"


def test_incomplete_and_expired_transfers() -> None:
    with producer(complete=False) as (_, params, _layers):
        assert refused(params).reason == "incomplete"
    with producer() as (server, params, _layers):
        server.store.ttl = 0.0
        assert refused(params).reason == "expired"


@contextmanager
def fake_peer(script: Callable[[socket.socket], None]) -> Iterator[int]:
    """A listener on 127.0.0.1 (its port yielded) running ``script`` on its one connection
    on a daemon thread (a script may outlive the test: a peer that never answers)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(10)

    def run() -> None:
        with contextlib.suppress(OSError):
            conn, _ = server.accept()
            with conn:
                script(conn)

    threading.Thread(target=run, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def flipping_proxy(target: int, where: float) -> contextlib.AbstractContextManager[int]:
    def run(conn: socket.socket) -> None:
        with socket.create_connection(("127.0.0.1", target), timeout=5) as up:
            ask = b""
            while not ask.endswith(b"\n"):
                ask += conn.recv(1)
            up.sendall(ask)
            answer = bytearray()
            while chunk := up.recv(1 << 16):
                answer += chunk
            answer[int(len(answer) * where)] ^= 0x04
            conn.sendall(answer)

    return fake_peer(run)


@pytest.mark.parametrize("where", [0.3, 0.6, 0.9])
def test_a_flipped_byte_fails_the_pull(where: float) -> None:
    with producer() as (_, params, _layers), flipping_proxy(params.port, where) as port:
        result = rc.pull(replace(params, port=port), FP, LAYERS, first_block=1, timeout=5)
    assert result.pages is None and result.failed_from == 1
    assert result.error is not None


def test_a_flipped_page_byte_is_a_page_digest_error() -> None:
    store = tr.TransferStore(FP, "m", 1)
    store.begin("t", "r", (1, 2, 3), len(PROMPT), tr.prompt_digest(PROMPT))
    key, value = pages(0)
    store.add_layer("t", 0, key, value)
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b'{"transfer_id":"t","request_id":"r","prompt_digest":"'
                  + tr.prompt_digest(PROMPT).encode() + b'","block_ids":[1,2,3]}\n')  # fmt: skip
        tr.serve_one(store, b)
        b.shutdown(socket.SHUT_WR)
        data = bytearray()
        while chunk := a.recv(1 << 16):
            data += chunk
    stream = data[data.index(b"\n") + 1 :]
    raw = key.tobytes()[B * H * D * 4 : B * H * D * 4 + 64]  # page 1's first bytes
    at = bytes(stream).index(raw)
    stream[at + 3] ^= 0x01
    from hurray_wire.containers import StreamReader

    with pytest.raises(PageDigestError) as info:
        list(StreamReader(bytes(stream)))
    assert info.value.positions == ((0, 1),)


def test_a_peer_that_is_not_there_is_a_transport_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    params = tr.TransferParams("t", "r", "127.0.0.1", port, (1,), 3, B, "d")
    result = rc.pull(params, FP, LAYERS, timeout=2)
    assert isinstance(result.error, TransportError) and result.failed_from == 0


def test_pull_over_nixl_equals_the_socket_pull() -> None:
    pytest.importorskip("nixl_cu12")
    store = tr.TransferStore(FP, "m", LAYERS)
    peers_p = NixlPeers("t-prefill", timeout=20, arena_bytes=4 << 20)
    server = tr.TransferServer(store, "127.0.0.1", 0, timeout=20, nixl=peers_p)
    peers_d = NixlPeers("t-decode", timeout=20, arena_bytes=4 << 20)
    try:
        layers = [pages(layer) for layer in range(LAYERS)]
        for n, first in enumerate((0, 2)):  # the second pull reuses the peered endpoints
            tid = store.new_id()
            params = tr.TransferParams(
                tid, f"r{n}", "127.0.0.1", server.port, (5, 9, 2), len(PROMPT), B,
                tr.prompt_digest(PROMPT),
            )  # fmt: skip
            store.begin(tid, f"r{n}", params.block_ids, len(PROMPT), params.prompt_digest)
            for layer, (key, value) in enumerate(layers):  # held digests: the save's (issue 30)
                held = [page_digests(one_sequence(p, len(PROMPT))) for p in (key, value)]
                store.add_layer(tid, layer, key, value, digests=held if n else None)
            result = rc.pull(params, FP, LAYERS, first_block=first, timeout=20, nixl=peers_d)
            assert result.error is None and result.pages is not None
            for (key, value), (k, v) in zip(result.pages.layers, layers, strict=True):
                np.testing.assert_array_equal(key, k[first:])
                np.testing.assert_array_equal(value, v[first:])
            again = rc.pull(params, FP, LAYERS, timeout=20, nixl=peers_d)
            assert isinstance(again.error, TransferRefusedError)
            assert again.error.reason == "consumed"
    finally:
        server.close()
        peers_d.close()


def test_a_socket_only_prefill_refuses_a_nixl_pull() -> None:
    pytest.importorskip("nixl_cu12")
    peers = NixlPeers("t-decode-2", timeout=5, arena_bytes=1 << 20)
    try:
        with producer() as (_, params, _layers):
            result = rc.pull(params, FP, LAYERS, timeout=5, nixl=peers)
        assert isinstance(result.error, TransferRefusedError)
        assert result.error.reason == "transport"
    finally:
        peers.close()


def test_concurrent_nixl_pulls_from_one_prefill_worker() -> None:
    """A decode batch pulls several transfers at once from one prefill worker: the pulls
    share one endpoint pair and queue on it (a regression: they used to wait on each other's
    control lines until the deadline)."""
    pytest.importorskip("nixl_cu12")
    store = tr.TransferStore(FP, "m", LAYERS)
    server = tr.TransferServer(
        store, "127.0.0.1", 0, timeout=20, nixl=NixlPeers("c-prefill", arena_bytes=4 << 20)
    )
    peers = NixlPeers("c-decode", timeout=20, arena_bytes=4 << 20)
    all_params = []
    layers = [pages(layer) for layer in range(LAYERS)]
    for n in range(4):
        tid = store.new_id()
        store.begin(tid, f"r{n}", (1, 2, 3), len(PROMPT), tr.prompt_digest(PROMPT))
        for layer, (key, value) in enumerate(layers):
            store.add_layer(tid, layer, key, value)
        all_params.append(
            tr.TransferParams(
                tid,
                f"r{n}",
                "127.0.0.1",
                server.port,
                (1, 2, 3),
                len(PROMPT),
                B,
                tr.prompt_digest(PROMPT),
            )
        )
    results: list[rc.LoadResult] = []
    try:
        threads = [
            threading.Thread(
                target=lambda p=p: results.append(rc.pull(p, FP, LAYERS, timeout=20, nixl=peers))
            )
            for p in all_params
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        server.close()
        peers.close()
    assert len(results) == 4
    assert all(r.error is None and r.pages is not None for r in results), results


@pytest.mark.parametrize(
    ("sent", "line", "rest"),
    [
        (b'{"ok":true}\nSTREAM', {"ok": True}, b"STREAM"),  # the stream after it stays unread
        (b'{"a":1}\n{"b":2}\n', {"a": 1}, b'{"b":2}\n'),
        (b'{"a":' + b" " * (tr.MAX_LINE + 10) + b"1}\n", None, None),  # over MAX_LINE
        (b'{"a":1}', None, None),  # closed before its newline
        (b"", None, None),  # closed before anything
        (b"[1, 2]\n", None, None),  # not an object
        (b"{nope\n", None, None),  # not JSON
    ],
)
def test_control_line(sent: bytes, line: dict[str, Any] | None, rest: bytes | None) -> None:
    """A control line is read up to its newline and not a byte further; anything else is a
    TransportError (never a foreign exception or a hang)."""
    a, b = socket.socketpair()
    with a, b:
        b.settimeout(5)

        def send() -> None:
            a.sendall(sent)
            a.shutdown(socket.SHUT_WR)

        writer = threading.Thread(target=send)
        writer.start()
        try:
            if line is None:
                with pytest.raises(TransportError):
                    tr._read_line(b)
            else:
                assert tr._read_line(b) == line
                got = b""
                while chunk := b.recv(1 << 16):
                    got += chunk
                assert got == rest
        finally:
            writer.join(timeout=5)


def test_a_failed_send_is_logged_once_with_the_request(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The prefill side logs a send that breaks off (here the stream writer's socket fails)
    once, naming the request; the puller gets an error, never pages."""

    class Broken:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def __enter__(self) -> Broken:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def write(self, *args: Any, **kwargs: Any) -> None:
            raise BrokenPipeError("peer gone")

    monkeypatch.setattr(tr, "StreamWriter", Broken)
    with caplog.at_level("ERROR", logger="hurray_wire.vllm"), producer() as (server, params, _):
        result = rc.pull(params, FP, LAYERS, timeout=5)
        assert result.pages is None and result.error is not None
        again = rc.pull(params, FP, LAYERS, timeout=5)  # consumed: refused, not logged
        assert isinstance(again.error, TransferRefusedError)
        errors = list(server.errors)
    lines = [r.getMessage() for r in caplog.records if "KV send failed" in r.getMessage()]
    assert lines == ["HurrayConnector: request req-1: KV send failed: peer gone"]
    assert len(errors) == 1 and isinstance(errors[0], TransportError)  # typed, with its cause
    assert isinstance(errors[0].__cause__, BrokenPipeError)


def test_a_send_that_fails_midway_aborts_its_stream_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A send that breaks off after its first layer: serve_one raises, and its StreamWriter
    is aborted (the puller sees a cut stream, no end record), not dropped unclosed."""
    from hurray_wire.containers import StreamReader, StreamWriter
    from hurray_wire.errors import StreamTruncatedError

    store = tr.TransferStore(FP, "m", 1)
    store.begin("t", "r", (1, 2, 3), len(PROMPT), tr.prompt_digest(PROMPT))
    key, value = pages(0)
    store.add_layer("t", 0, key, value)
    real = tr._tensors
    writers: list[StreamWriter] = []

    def one_then_fail(*args: Any) -> Iterator[Any]:
        yield next(iter(real(*args)))
        raise OSError("the engine's pages went away")

    class Recorded(StreamWriter):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            writers.append(self)

    monkeypatch.setattr(tr, "_tensors", one_then_fail)
    monkeypatch.setattr(tr, "StreamWriter", Recorded)
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b'{"transfer_id":"t","request_id":"r","prompt_digest":"'
                  + tr.prompt_digest(PROMPT).encode() + b'","block_ids":[1,2,3]}\n')  # fmt: skip
        with pytest.raises(OSError, match="went away"):
            tr.serve_one(store, b)
        b.shutdown(socket.SHUT_WR)
        data = bytearray()
        while chunk := a.recv(1 << 16):
            data += chunk
    assert len(writers) == 1 and writers[0].closed
    with pytest.raises(StreamTruncatedError):  # one layer, then cut: no end record
        list(StreamReader(bytes(data[data.index(b"\n") + 1 :])))
