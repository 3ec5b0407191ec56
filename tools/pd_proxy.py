"""A small prefill/decode proxy for two vLLM OpenAI servers: the two-call flow (docs/vllm.md § 9).

``python tools/pd_proxy.py --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200
--port 8000`` serves ``POST /v1/completions`` and ``POST /v1/chat/completions``. Each request
goes first to the prefill server with ``max_tokens`` 1, no streaming and
``"kv_transfer_params": {"do_remote_decode": true}``; the ``kv_transfer_params`` of its answer
then go with the client's own request to the decode server, whose answer (streamed or not,
status included) is relayed to the client unchanged. Both calls carry one ``X-Request-Id``
(the client's, or a fresh one), returned to the client, so that one grep finds the request in
both servers' logs. Standard library only: it runs in any Python 3.10+, no engine needed.

Works with any connector that follows vLLM's P/D convention (HurrayConnector,
NixlConnector). ``route`` (library use) may rewrite the params before the decode call: the
engine tests send chosen requests through a fault-injecting relay that way.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import threading
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

__all__ = ["PDProxy", "Route"]

#: ``route(request_body, kv_transfer_params) -> kv_transfer_params`` for the decode call.
Route = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]
PATHS = ("/v1/completions", "/v1/chat/completions")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # socketserver's 5 resets clients arriving at once under load


def _post(
    base: str, path: str, body: dict[str, Any], request_id: str, timeout: float
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    url = urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80, timeout=timeout)
    try:
        conn.request(
            "POST",
            path,
            json.dumps(body).encode(),
            {"Content-Type": "application/json", "X-Request-Id": request_id},
        )
        return conn, conn.getresponse()
    except BaseException:
        conn.close()
        raise


class PDProxy:
    """The proxy server on ``host:port`` (0: a free port), serving on a thread until
    ``close()``; each client request on its own thread, each upstream call bounded by
    ``timeout`` seconds of silence."""

    def __init__(
        self,
        prefill: str,
        decode: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        timeout: float = 300.0,
        route: Route | None = None,
    ) -> None:
        self.prefill, self.decode, self.timeout, self.route = prefill, decode, timeout, route
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet under load
                pass

            def do_POST(self) -> None:
                proxy.handle(self)

        self.server = _Server((host, port), Handler)
        self.port: int = self.server.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)

    def _reply(self, h: BaseHTTPRequestHandler, status: int, body: bytes, rid: str) -> None:
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.send_header("X-Request-Id", rid)
        h.end_headers()
        h.wfile.write(body)

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        rid = h.headers.get("X-Request-Id") or uuid.uuid4().hex
        if h.path not in PATHS:
            self._reply(h, 404, b'{"error": {"message": "not found", "code": 404}}', rid)
            return
        try:
            body = json.loads(h.rfile.read(int(h.headers.get("Content-Length") or 0)))
            if not isinstance(body, dict):
                raise ValueError("the request body must be a JSON object")
        except ValueError as exc:
            msg = {"error": {"message": f"bad request: {exc}", "code": 400}}
            self._reply(h, 400, json.dumps(msg).encode(), rid)
            return
        first = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        first.update(max_tokens=1, kv_transfer_params={"do_remote_decode": True})
        if "max_completion_tokens" in first:
            first["max_completion_tokens"] = 1
        sent = False  # once the decode answer's headers are out, no other answer can follow
        try:
            conn, resp = _post(self.prefill, h.path, first, rid, self.timeout)
            try:
                answer = resp.read()
            finally:
                conn.close()
            if resp.status != 200:  # the prefill server's own error, as it gave it
                self._reply(h, resp.status, answer, rid)
                return
            params = json.loads(answer).get("kv_transfer_params")
            if not isinstance(params, dict):
                why = "the prefill server returned no kv_transfer_params (a kv_producer?)"
                msg = {"error": {"message": why, "code": 502}}
                self._reply(h, 502, json.dumps(msg).encode(), rid)
                return
            if self.route is not None:
                params = self.route(body, params)
            conn, resp = _post(self.decode, h.path, {**body, "kv_transfer_params": params},
                               rid, self.timeout)  # fmt: skip
            try:
                h.send_response(resp.status)
                h.send_header("Content-Type", resp.getheader("Content-Type") or "text/plain")
                h.send_header("X-Request-Id", rid)
                h.send_header("Connection", "close")  # the body ends when the proxy closes
                h.end_headers()
                sent = True
                while chunk := resp.read1(65536):
                    h.wfile.write(chunk)
                    h.wfile.flush()
            finally:
                conn.close()
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if sent:
                return  # a half-relayed answer: the client sees the connection close early
            msg = {"error": {"message": f"proxy: upstream failed: {exc!r}", "code": 502}}
            with contextlib.suppress(OSError):  # the client is gone: nothing left to tell
                self._reply(h, 502, json.dumps(msg).encode(), rid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefill", required=True, help="the prefill server's base URL")
    parser.add_argument("--decode", required=True, help="the decode server's base URL")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    proxy = PDProxy(args.prefill, args.decode, host=args.host, port=args.port,
                    timeout=args.timeout)  # fmt: skip
    print(f"proxy on {proxy.url}: prefill {args.prefill}, decode {args.decode}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        proxy.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
