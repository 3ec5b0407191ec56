"""Run every atheris harness, one after the other, and print what each did.

    python tools/fuzz_all.py --seconds 60            # each harness for 60 s
    python tools/fuzz_all.py --runs 100000           # each harness for 100,000 executions
    python tools/fuzz_all.py --seconds 30 --only metadata records
    python tools/fuzz_all.py --seconds 300 --work /tmp/hw-fuzz --json /tmp/hw-fuzz/summary.json

Each harness runs in a child process under ``nice -n 19`` (the machine is shared; one
fuzzer at a time, never two), with ``-timeout=20`` (a hang is a finding) and its corpus in
``WORK/corpus/<name>`` (grown between runs, outside the repository; the seeds are the
fixtures, ``tests/fuzz_corpus/<harness>`` and each harness's generated seeds). libFuzzer
writes a crash, timeout or out-of-memory input to ``WORK/artifacts/<name>/``. The table
gives, per harness, the executions, exec/s, coverage (``cov:`` edges and ``ft:`` features
at the first and the last status line), corpus size, and findings (artifact files, with
the first line of the Python traceback). ``--log-only`` re-reads logs of an earlier run
instead of fuzzing (``WORK/logs/<name>.log``); ``--merge-into tests/fuzz_corpus`` minimises
the grown corpora (libFuzzer ``-merge=1``, every mode of a harness together, within a byte
budget per harness) into the committed corpus that ``tests/test_fuzz_smoke.py`` replays.
The exit status is 1 if anything was found.

Harnesses (``HARNESSES``): each atheris script in plain libFuzzer mode and, where it has
one, with its structure-aware mutator (``--fix-checksums``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
FIX = ROOT / "fixtures"
CONF = FIX / "conformance"
CORPUS = ROOT / "tests" / "fuzz_corpus"

#: name -> (script, extra flags, seed directories)
HARNESSES: dict[str, tuple[str, list[str], list[Path]]] = {
    "descriptor": (
        "fuzz_descriptor.py",
        [],
        [
            CONF / "block_paged" / "descriptors",
            CONF / "block_paged" / "invalid",
            CONF / "reference" / "descriptors",
        ],
    ),
    "descriptor-struct": (
        "fuzz_descriptor.py",
        ["--fix-checksums"],
        [
            CONF / "block_paged" / "descriptors",
            CONF / "block_paged" / "invalid",
            CONF / "reference" / "descriptors",
        ],
    ),
    "metadata": ("fuzz_metadata.py", [], []),
    "metadata-struct": ("fuzz_metadata.py", ["--fix-checksums"], []),
    "records": ("fuzz_records.py", [], [FIX / "streams"]),
    "records-fix": ("fuzz_records.py", ["--fix-checksums"], [FIX / "streams"]),
    "blob": ("fuzz_blob.py", [], [FIX / "blobs", FIX / "streams"]),
    "blob-fix": ("fuzz_blob.py", ["--fix-checksums"], [FIX / "blobs", FIX / "streams"]),
    "stream-file": ("fuzz_stream_file.py", [], [FIX / "streams"]),
    "stream-file-fix": ("fuzz_stream_file.py", ["--fix-checksums"], [FIX / "streams"]),
    "containers": (
        "fuzz_containers.py",
        [],
        [
            CONF / "block_paged" / "streams",
            CONF / "block_paged" / "files",
            CONF / "reference" / "files",
            FIX / "streams",
        ],
    ),
    "containers-fix": (
        "fuzz_containers.py",
        ["--fix-checksums"],
        [
            CONF / "block_paged" / "streams",
            CONF / "block_paged" / "files",
            CONF / "reference" / "files",
            FIX / "streams",
        ],
    ),
    # integrity records, transfer records, delta blobs through every refs reader, and the
    # claimed-size paths (0-byte pages): its own generated seeds
    "integrity": ("fuzz_integrity.py", [], []),
    # the vLLM connector's wire inputs (kv_transfer_params, the control line, a pull's
    # answer and stream): its own generated seeds
    "vllm": ("fuzz_vllm.py", [], []),
    "vllm-fix": ("fuzz_vllm.py", ["--fix-checksums"], []),
}

#: which committed corpus folder feeds which harness
CORPUS_OF = {
    "descriptor": "descriptor",
    "descriptor-struct": "descriptor",
    "metadata": "metadata",
    "metadata-struct": "metadata",
    "records": "records",
    "records-fix": "records",
    "blob": "blob",
    "blob-fix": "blob",
    "stream-file": "stream_file",
    "stream-file-fix": "stream_file",
    "containers": "containers",
    "containers-fix": "containers",
    "integrity": "integrity",
    "vllm": "vllm",
    "vllm-fix": "vllm",
}

_STATUS = re.compile(r"^#(\d+)\s+(\w+)\s+cov: (\d+) ft: (\d+)(?: corp: (\d+)/)?")
_EPS = re.compile(r"exec/s: (\d+)")
_DONE = re.compile(r"^Done (\d+) runs in (\d+) second")
_STAT = re.compile(r"^stat::(\w+):\s+(\d+)")
_ARTIFACT = re.compile(r"Test unit written to (\S+)")


@dataclass
class Result:
    name: str
    runs: int = 0
    seconds: int = 0
    exec_per_s: int = 0
    cov_start: int | None = None
    cov_end: int | None = None
    ft_start: int | None = None
    ft_end: int | None = None
    corpus: int | None = None
    findings: list[str] = field(default_factory=list)
    exit_code: int | None = None


def parse_log(name: str, text: str) -> Result:
    """The figures of one libFuzzer log."""
    result = Result(name)
    last_error = ""
    for line in text.splitlines():
        match = _STATUS.match(line)
        if match:
            runs, _, cov, ft, corp = match.groups()
            eps_match = _EPS.search(line)
            eps = eps_match.group(1) if eps_match else None
            if result.cov_start is None and match.group(2) in ("INITED", "pulse", "NEW"):
                result.cov_start, result.ft_start = int(cov), int(ft)
            result.cov_end, result.ft_end = int(cov), int(ft)
            result.runs = max(result.runs, int(runs))
            if corp:
                result.corpus = int(corp)
            if eps:
                result.exec_per_s = int(eps)
        match = _DONE.match(line)
        if match:
            result.runs, result.seconds = int(match.group(1)), int(match.group(2))
        match = _STAT.match(line)
        if match and match.group(1) == "number_of_executed_units":
            result.runs = int(match.group(2))
        if line.startswith(("=== Uncaught Python exception", "==ERROR", "AssertionError")):
            last_error = line
        if "Error:" in line and not line.startswith(("INFO", "#")):
            last_error = line.strip()
        match = _ARTIFACT.search(line)
        if match:
            result.findings.append(f"{match.group(1)}: {last_error}")
    if result.seconds:
        result.exec_per_s = result.runs // max(result.seconds, 1)
    return result


def command(
    name: str, work: Path, runs: int | None, seconds: int | None, nice: int = 19
) -> list[str]:
    script, flags, seeds = HARNESSES[name]
    corpus = work / "corpus" / name
    artifacts = work / "artifacts" / name
    corpus.mkdir(parents=True, exist_ok=True)
    artifacts.mkdir(parents=True, exist_ok=True)
    committed = CORPUS / CORPUS_OF[name]
    dirs = [str(corpus)] + [str(d) for d in seeds if d.is_dir()]
    if committed.is_dir():
        dirs.append(str(committed))
    budget = [f"-runs={runs}"] if runs is not None else []
    if seconds is not None:
        budget.append(f"-max_total_time={seconds}")
    return [
        "nice",
        "-n",
        str(nice),
        sys.executable,
        str(TOOLS / script),
        *flags,
        *budget,
        "-timeout=20",
        "-rss_limit_mb=3072",
        "-print_final_stats=1",
        f"-artifact_prefix={artifacts}/",
        *dirs,
    ]


def run(name: str, work: Path, runs: int | None, seconds: int | None, nice: int = 19) -> Result:
    log = work / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = command(name, work, runs, seconds, nice)
    started = time.monotonic()
    with log.open("w") as handle:
        handle.write(" ".join(argv) + "\n")
        handle.flush()
        code = subprocess.call(argv, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT)
    result = parse_log(name, log.read_text(errors="replace"))
    result.exit_code = code
    if not result.seconds:
        result.seconds = round(time.monotonic() - started)
    return result


#: committed corpus folder -> (the script that merges it, largest input kept, byte budget)
MERGE = {
    "descriptor": ("fuzz_descriptor.py", 4096, 150_000),
    "metadata": ("fuzz_metadata.py", 16384, 150_000),
    "records": ("fuzz_records.py", 16384, 150_000),
    "blob": ("fuzz_blob.py", 65536, 600_000),
    "stream_file": ("fuzz_stream_file.py", 65536, 400_000),
    "containers": ("fuzz_containers.py", 65536, 500_000),
    "integrity": ("fuzz_integrity.py", 16384, 200_000),
    "vllm": ("fuzz_vllm.py", 65536, 80_000),
}


def merge_corpora(work: Path, into: Path, nice: int = 19) -> None:
    """Minimise each grown corpus (every mode of a harness together) with libFuzzer's
    ``-merge=1`` into ``into/<folder>``: the inputs that keep the coverage, at most the
    folder's byte budget (the largest inputs are dropped first), named by their SHA-1."""
    import hashlib
    import shutil
    import tempfile

    for folder, (script, max_len, budget) in MERGE.items():
        names = [n for n, f in CORPUS_OF.items() if f == folder]
        with tempfile.TemporaryDirectory() as tmp:
            pool, merged = Path(tmp) / "pool", Path(tmp) / "merged"
            pool.mkdir()
            merged.mkdir()
            sources = [work / "corpus" / n for n in names] + [into / folder]
            for source in sources:
                for path in source.glob("*") if source.is_dir() else []:
                    if path.is_file() and path.stat().st_size <= max_len:
                        data = path.read_bytes()
                        (pool / hashlib.sha1(data).hexdigest()).write_bytes(data)
            argv = ["nice", "-n", str(nice), sys.executable, str(TOOLS / script), "-merge=1"]
            argv += [f"-max_len={max_len}", "-timeout=20", str(merged), str(pool)]
            log = work / "logs" / f"merge-{folder}.log"
            # libFuzzer's merge runs the script itself again (argv[0], by its #! line):
            # put this interpreter first on PATH so that it is the one found.
            env = dict(os.environ)
            env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
            with log.open("w") as handle:
                subprocess.call(argv, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
            kept = sorted(merged.iterdir(), key=lambda p: p.stat().st_size)
            total, chosen = 0, []
            for path in kept:
                if total + path.stat().st_size > budget:
                    break
                total += path.stat().st_size
                chosen.append(path)
            if not chosen:
                print(f"fuzz_all: merge of {folder} kept nothing; {log}", file=sys.stderr)
                continue
            target = into / folder
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            for path in chosen:
                data = path.read_bytes()
                (target / hashlib.sha1(data).hexdigest()).write_bytes(data)
            print(f"fuzz_all: {folder}: {len(chosen)} of {len(kept)} merged inputs, "
                  f"{total:,} bytes", file=sys.stderr)  # fmt: skip


def table(results: list[Result]) -> str:
    head = (
        "| Harness | Runs | s | exec/s | cov start -> end | ft start -> end | corpus | Findings |"
    )
    rows = [head, "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        rows.append(
            f"| {r.name} | {r.runs:,} | {r.seconds} | {r.exec_per_s:,} | "
            f"{r.cov_start} -> {r.cov_end} | {r.ft_start} -> {r.ft_end} | {r.corpus} | "
            f"{'; '.join(r.findings) or 'none'} |"
        )
    total = sum(r.runs for r in results)
    rows.append(f"| **total** | **{total:,}** | {sum(r.seconds for r in results)} | | | | | |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--runs", type=int, help="executions per harness")
    budget.add_argument("--seconds", type=int, help="seconds per harness")
    parser.add_argument("--only", nargs="+", choices=sorted(HARNESSES), help="these harnesses")
    parser.add_argument(
        "--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "hw-fuzz"
    )
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    parser.add_argument(
        "--nice", type=int, default=19, help="niceness of each fuzzer (default 19: shared machine)"
    )
    parser.add_argument("--log-only", action="store_true", help="summarise existing logs")
    parser.add_argument(
        "--merge-into", type=Path, help="minimise the grown corpora into this folder (no fuzzing)"
    )
    args = parser.parse_args(argv)
    if args.merge_into is not None:
        merge_corpora(args.work, args.merge_into, args.nice)
        return 0
    if args.runs is None and args.seconds is None and not args.log_only:
        args.seconds = 60
    results = []
    for name in args.only or list(HARNESSES):
        if args.log_only:
            log = args.work / "logs" / f"{name}.log"
            if not log.exists():
                continue
            result = parse_log(name, log.read_text(errors="replace"))
        else:
            print(f"fuzz_all: {name} ...", file=sys.stderr, flush=True)
            result = run(name, args.work, args.runs, args.seconds, args.nice)
            print(
                f"fuzz_all: {name}: {result.runs:,} runs, cov {result.cov_end}, "
                f"ft {result.ft_end}, findings {len(result.findings)}",
                file=sys.stderr,
                flush=True,
            )
        results.append(result)
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    return 1 if any(r.findings for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
