"""Rate of hurray-wire over NIXL against NIXL moving the same bytes raw, same agents, same run.

This process is the receiver (a ``NixlReceiver``); it starts itself again as the sender
(``--sender``, a ``NixlSender`` holding a KV cache of ``--layers`` x {key, value} page pools of
``--pages`` x 16 KiB, registered once) and the two exchange NIXL metadata over a pipe. Then,
round after round, interleaved:

* ``raw``: the receiver READs every blob's arrays (page pool, block table, seq_ptr) from the
  sender's registered memory with one NIXL transfer per blob, all posted at once; nothing
  is framed, hashed or checked, and no message is exchanged (the receiver knows the
  addresses from the start): the floor, and the reference of every ratio.
* ``raw-notified``: the same READs with the two messages any connector needs around them:
  the sender announces the blocks (one NIXL notification), the receiver says it is done
  (one notification); the same exchange as hurray-wire's offer and done records.
* ``zero-copy`` / ``zero-copy-nohash``: the sender ``publish``es every tensor
  (``mode="zero-copy"``, with and without checksums), the receiver ``receive``s and decodes
  each one validated (checksums verified when present) while the next ones move.
* ``expect`` / ``expect-one-pass``: ``zero-copy`` with checksums, each page pool expected
  in an engine array of the receiver (``NixlReceiver.expect``): by default READ into the
  receiver's staging ring, checked, then copied into the engine array (a refused blob
  leaves it untouched); with ``one_pass=True`` READ straight into the engine array.
* ``zero-copy-write``: ``zero-copy`` with checksums, pushed (``op="WRITE"``) into the
  receiver's write region, which copies each blob out before validating it (docs/nixl.md
  § 3.1): what the WRITE trust model costs.
* ``staged`` / ``staged-nohash``: the same with ``mode="staged"`` (``encode_into`` the
  sender's registered arena, then READ).

Each transport gets its own pair of agents: ``shm`` (UCX ``ucx_error_handling_mode="none"``,
shared memory) and ``tcp`` (``"peer"``, RMA emulated over TCP loopback). Reported per mode:
the best and median rate over the rounds, the ratio of medians to ``raw`` (target: >= 0.8
with checksums) and the CPU milliseconds both processes spent per round (median), split
into each process's main thread (the polling loop) and its other threads (hashing,
decoding, NIXL's own): on a shared two-core machine, where both ends copy and hash on the
same cores, that says more about what the format costs than wall time does.

Run: python tools/bench_nixl.py [--rounds 5] [--layers 8] [--pages 1024] [--transports shm,tcp]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
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
from hurray_wire.transport.nixl_endpoint import PEER_READ_NAP

ROLES = ("key", "value")
PAGE_SHAPE = (16, 8, 64)  # 16 KiB of float16 per page
MODES = ("raw", "raw-notified", "zero-copy", "zero-copy-nohash", "expect", "expect-one-pass",
         "zero-copy-write", "staged", "staged-nohash")  # fmt: skip
UCX_MODE = {"shm": "none", "tcp": "peer"}


def _send(fd: int, data: bytes) -> None:
    os.write(fd, struct.pack("<I", len(data)) + data)


def _recv(fd: int) -> bytes:
    def exactly(n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = os.read(fd, n - len(out))
            if not chunk:
                raise EOFError("the other process closed the pipe")
            out += chunk
        return out

    return exactly(struct.unpack("<I", exactly(4))[0])


def _cache(layers: int, pages: int) -> list[hw.BlockPagedTensor]:
    rng = np.random.default_rng(0)
    out = []
    for layer in range(layers):
        for role in ROLES:
            pool = rng.integers(0, 1 << 16, (pages, *PAGE_SHAPE), np.uint16).view(np.float16)
            table = rng.permutation(pages).astype(np.uint32)
            seq_ptr = np.array([0, pages // 2, pages], np.uint32)
            out.append(
                hw.BlockPagedTensor.from_arrays(
                    pool, table, seq_ptr, kv_role=role, layer_index=layer
                )
            )
    return out


def sender_main(args: argparse.Namespace) -> int:
    """The sending process: register the cache, then serve the receiver's commands."""
    from hurray_wire.transport.nixl import NixlSender

    tensors = _cache(args.layers, args.pages)
    total = sum(t.nbytes for t in tensors)
    sender = NixlSender(
        f"bench-sender-{args.ucx}", ucx_error_handling_mode=args.ucx,
        arena_bytes=total + (64 << 20), progress_thread=args.progress_thread,
    )  # fmt: skip
    table = []
    for t in tensors:
        for array in (t.page_pool, t.block_table, t.seq_ptr):
            sender.register(array)
            table.append((int(array.ctypes.data), int(array.nbytes)))
    _send(args.out_fd, sender.metadata())
    sender.add_peer(_recv(args.in_fd))
    _send(args.out_fd, b"".join(struct.pack("<QQ", a, n) for a, n in table))
    while True:
        while not select.select([args.in_fd], [], [], 0)[0]:
            sender.poll()  # serve the receiver's raw READs (needed without a progress thread)
            time.sleep(PEER_READ_NAP)  # as the sender naps while its peer READs in every mode
        command = _recv(args.in_fd).decode()
        if command == "quit":
            break
        if command == "raw-notified":  # the table as one notification, then wait for "done"
            agent, peer = sender.agent, sender.peer
            agent.send_notif(peer, b"".join(struct.pack("<QQ", a, n) for a, n in table))
            while not any(b"done" in m for m in agent.get_new_notifs().values()):
                time.sleep(PEER_READ_NAP)
            _send(args.out_fd, b"ok")
            continue
        mode, checksum, op = command.split(":")
        for t in tensors:
            sender.publish(t, mode=mode, checksum=checksum == "1", op=op)
        sender.wait(deadline=60)
        _send(args.out_fd, b"ok")
    sender.close()
    return 0


def _raw_round(receiver: Any, landing: np.ndarray[Any, Any], table: list[tuple[int, int]]) -> None:
    """One READ per blob (its three arrays), all posted, then wait for all."""
    agent, peer = receiver.agent, receiver.peer
    base = int(landing.ctypes.data)
    handles = []
    cursor = 0
    for k in range(0, len(table), 3):
        rows = table[k : k + 3]
        local, remote = [], []
        for address, size in rows:
            local.append((base + cursor, size, 0))
            remote.append((address, size, 0))
            cursor += (size + 63) & ~63
        h = agent.initialize_xfer(
            "READ", agent.get_xfer_descs(local, "DRAM"), agent.get_xfer_descs(remote, "DRAM"),
            peer, b"",
        )  # fmt: skip
        if agent.transfer(h) == "ERR":
            raise RuntimeError("raw READ failed to post")
        handles.append(h)
    for h in handles:
        while (state := agent.check_xfer_state(h)) == "PROC":
            time.sleep(0)
        if state != "DONE":
            raise RuntimeError(f"raw READ ended in {state}")
        h.release()


def _raw_notified_round(receiver: Any, landing: np.ndarray[Any, Any], to_w: int,
                        from_r: int) -> None:  # fmt: skip
    """What a connector moving raw blocks needs at the least: the sender tells where the
    blocks are (one notification), the receiver READs them and says it is done (one
    notification): the same messages as hurray-wire's offer / done, none of its checks."""
    agent = receiver.agent
    _send(to_w, b"raw-notified")
    while not (found := agent.get_new_notifs()):
        time.sleep(0)
    (messages,) = found.values()
    raw = messages[0]
    table = [struct.unpack_from("<QQ", raw, 16 * k) for k in range(len(raw) // 16)]
    _raw_round(receiver, landing, table)
    agent.send_notif(receiver.peer, b"done")
    if _recv(from_r) != b"ok":
        raise RuntimeError("the sender did not finish the round")


def _on_cpu(pid: int) -> tuple[float, float]:
    """Seconds on a CPU of process ``pid``'s main thread and of its other threads
    (/proc/PID/task/TID/schedstat: nanoseconds, unlike the 10 ms ticks of /proc/PID/stat)."""
    main = other = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that just ended
            seconds = int((task / "schedstat").read_text().split()[0]) / 1e9
            if task.name == str(pid):
                main += seconds
            else:
                other += seconds
    return main, other


def _cpu_seconds(pid: int) -> tuple[float, float, float, float]:
    """CPU seconds of this process's main thread, of its other threads, of process ``pid``'s
    main thread and of its other threads: where each end spends it (the polling loop on the
    main thread; hashing, decoding and NIXL's own threads on the others)."""
    return (*_on_cpu(os.getpid()), *_on_cpu(pid))


def _phases(receiver: Any, landing: np.ndarray[Any, Any], table: list[tuple[int, int]],
            args: argparse.Namespace) -> dict[str, float]:  # fmt: skip
    """CPU milliseconds a round of each phase of a checked transfer, each measured alone
    on this thread (``time.thread_time``) for every blob of a round: what the per-thread
    split of the rounds is made of."""
    import xxhash

    tensor = _cache(1, args.pages)[0]
    blob = bytes(hw.encode(tensor))
    pool = tensor.page_pool.reshape(-1).view(np.uint8)
    engine = np.empty_like(pool)
    count = 2 * args.layers

    def cpu(fn: Any) -> float:
        fn()  # warm
        start = time.thread_time()
        for _ in range(count):
            fn()
        return round(1000 * (time.thread_time() - start), 1)

    return {
        "READ of a blob (raw; over shm the copy itself)": cpu(lambda: _raw_round(receiver, landing,
                                                                         table[:3])),
        "xxh3 of the pool (once on each end)": cpu(lambda: xxhash.xxh3_64_intdigest(pool.data)),
        "copy into the engine array (expect's default)": cpu(lambda: np.copyto(engine, pool)),
        "plan and checks (decode, verify=False)": cpu(lambda: hw.decode(blob, verify=False)),
        "decode with checksums (plan, checks, xxh3)": cpu(lambda: hw.decode(blob)),
    }  # fmt: skip


def run_transport(transport: str, args: argparse.Namespace) -> dict[str, Any]:
    from hurray_wire.transport.nixl import NixlReceiver

    ucx = UCX_MODE[transport]
    count = 2 * args.layers
    blob = args.pages * int(np.prod(PAGE_SHAPE)) * 2
    total = count * blob
    receiver = NixlReceiver(f"bench-receiver-{transport}", ucx_error_handling_mode=ucx,
                            arena_bytes=total + (16 << 20), write_arena_bytes=4 * blob + (1 << 20),
                            progress_thread=args.progress_thread)  # fmt: skip
    landing = np.zeros(total + (16 << 20), np.uint8)
    receiver.register(landing)
    engine = {
        (layer, role): np.zeros((args.pages, *PAGE_SHAPE), np.float16)
        for layer in range(args.layers)
        for role in ROLES
    }
    for array in engine.values():  # the engine's KV pools, registered once (one_pass READs)
        receiver.register(array)
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    argv = [sys.executable, str(Path(__file__).resolve()), "--sender", "--ucx", ucx,
            "--in-fd", str(to_r), "--out-fd", str(from_w), "--layers", str(args.layers),
            "--pages", str(args.pages)]  # fmt: skip
    if args.progress_thread:
        argv.append("--progress-thread")
    child = subprocess.Popen(argv, pass_fds=(to_r, from_w), stdout=subprocess.DEVNULL)
    os.close(to_r)
    os.close(from_w)
    try:
        receiver.add_peer(_recv(from_r))
        _send(to_w, receiver.metadata())
        raw_table = _recv(from_r)
        table = [struct.unpack_from("<QQ", raw_table, 16 * k) for k in range(len(raw_table) // 16)]
        moved = sum(size for _, size in table)
        seconds: dict[str, list[float]] = {m: [] for m in MODES}
        cpu: dict[str, list[float]] = {m: [] for m in MODES}
        split: dict[str, list[tuple[float, ...]]] = {m: [] for m in MODES}
        for round_number in range(args.rounds + 1):  # round 0 warms up (page faults, connection)
            for mode in MODES:
                start, cpu_start = time.perf_counter(), _cpu_seconds(child.pid)
                if mode == "raw":
                    _raw_round(receiver, landing, table)
                elif mode == "raw-notified":
                    _raw_notified_round(receiver, landing, to_w, from_r)
                else:
                    if mode.startswith("expect"):
                        for (layer, role), array in engine.items():
                            receiver.expect(
                                layer, role, hw.IntoArray(array, one_pass=mode.endswith("pass"))
                            )
                    name = mode.removesuffix("-nohash").removesuffix("-write")
                    name = "zero-copy" if name.startswith("expect") else name
                    op = "WRITE" if mode.endswith("-write") else "READ"
                    _send(to_w, f"{name}:{0 if mode.endswith('-nohash') else 1}:{op}".encode())
                    for _tensor in receiver.receive(count, deadline=60):
                        pass
                    if _recv(from_r) != b"ok":
                        raise RuntimeError("the sender did not finish the round")
                if round_number:
                    seconds[mode].append(time.perf_counter() - start)
                    used = tuple(b - a for a, b in zip(cpu_start, _cpu_seconds(child.pid),
                                                       strict=True))  # fmt: skip
                    cpu[mode].append(sum(used))
                    split[mode].append(used)
        phases = _phases(receiver, landing, table, args)
        _send(to_w, b"quit")
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
        receiver.close()
    rates = {m: [moved / s / 1e9 for s in seconds[m]] for m in MODES}
    medians = {m: statistics.median(r) for m, r in rates.items()}
    return {
        "transport": transport,
        "ucx_error_handling_mode": ucx,
        "bytes_per_round": moved,
        "blobs_per_round": count,
        "rounds": args.rounds,
        "progress_thread": args.progress_thread,
        "load_average": os.getloadavg(),
        "phases_cpu_ms_per_round": phases,
        "modes": {
            m: {
                "best_gb_s": round(max(rates[m]), 3),
                "median_gb_s": round(medians[m], 3),
                "ratio_to_raw": round(medians[m] / medians["raw"], 3),
                "cpu_ms_per_round": round(1000 * statistics.median(cpu[m]), 1),
                # receiver main / other threads, sender main / other threads (medians)
                "cpu_ms_split": [
                    round(1000 * statistics.median(u[k] for u in split[m]), 1) for k in range(4)
                ],
            }
            for m in MODES
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layers", type=int, default=scaled(8, 2))
    parser.add_argument("--pages", type=int, default=scaled(1024, 64))
    parser.add_argument("--transports", default="shm,tcp")
    parser.add_argument("--json", action="store_true", help="print the results as JSON only")
    parser.add_argument(
        "--progress-thread", action="store_true", help="NIXL progress threads (one core each)"
    )
    parser.add_argument("--sender", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ucx", default="none", help=argparse.SUPPRESS)
    parser.add_argument("--in-fd", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out-fd", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sender:
        return sender_main(args)
    results = [run_transport(t, args) for t in args.transports.split(",")]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for r in results:
        size = r["bytes_per_round"] / (1 << 20)
        ucx = r["ucx_error_handling_mode"]
        blobs, rounds = r["blobs_per_round"], r["rounds"]
        print(f"{r['transport']} (ucx_error_handling_mode={ucx!r}): "
              f"{blobs} blobs, {size:.0f} MiB per round, {rounds} rounds")  # fmt: skip
        print(f"  {'mode':18} {'best GB/s':>10} {'median GB/s':>12} {'ratio':>7} {'CPU ms':>8}"
              "   (receiver main/other, sender main/other)")  # fmt: skip
        for mode, m in r["modes"].items():
            parts = "/".join(f"{v:.0f}" for v in m["cpu_ms_split"])
            print(f"  {mode:18} {m['best_gb_s']:>10.2f} {m['median_gb_s']:>12.2f} "
                  f"{m['ratio_to_raw']:>7.3f} {m['cpu_ms_per_round']:>8.1f}   {parts}")  # fmt: skip
        print("  CPU ms a round of each phase, alone on one thread:")
        for phase, ms in r["phases_cpu_ms_per_round"].items():
            print(f"    {phase:48} {ms:>8.1f}")
        print("  load average at the end: " + ", ".join(f"{x:.1f}" for x in r["load_average"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
