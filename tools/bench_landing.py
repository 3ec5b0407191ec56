"""decode_into(one_pass=True) on every kind of blob, against the safe default and a memcpy.

Each kind is timed in one run, the routes taking turns (``bench.interleaved``): a plain
``np.copyto`` of the pool into the engine array, ``decode_into`` (verified where it is or
decompressed into scratch, then copied: untouched on refusal) and ``one_pass=True``. The
ratios printed are within the run; ``uptime`` says how loaded the machine was.

    python tools/bench_landing.py [--repeat N] [--mib M]
"""

from __future__ import annotations

import argparse
import os
import subprocess
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from bench import interleaved
from bench_scale import scaled

import hurray_wire as hw
from hurray_wire import dtypes
from hurray_wire.integrity import MemoryPageStore, store_pages


def kinds(mib: int) -> dict[str, tuple[bytes, np.ndarray[Any, Any], Any]]:
    """name -> (blob, the pool the engine array receives, page store)."""
    page = (16, 8, 128)  # 32 KiB float16 pages
    pages = max(8, (mib << 20) // (2 * int(np.prod(page))))
    rng = np.random.default_rng(7)
    noisy = rng.integers(0, 1 << 16, (pages, *page), np.uint16).view(np.float16)
    ramp = np.linspace(0, 1, 128, dtype=np.float16) + (np.arange(pages) % 509)[:, None, None, None]
    smooth = np.broadcast_to(ramp.astype(np.float16), noisy.shape).copy()  # compressible pages
    table, starts = np.arange(pages), [0, pages // 2, pages]

    def t(pool: Any, **kw: Any) -> hw.BlockPagedTensor:
        return hw.BlockPagedTensor.from_arrays(pool, table, starts, kv_role="key", **kw)

    store = MemoryPageStore(1 << 30)
    refs_t = t(noisy)
    store_pages(store, refs_t, list(range(0, pages, 4)))  # a quarter of the pages referenced
    known = store.digests()
    zstore = MemoryPageStore(1 << 30)
    zrefs_t = t(smooth)
    store_pages(zstore, zrefs_t, list(range(0, pages, 4)))
    # int4: two codes a byte, an odd count so that the last byte holds padding bits
    n4 = pages * int(np.prod(page)) * 4 // 15 | 1  # pages of 15 codes, an odd count of them
    codes = (rng.integers(0, 4, n4 * 15, np.uint8) % 16).view(dtypes.int4.numpy_dtype)
    int4 = hw.BlockPagedTensor.from_arrays(
        codes.reshape(n4, 1, 1, 15), np.arange(n4), [0, n4], kv_role="key"
    )
    per_block = hw.PerBlockAffine.symmetric(
        axis=0, block_size=page[0], scale_buffer_index=3, scale_type=hw.float32
    )
    scaled_t = t(
        noisy.view(np.int8)[..., :128], quantization=per_block,
        scales=rng.random(pages * page[0], np.float32),
    )  # fmt: skip
    plain, shuffled, chunked = map(hw.Compression.parse, ("zstd", "shuffle-zstd",
                                                          "chunked-shuffle-zstd"))  # fmt: skip
    out: dict[str, tuple[memoryview, Any, Any]] = {
        "raw": (hw.encode(t(noisy)), noisy, None),
        "raw, page digests": (hw.encode(t(noisy), page_digests=True), noisy, None),
        "raw, page digests + refs (1/4)": (
            hw.encode(refs_t, page_digests=True, known_pages=known), noisy, store,
        ),
        "raw int8, per-block scales + digests": (
            hw.encode(scaled_t, page_digests=True), scaled_t.page_pool, None,
        ),
        "raw int4 (sub-byte)": (hw.encode(int4), None, None),
        "zstd": (hw.encode(t(smooth), compression=plain), smooth, None),
        "shuffle-zstd": (hw.encode(t(smooth), compression=shuffled), smooth, None),
        "chunked-shuffle-zstd": (hw.encode(t(smooth), compression=chunked), smooth, None),
        "zstd, page digests": (
            hw.encode(t(smooth), compression=plain, page_digests=True), smooth, None,
        ),
        "chunked, page digests": (
            hw.encode(t(smooth), compression=chunked, page_digests=True), smooth, None,
        ),
        "zstd, page digests + refs (1/4)": (
            hw.encode(zrefs_t, compression=plain, page_digests=True,
                      known_pages=zstore.digests()),
            smooth, zstore,
        ),
        "zstd int4 (sub-byte)": (hw.encode(int4, compression=plain), None, None),
        "chunked int4 (sub-byte)": (hw.encode(int4, compression=chunked), None, None),
    }  # fmt: skip
    for name, (blob, pool, _) in list(out.items()):
        if pool is None:  # the packed pool's bytes
            out[name] = (blob, hw.decode(blob).page_pool.copy(), None)
    return {k: (bytes(b), p, s) for k, (b, p, s) in out.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--mib", type=int, default=64, help="pool size of each blob")
    args = parser.parse_args(argv)
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print(f"{os.cpu_count()} cores; {args.mib} MiB pools; best of {args.repeat}, interleaved")
    print(f"{'blob':<34} {'memcpy ms':>9} {'safe/mcpy':>9} {'1pass/mcpy':>10} {'1pass/safe':>10}")
    for name, (blob, pool, store) in kinds(scaled(args.mib, 1)).items():
        engine = np.empty_like(pool)
        want = hw.decode(blob, page_store=store).page_pool

        def land(one_pass: bool, b: bytes = blob, e: Any = engine, s: Any = store) -> Any:
            return hw.decode(b, into=hw.IntoArray(e, one_pass=one_pass), page_store=s)

        fns: dict[str, Callable[[], Any]] = {
            "memcpy": partial(np.copyto, engine, pool),
            "safe": partial(land, False),
            "one_pass": partial(land, True),
        }
        best = interleaved(fns, repeat=scaled(args.repeat, 1))
        assert engine.tobytes() == want.tobytes(), name  # the last landing is the pool
        m = best["memcpy"]
        print(f"{name:<34} {m * 1e3:9.2f} {best['safe'] / m:8.2f}x {best['one_pass'] / m:9.2f}x"
              f" {best['one_pass'] / best['safe']:9.2f}x")  # fmt: skip
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
