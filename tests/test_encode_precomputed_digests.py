"""Precomputed page digests (``page_digests=`` an array, issue 30): the same bytes as the
encoder's own digest pass on every encode route, and a mismatching array refused by name."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire import blob
from hurray_wire.blob.encoder import Encoder, planned_into
from hurray_wire.errors import ArgumentTypeError, InvalidIntegrityRecordError
from hurray_wire.integrity import page_digests, plan_delta


def _tensor(pages: int) -> hw.BlockPagedTensor:
    pool = np.random.default_rng(pages).standard_normal((pages, 16, 2, 64)).astype(np.float16)
    half = pages // 2
    return hw.BlockPagedTensor.from_arrays(
        pool, np.arange(pages), [0, half, pages], kv_role="key", layer_index=3
    )


def _routes(tensor: hw.BlockPagedTensor, option: Any, **kw: Any) -> list[bytes]:
    """The blob from encode, encode_parts, encode_into and planned_into (NIXL's staged)."""
    out = [bytes(blob.encode(tensor, page_digests=option, **kw))]
    out.append(b"".join(blob.encode_parts(tensor, page_digests=option, **kw)))
    buffer = bytearray(len(out[0]))
    blob.encode_into(tensor, buffer, page_digests=option, **kw)
    out.append(bytes(buffer))
    size, write = planned_into(tensor, kw.get("compression"), kw.get("checksum", True), option,
                               kw.get("known_pages"))  # fmt: skip
    staged = bytearray(size)
    write(staged)
    out.append(bytes(staged))
    return out


# 3 pages: the small-blob route; 80 pages (640 KiB): the copying one
@pytest.mark.parametrize("pages", [3, 80])
@pytest.mark.parametrize("checksum", [True, False])
@pytest.mark.parametrize("delta", [False, True])
def test_precomputed_digests_give_the_same_bytes(pages: int, checksum: bool, delta: bool) -> None:
    """The golden equivalence: precomputed digests leave every byte of the blob as the
    encoder's own pass makes it (digests section, delta plan, section checksums)."""
    tensor = _tensor(pages)
    digests = page_digests(tensor)
    known = np.sort(digests[::2]) if delta else None
    mine = _routes(tensor, True, checksum=checksum, known_pages=known)
    given = _routes(tensor, digests.copy(), checksum=checksum, known_pages=known)
    assert given == mine
    assert len(set(mine)) == 1
    decoded = hw.decode(mine[0], page_store=None) if not delta else None
    if decoded is not None:
        assert np.array_equal(page_digests(decoded), digests)


def test_encoder_methods_take_the_digests() -> None:
    tensor = _tensor(5)
    digests = page_digests(tensor)
    plain = Encoder()
    with_section = bytes(Encoder(page_digests=True).encode(tensor))
    assert bytes(plain.encode(tensor, page_digests=digests)) == with_section
    assert b"".join(plain.encode_parts(tensor, page_digests=digests)) == with_section
    out = bytearray(len(with_section))
    assert plain.encode_into(tensor, out, page_digests=digests) == len(with_section)
    assert bytes(out) == with_section


@pytest.mark.parametrize(
    ("value", "error", "found"),
    [
        (np.zeros(4, np.uint64), InvalidIntegrityRecordError, 4),  # one page short
        (np.zeros(6, np.uint64), InvalidIntegrityRecordError, 6),  # one too many
        (np.zeros(5, np.int64), ArgumentTypeError, "dtype int64, shape (5,)"),
        (np.zeros((5, 1), np.uint64), ArgumentTypeError, "dtype uint64, shape (5, 1)"),
        (np.zeros(5, np.float64), ArgumentTypeError, "dtype float64, shape (5,)"),
    ],
)
def test_a_mismatching_array_is_refused(value: Any, error: type[Exception], found: Any) -> None:
    tensor = _tensor(5)
    for call in (
        lambda: blob.encode(tensor, page_digests=value),
        lambda: blob.encode_parts(tensor, page_digests=value),
        lambda: Encoder().encode(tensor, page_digests=value),
    ):
        with pytest.raises(error) as info:
            call()
        assert info.value.field == "page_digests"  # type: ignore[attr-defined]
        assert info.value.found == found  # type: ignore[attr-defined]


def test_not_an_array_on_a_method_is_refused() -> None:
    with pytest.raises(ArgumentTypeError, match="page_digests"):
        Encoder().encode(_tensor(5), page_digests=[1, 2, 3, 4, 5])


def test_refused_with_compact_and_with_a_plan() -> None:
    """compact renumbers the pages the digests were of; a plan carries its own digests."""
    tensor = _tensor(5)
    digests = page_digests(tensor)
    with pytest.raises(ArgumentTypeError, match="compact") as info:
        blob.encode(tensor, compact=True, page_digests=digests)
    assert info.value.field == "page_digests"
    plan = plan_delta(tensor, np.sort(digests[:2]))
    with pytest.raises(ArgumentTypeError, match="DeltaPlan") as info:
        blob.encode(tensor, known_pages=plan, page_digests=digests)
    assert info.value.field == "page_digests"
    assert bytes(blob.encode(tensor, known_pages=plan, page_digests=True))  # the plan alone


def test_a_wrong_value_is_not_detected_here_but_by_the_receiver() -> None:
    """The encoder cannot tell a wrong digest without the pass it saves: the receiver's
    page-digest check reports the page (why only digests of the encoded bytes may go)."""
    tensor = _tensor(5)
    digests = page_digests(tensor)
    digests[2] ^= np.uint64(1)
    data = blob.encode(tensor, page_digests=digests)
    with pytest.raises(hw.errors.HurrayWireError):
        hw.decode(data, verify=True)
