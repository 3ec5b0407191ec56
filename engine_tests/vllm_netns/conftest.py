"""Two hosts on one machine: the prefill engine in one network namespace, the decode engines
in another, joined by a veth pair with addresses that are not loopback (10.231.0.1/30 and
10.231.0.2/30, which exist only inside the two namespaces this session makes and removes).

Needs root and iproute2's ``ip`` (CI runs as root); skipped with the reason otherwise. The
engines are the engine tests' own workers (``engine_tests/vllm_cpu/engine_worker.py``)
started under ``ip netns exec``: a TP=1 prefill engine (transport "nixl", so it serves both
kinds of pull) listening on its veth address, a TP=2 decode engine pulling over the socket
and a TP=1 decode engine pulling over NIXL (UCX over the veth).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine_tests.vllm_cpu.conftest import Engine, connector, model_dir  # noqa: F401

PREFILL_ADDR, DECODE_ADDR = "10.231.0.1", "10.231.0.2"
KV_PORT = 14579  # a fresh namespace: every port is free
IP_TIMEOUT = 30


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, timeout=IP_TIMEOUT, capture_output=True)


@dataclass
class Hosts:
    prefill_ns: str
    decode_ns: str

    def prefix(self, ns: str) -> tuple[str, ...]:
        return ("ip", "netns", "exec", ns)


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    return None


@pytest.fixture(scope="session")
def hosts() -> Iterator[Hosts]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    tag = f"{os.getpid() % 100000}"
    made = Hosts(f"hw-prefill-{tag}", f"hw-decode-{tag}")
    veth = (f"hwp{tag}", f"hwd{tag}")  # created in the root namespace, then moved
    try:
        ip("netns", "add", made.prefill_ns)
    except subprocess.CalledProcessError as exc:  # root without CAP_SYS_ADMIN (a container)
        pytest.skip(f"cannot make a network namespace here: {exc.stderr.decode().strip()}")
    try:
        for ns in (made.prefill_ns, made.decode_ns):
            if ns != made.prefill_ns:
                ip("netns", "add", ns)
            ip("-n", ns, "link", "set", "lo", "up")
        ip("link", "add", veth[0], "type", "veth", "peer", "name", veth[1])
        for end, ns, addr in ((veth[0], made.prefill_ns, PREFILL_ADDR),
                              (veth[1], made.decode_ns, DECODE_ADDR)):  # fmt: skip
            ip("link", "set", end, "netns", ns)
            ip("-n", ns, "addr", "add", f"{addr}/30", "dev", end)
            ip("-n", ns, "link", "set", end, "up")
        yield made
    finally:
        for ns in (made.prefill_ns, made.decode_ns):  # the veth pair goes with them
            subprocess.run(["ip", "netns", "del", ns], timeout=IP_TIMEOUT, capture_output=True)
        subprocess.run(["ip", "link", "del", veth[0]], timeout=IP_TIMEOUT, capture_output=True)


@pytest.fixture(scope="session")
def engines(hosts: Hosts, model_dir: Path) -> Iterator[dict[str, Engine]]:  # noqa: F811
    logs = Path(tempfile.mkdtemp(prefix="hurray-vllm-netns-"))
    prefill = connector("kv_producer", KV_PORT, transport="nixl")
    prefill["kv_connector_extra_config"]["host"] = PREFILL_ADDR
    specs = {
        "prefill": (hosts.prefill_ns, {"kv_transfer_config": prefill, "prefix_caching": False}),
        "decode_tp2": (hosts.decode_ns, {"kv_transfer_config": connector("kv_consumer", 1),
                                         "tp": 2}),
        "decode_nixl": (hosts.decode_ns, {"kv_transfer_config": connector(
            "kv_consumer", 1, transport="nixl")}),
    }  # fmt: skip
    started: dict[str, Engine] = {}
    try:
        for name, (ns, spec) in specs.items():
            started[name] = Engine({"model": str(model_dir), "block_size": 32, **spec},
                                   logs / f"{name}.log", prefix=hosts.prefix(ns))  # fmt: skip
        for engine in started.values():
            engine.wait_ready()
        yield started
    finally:
        for engine in started.values():
            engine.close()
