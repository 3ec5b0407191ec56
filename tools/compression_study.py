"""Compression study: which storage codec suits fp16/bf16 KV caches.

Measures every codec and level hurray_wire.codecs offers, through its public functions,
against plain zstd-3 and blosc2 (byte shuffle + zstd) on the real K/V activations in
fixtures/kv_sample/. The machine is shared and noisy: candidates run interleaved,
round after round, each speed is the best of all rounds, and speeds are also given as a
ratio to zstd-3 measured in the same run. Results go to docs/compression.md.

Run: python tools/compression_study.py [--rounds 15] [--data DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blosc2
import ml_dtypes
import numpy as np
import numpy.typing as npt
import zstandard
from bench_scale import scaled

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hurray_wire import codecs
from hurray_wire.codecs import (
    CODEC_CHUNKED,
    CODEC_SHUFFLE_ZSTD,
    CODEC_ZSTD,
    DEFAULT_COMPRESSION,
    Compression,
    byteshuffle,
)
from hurray_wire.codecs.zstd import entropy_bits

U8 = npt.NDArray[np.uint8]
Encoded = tuple[int, int, Any]


@dataclass
class Candidate:
    """One way to store a section: encode(raw) -> stored, decode(stored, out)."""

    name: str
    encode: Callable[[U8], Any]
    decode: Callable[[Any, U8], None]
    note: str = ""


@dataclass
class Result:
    stored: int = 0
    compress_s: list[float] = field(default_factory=list)
    decompress_s: list[float] = field(default_factory=list)


def hurray(compression: Compression, note: str = "") -> Candidate:
    """A candidate that goes through codecs.compress / codecs.decompress_into."""

    def encode(raw: U8) -> Encoded:
        return codecs.compress(raw, compression, 2)

    def decode(enc: Encoded, out: U8) -> None:
        codecs.decompress_into(enc[0], enc[1], enc[2], out, threads=compression.threads)

    name = str(compression)
    if compression.threads:
        name += " every core" if compression.threads == -1 else f" threads={compression.threads}"
    if compression == DEFAULT_COMPRESSION:
        name += " (default)"
    return Candidate(name, encode, decode, note)


def untuned_shuffle(level: int) -> Candidate:
    """Shuffle + zstd at a stock level, one-shot: what the default improves on."""
    cctx = zstandard.ZstdCompressor(level=level)

    def encode(raw: U8) -> Encoded:
        shuffled: Any = codecs.shuffle_bytes(raw, 2)
        return CODEC_SHUFFLE_ZSTD, 2, cctx.compress(shuffled)

    def decode(enc: Encoded, out: U8) -> None:
        codecs.decompress_into(enc[0], enc[1], enc[2], out)

    return Candidate(
        f"shuffle-zstd:{level}, stock zstd",
        encode,
        decode,
        "no plane-aligned blocks, no hash-table tuning",
    )


def blosc(clevel: int, nthreads: int, filt: Any = None) -> Candidate:
    """blosc2 with a (bit)shuffle filter and zstd, decompressing into a preallocated array."""
    filt = blosc2.Filter.SHUFFLE if filt is None else filt
    cparams = blosc2.CParams(
        codec=blosc2.Codec.ZSTD, clevel=clevel, typesize=2, nthreads=nthreads, filters=[filt]
    )
    dparams = blosc2.DParams(nthreads=nthreads)

    def encode(raw: U8) -> Any:
        return blosc2.compress2(raw, cparams=cparams)

    def decode(stored: Any, out: U8) -> None:
        blosc2.decompress2(stored, dst=out, dparams=dparams)

    label = "shuffle" if filt == blosc2.Filter.SHUFFLE else "bitshuffle"
    return Candidate(f"blosc2 {label}+zstd clevel={clevel} nthreads={nthreads}", encode, decode)


def stored_size(enc: Any) -> int:
    if isinstance(enc, tuple):
        return len(memoryview(enc[2]).cast("B"))
    return len(enc)


def load(data_dir: Path, kind: str) -> list[U8]:
    """The 12 K/V arrays of one dtype, as raw little-endian bytes."""
    arrays = []
    for path in sorted(data_dir.glob(f"layer*_*.{kind}.npy")):
        a = np.load(path)
        if kind == "bf16":
            a = a.view(ml_dtypes.bfloat16)  # uint16 bit patterns -> bfloat16
        arrays.append(np.ascontiguousarray(a).reshape(-1).view(np.uint8))
    if not arrays:
        raise SystemExit(f"no *.{kind}.npy in {data_dir}")
    return arrays


def run(candidates: list[Candidate], sections: list[U8], rounds: int) -> dict[str, Result]:
    results = {c.name: Result() for c in candidates}
    outs = [np.empty(s.size, np.uint8) for s in sections]
    for r in range(rounds):
        for cand in candidates if r % 2 == 0 else reversed(candidates):
            res = results[cand.name]
            t0 = time.perf_counter()
            encoded = [cand.encode(s) for s in sections]
            t1 = time.perf_counter()
            for enc, out in zip(encoded, outs, strict=True):
                cand.decode(enc, out)
            t2 = time.perf_counter()
            res.compress_s.append(t1 - t0)
            res.decompress_s.append(t2 - t1)
            if r == 0:
                res.stored = sum(stored_size(e) for e in encoded)
                for s, out in zip(sections, outs, strict=True):
                    if not np.array_equal(s, out):
                        raise SystemExit(f"{cand.name}: round trip failed")
    return results


def table(title: str, raw: int, results: dict[str, Result], notes: dict[str, str]) -> str:
    base = results["zstd:3"]
    base_c, base_d = min(base.compress_s), min(base.decompress_s)
    lines = [
        f"### {title}",
        "",
        "| codec | ratio | compress GB/s | decompress GB/s | compress vs zstd-3 "
        "| decompress vs zstd-3 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, res in results.items():
        c, d = min(res.compress_s), min(res.decompress_s)
        label = name + (f" [{notes[name]}]" if notes.get(name) else "")
        lines.append(
            f"| {label} | {raw / res.stored:.4f} | {raw / c / 1e9:.2f} | {raw / d / 1e9:.2f} "
            f"| {base_c / c:.2f}x | {base_d / d:.2f}x |"
        )
    return "\n".join(lines)


def tuning(arrays: list[U8], kind: str, rounds: int) -> str:
    """Why level 1 shrinks zstd's hash table for low-entropy top planes: the top byte
    plane alone, compressed with zstd level 1 and each hash_log."""
    whole = np.concatenate(arrays)
    half = whole.size // 2
    top = codecs.shuffle_bytes(whole, 2)[half:]
    bits = [entropy_bits(codecs.shuffle_bytes(a, 2)[a.size // 2 :]) for a in arrays]
    lines = [
        f"### {kind}: top byte plane ({half} bytes), zstd level 1 by hash_log",
        "",
        f"Order-0 entropy of the top plane per array: {min(bits):.2f}-{max(bits):.2f} bits/byte.",
        "",
        "| hash_log | ratio | compress GB/s | decompress GB/s |",
        "|---:|---:|---:|---:|",
    ]
    plane: Any = np.ascontiguousarray(top)
    out = np.empty(half, np.uint8)
    for hash_log in (6, 8, 10, 12, 14):
        params = zstandard.ZstdCompressionParameters.from_level(
            1, source_size=whole.size, hash_log=hash_log
        )
        cctx = zstandard.ZstdCompressor(compression_params=params)
        best_c = best_d = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            stored = cctx.compress(plane)
            t1 = time.perf_counter()
            codecs.decompress_into(CODEC_ZSTD, 0, stored, out)
            t2 = time.perf_counter()
            best_c, best_d = min(best_c, t1 - t0), min(best_d, t2 - t1)
        lines.append(
            f"| {hash_log} | {half / len(stored):.4f} | {half / best_c / 1e9:.2f} "
            f"| {half / best_d / 1e9:.2f} |"
        )
    return "\n".join(lines)


def alternating(arrays: list[U8], kind: str, rounds: int) -> str:
    """The default against single-threaded blosc2 one call at a time, in A-B-B-A order, so
    that neither side always runs after the other: a second view of the one-chunk
    sections, where the tables above take each candidate's best loop over all 12."""
    ours, theirs = hurray(DEFAULT_COMPRESSION), blosc(1, 1)
    out = np.empty(arrays[0].size, np.uint8)
    ratios: dict[str, list[float]] = {"compress": [], "decompress": []}
    for _ in range(rounds):
        for raw in arrays:
            stored = {c.name: c.encode(raw) for c in (ours, theirs)}
            for what in ratios:
                spent = {ours.name: 0.0, theirs.name: 0.0}
                for cand in (ours, theirs, theirs, ours):
                    t0 = time.perf_counter()
                    if what == "compress":
                        cand.encode(raw)
                    else:
                        cand.decode(stored[cand.name], out)
                    spent[cand.name] += time.perf_counter() - t0
                ratios[what].append(spent[theirs.name] / spent[ours.name])
    lines = [
        f"### {kind}: one-chunk sections ({arrays[0].size} bytes), one call at a time",
        "",
        f"Speed of the default against blosc2 shuffle+zstd clevel=1 nthreads=1, median of "
        f"{len(ratios['compress'])} A-B-B-A groups (quartiles):",
        "",
    ]
    for what, values in ratios.items():
        q1, q2, q3 = np.percentile(values, [25, 50, 75])
        lines.append(f"- {what}: {q2:.2f}x ({q1:.2f}-{q3:.2f})")
    return "\n".join(lines)


def candidates() -> list[Candidate]:
    return [
        hurray(Compression(CODEC_ZSTD, level=3), "baseline"),
        hurray(Compression(CODEC_ZSTD, level=3, threads=2)),
        hurray(Compression(CODEC_ZSTD, level=1)),
        hurray(DEFAULT_COMPRESSION, "1 MiB chunks, both directions on every usable core"),
        hurray(Compression(CODEC_CHUNKED, level=1, threads=0), "1 MiB chunks, one thread"),
        hurray(Compression(CODEC_SHUFFLE_ZSTD, level=1), "one frame"),
        hurray(Compression(CODEC_SHUFFLE_ZSTD, level=1, threads=2)),
        hurray(Compression(CODEC_SHUFFLE_ZSTD, level=3)),
        hurray(Compression(CODEC_SHUFFLE_ZSTD, level=5)),
        hurray(Compression(CODEC_SHUFFLE_ZSTD, level=9)),
        untuned_shuffle(1),
        blosc(1, 1),
        blosc(1, 2),
        blosc(5, 1),
        blosc(1, 1, blosc2.Filter.BITSHUFFLE),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=scaled(15, 1))
    parser.add_argument(
        "--data",
        type=Path,
        default=Path(__file__).resolve().parent.parent / "fixtures" / "kv_sample",
    )
    parser.add_argument(
        "--tuning", action="store_true", help="also sweep zstd's hash_log on the top byte plane"
    )
    args = parser.parse_args(argv)
    manifest = json.loads((args.data / "manifest.json").read_text())
    print(f"# data: {manifest['model']}, {manifest['tokens_kept']} tokens")
    print(
        f"# zstd {zstandard.ZSTD_VERSION}, python-zstandard {zstandard.__version__}, "
        f"blosc2 {blosc2.__version__}, numpy {np.__version__}, rounds {args.rounds}"
    )
    print(f"# byte-shuffle kernels: {byteshuffle.backend()}")
    cands = candidates()
    notes = {c.name: c.note for c in cands}
    for kind in ("f16", "bf16"):
        arrays = load(args.data, kind)
        whole = np.concatenate(arrays)
        tiled = np.concatenate([whole] * 4)  # a layer-sized pool: 18 chunks of 1 MiB
        for title, sections in (
            (f"{kind}: the 12 K/V arrays 4 times as one section ({tiled.size} bytes)", [tiled]),
            (f"{kind}: all 12 K/V arrays as one section ({whole.size} bytes)", [whole]),
            (f"{kind}: 12 sections of {arrays[0].size} bytes (one per array)", arrays),
        ):
            raw = sum(s.size for s in sections)
            results = run(cands, sections, args.rounds)
            print()
            print(table(title, raw, results, notes))
            sys.stdout.flush()
        print()
        print(alternating(arrays, kind, args.rounds))
        if args.tuning:
            print()
            print(tuning(arrays, kind, args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
