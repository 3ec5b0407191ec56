"""The start-up cost of the HurrayConnector's model digest (hurray_wire.vllm.model_digest):
``checkpoint_digest`` of a checkpoint directory, first (every byte read and hashed) and
again (the cache by path, size, mtime and inode), against reading the same bytes alone.

    python tools/bench_model_digest.py [--mb 1024] [--model DIR]

Prints seconds and GB/s; ``--model`` also digests a real checkpoint (e.g. the engine
tests' tiny Llama). The cache file goes to a temporary ``XDG_CACHE_HOME``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def _read_all(path: Path) -> None:
    with path.open("rb") as handle:
        while handle.read(64 << 20):
            pass


def _digest(directory: Path) -> tuple[float, float]:
    from hurray_wire.vllm import model_digest

    model_digest._memo.clear()
    start = time.perf_counter()
    model_digest.checkpoint_digest(directory, {"a": 1})
    first = time.perf_counter() - start
    model_digest._memo.clear()  # a restart: only the cache file remains
    start = time.perf_counter()
    model_digest.checkpoint_digest(directory, {"a": 1})
    return first, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=1024, help="size of the synthetic file")
    parser.add_argument("--model", type=Path, default=None, help="a checkpoint directory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")
        if args.model is not None:
            size = sum(p.stat().st_size for p in args.model.rglob("*.safetensors"))
            first, again = _digest(args.model)
            print(f"{args.model}: {size / 1e6:.1f} MB of weights: first {first * 1e3:.1f} ms, "
                  f"cached {again * 1e3:.2f} ms")  # fmt: skip
        folder = Path(tmp) / "ckpt"
        folder.mkdir()
        path = folder / "model.safetensors"
        block = os.urandom(1 << 20)
        with path.open("wb") as handle:
            for _ in range(args.mb):
                handle.write(block)
        start = time.perf_counter()
        _read_all(path)
        read = time.perf_counter() - start
        first, again = _digest(folder)
        gb = args.mb / 1024
        print(f"{args.mb} MB file (page cache warm): read alone {read:.2f} s "
              f"({gb / read:.2f} GB/s); digest first {first:.2f} s ({gb / first:.2f} GB/s, "
              f"{first / read:.2f}x the read); cached {again * 1e3:.2f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
