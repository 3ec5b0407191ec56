"""Start-up of the decode path: ``from hurray_wire import decode, encode, BlockPagedTensor``
against ``import numpy`` (its floor), each in fresh interpreters taking turns, median and
best of ``--rounds`` (on a shared machine the best is the steadier figure), and the same
less an empty interpreter's start (``python -c pass``); and which modules it loads
(issue 31: <= 1.5x ``import numpy``).

Run: python tools/bench_import.py [--rounds 21] [--modules] [--before TREE]
(``PYTHONPATH`` pointing at the tree to measure.) ``--modules`` prints the hurray_wire
modules loaded and the ten largest self times from ``python -X importtime``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from bench_scale import scaled

EMPTY = "pass"
NUMPY = "import numpy"
DECODE_PATH = "from hurray_wire import decode, encode, BlockPagedTensor"
#: As users run it: with bytecode caches (a warm-up round writes them for a source tree;
#: without them each start compiles every module, which says nothing about the imports).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def seconds(code: str, tree: str | None = None) -> float:
    """Wall time of a fresh interpreter running ``code`` (``-S``-free, as users start it),
    importing from ``tree`` (a source tree, put first on the path) when given."""
    env = ENV if tree is None else {**ENV, "PYTHONPATH": tree}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env=env, cwd=tree)
    return time.perf_counter() - start


def loaded(code: str) -> list[str]:
    """The hurray_wire modules ``code`` leaves in ``sys.modules``."""
    probe = (
        f"{code}\nimport sys\nprint(sorted(m for m in sys.modules if m.startswith('hurray_wire')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env=ENV,
    ).stdout
    return list(eval(out))  # a printed list of str, from our own probe


def self_times(code: str, top: int = 10) -> list[tuple[int, str]]:
    """(self microseconds, module) of the ``top`` slowest imports under ``-X importtime``."""
    err = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True, text=True, check=True, timeout=120, env=ENV,
    ).stderr  # fmt: skip
    rows = []
    for text in err.splitlines():
        if text.startswith("import time:") and "|" in text and "self" not in text:
            own, _, name = text[len("import time:") :].split("|")
            rows.append((int(own), name.strip()))
    return sorted(rows, reverse=True)[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=scaled(21, 1))
    parser.add_argument("--modules", action="store_true")
    parser.add_argument("--before", help="another source tree (e.g. a `git archive` of main)"
                        " whose decode path is measured in the same rounds")  # fmt: skip
    args = parser.parse_args()
    runs = {EMPTY: (EMPTY, None), NUMPY: (NUMPY, None), DECODE_PATH: (DECODE_PATH, None)}
    if args.before:
        runs[f"{DECODE_PATH} (--before)"] = (DECODE_PATH, args.before)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for code, tree in runs.values():  # warm-up: bytecode caches written, files cached
        seconds(code, tree)
    for _ in range(args.rounds):  # taking turns: all see the same load
        for name, (code, tree) in runs.items():
            times[name].append(seconds(code, tree))
    empty = statistics.median(times.pop(EMPTY))
    base = statistics.median(times[NUMPY])
    low = min(times[NUMPY])
    for name, spent in times.items():
        mid, best = statistics.median(spent), min(spent)
        print(f"{name:70s} median {mid * 1e3:6.1f} ms {mid / base:5.2f}x, best {best * 1e3:6.1f}"
              f" ms {best / low:5.2f}x import numpy")  # fmt: skip
    print(f"imports alone (each median less an empty interpreter's, {empty * 1e3:.1f} ms):")
    for name, spent in times.items():
        cost = statistics.median(spent) - empty
        print(f"  {name:68s} {cost * 1e3:6.1f} ms {cost / (base - empty):5.2f}x import numpy")
    modules = loaded(DECODE_PATH)
    print(f"hurray_wire modules loaded: {len(modules)}")
    if args.modules:
        print(" ".join(modules))
        for own, name in self_times(DECODE_PATH):
            print(f"{own:8d} us  {name}")


if __name__ == "__main__":
    main()
