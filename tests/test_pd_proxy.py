"""tools/pd_proxy.py without engines: what it sends each side and every answer it can give.

Two small upstream HTTP servers stand for the prefill and decode servers (the proxy's contract
is HTTP and JSON: the real vLLM servers run it in engine_tests/vllm_http); they record each
call and answer as told."""

from __future__ import annotations

import http.client
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
from pd_proxy import PDProxy

PARAMS = {"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": 1}


class Upstream:
    """Records (path, headers, body) per call; answers ``status`` with ``body`` (bytes)."""

    def __init__(self, status: int, body: bytes, content_type: str = "application/json"):
        self.calls: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self.status, self.body, self.content_type = status, body, content_type
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                upstream.calls.append(
                    (self.path, dict(self.headers), json.loads(self.rfile.read(length)))
                )
                self.send_response(upstream.status)
                self.send_header("Content-Type", upstream.content_type)
                self.send_header("Content-Length", str(len(upstream.body)))
                self.end_headers()
                self.wfile.write(upstream.body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def ends() -> Iterator[tuple[Upstream, Upstream]]:
    prefill = Upstream(200, json.dumps({"choices": [], "kv_transfer_params": PARAMS}).encode())
    decode = Upstream(200, b'data: {"choices": [{"token_ids": [7]}]}\n\ndata: [DONE]\n\n',
                      "text/event-stream")  # fmt: skip
    yield prefill, decode
    prefill.close()
    decode.close()


def post(url: str, path: str, body: bytes, headers: dict[str, str] | None = None) -> Any:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, resp.getheader("X-Request-Id"), resp.read()
    finally:
        conn.close()


def test_the_two_calls(ends: tuple[Upstream, Upstream]) -> None:
    prefill, decode = ends
    proxy = PDProxy(prefill.url, decode.url)
    try:
        request = {"prompt": [1, 2, 3], "max_tokens": 9, "stream": True,
                   "stream_options": {"include_usage": True}}  # fmt: skip
        status, rid, body = post(proxy.url, "/v1/completions", json.dumps(request).encode(),
                                 {"X-Request-Id": "abc"})  # fmt: skip
    finally:
        proxy.close()
    assert (status, rid) == (200, "abc")
    assert body == decode.body  # the decode server's stream, relayed unchanged
    [(path, headers, first)] = prefill.calls
    assert path == "/v1/completions" and headers["X-Request-Id"] == "abc"
    assert first == {"prompt": [1, 2, 3], "max_tokens": 1,
                     "kv_transfer_params": {"do_remote_decode": True}}  # fmt: skip
    [(path, headers, second)] = decode.calls
    assert headers["X-Request-Id"] == "abc"
    assert second == {**request, "kv_transfer_params": PARAMS}


def test_route_rewrites_the_params(ends: tuple[Upstream, Upstream]) -> None:
    prefill, decode = ends
    proxy = PDProxy(prefill.url, decode.url, route=lambda body, p: {**p, "remote_port": 2})
    try:
        assert post(proxy.url, "/v1/chat/completions", b'{"max_completion_tokens": 5}')[0] == 200
    finally:
        proxy.close()
    assert prefill.calls[0][2]["max_completion_tokens"] == 1
    assert decode.calls[0][2]["kv_transfer_params"] == {**PARAMS, "remote_port": 2}


@pytest.mark.parametrize(
    ("path", "body", "prefill_answer", "status", "message"),
    [
        ("/v1/other", b"{}", None, 404, "not found"),
        ("/v1/completions", b"[1]", None, 400, "bad request"),
        ("/v1/completions", b"{not json", None, 400, "bad request"),
        # the prefill server's own error, relayed as it gave it
        ("/v1/completions", b"{}", (503, b'{"error": {"message": "busy"}}'), 503, "busy"),
        # a prefill server that is not a kv_producer
        ("/v1/completions", b"{}", (200, b'{"choices": []}'), 502, "no kv_transfer_params"),
        ("/v1/completions", b"{}", (200, b"not json"), 502, "upstream failed"),
    ],
)
def test_every_answer_the_proxy_makes_itself(
    ends: tuple[Upstream, Upstream],
    path: str,
    body: bytes,
    prefill_answer: tuple[int, bytes] | None,
    status: int,
    message: str,
) -> None:
    prefill, decode = ends
    if prefill_answer is not None:
        prefill.status, prefill.body = prefill_answer
    proxy = PDProxy(prefill.url, decode.url)
    try:
        got, rid, answer = post(proxy.url, path, body)
    finally:
        proxy.close()
    assert got == status and rid
    assert message in json.loads(answer)["error"]["message"]
    assert decode.calls == []  # nothing reached the decode server


def test_an_unreachable_decode_server_is_502(ends: tuple[Upstream, Upstream]) -> None:
    prefill, decode = ends
    dead = decode.url
    decode.close()
    proxy = PDProxy(prefill.url, dead, timeout=5)
    try:
        status, _, answer = post(proxy.url, "/v1/completions", b"{}")
    finally:
        proxy.close()
    assert status == 502 and "upstream failed" in json.loads(answer)["error"]["message"]
