"""The sending process of tests/test_nixl.py: a NixlSender publishing a multi-layer KV cache.

Run by the test with two pipe descriptors: it writes its NIXL metadata to ``--out-fd``
(length-prefixed) and reads the receiver's from ``--in-fd``; nothing is pickled. The page
pools are ``cache_pool(layer, role, pages)``, which the receiver recomputes to check every
value. Faults for the tests: ``--corrupt LAYER:ROLE`` flips one page-pool byte of that blob
after its checksums were computed (in the sender's registered memory, as a bad link
would), ``--die-after N`` kills this process (SIGKILL) once N blobs are done, ``--abort-at N``
aborts the transfer after N blobs.
"""

from __future__ import annotations

import argparse
import os
import signal
import struct
import sys
from typing import Any

import numpy as np

import hurray_wire as hw

ROLES = ("key", "value")
PAGE_SHAPE = (16, 8, 64)  # page_size, num_heads, head_dim: 16 KiB of float16 per page


def cache_pool(layer: int, role: str, pages: int) -> np.ndarray[Any, Any]:
    """A deterministic page pool: every blob's bytes differ from every other blob's."""
    count = pages * int(np.prod(PAGE_SHAPE))
    seed = np.uint32(layer * 2 + ROLES.index(role) + 1)
    words = np.arange(count, dtype=np.uint32) * np.uint32(2654435761) + seed * np.uint32(40503)
    pool: np.ndarray[Any, Any] = (words >> np.uint32(7)).astype(np.uint16).view(np.float16)
    return pool.reshape(pages, *PAGE_SHAPE)


def cache_tensor(pool: np.ndarray[Any, Any], layer: int, role: str) -> hw.BlockPagedTensor:
    pages = len(pool)
    table = np.arange(pages)[::-1].copy()
    return hw.BlockPagedTensor.from_arrays(
        pool, table, [0, pages // 3, pages], kv_role=role, layer_index=layer
    )


def plan(layer: int) -> tuple[str, str]:
    """(op, mode) of a layer: every combination within four layers."""
    return ("READ", "WRITE")[layer % 2], ("zero-copy", "staged")[(layer // 2) % 2]


def send_bytes(fd: int, data: bytes) -> None:
    os.write(fd, struct.pack("<I", len(data)) + data)


def recv_bytes(fd: int) -> bytes:
    def exactly(n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = os.read(fd, n - len(out))
            if not chunk:
                raise EOFError("peer closed the pipe")
            out += chunk
        return out

    return exactly(struct.unpack("<I", exactly(4))[0])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--in-fd", type=int, required=True)
    parser.add_argument("--out-fd", type=int, required=True)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--pages", type=int, default=1024)
    parser.add_argument("--ucx", default="none")
    parser.add_argument("--corrupt", default="")
    parser.add_argument("--die-after", type=int, default=-1)
    parser.add_argument("--abort-at", type=int, default=-1)
    args = parser.parse_args()
    from hurray_wire.transport.nixl import NixlSender

    corrupt = tuple(args.corrupt.split(":")) if args.corrupt else None
    if corrupt is not None:
        from hurray_wire.blob import encoder
        from hurray_wire.transport import nixl_sender

        real = encoder.planned_into

        def flipping(tensor: hw.BlockPagedTensor, *args: Any) -> tuple[int, Any]:
            """The staged blob's plan, written, then one flipped page-pool byte (after the
            checksums)."""
            size, write = real(tensor, *args)

            def written(buffer: Any) -> int:
                done = write(buffer)
                if (str(tensor.layer_index), tensor.kv_role) == corrupt:
                    view = np.frombuffer(buffer, np.uint8)
                    view[4096 + 12345] ^= 0x10  # inside the page pool, past the header
                return int(done)

            return size, written

        setattr(nixl_sender, "planned_into", flipping)  # noqa: B010 (a test fault)
    sender = NixlSender("nixl-test-sender", ucx_error_handling_mode=args.ucx, arena_bytes=96 << 20)
    pools = {}
    for layer in range(args.layers):
        for role in ROLES:
            pools[layer, role] = cache_pool(layer, role, args.pages)
            sender.register(pools[layer, role])
    send_bytes(args.out_fd, sender.metadata())
    sender.add_peer(recv_bytes(args.in_fd))
    done = 0
    for layer in range(args.layers):
        for role in ROLES:
            if done == args.abort_at:
                sender.abort(f"test abort after {done} blobs")
                return 0
            if done == args.die_after:
                os.kill(os.getpid(), signal.SIGKILL)
            op, mode = plan(layer)
            if corrupt is not None:
                mode = "staged"
            sender.publish(cache_tensor(pools[layer, role], layer, role), op=op, mode=mode)
            if args.die_after >= 0 or args.abort_at >= 0:
                sender.wait(deadline=30)  # one at a time: the fault comes at a known blob
            done += 1
    sender.wait(deadline=30)
    sender.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
