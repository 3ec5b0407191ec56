#!/usr/bin/env python3
"""atheris fuzz harness for ``hurray_wire.StreamFile`` on a real file (the ``mmap`` path).

``check_stream_file(data)`` writes the bytes to a scratch file and opens it as
``StreamFile(path)`` (mapped), and opens the same bytes as ``StreamFile(bytes)`` and through a
``memoryview`` slice at offset 3 of a ``bytearray``; it fails on any exception that is not a
``HurrayWireError`` and on any disagreement:

* the three sources agree on opening (verdict and error type), on ``header``, ``entries``,
  ``complete``, ``keys()`` and the type of ``error``, and for each entry on ``read`` (equal
  tensors, or errors of the same type, section, field and offset); ``tensor(layer, role)``
  answers for every key;
* ``verify=False`` opens the same entries and never refuses a blob that ``verify=True``
  reads; the small limits of ``fuzz_blob.SMALL_LIMITS`` and ``max_blob_bytes=4096`` never
  read a blob the defaults refuse, and refuse one the defaults read only with
  ``LimitExceededError``;
* every blob the mapped file reads lands in a caller's flat uint8 array
  (``read(entry, page_pool=)``, the ``decode_into`` landing) as the same tensor;
* the input bytes are never modified, and the mapped file is released on ``close``.

Modes. By default libFuzzer's byte mutations; ``--fix-checksums`` installs the container
harness's stream mutator (``fuzz_containers.mutate``: record fields, blob mutations spliced
in with the end index moved, every checksum recomputed).

Usage (``pip install atheris``)::

    mkdir -p /tmp/hw-stream-file
    python tools/fuzz_stream_file.py -max_total_time=300 -timeout=20 /tmp/hw-stream-file \\
        fixtures/streams fixtures/conformance/block_paged/streams
    python tools/fuzz_stream_file.py --fix-checksums -max_total_time=300 -timeout=20 ...

Generated streams (``fuzz_containers.generated_seeds``) go to
``$TMPDIR/hurray-wire-fuzz-stream-file-seeds``.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

try:
    import atheris  # type: ignore[import-untyped]
except ImportError:
    atheris = None

if atheris is not None and __name__ == "__main__":
    with atheris.instrument_imports(include=["hurray_wire"]):
        import _instrumented  # the lazy package: every module now, instrumented

        import hurray_wire as hw
        from hurray_wire import containers as hws

        _instrumented.import_all()
else:
    import hurray_wire as hw
    from hurray_wire import containers as hws

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_blob  # outcomes, tensor comparison, small limits, flags and seeding
import fuzz_containers  # the stream mutator and generated streams
import fuzz_records  # header comparison

ROOT = Path(__file__).resolve().parent.parent
SEED_DIRS = [ROOT / "fixtures" / "streams", ROOT / "fixtures/conformance/block_paged/streams"]
_SCRATCH: list[Path] = []


def _scratch() -> Path:
    if not _SCRATCH:
        folder = tempfile.mkdtemp(prefix="hw-fuzz-sf-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)  # no scratch left in /tmp
        _SCRATCH.append(Path(folder) / "stream.hrws")
    return _SCRATCH[0]


def _error_key(error: hw.HurrayWireError | None) -> Any:
    if error is None:
        return None
    return (type(error), error.section, error.field, error.offset)


def _survey(
    source: Any, land: bool = False, **options: Any
) -> tuple[Any, list[tuple[Any, Any]], Any]:
    """(summary, per-entry (tensor, error), opening error) of one StreamFile; ``land``: each
    blob that reads is read again into a caller's array (``read(entry, page_pool=)``, the
    ``decode_into`` landing) and must give the same tensor."""
    stream_file, error = fuzz_blob.outcome(lambda: hws.StreamFile(source, **options))
    if stream_file is None:
        return None, [], error
    with stream_file:
        header = stream_file.header
        summary = (
            None if header is None else fuzz_records.header_key(header),
            stream_file.entries,
            stream_file.complete,
            tuple(stream_file.keys()),
            type(stream_file.error),
        )
        reads = [
            fuzz_blob.outcome(functools.partial(stream_file.read, e)) for e in stream_file.entries
        ]
        for entry, (tensor, _) in zip(stream_file.entries, reads, strict=True):
            if land and tensor is not None and tensor.page_pool.nbytes <= 1 << 20:
                out = np.full(tensor.page_pool.nbytes, 0xA5, np.uint8)
                landed, error = fuzz_blob.outcome(
                    functools.partial(stream_file.read, entry, into=hw.IntoArray(out))
                )
                diff = (
                    "the verdict" if landed is None else fuzz_blob.tensor_difference(landed, tensor)
                )
                if diff is not None:
                    raise AssertionError(f"read(page_pool=) differs in {diff}: {error!r}")
        for key in list(stream_file.keys()):
            fuzz_blob.outcome(functools.partial(stream_file.tensor, *key))
        # compare now: the tensors are views of the mapping, released by close()
        reads = [(None if t is None else _detached(t), e) for t, e in reads]
    return summary, reads, None


def _detached(tensor: hw.BlockPagedTensor) -> hw.BlockPagedTensor:
    return hw.BlockPagedTensor._trusted(
        tensor.descriptor,
        tensor.page_pool.copy(),
        tensor.block_table.copy(),
        tensor.seq_ptr.copy(),
        None if tensor.scales is None else tensor.scales.copy(),
        None if tensor.zero_points is None else tensor.zero_points.copy(),
    )


def _same_reads(what: str, a: list[tuple[Any, Any]], b: list[tuple[Any, Any]]) -> None:
    if len(a) != len(b):
        raise AssertionError(f"{what}: {len(a)} entries vs {len(b)}")
    for number, ((t1, e1), (t2, e2)) in enumerate(zip(a, b, strict=True)):
        if _error_key(e1) != _error_key(e2):
            raise AssertionError(f"{what}: entry {number}: {e1!r} vs {e2!r}")
        if t1 is not None:
            diff = fuzz_containers.tensor_difference(t1, t2, extras=False)
            if diff is not None:
                raise AssertionError(f"{what}: entry {number} differs in {diff}")


def check_stream_file(data: bytes) -> None:
    """One fuzz case: a mapped file, bytes and a memoryview agree; limits only refuse."""
    original = bytes(data)
    path = _scratch()
    path.unlink(missing_ok=True)  # a new inode: a mapping still alive is never truncated
    path.write_bytes(data)
    mapped = _survey(path, land=True)
    padded = bytearray(b"xyz" + data + b"!")
    for label, source in (("bytes", data), ("memoryview at 3", memoryview(padded)[3:-1])):
        other = _survey(source)
        if _error_key(mapped[2]) != _error_key(other[2]) or mapped[0] != other[0]:
            raise AssertionError(f"StreamFile file vs {label}: {mapped[2]!r} vs {other[2]!r}")
        _same_reads(f"StreamFile file vs {label}", mapped[1], other[1])
    if data != original or padded[3:-1] != original:
        raise AssertionError("StreamFile modified its input")
    summary, reads, error = mapped
    if error is not None:
        return
    unverified = _survey(data, verify=False)
    if unverified[0] is None or unverified[0][1] != summary[1]:
        raise AssertionError("verify=False opens different entries")
    for number, ((_, e1), (_, e2)) in enumerate(zip(reads, unverified[1], strict=True)):
        if e1 is None and e2 is not None:
            raise AssertionError(f"verify=False refused entry {number}: {e2!r}")
    small = _survey(data, limits=fuzz_blob.SMALL_LIMITS, max_blob_bytes=4096)
    if small[2] is not None and not isinstance(small[2], hw.errors.LimitExceededError):
        raise AssertionError(f"small limits refused to open with {small[2]!r}")
    if small[0] is not None:
        by_entry = dict(zip(summary[1], reads, strict=True))
        for entry, (_, e2) in zip(small[0][1], small[1], strict=True):
            if entry not in by_entry:
                continue
            e1 = by_entry[entry][1]
            if e1 is not None and e2 is None:
                raise AssertionError(f"small limits read a blob the defaults refuse: {e1!r}")
            if e1 is None and e2 is not None and not isinstance(e2, hw.errors.LimitExceededError):
                raise AssertionError(f"small limits refused a good blob with {e2!r}")


# -- seeds and main --------------------------------------------------------------------------
MUTATOR_ERRORS = fuzz_containers.MUTATOR_ERRORS
mutate = fuzz_containers.mutate


def generated_seeds() -> dict[str, bytes]:
    return {k: v for k, v in fuzz_containers.generated_seeds().items() if k.endswith(".hrws")}


def seed_inputs() -> dict[str, bytes]:
    seeds = {
        f"{p.parent.name}-{p.name}": p.read_bytes() for d in SEED_DIRS for p in sorted(d.iterdir())
    }
    seeds.update(generated_seeds())
    return seeds


def main() -> None:
    fix, argv = fuzz_blob.fix_mode(sys.argv)
    argv = fuzz_blob.seeded_argv(argv, "stream-file", SEED_DIRS, generated_seeds)
    if fix:
        fuzz_containers._IN_LIBFUZZER.append(True)
        fuzz_blob._IN_LIBFUZZER.append(True)
        atheris.Setup(argv, check_stream_file, custom_mutator=mutate)
    else:
        atheris.Setup(argv, check_stream_file)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
