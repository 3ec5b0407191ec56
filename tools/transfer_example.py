"""Move a KV cache from a prefill worker to a decode worker over TCP, layer by layer.

Two processes talk over a socket on 127.0.0.1. The prefill side builds a multi-layer KV
cache (8 layers x key/value of float16 by default, about 320 MiB) and streams it with
``StreamWriter``: a stream header first (model, layers, roles, dtype, and the pool geometry
in its metadata), then one blob per ``{kv_role, layer}`` as ``encode_parts`` pieces sent
with ``sendmsg`` (no copy of the page data in user space), then the end record. The decode
side preallocates its KV pool from the header, then takes each blob as it arrives:
``StreamReader`` validates it (header, descriptor, checksums, index invariants), the layer
and role are read from the blob's own descriptor, every value is compared with what the
prefill side computed, and the pages are copied into the pool.

With ``--cut-after N`` the prefill side sends N whole blobs and half of the next one, then
closes the connection (``--reset``: with an RST); the decode side reports a typed error and
shows that the N layers it already has are intact.

Run the whole demo (it starts both processes)::

    python tools/transfer_example.py
    python tools/transfer_example.py --cut-after 11          # cut mid-blob
    python tools/transfer_example.py --cut-after 11 --reset  # cut with a TCP reset

Or run each side yourself (the decode side listens, the prefill side connects)::

    python tools/transfer_example.py decode --port 5555 &
    python tools/transfer_example.py prefill --port 5555

The decode side prints one JSON report on stdout; the demo prints it too.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

import hurray_wire as hw
from hurray_wire.containers import StreamHeader, StreamReader, StreamWriter

ROLES = ("key", "value")
TIMEOUT = 60.0  # seconds: every socket operation and every process is bounded


@dataclass(frozen=True)
class CacheSpec:
    """Geometry of the demo KV cache: both sides derive every value from it."""

    layers: int = 8
    num_pages: int = 640
    page_size: int = 16
    num_heads: int = 8
    head_dim: int = 128
    seed: int = 2024

    @property
    def pool_elements(self) -> int:
        return self.num_pages * self.page_size * self.num_heads * self.head_dim

    @property
    def pool_shape(self) -> tuple[int, int, int, int]:
        return (self.num_pages, self.page_size, self.num_heads, self.head_dim)


def _base_bits(spec: CacheSpec) -> npt.NDArray[np.uint16]:
    """Random float16 bit patterns (NaNs and all), made once per process."""
    rng = np.random.default_rng(spec.seed)
    return rng.integers(0, 1 << 16, size=spec.pool_elements, dtype=np.uint16)


def _layout(spec: CacheSpec, layer: int, role: str) -> tuple[Any, Any, Any]:
    """block_table, seq_ptr, seq_lens of one layer: four sequences over shuffled pages."""
    rng = np.random.default_rng([spec.seed, layer, ROLES.index(role)])
    pages = rng.permutation(spec.num_pages)
    counts = np.array([spec.num_pages // 2, spec.num_pages // 4, spec.num_pages // 8])
    counts = np.append(counts, spec.num_pages - counts.sum())
    seq_ptr = np.concatenate([[0], np.cumsum(counts)])
    seq_lens = counts * spec.page_size - rng.integers(0, spec.page_size, size=len(counts))
    return pages, seq_ptr, seq_lens


def expected_pool(
    spec: CacheSpec, base: npt.NDArray[np.uint16], layer: int, role: str
) -> npt.NDArray[np.uint16]:
    """The page_pool bits of ``{role, layer}``: different for every layer and role."""
    key = np.uint16((layer * 2 + ROLES.index(role) + 1) * 0x9E37 & 0xFFFF)
    bits: npt.NDArray[np.uint16] = (base ^ key).reshape(spec.pool_shape)
    return bits


def make_layer(
    spec: CacheSpec, base: npt.NDArray[np.uint16], layer: int, role: str
) -> hw.BlockPagedTensor:
    pages, seq_ptr, seq_lens = _layout(spec, layer, role)
    return hw.BlockPagedTensor.from_arrays(
        expected_pool(spec, base, layer, role).view(np.float16),
        pages,
        seq_ptr,
        seq_lens=seq_lens,
        kv_role=role,
        layer_index=layer,
        metadata={"request_id": "req-42"},
    )


def stream_header(spec: CacheSpec) -> StreamHeader:
    return StreamHeader(
        model="demo-llm-8l",
        num_layers=spec.layers,
        kv_roles=ROLES,
        element_type=hw.float16,
        metadata={k: v for k, v in asdict(spec).items() if k != "seed"},
    )


# -- prefill side ----------------------------------------------------------------------------
def prefill(port: int, spec: CacheSpec, cut_after: int | None, reset: bool) -> dict[str, Any]:
    """Connect to the decode side and stream the cache, one blob per {role, layer}."""
    base = _base_bits(spec)
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    sent = 0
    started = time.perf_counter()
    writer = StreamWriter(sock, stream_header(spec))
    for layer in range(spec.layers):
        for role in ROLES:
            tensor = make_layer(spec, base, layer, role)
            if cut_after is not None and sent == cut_after:
                # Simulate a crash mid-blob: half of this blob's bytes, then the line drops.
                blob = b"".join(hw.encode_parts(tensor))
                sock.sendall(blob[: len(blob) // 2])
                writer.abort()
                if reset:  # RST instead of FIN
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()
                return {"side": "prefill", "blobs_sent": sent, "cut": True}
            writer.write(tensor)  # encode_parts + sendmsg
            sent += 1
    writer.close()  # the end record: the decode side knows the stream is complete
    sock.shutdown(socket.SHUT_WR)
    sock.recv(1)  # wait for the decode side to finish before closing
    sock.close()
    seconds = time.perf_counter() - started
    return {"side": "prefill", "blobs_sent": sent, "bytes": writer.position, "seconds": seconds}


# -- decode side -----------------------------------------------------------------------------
def decode(listener: socket.socket, spec: CacheSpec) -> dict[str, Any]:
    """Accept one prefill connection and receive the cache into a preallocated pool."""
    base = _base_bits(spec)
    listener.settimeout(TIMEOUT)
    conn, _ = listener.accept()
    conn.settimeout(TIMEOUT)
    started = time.perf_counter()
    reader = StreamReader(conn)
    report: dict[str, Any] = {"side": "decode", "received": [], "error": None}
    try:
        header = reader.header  # read before the first blob: enough to preallocate
        assert header is not None and header.num_layers is not None
        meta = header.metadata
        shape = (meta["num_pages"], meta["page_size"], meta["num_heads"], meta["head_dim"])
        pool = np.zeros((header.num_layers, len(header.kv_roles), *shape), np.float16)
        report["header"] = {"model": header.model, "num_layers": header.num_layers,
                            "kv_roles": list(header.kv_roles),
                            "element_type": None if header.element_type is None
                            else header.element_type.name}  # fmt: skip
        checked = 0
        for tensor in reader:  # each blob validated as it arrives
            layer, role = tensor.layer_index, tensor.kv_role  # from its own descriptor
            assert layer is not None
            want = expected_pool(spec, base, layer, role)
            if not np.array_equal(tensor.page_pool.view(np.uint16), want):
                raise AssertionError(f"values differ in {role} of layer {layer}")
            pages, seq_ptr, seq_lens = _layout(spec, layer, role)
            assert np.array_equal(tensor.block_table, pages)
            assert np.array_equal(tensor.seq_ptr, seq_ptr)
            assert tensor.seq_lens is not None and np.array_equal(tensor.seq_lens, seq_lens)
            np.copyto(pool[layer, header.kv_roles.index(role)], tensor.page_pool)
            checked += want.size
            report["received"].append([layer, role])
            del tensor  # hold at most one blob besides the pool
        report["checked_values"] = checked
    except hw.HurrayWireError as exc:
        report["error"] = {"type": type(exc).__name__,
                           "classes": [k.__name__ for k in type(exc).__mro__],
                           "message": str(exc).splitlines()[0],
                           "cause": None if exc.__cause__ is None
                           else type(exc.__cause__).__name__}  # fmt: skip
    # Whatever happened, the layers already received are intact.
    report["intact_after"] = all(
        np.array_equal(pool[layer, ROLES.index(role)].view(np.uint16),
                       expected_pool(spec, base, layer, role))
        for layer, role in report["received"]
    )  # fmt: skip
    report["complete"] = reader.complete
    report["bytes"] = reader.position
    report["seconds"] = time.perf_counter() - started
    conn.close()
    return report


# -- the demo: both processes ----------------------------------------------------------------
def _spec_args(spec: CacheSpec) -> list[str]:
    return [f"--layers={spec.layers}", f"--num-pages={spec.num_pages}"]


def run_demo(spec: CacheSpec, cut_after: int | None, reset: bool) -> dict[str, Any]:
    """Start a decode process (listening) and a prefill process (connecting); collect both."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    common = [sys.executable, __file__]
    decode_proc = subprocess.Popen(
        [*common, "decode", f"--fd={listener.fileno()}", *_spec_args(spec)],
        pass_fds=[listener.fileno()],
        stdout=subprocess.PIPE,
        text=True,
    )
    listener.close()  # the decode process holds it now
    cut = [f"--cut-after={cut_after}"] if cut_after is not None else []
    prefill_proc = subprocess.Popen(
        [*common, "prefill", f"--port={port}", *_spec_args(spec), *cut]
        + (["--reset"] if reset else []),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        prefill_out, _ = prefill_proc.communicate(timeout=TIMEOUT)
        decode_out, _ = decode_proc.communicate(timeout=TIMEOUT)
    finally:
        for proc in (prefill_proc, decode_proc):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {
        "prefill": json.loads(prefill_out),
        "decode": json.loads(decode_out),
        "exit_codes": [prefill_proc.returncode, decode_proc.returncode],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("side", nargs="?", choices=["demo", "prefill", "decode"], default="demo")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--fd", type=int, default=None, help="an inherited listening socket")
    parser.add_argument("--layers", type=int, default=CacheSpec.layers)
    parser.add_argument("--num-pages", type=int, default=CacheSpec.num_pages)
    parser.add_argument("--cut-after", type=int, default=None, help="whole blobs before a cut")
    parser.add_argument("--reset", action="store_true", help="cut with a TCP reset")
    args = parser.parse_args(argv)
    spec = CacheSpec(layers=args.layers, num_pages=args.num_pages)
    if args.side == "prefill":
        result = prefill(args.port, spec, args.cut_after, args.reset)
    elif args.side == "decode":
        if args.fd is not None:
            listener = socket.socket(fileno=args.fd)
        else:
            listener = socket.create_server(("127.0.0.1", args.port))
        with listener:
            result = decode(listener, spec)
    else:
        result = run_demo(spec, args.cut_after, args.reset)
        d = result["decode"]
        mib = d["bytes"] / (1 << 20)
        print(
            f"decode received {len(d['received'])} blobs, {mib:.1f} MiB in {d['seconds']:.2f} s;"
            f" complete={d['complete']} error={d['error'] and d['error']['type']}"
            f" intact={d['intact_after']}",
            file=sys.stderr,
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
