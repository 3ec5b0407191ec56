"""The Bloom form of the known-pages record (docs/integrity.md § 5.2): ~10 bits per held page
instead of 64. A false positive would make the sender send a reference the receiver cannot
fill, so the filter only proposes candidates (``bloom_candidates``) and the receiver
confirms the ones it holds (``confirm_known``): false positives cost bytes, never a page.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hurray_wire.buffers import U8Array, byte_view
from hurray_wire.errors import (
    ArgumentTypeError,
    IntegrityRecordTruncatedError,
    InvalidIntegrityRecordError,
    instance,
    non_negative,
)
from hurray_wire.integrity.delta import KNOWN_RECORD, encode_known_pages
from hurray_wire.integrity.digests import DigestArray, digest_array
from hurray_wire.integrity.page_store import PageStore
from hurray_wire.wire import integrity as w, records as wr

__all__ = [
    "KnownPagesBloom",
    "bloom_candidates",
    "confirm_known",
    "decode_known_pages_bloom",
    "encode_known_pages_bloom",
]

_KNOWN = KNOWN_RECORD.expecting("form", w.KNOWN_PAGES_FORM_BLOOM, "unsupported form")
_BLOOM = wr.BLOOM_PARAMS.raising(InvalidIntegrityRecordError, IntegrityRecordTruncatedError)
_PARAMS = _BLOOM.head
MIN_LOG2_BITS = 6  # 8 bytes
MAX_LOG2_BITS = 32  # 512 MiB of filter, for 400M pages; the decoder also has max_bytes
MAX_HASHES = 16


def _positions(digests: DigestArray, num_hashes: int, log2_bits: int) -> DigestArray:
    """``[len(digests), num_hashes]`` bit positions by double hashing of the digest itself
    (xxh3 outputs are uniform over 64 bits; uint64 arithmetic wraps by design)."""
    d = digests.astype(np.uint64)[:, None]
    step = (d >> np.uint64(32)) | np.uint64(1)
    i = np.arange(num_hashes, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        out: DigestArray = (d + i * step) & np.uint64((1 << log2_bits) - 1)
    return out


@dataclass(frozen=True)
class KnownPagesBloom:
    """A decoded (or built) Bloom filter of a receiver's digests."""

    bits: U8Array  # 2**log2_bits / 8 bytes
    num_hashes: int
    log2_bits: int
    count: int  # digests inserted (as the receiver says; informational)

    def might_contain(self, digests: object) -> npt.NDArray[np.bool_]:
        """A bool mask: False means surely absent, True means perhaps held."""
        values = digest_array(digests, None)
        pos = _positions(values, self.num_hashes, self.log2_bits)
        byte = self.bits[(pos >> np.uint64(3)).astype(np.intp)]
        hit = (byte >> (pos & np.uint64(7)).astype(np.uint8)) & np.uint8(1)
        return np.asarray(hit.all(axis=1), bool)


def encode_known_pages_bloom(digests: object, *, bits_per_entry: int = 10) -> bytes:
    """A Bloom known-pages record of ``digests`` (~1% false positives at 10 bits/entry)."""
    per = bits_per_entry
    if isinstance(per, bool) or not isinstance(per, int) or not 1 <= per <= 64:
        message = "bits_per_entry must be an int in [1, 64]"
        raise ArgumentTypeError(message, field="bits_per_entry", found=repr(per))
    values = np.unique(digest_array(digests, None))
    wanted = max(1, values.size * bits_per_entry)
    log2_bits = min(max(MIN_LOG2_BITS, math.ceil(math.log2(wanted))), MAX_LOG2_BITS)
    num_hashes = min(MAX_HASHES, max(1, round((1 << log2_bits) / max(1, values.size) * 0.693)))
    mask = np.zeros(1 << log2_bits, bool)
    mask[_positions(values, num_hashes, log2_bits).ravel().astype(np.intp)] = True
    bits = np.packbits(mask, bitorder="little")
    head = _KNOWN.pack(count=values.size) + _PARAMS.pack(num_hashes, log2_bits)
    return _KNOWN.close(head + bits.tobytes())


def decode_known_pages_bloom(data: object, *, max_bytes: int) -> KnownPagesBloom:
    """The filter of a Bloom known-pages record; its bit set may be at most ``max_bytes``
    (checked before the checksum pass or any copy)."""
    non_negative(max_bytes, "max_bytes")
    view = byte_view(data, "data")
    head = _KNOWN.read_head(view)
    at = _KNOWN.head.size
    params = _BLOOM.read_head(view, at=at, what="record ends inside its Bloom parameters")
    for name, low, high in (("num_hashes", 1, MAX_HASHES),
                            ("log2_bits", MIN_LOG2_BITS, MAX_LOG2_BITS)):  # fmt: skip
        if not low <= params[name] <= high:
            expected = f"{low}..{high}"
            raise _BLOOM.error(
                name, f"{name} out of range", base=at, found=params[name], expected=expected
            )
    nbytes = (1 << params["log2_bits"]) // 8
    if nbytes > max_bytes:
        msg = "Bloom filter larger than max_bytes allows"
        found = f"{nbytes} bytes"
        raise _BLOOM.error("log2_bits", msg, base=at, found=found, expected=f"<= {max_bytes}")
    start = at + _PARAMS.size
    _KNOWN.sealed(view, start + nbytes)
    bits = np.frombuffer(view, np.uint8, nbytes, start).copy()
    return KnownPagesBloom(bits, params["num_hashes"], params["log2_bits"], head["count"])


def bloom_candidates(digests: object, bloom: KnownPagesBloom) -> DigestArray:
    """Sorted unique digests of ``digests`` the filter may hold: what the sender asks the
    receiver to confirm (``encode_known_pages(candidates)``)."""
    instance(bloom, KnownPagesBloom, "bloom")
    values = digest_array(digests, None)
    return np.unique(values[bloom.might_contain(values)])


def confirm_known(store: PageStore, candidates: object) -> bytes:
    """The receiver's answer: a sorted known-pages record of the candidates it holds."""
    if not isinstance(store, PageStore):
        raise ArgumentTypeError("expected a PageStore", field="store", found=type(store).__name__)
    held = store.digests()
    values = np.unique(digest_array(candidates, None))
    return encode_known_pages(values[np.isin(values, held, assume_unique=True)])
