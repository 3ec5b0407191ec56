"""Whole KV caches on disk against the peers a user would pick instead, in one run.

The cache: 32 layers x key/value, each a 32 MiB fp16 page pool (2 GiB in all) with its
block table and seq_ptr. Saved as one hurray-wire stream file (``StreamWriter`` to a
path: atomic, checksummed), as a safetensors file (``save_file``) and with ``torch.save``;
then loaded warm (the files in the page cache), every layer, verified where the format
can verify (``StreamFile.read`` then a copy, and ``read(entry, page_pool=engine,
one_pass=True)``, which hashes each chunk as it copies it into the engine's array); then
one layer of 32.
Prints each figure as a ratio to the peer's in the same run (best of rounds, the
candidates taking turns). Run:

    pip install -e ".[bench]" && python tools/bench_disk.py [--rounds 5] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from bench_scale import scaled

import hurray_wire as hw

LAYERS = scaled(32, 2)
ROLES = ("key", "value")
PAGES, PAGE_SIZE, HEADS, HEAD_DIM = scaled(2048, 64), 16, 8, 64  # 32 MiB of fp16 per tensor


def make_cache() -> dict[tuple[int, str], hw.BlockPagedTensor]:
    rng = np.random.default_rng(0)
    base = rng.standard_normal((PAGES, PAGE_SIZE, HEADS, HEAD_DIM)).astype(np.float16)
    table = rng.permutation(PAGES).astype(np.uint32)
    seq_ptr = np.linspace(0, PAGES, 33).astype(np.uint32)
    cache = {}
    for layer in range(LAYERS):
        for role in ROLES:
            pool = base + np.float16(layer)  # a distinct pool per tensor
            cache[layer, role] = hw.BlockPagedTensor.from_arrays(
                pool, table, seq_ptr, kv_role=role, layer_index=layer
            )
    return cache


def best(fn: Callable[[], Any], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=scaled(5, 1))
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args(argv)
    import safetensors.numpy as stn
    import torch

    cache = make_cache()
    arrays = {
        f"layer{layer}.{role}.{name}": getattr(t, name)
        for (layer, role), t in cache.items()
        for name in ("page_pool", "block_table", "seq_ptr")
    }
    tensors = {k: torch.from_numpy(v.view(np.int16) if v.dtype == np.float16 else
                                   v.astype(np.int64)) for k, v in arrays.items()}  # fmt: skip
    work = Path(tempfile.mkdtemp(dir=args.dir))
    hrws, st_path, pt_path = work / "cache.hrws", work / "cache.safetensors", work / "cache.pt"

    def save_stream(checksum: bool = True) -> None:  # atomic: fsync'd, renamed
        with hw.StreamWriter(hrws, hw.StreamHeader(model="bench", num_layers=LAYERS)) as w:
            for t in cache.values():
                w.write(t, checksum=checksum)

    def save_safetensors(durable: bool = False) -> None:
        stn.save_file(arrays, str(st_path))
        if durable:  # what the stream writer does: the bytes on disk before the rename
            fd = os.open(st_path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)

    def save_torch() -> None:
        torch.save(tensors, pt_path)

    # "Loading" a layer = its pool copied into the engine's own KV memory, as an engine does.
    engine = np.empty(PAGES * PAGE_SIZE * HEADS * HEAD_DIM * 2, np.uint8)

    def load_stream(verify: bool = True) -> None:
        with hw.StreamFile(hrws, verify=verify) as f:
            for t in f:
                np.copyto(engine, t.page_pool.reshape(-1).view(np.uint8))

    def load_stream_into(verify: bool = True) -> None:  # decode_into: hashed while copied
        with hw.StreamFile(hrws, verify=verify) as f:
            for entry in f.entries:
                f.read(entry, into=hw.IntoArray(engine, one_pass=True))

    def load_torch() -> None:
        loaded = torch.load(pt_path, mmap=True, weights_only=True)
        for name, v in loaded.items():
            if name.endswith("page_pool"):
                np.copyto(engine, v.numpy().reshape(-1).view(np.uint8))

    def load_safetensors() -> None:
        loaded = stn.load_file(str(st_path))
        for name, v in loaded.items():
            if name.endswith("page_pool"):
                np.copyto(engine, v.reshape(-1).view(np.uint8))

    def one_stream() -> None:
        with hw.StreamFile(hrws) as f:
            np.copyto(engine, f.tensor(LAYERS // 2, "value").page_pool.reshape(-1).view(np.uint8))

    def one_safetensors() -> None:
        from safetensors import safe_open

        with safe_open(str(st_path), framework="numpy") as f:
            pool = f.get_tensor(f"layer{LAYERS // 2}.value.page_pool")
            np.copyto(engine, pool.reshape(-1).view(np.uint8))

    def one_torch() -> None:
        loaded = torch.load(pt_path, mmap=True, weights_only=True)
        np.copyto(
            engine, loaded[f"layer{LAYERS // 2}.value.page_pool"].numpy().reshape(-1).view(np.uint8)
        )

    size = sum(t.nbytes for t in cache.values())
    print(f"[whole cache on disk: {LAYERS} layers x key/value, {size / 2**30:.2f} GiB, {work}]")
    saves = {"stream": save_stream, "stream, no checksums": lambda: save_stream(False),
             "safetensors save_file": save_safetensors,
             "safetensors save_file + fsync": lambda: save_safetensors(True),
             "torch.save": save_torch}  # fmt: skip
    results = {name: float("inf") for name in saves}
    names = list(saves)
    for round_number in range(args.rounds):  # the candidates take turns, each one first once
        for name in names[round_number % len(names) :] + names[: round_number % len(names)]:
            os.sync()  # no other save's dirty pages left to throttle this one
            time.sleep(
                scaled(1000, 0) / 1000
            )  # and the virtual disk a moment to take what sync handed it
            results[name] = min(results[name], best(saves[name], 1))
    base = results["safetensors save_file"]
    for name, seconds in results.items():
        print(f"  save  {name:<28} {seconds:7.3f} s  = {seconds / base:5.2f}x safetensors")
    for path in (hrws, st_path, pt_path):
        with open(path, "rb") as f:  # warm the page cache
            while f.read(64 << 20):
                pass
    loads = {"StreamFile, verified": load_stream, "StreamFile, verify=False": lambda:
             load_stream(False), "StreamFile page_pool=, verified": load_stream_into,
             "torch.load(mmap=True)": load_torch,
             "safetensors load_file": load_safetensors}  # fmt: skip
    results = {name: float("inf") for name in loads}
    for _ in range(args.rounds):
        for name, fn in loads.items():
            results[name] = min(results[name], best(fn, 1))
    base = results["torch.load(mmap=True)"]
    for name, seconds in results.items():
        print(f"  load every layer, warm: {name:<26} {seconds:7.3f} s  = "
              f"{seconds / base:5.2f}x torch.load(mmap)")  # fmt: skip
    ones = {"StreamFile.tensor": one_stream, "safetensors safe_open": one_safetensors,
            "torch.load(mmap=True)": one_torch}  # fmt: skip
    results = {name: float("inf") for name in ones}
    for _ in range(args.rounds):
        for name, fn in ones.items():
            results[name] = min(results[name], best(fn, 3))
    base = results["StreamFile.tensor"]
    for name, seconds in results.items():
        print(f"  one layer of {LAYERS}: {name:<26} {seconds * 1e3:8.2f} ms  = "
              f"{seconds / base:5.2f}x StreamFile")  # fmt: skip
    for path in (hrws, st_path, pt_path):
        os.unlink(path)
    work.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
