"""Loopback transfer rate of a KV-cache stream against a raw socket copy, and its memory.

``rate`` (the default): a sender process holds a multi-layer KV cache (16 float16 tensors of
about 20 MiB by default) and, over TCP on 127.0.0.1, sends it to this process again and
again, alternating between

* ``raw``: per tensor an 8-byte length, then its buffers with ``sendmsg``; the receiver
  ``recv_into``s them into a new buffer. No framing, no validation: the floor.
* ``stream``: ``StreamWriter`` (header, blobs from ``encode_parts`` with checksums, end
  record); the receiver iterates ``StreamReader``, which reads each blob into a new buffer
  and validates it completely (checksums verified).
* ``stream-nohash``: the same without section checksums (``checksum=False``).

Both sides run in separate processes; the machine may be shared, so modes are interleaved
round after round and each is reported as its best and median rate over the rounds. The
figure of merit is the ratio stream / raw measured in the same run (target >= 0.8). The CPU
seconds of both processes per run (user + system) are reported too, as ``cpu_ratio`` (raw
CPU / stream CPU): on a busy machine it says more about the cost of the format than wall
time does.

``rss``: write a stream file of ``--size-gib`` GiB to /tmp (blobs of ``--blob-mib`` MiB),
then read it in a child process through ``StreamReader`` from a pipe (``cat file |``) or a
socket, and report the child's peak RSS (``resource.getrusage``) above its RSS before the
first blob, in blobs.

Run: python tools/bench_transfer.py [rate] [--rounds 5] [--layers 8] [--num-pages 640]
     python tools/bench_transfer.py rss [--size-gib 2] [--blob-mib 32] [--via pipe|socket]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_scale import scaled

import hurray_wire as hw
from hurray_wire.containers import StreamHeader, StreamReader, StreamWriter

MODES = ("raw", "stream", "stream-nohash")
TIMEOUT = 120.0


# -- the cache -------------------------------------------------------------------------------
def make_cache(layers: int, num_pages: int, seed: int = 7) -> list[hw.BlockPagedTensor]:
    """layers x {key, value} float16 tensors, [num_pages, 16, 8, 128] pools of random bits."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 1 << 16, size=(num_pages, 16, 8, 128), dtype=np.uint16)
    tensors = []
    for layer in range(layers):
        for code, role in enumerate(("key", "value")):
            pool = (base ^ np.uint16(layer * 2 + code + 1)).view(np.float16)
            tensors.append(
                hw.BlockPagedTensor.from_arrays(
                    pool,
                    rng.permutation(num_pages),
                    [0, num_pages // 2, num_pages],
                    kv_role=role,
                    layer_index=layer,
                )
            )
    return tensors


def _raw_parts(tensor: hw.BlockPagedTensor) -> list[memoryview]:
    parts = [memoryview(p.data).cast("B") for group in tensor.buffer_arrays() for p in group]
    size = sum(len(p) for p in parts)
    return [memoryview(struct.pack("<Q", size)), *parts]


def _sendmsg_all(sock: socket.socket, parts: list[memoryview]) -> None:
    pending = [p for p in parts if len(p)]
    while pending:
        sent = sock.sendmsg(pending)
        while sent:
            if sent >= len(pending[0]):
                sent -= len(pending.pop(0))
            else:
                pending[0] = pending[0][sent:]
                sent = 0


# -- rate: sender process --------------------------------------------------------------------
def sender(fd: int, layers: int, num_pages: int, schedule: list[str]) -> None:
    tensors = make_cache(layers, num_pages)
    header = StreamHeader(model="bench", num_layers=layers, kv_roles=("key", "value"))
    cpu: list[float] = []
    with socket.socket(fileno=fd) as listener:
        listener.settimeout(TIMEOUT)
        for mode in schedule:
            conn, _ = listener.accept()
            conn.settimeout(TIMEOUT)
            started = time.process_time()
            with conn:
                if mode == "raw":
                    for tensor in tensors:
                        _sendmsg_all(conn, _raw_parts(tensor))
                else:
                    with StreamWriter(conn, header) as writer:
                        for tensor in tensors:
                            writer.write(tensor, checksum=mode == "stream")
                conn.shutdown(socket.SHUT_WR)
                cpu.append(time.process_time() - started)
                conn.recv(1)  # the receiver closes when done: one run at a time
    print(json.dumps(cpu))  # CPU seconds (user + system) of each run, for the parent


# -- rate: receiver (this process) -----------------------------------------------------------
def _recv_exact(conn: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        count = conn.recv_into(view[got:], len(view) - got, socket.MSG_WAITALL)
        if not count:
            raise EOFError("raw stream ended early")
        got += count


def receive(port: int, mode: str) -> tuple[int, float, float]:
    """(payload bytes, seconds, CPU seconds) of one run, from connect to the last byte checked."""
    payload = 0
    started = time.perf_counter()
    cpu = time.process_time()
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as conn:
        if mode == "raw":
            head = bytearray(8)
            while True:
                got = conn.recv_into(head, 8, socket.MSG_WAITALL)
                if got == 0:
                    break
                size = struct.unpack("<Q", head)[0]
                buffer = np.empty(size, np.uint8)
                _recv_exact(conn, memoryview(buffer.data))
                payload += size
                del buffer
        else:
            reader = StreamReader(conn)
            for tensor in reader:
                payload += tensor.nbytes
                del tensor
            assert reader.complete
        seconds = time.perf_counter() - started
    return payload, seconds, time.process_time() - cpu


def bench_rate(args: argparse.Namespace) -> dict[str, Any]:
    schedule = [mode for _ in range(args.rounds) for mode in MODES]
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, __file__, "_sender", f"--fd={listener.fileno()}",
         f"--layers={args.layers}", f"--num-pages={args.num_pages}",
         f"--schedule={','.join(schedule)}"],
        pass_fds=[listener.fileno()],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    listener.close()
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpu: dict[str, list[float]] = {mode: [] for mode in MODES}
    sides: dict[str, tuple[list[float], list[float]]] = {mode: ([], []) for mode in MODES}
    payload = 0
    try:
        received = []
        for mode in schedule:
            payload, seconds, cpu_seconds = receive(port, mode)
            rates[mode].append(payload / seconds)
            received.append(cpu_seconds)
        out, _ = proc.communicate(timeout=TIMEOUT)
        for mode, sent_cpu, got_cpu in zip(schedule, json.loads(out), received, strict=True):
            cpu[mode].append(sent_cpu + got_cpu)
            sides[mode][0].append(sent_cpu)
            sides[mode][1].append(got_cpu)
    finally:
        if proc.poll() is None:
            proc.kill()
    gib = float(1 << 30)
    result: dict[str, Any] = {
        "payload_mib": payload / (1 << 20),
        "tensors": 2 * args.layers,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
    }
    for mode in MODES:
        result[f"{mode}_gib_s_best"] = max(rates[mode]) / gib
        result[f"{mode}_gib_s_median"] = statistics.median(rates[mode]) / gib
        result[f"{mode}_cpu_s_per_gib"] = statistics.median(cpu[mode]) * gib / payload
        for side, values in zip(("sender", "receiver"), sides[mode], strict=True):
            result[f"{mode}_{side}_cpu_s_per_gib"] = statistics.median(values) * gib / payload
    for mode in MODES[1:]:
        # CPU of both processes: far less sensitive to other load than wall time
        result[f"cpu_ratio_{mode}"] = statistics.median(cpu["raw"]) / statistics.median(cpu[mode])
        result[f"ratio_{mode}_best"] = max(rates[mode]) / max(rates["raw"])
        result[f"ratio_{mode}_median"] = statistics.median(rates[mode]) / statistics.median(
            rates["raw"]
        )
    return result


# -- rss -------------------------------------------------------------------------------------
def write_stream_file(path: Path, size_gib: float, blob_mib: int) -> tuple[int, int]:
    """A stream of about ``size_gib`` GiB of ``blob_mib`` MiB blobs; (blobs, bytes)."""
    pages = blob_mib * (1 << 20) // (16 * 8 * 128 * 2)
    count = max(1, int(size_gib * 1024 // blob_mib))
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 1 << 16, size=(pages, 16, 8, 128), dtype=np.uint16)
    with StreamWriter(path, StreamHeader(model="rss", kv_roles=("key", "value"))) as writer:
        for number in range(count):
            tensor = hw.BlockPagedTensor.from_arrays(
                bits.view(np.float16),
                np.arange(pages),
                [0, pages],
                kv_role=("key", "value")[number % 2],
                layer_index=number // 2,
            )
            writer.write(tensor)
    return count, path.stat().st_size


def _rss_kib() -> int:
    """Peak RSS so far (KiB on Linux). It starts at the peak of the process that spawned
    this one (Linux keeps it across exec), so the spawner must be smaller than we are."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _hwm_kib() -> int | None:
    """VmHWM: the peak RSS of this process's own address space (not inherited)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_reader(port: int | None) -> dict[str, Any]:
    """Child: read a stream from stdin (a pipe) or a socket, drop each tensor when done."""
    if port is None:
        source: Any = sys.stdin.buffer
    else:
        source = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    reader = StreamReader(source)
    assert reader.header is not None
    before = _rss_kib()
    hwm_before = _hwm_kib()
    blobs = 0
    largest = 0
    checksum = 0
    iterator = iter(reader)
    while True:
        tensor = next(iterator, None)
        if tensor is None:
            break
        blobs += 1
        largest = max(largest, reader.entries[-1].length)
        checksum ^= int(tensor.page_pool.view(np.uint16)[-1, -1, -1, -1])
        del tensor  # the consumer's part of "at most one blob in memory"
    return {
        "rss_before_kib": before,
        "rss_peak_kib": _rss_kib(),
        "vm_hwm_before_kib": hwm_before,
        "vm_hwm_peak_kib": _hwm_kib(),
        "blobs": blobs,
        "largest_blob_bytes": largest,
        "stream_bytes": reader.position,
        "complete": reader.complete,
    }


def bench_rss(args: argparse.Namespace) -> dict[str, Any]:
    path = Path(args.path)
    if args.regenerate or not path.exists():  # in a child: this process must stay small
        subprocess.run(
            [sys.executable, __file__, "_write_file", f"--path={path}",
             f"--size-gib={args.size_gib}", f"--blob-mib={args.blob_mib}"],
            check=True,
            timeout=10 * TIMEOUT,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
    child = [sys.executable, __file__, "_rss_reader"]
    started = time.perf_counter()
    if args.via == "pipe":
        with subprocess.Popen(["cat", str(path)], stdout=subprocess.PIPE) as cat:
            out = subprocess.run(
                child, stdin=cat.stdout, capture_output=True, text=True, timeout=TIMEOUT, check=True
            ).stdout
    else:
        with socket.create_server(("127.0.0.1", 0)) as listener:
            port = listener.getsockname()[1]
            proc = subprocess.Popen([*child, f"--port={port}"], stdout=subprocess.PIPE, text=True)
            listener.settimeout(TIMEOUT)
            conn, _ = listener.accept()
            with conn, open(path, "rb") as handle:
                conn.sendfile(handle)
            out, _ = proc.communicate(timeout=TIMEOUT)
    seconds = time.perf_counter() - started
    result: dict[str, Any] = json.loads(out)
    blob = result["largest_blob_bytes"]
    grew = (result["rss_peak_kib"] - result["rss_before_kib"]) * 1024
    result.update(
        via=args.via,
        seconds=seconds,
        stream_gib=result["stream_bytes"] / (1 << 30),
        blob_mib=blob / (1 << 20),
        rss_peak_mib=result["rss_peak_kib"] / 1024,
        rss_growth_mib=grew / (1 << 20),
        rss_growth_in_blobs=grew / blob,
        rss_peak_in_blobs=result["rss_peak_kib"] * 1024 / blob,
    )
    if args.remove:
        path.unlink()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = ["rate", "rss", "_sender", "_rss_reader", "_write_file"]
    parser.add_argument("what", nargs="?", default="rate", choices=commands)
    parser.add_argument("--rounds", type=int, default=scaled(5, 1))
    parser.add_argument("--layers", type=int, default=scaled(8, 2))
    parser.add_argument("--num-pages", type=int, default=scaled(640, 64))
    parser.add_argument("--fd", type=int)
    parser.add_argument("--schedule", default="")
    parser.add_argument("--size-gib", type=float, default=scaled(2048, 16) / 1024)
    parser.add_argument("--blob-mib", type=int, default=scaled(32, 1))
    parser.add_argument("--via", choices=["pipe", "socket"], default="pipe")
    parser.add_argument("--path", default="/tmp/hurray_wire_rss_stream.hrws")
    parser.add_argument("--regenerate", action="store_true")
    parser.add_argument("--remove", action="store_true", help="delete the stream file after")
    parser.add_argument("--port", type=int)
    args = parser.parse_args(argv)
    if args.what == "_sender":
        sender(args.fd, args.layers, args.num_pages, args.schedule.split(","))
        return 0
    if args.what == "_write_file":
        blobs, size = write_stream_file(Path(args.path), args.size_gib, args.blob_mib)
        print(json.dumps({"blobs": blobs, "bytes": size}))
        return 0
    if args.what == "_rss_reader":
        result = rss_reader(args.port)
    elif args.what == "rss":
        result = bench_rss(args)
    else:
        result = bench_rate(args)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
