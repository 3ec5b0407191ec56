"""The fuzz harnesses in CI, without atheris (docs/fuzzing.md, "CI").

Every harness's target (the function its atheris script fuzzes) replays the committed,
minimised corpus in ``tests/fuzz_corpus/<harness>/`` (the inputs that gave the campaign its
coverage, merged with libFuzzer's ``-merge=1``), and then runs a short loop of its own
mutator without libFuzzer: 200 cases per harness from a fixed seed, each the corpus input
after one to three mutations, structure-aware (the harness's ``mutate``, checksums fixed
where the format has them) or plain byte mutations (``fuzz_blob.byte_mutate``). A target
raises ``AssertionError`` on a broken property and lets through any exception that is not
a ``HurrayWireError``; the failing input is in the message as hex, and every case derives
from the fixed seed, so a failure reproduces exactly.
"""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import _instrumented  # noqa: E402
import fuzz_blob  # noqa: E402
import fuzz_containers  # noqa: E402
import fuzz_descriptor  # noqa: E402
import fuzz_integrity  # noqa: E402
import fuzz_metadata  # noqa: E402
import fuzz_records  # noqa: E402
import fuzz_stream_file  # noqa: E402
import fuzz_vllm  # noqa: E402

CORPUS = ROOT / "tests" / "fuzz_corpus"
Target = Callable[[bytes], None]
Mutator = Callable[[bytes, int, int], bytes]

#: corpus folder -> (target, structure-aware mutator, that mutator's error list, max size)
HARNESSES: dict[str, tuple[Target, Mutator, list[str], int]] = {
    "descriptor": (
        fuzz_descriptor.check_descriptor,
        fuzz_descriptor.mutate,
        fuzz_descriptor.MUTATOR_ERRORS,
        4096,
    ),
    "metadata": (
        fuzz_metadata.check_metadata,
        fuzz_metadata.mutate,
        fuzz_metadata.MUTATOR_ERRORS,
        1 << 16,
    ),
    "records": (
        fuzz_records.check_records,
        fuzz_records.mutate,
        fuzz_records.MUTATOR_ERRORS,
        1 << 16,
    ),
    "blob": (fuzz_blob.check_blob, fuzz_blob.mutate, fuzz_blob.MUTATOR_ERRORS, 1 << 19),
    "stream_file": (
        fuzz_stream_file.check_stream_file,
        fuzz_stream_file.mutate,
        fuzz_stream_file.MUTATOR_ERRORS,
        1 << 19,
    ),
    "containers": (
        fuzz_containers.check_containers,
        fuzz_containers.mutate,
        fuzz_containers.MUTATOR_ERRORS,
        1 << 19,
    ),
    # plain libFuzzer mode only: byte mutations
    "integrity": (
        fuzz_integrity.check_integrity,
        lambda data, size, seed: fuzz_blob.byte_mutate(data, random.Random(seed), size),
        [],
        1 << 14,
    ),
    "vllm": (fuzz_vllm.check_vllm, fuzz_vllm.mutate, fuzz_vllm.MUTATOR_ERRORS, 1 << 16),
}
RUNS = 200


def corpus(name: str) -> list[bytes]:
    return [path.read_bytes() for path in sorted((CORPUS / name).iterdir()) if path.is_file()]


def test_the_corpus_is_small_and_complete() -> None:
    sizes = {name: sum(len(d) for d in corpus(name)) for name in HARNESSES}
    assert all(sizes.values()), sizes
    assert sum(sizes.values()) < 2_500_000, sizes
    assert {p.name for p in CORPUS.iterdir() if p.is_dir()} == set(HARNESSES)


@pytest.mark.parametrize("name", list(HARNESSES))
def test_the_corpus_replays(name: str) -> None:
    target = HARNESSES[name][0]
    for path in sorted((CORPUS / name).iterdir()):
        try:
            target(path.read_bytes())
        except Exception as exc:
            raise AssertionError(f"{exc!r} on {path.name}") from exc


@pytest.mark.parametrize("name", list(HARNESSES))
def test_the_mutator_loop(name: str) -> None:
    target, mutate, errors, max_size = HARNESSES[name]
    seeds = corpus(name)
    rng = random.Random(20261201)
    for _ in range(RUNS):
        data = rng.choice(seeds)
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.6:
                data = mutate(data, max_size, rng.getrandbits(32))
            else:
                data = fuzz_blob.byte_mutate(data, rng, max_size)
        try:
            target(data)
        except Exception as exc:
            raise AssertionError(f"{exc!r} on input {data.hex()}") from exc
    assert errors == [], errors[:3]


def test_the_harnesses_instrument_the_lazy_package() -> None:
    """``import hurray_wire`` loads nothing but the package: the harnesses import every
    reader module inside atheris' instrumentation block (tools/_instrumented.py)."""
    names = _instrumented.import_all()
    for module in ("hurray_wire.blob.decoder", "hurray_wire.model.descriptor_codec",
                   "hurray_wire.containers.blob_stream", "hurray_wire.vllm.transfer",
                   "hurray_wire.cli", "hurray_wire.integrity.delta"):  # fmt: skip
        assert module in names
    assert not any(".adapters" in n or "connector" in n or "__main__" in n for n in names)


def test_the_vllm_harness_leaves_no_socket_open() -> None:
    """A fresh interpreter that runs each of the vllm harness's targets exits without a
    ResourceWarning: its pull target's listener, once kept for the process, was the
    ``unclosed socket`` reported at the end of every unit run."""
    code = (
        "import fuzz_vllm\n"
        "for data in fuzz_vllm.generated_seeds().values(): fuzz_vllm.check_vllm(data)\n"
        "fuzz_vllm.check_vllm(b'\\x02not a stream\\n')\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "always::ResourceWarning", "-X", "tracemalloc=10", "-c", code],
        cwd=ROOT / "tools", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ResourceWarning" not in done.stderr, done.stderr[-3000:]
