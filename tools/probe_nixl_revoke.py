"""Does deregistering memory stop a NIXL peer that already holds its metadata from writing it?

docs/nixl.md § 3.1 relies on the answer (measured here with nixl-cu12 1.5.1 over UCX on one
machine: no, for both error-handling modes, that is shared memory and TCP loopback). Two
agents in one process: A registers a buffer and hands B its metadata; B WRITEs into it
(lands); A deregisters it, then also removes B; B WRITEs again with the metadata it holds.

    python tools/probe_nixl_revoke.py            # both modes
    python tools/probe_nixl_revoke.py --ucx peer
"""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

import numpy as np

import hurray_wire.transport.nixl_endpoint as endpoint

logging.getLogger("nixl").setLevel(logging.ERROR)


def _agent(name: str, mode: str) -> Any:
    nixl = vars(endpoint)["_nixl"]  # the NIXL module the endpoint loaded
    agent = nixl.nixl_agent(name, nixl.nixl_agent_config(enable_prog_thread=False, backends=[]))
    params = dict(agent.get_plugin_params("UCX"))
    params["ucx_error_handling_mode"] = mode
    agent.create_backend("UCX", params)
    return agent


def _write(a: Any, b: Any, src: np.ndarray[Any, Any], dst: np.ndarray[Any, Any]) -> str:
    """B WRITEs src over dst (A's): "landed", "not landed" or NIXL's refusal."""
    dst[:] = 0
    try:
        local = b.get_xfer_descs([(int(src.ctypes.data), src.nbytes, 0)], "DRAM")
        remote = b.get_xfer_descs([(int(dst.ctypes.data), src.nbytes, 0)], "DRAM")
        handle = b.initialize_xfer("WRITE", local, remote, "A", b"")
        state = b.transfer(handle)
        until = time.monotonic() + 5
        while state not in ("DONE", "ERR") and time.monotonic() < until:
            state = b.check_xfer_state(handle)
            a.get_new_notifs()
    except Exception as exc:
        return f"refused by B's NIXL ({type(exc).__name__})"
    return f"{state}, {'landed' if (dst == src).all() else 'not landed'}"


def probe(mode: str) -> None:
    a, b = _agent("A", mode), _agent("B", mode)
    target = np.zeros(4096, np.uint8)
    src = np.full(4096, 0x5A, np.uint8)
    reg = a.register_memory([(int(target.ctypes.data), target.nbytes, 0, "")], "DRAM")
    b.register_memory([(int(src.ctypes.data), src.nbytes, 0, "")], "DRAM")
    b.add_remote_agent(a.get_agent_metadata())
    a.add_remote_agent(b.get_agent_metadata())
    print(f"[{mode}] registered:                     {_write(a, b, src, target)}")
    a.deregister_memory(reg)
    print(f"[{mode}] after A deregistered it:        {_write(a, b, src, target)}")
    a.remove_remote_agent("B")
    print(f"[{mode}] after A also removed peer B:    {_write(a, b, src, target)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ucx", choices=["none", "peer"], action="append")
    for mode in parser.parse_args().ucx or ["none", "peer"]:
        probe(mode)


if __name__ == "__main__":
    main()
