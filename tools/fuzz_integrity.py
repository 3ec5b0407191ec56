#!/usr/bin/env python3
"""atheris fuzz harness for the integrity and transfer readers, and the claimed-size paths.

``check_integrity(data)`` takes its first byte as the target and the rest as its input:

* the record decoders: ``decode_digest_section``, ``decode_page_refs``,
  ``decode_known_pages``, ``decode_known_pages_bloom``, ``decode_fingerprint`` and the
  transfer ``decode_record``, each with a claimed page count or cap taken from the input;
  an accepted record must encode back to the same bytes (``decode_record``,
  ``decode_page_refs``, ``decode_digest_section``, ``decode_known_pages``) and decode to
  the same value;
* delta blobs (a page-refs section, 0x05, and page digests, 0x04) through every reader that
  resolves refs: ``decode`` and ``decode_report`` with a ``page_store``,
  ``decode(into=InPlace)`` and ``decode_report(into=InPlace)`` (the same verdict when no page fails)
  into an engine pool (``EnginePoolStore``) and ``StreamReader`` with
  a ``page_store``; the blob's checksums are recomputed after the mutation when the target
  byte asks for it, so that the mutated fields reach the section rules;
* **claimed sizes**: a small delta blob of 0-byte pages (``num_heads`` 0) whose descriptor's
  page count (and, with uint64 indices, any u64) is taken from the input, then
  checksummed: the readers must refuse it with ``LimitExceededError`` (more than
  ``DecodeLimits.max_empty_pages`` sent pages) or decode it, in time linear in the blob,
  never allocate per claimed page;
* a tensor of 0-byte pages with a claimed page count through ``page_digests``,
  ``plan_delta`` and ``store_pages``.

Every exception must be a ``HurrayWireError``; a decoded delta blob must equal the tensor
rebuilt independently from the store; the input is never modified; ``-timeout=20`` makes a
slow claimed size a finding.

Usage (``pip install atheris``)::

    mkdir -p /tmp/hw-integrity
    python tools/fuzz_integrity.py -max_total_time=300 -timeout=20 /tmp/hw-integrity
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    import atheris  # type: ignore[import-untyped]
except ImportError:
    atheris = None

if atheris is not None and __name__ == "__main__":
    with atheris.instrument_imports(include=["hurray_wire"]):
        import _instrumented  # the lazy package: every module now, instrumented
        import numpy as np

        import hurray_wire as hw
        from hurray_wire import integrity as hi
        from hurray_wire.containers import StreamReader
        from hurray_wire.transport import records as tr

        _instrumented.import_all()
else:
    import numpy as np

    import hurray_wire as hw
    from hurray_wire import integrity as hi
    from hurray_wire.containers import StreamReader
    from hurray_wire.transport import records as tr

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_blob  # the blob checksum fixer and seeding

_U64 = struct.Struct("<Q")
_MARK = 0x1234  # the page count of the claimed-size seed, patched by the input
LIMITS = hw.DecodeLimits(
    max_descriptor_length=1 << 12,
    max_decompressed_bytes=1 << 22,
    max_metadata_bytes=1 << 12,
    max_empty_pages=1 << 12,
)


def _tensor(pages: int, heads: int, index_type: str = "uint32") -> Any:
    pool = np.arange(pages * 4 * heads * 8, dtype=np.float16).reshape(pages, 4, heads, 8)
    table = np.array([0, 1, 2, 1, 3][: max(1, min(5, pages))]) % max(pages, 1)
    return hw.BlockPagedTensor.from_arrays(
        pool, table, np.array([0, 2, len(table)]), block_table_index_type=index_type
    )


_SENDER = _tensor(6, 2)
_STORE = hi.MemoryPageStore(1 << 20)
hi.store_pages(_STORE, _SENDER, pages=[0, 1, 3])
_ENGINE = np.zeros((16, 4, 2, 8), np.float16)
_ENGINE[5] = _SENDER.page_pool[1]
_ENGINE[9] = _SENDER.page_pool[3]
_POOL = hi.EnginePoolStore(_ENGINE)
_POOL.index([5, 9])
_ENGINE_FREE = [0, 1, 2, 3, 4, 6, 7, 8, 10, 11, 12, 13, 14, 15]
_FP = hi.EngineFingerprint("m", "vllm", "0.9", "NHD", "float16", 16, 0, 1, {"a": 1})


def delta_seeds() -> dict[str, bytes]:
    known = hi.page_digests(_SENDER)[[0, 1, 3]]
    out = {
        "delta.hrwb": bytes(hw.encode(_SENDER, known_pages=np.sort(known))),
        "delta-digests.hrwb": bytes(
            hw.encode(_SENDER, known_pages=np.sort(known), page_digests=True)
        ),
        "digests.hrwb": bytes(hw.encode(_SENDER, page_digests=True)),
        "delta-zstd.hrwb": bytes(
            hw.encode(_SENDER, known_pages=np.sort(known), compression="zstd:1")
        ),
    }
    return out


def _claiming_seed() -> bytes:
    empty = _tensor(_MARK, 0, "uint64")
    return bytes(hw.encode(empty, known_pages=np.array([1], np.uint64)))


_CLAIM = _claiming_seed()
_SEEDS = set(delta_seeds().values())
_CLAIM_AT = _CLAIM.index(_U64.pack(_MARK))


def generated_seeds() -> dict[str, bytes]:
    digests = np.array([5, 7, 2**64 - 1], np.uint64)
    records = {
        0: hi.encode_digest_section(digests),
        1: hi.encode_page_refs(hi.PageRefs(np.array([0, 3, 8]), digests)),
        2: hi.encode_known_pages(digests),
        3: hi.encode_known_pages_bloom(digests),
        4: hi.encode_fingerprint(_FP),
        5: tr.encode_record(tr.TransferRecord("abort", 3, reason="no")),
        6: tr.encode_record(
            tr.TransferRecord(
                "offer",
                9,
                layer=1,
                role="key",
                total_length=128,
                pool_offset=64,
                pool_length=64,
                segments=(tr.Segment(0, 128, 4096, 0),),
            )
        ),
    }
    seeds = {f"gen-{k}.bin": bytes([k]) + v for k, v in records.items()}
    for number, (name, blob) in enumerate(sorted(delta_seeds().items())):
        for target in (7, 8, 9, 10):
            seeds[f"gen-{target}-{number}-{name}"] = bytes([target]) + blob
    for count in (0, 1, 5, 1 << 12, (1 << 12) + 1, 1 << 33, 2**63):
        seeds[f"gen-11-{count}.bin"] = bytes([11]) + _U64.pack(count)
        seeds[f"gen-12-{count}.bin"] = bytes([12]) + _U64.pack(count)
    return seeds


def _typed(call: Callable[[], Any]) -> Any:
    """``call()``; a HurrayWireError is None, anything else propagates (a finding)."""
    try:
        return call()
    except hw.HurrayWireError:
        return None


def _u64(data: bytes) -> int:
    return int(_U64.unpack(data[:8].ljust(8, b"\0"))[0])


def _records(target: int, body: bytes) -> None:
    claimed = _u64(body) & 0xFFFF  # a page count or cap the caller passes, from the input
    rest = body[8:]
    if target == 0:
        got = _typed(lambda: hi.decode_digest_section(rest, claimed))
        if got is not None:
            assert hi.encode_digest_section(got) == rest
    elif target == 1:
        refs = _typed(lambda: hi.decode_page_refs(rest, claimed))
        if refs is not None:
            assert hi.encode_page_refs(refs) == rest
            sent = refs.sent_pages(claimed)
            assert sent.size + refs.pages.size == claimed
    elif target == 2:
        got = _typed(lambda: hi.decode_known_pages(rest, max_entries=claimed))
        if got is not None:
            assert hi.encode_known_pages(got) == rest
    elif target == 3:
        bloom = _typed(lambda: hi.decode_known_pages_bloom(rest, max_bytes=claimed + 64))
        if bloom is not None:
            _typed(lambda: hi.bloom_candidates(np.array([5, 7, 9], np.uint64), bloom))
    elif target == 4:
        fp = _typed(lambda: hi.decode_fingerprint(body))
        if fp is not None:
            assert hi.decode_fingerprint(hi.encode_fingerprint(fp)) == fp
    else:
        record = _typed(lambda: tr.decode_record(body))
        if record is not None:
            assert tr.encode_record(record) == body


def _same(got: Any, want: Any) -> None:
    assert got.shape == want.shape and got.element_type == want.element_type
    assert np.array_equal(got.block_table, want.block_table)
    assert np.array_equal(got.seq_ptr, want.seq_ptr)
    for seq in range(got.num_seqs):
        a = got.gather_sequence(seq)
        b = want.gather_sequence(seq)
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


def _delta(target: int, blob: bytes) -> None:
    if target in (8, 10):
        blob = fuzz_blob.fix_checksums(blob)
    original = bytes(blob)
    if target in (7, 8):
        tensor = _typed(lambda: hw.decode(blob, page_store=_STORE, limits=LIMITS))
        report = _typed(lambda: hw.decode_report(blob, page_store=_STORE, limits=LIMITS))
        if tensor is not None:
            assert report is not None and report.ok
            plain = _typed(lambda: hw.decode(blob, limits=LIMITS))  # refs need the store
            if plain is not None:
                _same(tensor, plain)
            if original in _SEEDS:  # an unchanged seed: the sender's own tensor
                _same(tensor, _SENDER)
        stream = _typed(lambda: list(StreamReader(blob, page_store=_STORE, limits=LIMITS)))
        if tensor is not None and stream:
            _same(stream[0], tensor)
    else:
        before = _ENGINE.copy()
        try:
            landed = _typed(
                lambda: hw.decode(blob, into=hw.InPlace(_POOL, _ENGINE_FREE), limits=LIMITS)
            )
            _ENGINE[:] = before
            report = _typed(
                lambda: hw.decode_report(blob, into=hw.InPlace(_POOL, _ENGINE_FREE), limits=LIMITS)
            )
            # the report variant: accepts what decode(into=InPlace) accepts, with no failed page,
            # and reports nothing failed only for what decode(into=InPlace) accepts
            if landed is not None and (report is None or not report.ok):
                raise AssertionError(f"in-place report vs in-place decode: {report!r}")
            if report is not None and report.ok and landed is None:
                raise AssertionError("the in-place report is ok where the in-place decode refuses")
        finally:
            _ENGINE[:] = before  # the next input sees the same pool
    assert blob == original


def _claimed(target: int, body: bytes) -> None:
    count = _u64(body)
    if target == 11:  # a delta blob of 0-byte pages claiming ``count`` pages
        blob = bytearray(_CLAIM)
        blob[_CLAIM_AT : _CLAIM_AT + 8] = _U64.pack(count)
        data = fuzz_blob.fix_checksums(bytes(blob))
        for call in (
            lambda: hw.decode(data, page_store=_STORE),
            lambda: hw.decode(data, page_store=_STORE, limits=LIMITS),
            lambda: hw.decode_report(data, page_store=_STORE),
            lambda: list(StreamReader(data, page_store=_STORE)),
            lambda: hw.decode(data, into=hw.InPlace(_POOL, _ENGINE_FREE)),
        ):
            try:
                got = call()
            except hw.errors.LimitExceededError:
                assert count > (1 << 12)  # refused only above the smallest cap tried
                continue
            except hw.HurrayWireError:
                continue
            if got is not None and not isinstance(got, list):
                assert count <= hw.DecodeLimits().max_empty_pages
    else:  # a tensor of 0-byte pages claiming ``count`` pages
        count = min(count, 1 << 40)  # NumPy refuses larger shapes, even of 0 bytes
        pool = np.zeros((count, 4, 0, 8), np.float16)
        tensor = _typed(
            lambda: hw.BlockPagedTensor.from_arrays(
                pool,
                np.array([0]) % max(count, 1),
                np.array([0, min(count, 1)]),
                block_table_index_type="uint64",
            )
        )
        if tensor is None:
            return
        for work in (
            lambda: hi.page_digests(tensor),
            lambda: hi.plan_delta(tensor, np.zeros(0, np.uint64)),
            lambda: hi.store_pages(hi.MemoryPageStore(1 << 16), tensor),
        ):
            _typed(work)


def check_integrity(data: bytes) -> None:
    """One input: first byte the target, the rest its input."""
    if not data:
        return
    target, body = data[0] % 13, bytes(data[1:])
    if target <= 6:
        _records(target, body)
    elif target <= 10:
        _delta(target, body)
    else:
        _claimed(target, body)


test_one_input = check_integrity


def seed_inputs() -> dict[str, bytes]:
    return generated_seeds()


def main() -> None:
    _, argv = fuzz_blob.fix_mode(sys.argv)
    argv = fuzz_blob.seeded_argv(argv, "integrity", [], generated_seeds)
    atheris.Setup(argv, check_integrity)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
