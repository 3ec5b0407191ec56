"""Encoded size and time of a mostly-unreferenced pool, before and after compaction.

A 65,536-page pool (16 tokens x 8 heads x 128 dims, float16: 32 KiB a page, 2 GiB in all)
of which the block table references 512 pages (8 sequences of 64 pages; the first 16 pages
of each are a prefix shared by all, so 512 entries name 16 + 8 * 48 = 400 distinct pages).
It times ``hw.encode(tensor)`` against ``hw.encode(tensor, compact=True)`` (compaction
included) and ``hw.decode`` of each blob, best of ``--rounds``; and checks that both blobs
decode to the same tokens per sequence.

Run: python tools/bench_compact.py [--rounds 3] [--pages 65536] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from bench_scale import scaled

import hurray_wire as hw


def best(fn: Callable[[], Any], rounds: int) -> tuple[float, Any]:
    """(best wall seconds, the last result) over ``rounds`` calls."""
    times, result = [], None
    for _ in range(rounds):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def build(pages: int, seqs: int = 8, per_seq: int = 64, shared: int = 16) -> hw.BlockPagedTensor:
    """The pool (a constant in the unreferenced pages) and a block table of seqs * per_seq."""
    rng = np.random.default_rng(0)
    pool = np.full((pages, 16, 8, 128), 0.25, np.float16)  # stale data in every page, touched
    chosen = rng.choice(pages, size=shared + seqs * (per_seq - shared), replace=False)
    prefix, rest = chosen[:shared], chosen[shared:].reshape(seqs, per_seq - shared)
    table = np.concatenate([np.concatenate((prefix, row)) for row in rest])
    pool[chosen] = rng.standard_normal((len(chosen), 16, 8, 128)).astype(np.float16)
    lens = np.full(seqs, per_seq * 16 - 5)
    seq_ptr = np.arange(seqs + 1) * per_seq
    return hw.BlockPagedTensor.from_arrays(pool, table, seq_ptr, seq_lens=lens, layer_index=0)


def measure_full(tensor: hw.BlockPagedTensor, rounds: int) -> tuple[float, float, int, Any]:
    """Encode and decode times of the whole pool; one 2 GiB blob alive at a time."""
    encode_s, size = best(lambda: len(hw.encode(tensor)), rounds)
    blob = hw.encode(tensor)
    decode_s, decoded = best(lambda: hw.decode(blob), rounds)
    return encode_s, decode_s, size, decoded.sequences()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=scaled(3, 1))
    parser.add_argument("--pages", type=int, default=scaled(65536, 1024))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    tensor = build(args.pages)
    compact_s, small = best(lambda: tensor.compact(), args.rounds)
    full_s, full_dec_s, full_size, reference = measure_full(tensor, args.rounds)
    enc_s, blob = best(lambda: hw.encode(tensor, compact=True), args.rounds)
    dec_s, got = best(lambda: hw.decode(blob), args.rounds)
    assert all(np.array_equal(a, b) for a, b in zip(got.sequences(), reference, strict=True))
    result = {
        "pool_pages": tensor.layout.num_pages,
        "referenced_entries": len(tensor.block_table),
        "distinct_pages": small.layout.num_pages,
        "full_bytes": full_size,
        "compact_bytes": len(blob),
        "size_ratio": full_size / len(blob),
        "encode_full_s": full_s,
        "encode_compact_s": enc_s,
        "compact_only_s": compact_s,
        "decode_full_s": full_dec_s,
        "decode_compact_s": dec_s,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:20} {value:.4f}" if isinstance(value, float) else f"{key:20} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
