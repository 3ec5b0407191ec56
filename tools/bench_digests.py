"""What per-page digests and the delta protocol cost, and what the delta saves.

1. Digest pass vs one plain xxh3_64 pass over the same pool: a 4096-page pool of 16 tokens x
   8 heads x 128 dims float16 (32 KiB pages, 128 MiB). Also the alternatives the chosen
   loop was measured against (memoryview slices, a hasher object per page, a vectorised
   NumPy multiply-xorshift hash, concatenating quantized records first).
2. A delta estimate for a 32-layer cache (key + value tensors per layer) whose pages are
   90% shared with an earlier request the receiver holds: bytes of the delta transfer
   (blob minus referenced pages plus the page-refs section, plus the known-pages record)
   vs the full blobs, and the planning time.
3. fill_from_store on the receiver for one tensor.
4. The real thing, end to end over a socketpair stream (StreamWriter -> StreamReader), for
   the same 32-layer cache: a full transfer against a delta transfer (the receiver first
   sends its known-pages record; the sender plans every blob against it, with page
   digests; the reader fills the referenced pages from its MemoryPageStore). Bytes on the
   wire and wall time, best of --transfer-rounds, unpaced (loopback: memory-bound) and over
   a link paced to --link-gbps (default 10, a stand-in for the network between workers);
   and encode / decode with page digests against plain (the digest pass against the
   checksum pass it rides with).
   In the same run, the in-place receiver (docs/integrity.md § 5.3): the engine's pool of
   each {layer, role} holds the earlier request's pages, indexed by an EnginePoolStore;
   the reader (StreamReader(into=...)) writes only the sent pages into free pages and
   re-hashes the referenced ones where they sit. Twice: the sender digesting every page
   per transfer (known_pages=known), and with the digests cached since it filled the
   pages (known_pages=plan_delta(t, known, digests=cached)).

Run: python tools/bench_digests.py [--rounds 5] [--pages 4096] [--layers 32]
     [--request-pages 512] [--shared 0.9] [--transfer-rounds 3] [--only transfer] [--json]
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import xxhash
from bench_scale import scaled

import hurray_wire as hw
from hurray_wire.containers import StreamHeader, StreamReader, StreamWriter
from hurray_wire.integrity import (
    EnginePoolStore,
    MemoryPageStore,
    decode_known_pages,
    encode_known_pages,
    encode_page_refs,
    fill_from_store,
    page_digests,
    page_records,
    plan_delta,
    store_pages,
)

MiB = 1 << 20


def best(fn: Callable[[], Any], rounds: int) -> float:
    """Best wall seconds over ``rounds`` calls."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def pool_bytes(rng: np.random.Generator, pages: int) -> np.ndarray:
    return rng.integers(0, 256, (pages, 16, 8, 128 * 2), dtype=np.uint8).view(np.float16)


def digest_pass(pages: int, rounds: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    pool = pool_bytes(rng, pages)
    t = hw.BlockPagedTensor.from_arrays(pool, np.arange(pages), [0, pages])
    flat = pool.reshape(-1).view(np.uint8).data
    size = pool[0].nbytes
    rows = pool.reshape(pages, -1).view(np.uint8)
    words = pool.reshape(pages, -1).view(np.uint64)
    f = xxhash.xxh3_64_intdigest

    def mv_slices() -> list[int]:
        return [f(flat[i * size : (i + 1) * size]) for i in range(pages)]

    def hasher_objects() -> list[int]:
        return [xxhash.xxh3_64(r.data).intdigest() for r in rows]

    def numpy_mix() -> Any:
        x = words * np.uint64(0x9E3779B97F4A7C15)
        x ^= x >> np.uint64(29)
        return np.bitwise_xor.reduce(x, axis=1)

    whole = best(lambda: f(flat), rounds)
    out = {
        "pool_mib": pool.nbytes / MiB,
        "whole_pool_xxh3_ms": whole * 1e3,
        "whole_pool_gbps": pool.nbytes / whole / 1e9,
        "page_digests_ms": best(lambda: page_digests(t), rounds) * 1e3,
        "alt_memoryview_slices_ms": best(mv_slices, rounds) * 1e3,
        "alt_hasher_objects_ms": best(hasher_objects, rounds) * 1e3,
        "alt_numpy_mix_ms": best(numpy_mix, max(1, rounds // 2)) * 1e3,
    }
    # Quantized: int8 pool, per-block scales and zero points (one per page slot).
    q = hw.PerBlockAffine(0, 16, 3, hw.float32, 4)
    qt = hw.BlockPagedTensor.from_arrays(
        pool.view(np.int8).reshape(pages, 16, 8, 256)[..., :128].copy(),
        np.arange(pages),
        [0, pages],
        quantization=q,
        scales=np.ones(pages * 16, np.float32),
        zero_points=np.zeros(pages * 16, np.int32),
    )
    records = page_records(qt)
    qflat = qt.page_pool.reshape(-1).view(np.uint8).data

    def concatenated() -> list[int]:
        assert records.scales is not None and records.zero_points is not None
        joined = np.concatenate((records.pool, records.scales, records.zero_points), axis=1)
        return [f(r) for r in joined]

    qwhole = best(lambda: f(qflat), rounds)
    out.update(
        {
            "quantized_pool_mib": qt.page_pool.nbytes / MiB,
            "quantized_whole_pool_xxh3_ms": qwhole * 1e3,
            "quantized_page_digests_ms": best(lambda: page_digests(qt), rounds) * 1e3,
            "quantized_alt_concatenate_ms": best(concatenated, rounds) * 1e3,
        }
    )
    for key in list(out):
        if key.endswith("_ms") and "whole" not in key:
            base = qwhole if key.startswith("quantized") else whole
            out[key.replace("_ms", "_ratio")] = out[key] / (base * 1e3)
    out["per_page_overhead_us"] = (out["page_digests_ms"] - whole * 1e3) / pages * 1e3
    return out


def delta_estimate(layers: int, pages: int, shared: float, rounds: int) -> dict[str, float]:
    """Earlier request A (held by the receiver) and request B sharing ``shared`` of its
    pages with A, for ``layers`` x {key, value} tensors of ``pages`` pages each."""
    rng = np.random.default_rng(1)
    same = round(pages * shared)
    full = delta = refs_bytes = 0
    known_digests = []
    plan_s = plan_with_digests_s = 0.0
    for _layer in range(layers):
        for role in ("key", "value"):
            earlier = pool_bytes(rng, pages)
            now = earlier.copy()
            now[same:] = pool_bytes(rng, pages - same)
            a = hw.BlockPagedTensor.from_arrays(earlier, np.arange(pages), [0, pages], kv_role=role)
            b = hw.BlockPagedTensor.from_arrays(now, np.arange(pages), [0, pages], kv_role=role)
            known = np.unique(page_digests(a))
            known_digests.append(known)
            digests = page_digests(b)
            plan_s += best(lambda: plan_delta(b, known, digests=digests), rounds)  # noqa: B023
            plan_with_digests_s += best(lambda: plan_delta(b, known), 1)  # noqa: B023
            plan = plan_delta(b, known, digests=digests)
            blob = len(hw.encode(b))
            refs = len(encode_page_refs(plan.refs))
            refs_bytes += refs
            full += blob
            # The proposed blob: the pool section shrinks by the referenced pages, and a
            # page-refs section (48-byte table entry + payload + <= 63 padding) is added.
            delta += blob - plan.bytes_referenced + 48 + refs + 63
    known_record = len(encode_known_pages(np.concatenate(known_digests)))
    tensors = layers * 2
    return {
        "tensors": tensors,
        "pages_per_tensor": pages,
        "shared_fraction": shared,
        "full_mib": full / MiB,
        "delta_mib": delta / MiB,
        "page_refs_kib": refs_bytes / 1024,
        "known_pages_record_kib": known_record / 1024,
        "delta_ratio": delta / full,
        "delta_ratio_with_known_record": (delta + known_record) / full,
        "plan_ms_total": plan_s * 1e3,
        "plan_us_per_tensor": plan_s / tensors * 1e6,
        "plan_with_digest_pass_ms_total": plan_with_digests_s * 1e3,
    }


def fill_cost(pages: int, rounds: int) -> dict[str, float]:
    rng = np.random.default_rng(2)
    pool = pool_bytes(rng, pages)
    t = hw.BlockPagedTensor.from_arrays(pool, np.arange(pages), [0, pages])
    store = MemoryPageStore(pool.nbytes)
    store_pages(store, t)
    plan = plan_delta(t, store.digests())
    out = np.zeros_like(pool)
    seconds = best(lambda: fill_from_store(plan, store, out), rounds)
    copy = best(lambda: np.copyto(out, pool), rounds)
    return {
        "fill_pages": pages,
        "fill_ms": seconds * 1e3,
        "fill_us_per_page": seconds / pages * 1e6,
        "plain_copy_ms": copy * 1e3,
        "fill_vs_copy_ratio": seconds / copy,
    }


def _requests(layers: int, pages: int, shared: float) -> tuple[list[Any], list[Any]]:
    """An earlier request's tensors (held by the receiver) and a new request's, which
    shares ``shared`` of each tensor's pages with the earlier one."""
    rng = np.random.default_rng(4)
    same = round(pages * shared)
    earlier: list[Any] = []
    now: list[Any] = []
    for layer in range(layers):
        for role in ("key", "value"):
            a = pool_bytes(rng, pages)
            b = a.copy()
            b[same:] = pool_bytes(rng, pages - same)
            for pool, out in ((a, earlier), (b, now)):
                table, starts = np.arange(pages), [0, pages]
                out.append(
                    hw.BlockPagedTensor.from_arrays(
                        pool, table, starts, kv_role=role, layer_index=layer
                    )
                )
    return earlier, now


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("peer closed")
        data += chunk
    return bytes(data)


class PacedSocket:
    """A binary file-like over a socket that sends at most ``gbps`` gigabits per second:
    a stand-in for the network link between prefill and decode workers (0: unpaced)."""

    def __init__(self, sock: socket.socket, gbps: float) -> None:
        self.sock, self.rate = sock, gbps * 1e9 / 8
        self.start = time.perf_counter()
        self.sent = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for at in range(0, len(view), 1 << 20):
            chunk = view[at : at + (1 << 20)]
            self.sock.sendall(chunk)
            self.sent += len(chunk)
            ahead = self.sent / self.rate - (time.perf_counter() - self.start)
            if ahead > 0:
                time.sleep(ahead)
        return len(view)

    def flush(self) -> None:
        pass


class EnginePools:
    """The decode worker's own KV pools, one per {layer, role}: the earlier request's pages
    at engine pages [0, pages), indexed, and ``spare`` free pages after them."""

    def __init__(self, earlier: list[Any], spare: int) -> None:
        self.stores: dict[tuple[int | None, str], EnginePoolStore] = {}
        self.free = {}
        for t in earlier:
            pages = t.layout.num_pages
            pool = np.zeros((pages + spare, *t.page_pool.shape[1:]), t.page_pool.dtype)
            pool[:pages] = t.page_pool
            store = EnginePoolStore(pool)
            store.index(np.arange(pages))
            key = (t.layer_index, t.kv_role)
            self.stores[key] = store
            self.free[key] = np.arange(pages, pages + spare)

    def digests(self) -> np.ndarray:
        return np.unique(np.concatenate([s.digests() for s in self.stores.values()]))

    def target(self, descriptor: Any, count: int) -> hw.InPlace:
        """StreamReader(into=...): the pool of the blob's layer and role, and ``count``
        free pages from its allocator (the same ones each round: nothing is kept)."""
        key = (descriptor.layout.layer_index, descriptor.layout.kv_role)
        return hw.InPlace(self.stores[key], self.free[key][:count])


def _transfer(
    tensors: list[Any],
    store: MemoryPageStore | EnginePools | None,
    layers: int,
    gbps: float = 0.0,
    cached: list[np.ndarray] | None = None,
) -> tuple[float, int, int]:
    """(seconds, stream bytes, known-pages record bytes) of one transfer over a socketpair
    (paced to ``gbps`` when > 0); with ``store`` a delta transfer: the receiver sends its
    known pages first. An ``EnginePools`` store decodes in place into the engine's pools;
    ``cached`` are the sender's page digests, computed once before (an engine digests a
    page when it fills it)."""
    a, b = socket.socketpair()
    for sock in (a, b):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    written = [0]
    done: list[None] = []

    def sender() -> None:
        with a:
            known = None
            if store is not None:
                head = _recv_exact(a, 16)
                count = int.from_bytes(head[8:12], "little")
                record = head + _recv_exact(a, 8 * count + 8)
                known = decode_known_pages(record, max_entries=1 << 24)
            sink: Any = PacedSocket(a, gbps) if gbps > 0 else a
            with StreamWriter(sink, StreamHeader(num_layers=layers)) as writer:
                for t in tensors:
                    if known is None:
                        writer.write(t)
                    elif cached is not None:
                        plan = plan_delta(t, known, digests=cached[len(done)])
                        writer.write(t, known_pages=plan, page_digests=True)
                    else:
                        writer.write(t, known_pages=known, page_digests=True)
                    done.append(None)
            written[0] = writer.position

    start = time.perf_counter()
    thread = threading.Thread(target=sender)
    thread.start()
    record_bytes = 0
    with b:
        if store is not None:
            record = encode_known_pages(store.digests())
            record_bytes = len(record)
            b.sendall(record)
        count = 0
        reader = (
            StreamReader(b, into=store.target)
            if isinstance(store, EnginePools)
            else StreamReader(b, page_store=store)
        )
        for tensor in reader:
            count += 1
            del tensor
    thread.join()
    seconds = time.perf_counter() - start
    assert count == len(tensors)
    return seconds, written[0], record_bytes


def transfer_run(
    layers: int, pages: int, shared: float, rounds: int, gbps: float = 10.0
) -> dict[str, float]:
    earlier, now = _requests(layers, pages, shared)
    store = MemoryPageStore(sum(t.page_pool.nbytes for t in earlier) + (1 << 20))
    for t in earlier:
        store_pages(store, t, range(pages))
    engine = EnginePools(earlier, spare=pages - round(pages * shared) + 8)
    del earlier
    cached = [page_digests(t) for t in now]
    full_s = delta_s = paced_full_s = paced_delta_s = float("inf")
    in_place = {name: float("inf") for name in ("s", "cached_s", "link_s", "link_cached_s")}
    full_bytes = delta_bytes = record = in_place_bytes = 0
    for _ in range(rounds):
        seconds, full_bytes, _ = _transfer(now, None, layers)
        full_s = min(full_s, seconds)
        seconds, delta_bytes, record = _transfer(now, store, layers)
        delta_s = min(delta_s, seconds)
        seconds, in_place_bytes, _ = _transfer(now, engine, layers)
        in_place["s"] = min(in_place["s"], seconds)
        seconds = _transfer(now, engine, layers, 0, cached)[0]
        in_place["cached_s"] = min(in_place["cached_s"], seconds)
        if gbps > 0:
            paced_full_s = min(paced_full_s, _transfer(now, None, layers, gbps)[0])
            paced_delta_s = min(paced_delta_s, _transfer(now, store, layers, gbps)[0])
            for name, digests in (("link_s", None), ("link_cached_s", cached)):
                seconds = _transfer(now, engine, layers, gbps, digests)[0]
                in_place[name] = min(in_place[name], seconds)
    one = now[0]
    plain = best(lambda: hw.encode(one), rounds)
    digested = best(lambda: hw.encode(one, page_digests=True), rounds)
    blob = hw.encode(one)
    with_digests = hw.encode(one, page_digests=True)
    plain_decode = best(lambda: hw.decode(blob), rounds)
    digested_decode = best(lambda: hw.decode(with_digests), rounds)
    return {
        "tensors": len(now),
        "cache_mib": sum(t.page_pool.nbytes for t in now) / MiB,
        "full_wire_mib": full_bytes / MiB,
        "delta_wire_mib": (delta_bytes + record) / MiB,
        "known_pages_record_kib": record / 1024,
        "bytes_ratio": (delta_bytes + record) / full_bytes,
        "full_s": full_s,
        "delta_s": delta_s,
        "time_ratio": delta_s / full_s,
        "link_gbps": gbps,
        "link_full_s": paced_full_s,
        "link_delta_s": paced_delta_s,
        "link_time_ratio": paced_delta_s / paced_full_s if gbps > 0 else float("nan"),
        "in_place_wire_mib": (in_place_bytes + record) / MiB,
        "in_place_bytes_ratio": (in_place_bytes + record) / full_bytes,
        "in_place_s": in_place["s"],
        "in_place_time_ratio": in_place["s"] / full_s,
        "in_place_cached_s": in_place["cached_s"],
        "in_place_cached_time_ratio": in_place["cached_s"] / full_s,
        "link_in_place_s": in_place["link_s"],
        "link_in_place_time_ratio": in_place["link_s"] / paced_full_s if gbps > 0 else float("nan"),
        "link_in_place_cached_s": in_place["link_cached_s"],
        "link_in_place_cached_time_ratio": in_place["link_cached_s"] / paced_full_s
        if gbps > 0
        else float("nan"),
        "encode_ms": plain * 1e3,
        "encode_with_digests_ms": digested * 1e3,
        "encode_digest_cost_ratio": digested / plain,
        "decode_ms": plain_decode * 1e3,
        "decode_with_digests_ms": digested_decode * 1e3,
        "decode_digest_cost_ratio": digested_decode / plain_decode,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=scaled(5, 1))
    parser.add_argument("--pages", type=int, default=scaled(4096, 64))
    parser.add_argument("--layers", type=int, default=scaled(32, 2))
    parser.add_argument("--request-pages", type=int, default=scaled(512, 16))
    parser.add_argument("--shared", type=float, default=0.9)
    parser.add_argument("--transfer-rounds", type=int, default=scaled(3, 1))
    parser.add_argument("--link-gbps", type=float, default=10.0, help="paced link; 0: skip")
    parser.add_argument("--only", default="", help="comma-separated sections, e.g. transfer")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runs: dict[str, Callable[[], dict[str, float]]] = {
        "digests": lambda: digest_pass(args.pages, args.rounds),
        "delta": lambda: delta_estimate(args.layers, args.request_pages, args.shared, args.rounds),
        "fill": lambda: fill_cost(args.request_pages, args.rounds),
        "transfer": lambda: transfer_run(
            args.layers, args.request_pages, args.shared, args.transfer_rounds, args.link_gbps
        ),
    }
    chosen = args.only.split(",") if args.only else list(runs)
    result = {name: runs[name]() for name in chosen}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for group, values in result.items():
        print(f"[{group}]")
        for key, value in values.items():
            print(
                f"  {key:40s} {value:12.3f}" if isinstance(value, float) else f"  {key:40s} {value}"
            )


if __name__ == "__main__":
    main()
