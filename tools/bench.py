"""Benchmarks of the blob codec against baselines measured in the same run.

Prints ratios (this machine is noisy: absolute times are shown only for context). Run:

    python tools/bench.py            # the reference workload and all peers
    python tools/bench.py --quick    # fewer repetitions

Reference workload (issue 3): one layer's keys, num_pages=4096, page_size=16, num_heads=8,
head_dim=128, float16 (a 128 MiB page_pool), 32 sequences.
"""

from __future__ import annotations

import argparse
import io
import pickle
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import xxhash
from bench_scale import SMOKE, scaled

import hurray_wire as hw
from hurray_wire import blob
from hurray_wire.blob import decoder, envelope
from hurray_wire.crc32c import crc32c

#: The clock best_of reads (a script may set ``time.thread_time``: a thread's CPU time).
clock: Callable[[], float] = time.perf_counter


def best_of(fn: Callable[[], Any], repeat: int, number: int = 1) -> float:
    """Seconds of one call: the fastest of ``repeat`` timed batches of ``number`` calls (the
    least disturbed by other work on a shared machine; every row uses the same estimator)."""
    fn()
    samples = []
    for _ in range(repeat):
        start = clock()
        for _ in range(number):
            fn()
        samples.append((clock() - start) / number)
    return min(samples)


def interleaved(
    fns: dict[str, Callable[[], Any]], repeat: int, rounds: int = 3
) -> dict[str, float]:
    """best_of for each function, the functions taking turns over ``rounds`` rounds, so
    that a ratio's two sides see the same phases of a noisy machine."""
    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            best[name] = min(best[name], best_of(fn, repeat))
    return best


def paired_ratio(base: Callable[[], Any], fn: Callable[[], Any], pairs: int = 31) -> float:
    """Median over back-to-back (base, fn) pairs of time(fn) / time(base): each pair sees
    the same phase of a noisy machine, which best-of over separate runs does not."""
    ratios = []
    base()
    fn()
    for _ in range(pairs):
        t0 = time.perf_counter()
        base()
        t1 = time.perf_counter()
        fn()
        t2 = time.perf_counter()
        ratios.append((t2 - t1) / (t1 - t0))
    return sorted(ratios)[len(ratios) // 2]


def make_tensor(num_pages: int, seqs: int = 32, seed: int = 0) -> hw.BlockPagedTensor:
    """A float16 key cache of ``num_pages`` pages of [16, 8, 128] shared by ``seqs`` sequences."""
    rng = np.random.default_rng(seed)
    pool = rng.standard_normal((num_pages, 16, 8, 128), dtype=np.float32).astype(np.float16)
    block_table = rng.permutation(num_pages).astype(np.uint32)
    per_seq = num_pages // seqs
    seq_ptr = np.arange(0, per_seq * seqs + 1, per_seq, dtype=np.uint32)
    block_table = block_table[: per_seq * seqs]
    return hw.BlockPagedTensor.from_arrays(pool, block_table, seq_ptr, kv_role="key", layer_index=0)


def line(name: str, seconds: float, base: float, base_name: str, nbytes: int | None = None) -> None:
    rate = f"{nbytes / seconds / 1e9:6.2f} GB/s" if nbytes else " " * 11
    print(f"  {name:<44} {seconds * 1e6:12.1f} us  {rate}  = {seconds / base:6.3f}x {base_name}")


def bench_decode_flat(repeat: int) -> None:
    print("\n[decode(verify=False): O(index), not O(page_pool)]")
    print("  256 pages and 8 sequences each time; the pages grow (head_dim 16 -> 16384)")
    blobs = []
    for head_dim in (16, 2048, 16384):
        pool = np.zeros((256, 16, 8, head_dim), np.float16)
        seq_ptr = np.arange(0, 257, 32, dtype=np.uint32)
        tensor = hw.BlockPagedTensor.from_arrays(pool, np.arange(256, dtype=np.uint32), seq_ptr)
        blobs.append(blob.encode(tensor, checksum=False))
        del tensor, pool
    times = [float("inf")] * len(blobs)
    for _ in range(5):  # sizes interleaved, best of all rounds: the machine is noisy
        for i, data in enumerate(blobs):
            t = best_of(partial(blob.decode, data, verify=False), repeat, 500)
            times[i] = min(times[i], t)
    for label, t in zip(("1 MiB", "128 MiB", "1 GiB"), times, strict=True):
        print(f"  pool {label:>8}: {t * 1e6:8.1f} us")
    print(f"  1 GiB / 1 MiB = {times[-1] / times[0]:.2f}x (flat means ~1)")


def arrow_roundtrip(arrays: list[np.ndarray]) -> tuple[Callable[[], Any], Callable[[], Any]]:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    for array in arrays:
        pa.ipc.write_tensor(pa.Tensor.from_numpy(array), sink)
    buf = sink.getvalue()

    def write() -> Any:
        out = pa.BufferOutputStream()
        for array in arrays:
            pa.ipc.write_tensor(pa.Tensor.from_numpy(array), out)
        return out.getvalue()

    def read() -> Any:
        reader = pa.BufferReader(buf)
        return [pa.ipc.read_tensor(reader).to_numpy() for _ in arrays]

    return write, read


def bench_reference(repeat: int) -> None:
    tensor = make_tensor(4096)
    pool_bytes = tensor.page_pool.reshape(-1).view(np.uint8)
    nbytes = pool_bytes.nbytes
    arrays = [tensor.page_pool, tensor.block_table, tensor.seq_ptr]
    blob_checked = blob.encode(tensor)  # what a receiver holds: a NumPy-allocated buffer
    warm = np.empty(len(blob_checked), np.uint8)
    warm_dst = warm[:nbytes]
    np.copyto(warm_dst, pool_bytes)
    pool_offset = envelope.ENTRY.unpack_dict(blob_checked, envelope.entry_at(0))["offset"]
    pool_in_blob = blob_checked[pool_offset : pool_offset + nbytes]

    print("\n[baselines, 128 MiB page_pool]")
    timed = interleaved(
        {
            "memcpy": lambda: np.copyto(warm_dst, pool_bytes),
            "fresh_np": lambda: np.copyto(np.empty(nbytes, np.uint8), pool_bytes),
            "xxh": lambda: xxhash.xxh3_64_intdigest(pool_in_blob),
            "parts_chk": lambda: blob.encode_parts(tensor),
            "into": lambda: blob.encode_into(tensor, warm),
            "into_plain": lambda: blob.encode_into(tensor, warm, checksum=False),
            "enc": lambda: blob.encode(tensor),
            "enc_plain": lambda: blob.encode(tensor, checksum=False),
            "dec": lambda: blob.decode(blob_checked),
        },
        repeat,
    )
    memcpy, fresh_np, xxh = timed["memcpy"], timed["fresh_np"], timed["xxh"]
    line("memcpy into a warm buffer", memcpy, memcpy, "memcpy", nbytes)
    fresh_bytes = best_of(lambda: bytes(pool_bytes.data), repeat)
    line("bytes(memoryview) (a fresh bytes object)", fresh_bytes, memcpy, "memcpy", nbytes)
    line("copy into a fresh NumPy array", fresh_np, memcpy, "memcpy", nbytes)
    line("xxh3_64 (chosen checksum) of the blob's pool", xxh, memcpy, "memcpy", nbytes)
    crc = best_of(lambda: crc32c(pool_bytes), repeat)
    line("CRC-32C (google-crc32c)", crc, memcpy, "memcpy", nbytes)
    zcrc = best_of(lambda: zlib.crc32(pool_bytes.data), repeat)
    line("zlib.crc32", zcrc, memcpy, "memcpy", nbytes)

    print("\n[peers: write / read of the same three arrays]")
    peers: list[tuple[str, float, float, Callable[[], Any]]] = []
    try:
        aw, ar = arrow_roundtrip(arrays)
        peers.append(("pyarrow IPC", best_of(aw, repeat), best_of(ar, repeat, 200), ar))
    except ImportError:
        print("  pyarrow not installed")
    arrow_read = peers[0][2] if peers else None
    try:
        from safetensors.numpy import load as st_load, save as st_save

        named = {"page_pool": arrays[0], "block_table": arrays[1], "seq_ptr": arrays[2]}
        st_blob = st_save(named)
        peers.append(
            ("safetensors", best_of(lambda: st_save(named), repeat),
             best_of(lambda: st_load(st_blob), repeat), lambda: st_load(st_blob))
        )  # fmt: skip
    except ImportError:
        print("  safetensors not installed")

    def np_save() -> bytes:
        out = io.BytesIO()
        for array in arrays:
            np.save(out, array)
        return out.getvalue()

    saved = np_save()

    def np_load() -> list[np.ndarray]:
        source = io.BytesIO(saved)
        return [np.load(source) for _ in arrays]

    peers.append(("np.save / np.load", best_of(np_save, repeat), best_of(np_load, repeat), np_load))
    pickled = pickle.dumps(arrays, protocol=5)
    peers.append(
        ("pickle protocol 5", best_of(lambda: pickle.dumps(arrays, protocol=5), repeat),
         best_of(lambda: pickle.loads(pickled), repeat), lambda: pickle.loads(pickled))
    )  # fmt: skip
    for name, write, read, _ in peers:
        print(f"  {name:<20} write {write / memcpy:6.3f}x memcpy   read {read * 1e6:10.1f} us")

    print("\n[hurray-wire, 128 MiB page_pool]")
    parts = best_of(lambda: blob.encode_parts(tensor, checksum=False), repeat, 200)
    pieces = blob.encode_parts(tensor, checksum=False)
    shares = any(np.shares_memory(np.frombuffer(p, np.uint8), tensor.page_pool) for p in pieces)
    print(f"  encode_parts(checksum=False)                 {parts * 1e6:10.1f} us  "
          f"(page_pool piece is a view of the array: {shares})")  # fmt: skip
    line("encode_parts(checksum=True)", timed["parts_chk"], xxh, "xxh3 alone", nbytes)
    line("encode_into(warm buffer)", timed["into"], memcpy, "memcpy", nbytes)
    line("encode_into(warm buffer, checksum=False)", timed["into_plain"], memcpy, "memcpy", nbytes)
    line("encode() (own allocation)", timed["enc"], memcpy, "memcpy", nbytes)
    line("encode(checksum=False)", timed["enc_plain"], memcpy, "memcpy", nbytes)
    for name, fn in (
        ("encode_into(warm buffer)", lambda: blob.encode_into(tensor, warm)),
        (
            "encode_into(warm, checksum=False)",
            lambda: blob.encode_into(tensor, warm, checksum=False),
        ),
        ("encode() (own allocation)", lambda: blob.encode(tensor)),
    ):
        ratio = paired_ratio(lambda: np.copyto(warm_dst, pool_bytes), fn)
        print(f"  {name + ', paired with memcpy':<58} median = {ratio:6.3f}x memcpy")
    dec_fast = float("inf")
    for _ in range(3):  # interleaved with the peer's read, best of all rounds
        dec_fast = min(
            dec_fast, best_of(lambda: blob.decode(blob_checked, verify=False), repeat, 500)
        )
        if arrow_read:
            arrow_read = min(arrow_read, best_of(peers[0][3], repeat, 200))
    msg = f"{dec_fast * 1e6:8.1f} us"
    if arrow_read:
        msg += f" = {dec_fast / arrow_read:5.2f}x pyarrow IPC read ({arrow_read * 1e6:.1f} us)"
    print(f"  decode(verify=False)                         {msg}")
    plans = decoder.DEFAULT_DECODER.plans

    def cold_decode() -> None:
        plans.clear()
        blob.decode(blob_checked, verify=False)

    cold = best_of(cold_decode, repeat, 200)
    print(f"  decode(verify=False), header not memoised    {cold * 1e6:8.1f} us")
    dec = timed["dec"]
    from_bytes = bytes(blob_checked)
    dec_bytes = best_of(lambda: blob.decode(from_bytes), repeat)
    xxh_bytes = best_of(
        lambda: xxhash.xxh3_64_intdigest(memoryview(from_bytes)[pool_offset:]), repeat
    )
    print(f"  decode(verify=True)  throughput = {xxh / dec:5.3f}x xxh3 alone "
          f"({nbytes / dec / 1e9:.1f} GB/s)")  # fmt: skip
    print(f"  decode(verify=True) of a bytes copy = {xxh_bytes / dec_bytes:5.3f}x xxh3 over "
          f"the same bytes object")  # fmt: skip


def bench_small(repeat: int) -> None:
    print("\n[per-blob fixed overhead: tiny blob (spec example, 664 B of buffers)]")
    pool = np.arange(5 * 4 * 2 * 8, dtype=np.float16).reshape(5, 4, 2, 8)
    tensor = hw.BlockPagedTensor.from_arrays(pool, [0, 1, 0], [0, 2, 3], layer_index=3)
    desc = hw.encode_descriptor(tensor.descriptor)
    arrays = [a.reshape(-1).view(np.uint8) for a in (pool, tensor.block_table, tensor.seq_ptr)]
    head = struct.Struct("<4sQI")

    def struct_encode() -> bytes:
        body = b"".join([desc, *(a.tobytes() for a in arrays)])
        return head.pack(b"TEST", len(body), 3) + body

    raw = struct_encode()

    def struct_decode() -> list[np.ndarray]:
        _, _length, _count = head.unpack_from(raw, 0)
        offset = head.size + len(desc)
        out = []
        for a in arrays:
            out.append(np.frombuffer(raw, np.uint8, a.nbytes, offset))
            offset += a.nbytes
        return out

    base = best_of(lambda: (struct_encode(), struct_decode()), repeat, 2000)
    data = bytes(blob.encode(tensor))
    ours = best_of(lambda: (blob.encode(tensor), blob.decode(data)), repeat, 2000)
    ours_plain = best_of(
        lambda: (blob.encode(tensor, checksum=False), blob.decode(data, verify=False)), repeat, 2000
    )
    print(f"  hand-written struct encode + decode          {base * 1e6:8.1f} us")
    print(f"  hurray-wire encode + decode                  {ours * 1e6:8.1f} us = "
          f"{ours / base:5.1f}x")  # fmt: skip
    print(f"  hurray-wire (no checksums)                   {ours_plain * 1e6:8.1f} us = "
          f"{ours_plain / base:5.1f}x")  # fmt: skip


def numpy_invariants(
    block_table: np.ndarray, seq_ptr: np.ndarray, lens: np.ndarray, num_pages: int, page: int
) -> None:
    """The storage invariants as a user would write them in plain vectorised NumPy."""
    assert block_table.size == 0 or int(block_table.max()) < num_pages
    assert int(seq_ptr[0]) == 0 and int(seq_ptr[-1]) == block_table.size
    assert not (seq_ptr[1:] < seq_ptr[:-1]).any()
    assert ((seq_ptr[1:] - seq_ptr[:-1]) == (lens + (page - 1)) // page).all()


def bench_many_sequences(repeat: int) -> None:
    """decode(verify=False) at 100k sequences with seq_lens, against pyarrow's read of the same
    arrays plus the same invariants in plain NumPy: the cost per block-table entry."""
    print("\n[decode(verify=False), 100k sequences with seq_lens vs pyarrow read + NumPy checks]")
    rng = np.random.default_rng(3)
    seqs, page = 100_000, 16
    lens = rng.integers(1, 64, seqs).astype(np.uint64)
    pages = (lens + page - 1) // page
    seq_ptr = np.zeros(seqs + 1, np.uint32)
    seq_ptr[1:] = np.cumsum(pages)
    num_pages = int(seq_ptr[-1])
    pool = np.zeros((num_pages, page, 2, 64), np.float16)
    block_table = rng.permutation(num_pages).astype(np.uint32)
    tensor = hw.BlockPagedTensor.from_arrays(pool, block_table, seq_ptr, seq_lens=lens)
    data = blob.encode(tensor, checksum=False)
    _, read = arrow_roundtrip([pool, block_table, seq_ptr, lens])

    def peer() -> None:
        _, bt, sp, ln = read()
        numpy_invariants(bt, sp, ln, num_pages, page)

    blob.decode(data, verify=False)
    timed = interleaved({"peer": peer, "ours": lambda: blob.decode(data, verify=False)}, repeat)
    line("pyarrow read + NumPy invariants", timed["peer"], timed["peer"], "peer")
    line("decode(verify=False)", timed["ours"], timed["peer"], "peer")


def bench_tiny_safe(repeat: int) -> None:
    """from_arrays + encode + decode of a one-page tensor against a hand-written safe decoder
    of the same bytes (xxh3 + three np.frombuffer + the index invariants), without and with
    seq_lens (the common case: a real sequence's last page is partial)."""
    print("\n[tiny tensor (one 32 KiB page): from_arrays + encode + decode vs a safe decoder]")
    pool = np.ones((1, 16, 8, 128), np.float16)
    table = np.zeros(1, np.uint32)
    seq_ptr = np.array([0, 1], np.uint32)
    for lens in (None, np.array([11], np.uint64)):
        tensor = hw.BlockPagedTensor.from_arrays(pool, table, seq_ptr, seq_lens=lens)
        data = bytes(blob.encode(tensor))
        count = 3 if lens is None else 4
        entries = [envelope.ENTRY.unpack_dict(data, envelope.entry_at(i)) for i in range(count)]
        spans = [(e["offset"], e["raw_size"]) for e in entries]  # where a safe format keeps them
        checked = np.array([16], np.uint64) if lens is None else lens

        def safe(spans: Any = spans, checked: Any = checked, data: bytes = data) -> None:
            xxhash.xxh3_64_intdigest(data)
            out = [np.frombuffer(data, np.uint8, size, offset) for offset, size in spans]
            bt, sp = out[1].view(np.uint32), out[2].view(np.uint32)
            got = out[3].view(np.uint64) if len(out) > 3 else checked
            numpy_invariants(bt, sp, got, 1, 16)

        def ours(lens: Any = lens) -> None:
            t = hw.BlockPagedTensor.from_arrays(pool, table, seq_ptr, seq_lens=lens)
            blob.decode(blob.encode(t))

        # each alone, on a fixed tensor / blob: where the round trip goes
        stages: dict[str, Callable[[], Any]] = {
            "  from_arrays alone": partial(hw.BlockPagedTensor.from_arrays, pool, table,
                                           seq_ptr, seq_lens=lens),
            "  encode alone": partial(blob.encode, tensor),
            "  decode alone": partial(blob.decode, data),
        }  # fmt: skip
        timed = interleaved({"safe": safe, "ours": ours, **stages}, repeat)
        what = "" if lens is None else ", seq_lens"
        line(f"hand-written safe decoder{what}", timed["safe"], timed["safe"], "safe")
        line(f"from_arrays + encode + decode{what}", timed["ours"], timed["safe"], "safe")
        for name in stages:
            line(name, timed[name], timed["safe"], "safe")


def bench_descriptor_parsers(repeat: int) -> None:
    """Why the fast path: plain construct vs compiled construct vs the derived structs."""
    from hurray_wire.wire import descriptor as wd
    from hurray_wire.wire.fast import derive, offset_of

    print("\n[parsing one 133-byte block-paged descriptor]")
    data = hw.encode_descriptor(make_tensor(64).descriptor)
    start = offset_of(wd.BLOCK_PAGED_FIXED, "layout")
    payload = data[start : start + wd.BLOCK_PAGED_PAYLOAD.sizeof()]
    compiled = wd.BLOCK_PAGED_PAYLOAD.compile()
    derived = derive(wd.BLOCK_PAGED_PAYLOAD).struct
    rows = [
        ("construct, plain: the whole descriptor", lambda: wd.DESCRIPTOR.parse(data)),
        ("construct, plain: the 32-byte payload", lambda: wd.BLOCK_PAGED_PAYLOAD.parse(payload)),
        ("construct, compiled: the 32-byte payload", lambda: compiled.parse(payload)),
        ("derived struct.Struct: the 32-byte payload", lambda: derived.unpack(payload)),
        ("decode_descriptor (all checks)", lambda: hw.decode_descriptor(data)),
    ]  # fmt: skip
    for name, fn in rows:
        print(f"  {name:<46} {best_of(fn, repeat, 2000) * 1e6:8.2f} us")


def bench_index_check() -> None:
    print("\n[validate_index_buffers on 10 million entries]")
    layout = hw.BlockPagedLayout(16, 10_000_000, 0, 1000)
    rng = np.random.default_rng(1)
    block_table = rng.integers(0, 10_000_000, 10_000_000, dtype=np.uint32)
    seq_ptr = np.linspace(0, 10_000_000, 1001).astype(np.int64)
    seq_ptr[-1] = 10_000_000
    elapsed = best_of(
        lambda: layout.validate_index_buffers(seq_ptr=seq_ptr, block_table=block_table), 3
    )
    print(f"  {elapsed * 1e3:.1f} ms")


def _run_seconds(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def bench_import(repeat: int) -> None:
    """Start-up cost: ``import hurray_wire`` and ``hurray-wire --help`` in fresh interpreters,
    against ``import numpy`` (its floor), the three taking turns."""
    print("\n[start-up: fresh interpreter, best of rounds, against import numpy]")
    python = sys.executable
    runs = {
        "import numpy": [python, "-c", "import numpy"],
        "import hurray_wire": [python, "-c", "import hurray_wire"],
        # the entry point of this tree (an installed script may predate cli_args)
        "hurray-wire --help": [
            *(python, "-c", "from hurray_wire.cli_args import main; main()", "--help")
        ],
    }
    best = interleaved({name: partial(_run_seconds, argv) for name, argv in runs.items()},
                       repeat=1, rounds=max(3, repeat))  # fmt: skip
    base = best["import numpy"]
    for name in ("import hurray_wire", "hurray-wire --help"):
        line(name, best[name], base, "import numpy")


def bench_landing(repeat: int) -> None:
    """decode_into (verified, then copied: untouched on refusal) and decode_into(one_pass=True)
    against decode + copy and a memcpy of the pool, all in one run."""
    print("\n[decode_into: the default and one_pass=True, against decode + copy and memcpy]")
    from hurray_wire.integrity import MemoryPageStore, store_pages

    pages, page = 2048, (16, 8, 128)  # 32 KiB pages, a 64 MiB pool
    rng = np.random.default_rng(7)
    pool = rng.integers(0, 1 << 16, (pages, *page), np.uint16).view(np.float16)
    t = hw.BlockPagedTensor.from_arrays(
        pool, np.arange(pages), [0, pages // 2, pages], kv_role="key", layer_index=0
    )
    smooth = np.broadcast_to(np.linspace(0, 1, 128, dtype=np.float16), pool.shape).copy()
    store = MemoryPageStore(1 << 28)
    store_pages(store, t, list(range(0, pages, 4)))  # a quarter of the pages referenced
    blobs = {
        "raw": hw.encode(t),
        "page digests": hw.encode(t, page_digests=True),
        "page digests + refs (1/4)": hw.encode(t, page_digests=True, known_pages=store.digests()),
        "zstd": hw.encode(
            hw.BlockPagedTensor.from_arrays(smooth, np.arange(pages), [0, pages // 2, pages]),
            compression="zstd",
        ),
    }
    engine = np.empty_like(pool)
    for name, data in blobs.items():

        def two_pass(b: Any = data) -> None:
            engine[...] = hw.decode(b, page_store=store).page_pool

        def into(b: Any = data, one_pass: bool = False) -> Any:
            return hw.decode(b, into=hw.IntoArray(engine, one_pass=one_pass), page_store=store)

        best = interleaved(
            {
                "memcpy": lambda: np.copyto(engine, pool),
                "decode + copy": two_pass,
                "decode_into": into,
                "one_pass=True": partial(into, one_pass=True),
            },
            repeat=repeat,
        )
        for row in ("decode + copy", "decode_into", "one_pass=True"):
            line(f"{name}: {row}", best[row], best["memcpy"], "memcpy", pool.nbytes)
        base = best["decode + copy"]
        print(f"  {name}: decode_into = {best['decode_into'] / base:.3f}x, one_pass=True = "
              f"{best['one_pass=True'] / base:.3f}x decode + copy")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--skip-flat", action="store_true", help="skip the 1 GiB decode case")
    parser.add_argument(
        "--transfer", action="store_true", help="also the loopback TCP rate vs a raw socket copy"
    )
    parser.add_argument(
        "--nixl",
        action="store_true",
        help="also hurray-wire over NIXL vs raw NIXL between the same agents (tools/bench_nixl.py)",
    )
    args = parser.parse_args(argv)
    repeat = scaled(3 if args.quick else 7, 1)
    print(f"hurray-wire {hw.__version__}, numpy {np.__version__}, python {sys.version.split()[0]}")
    bench_import(repeat)
    bench_landing(repeat)
    bench_reference(repeat)
    bench_small(repeat)
    bench_tiny_safe(repeat)
    bench_many_sequences(repeat)
    bench_descriptor_parsers(repeat)
    bench_index_check()
    if not (args.skip_flat or SMOKE):  # the 1 GiB case has no smoke size
        bench_decode_flat(repeat)
    if args.transfer:
        print("\n[loopback transfer: stream of blobs vs raw socket copy (tools/bench_transfer.py)]")
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import bench_transfer

        bench_transfer.main(["rate", "--rounds", str(scaled(3 if args.quick else 5, 1))])
    if args.nixl:
        print("\n[NIXL: hurray-wire blobs vs raw NIXL READs, same agents (tools/bench_nixl.py)]")
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import bench_nixl

        bench_nixl.main(["--rounds", str(scaled(3 if args.quick else 9, 1))])
    return 0


if __name__ == "__main__":
    sys.exit(main())
