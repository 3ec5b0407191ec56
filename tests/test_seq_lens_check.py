"""check_seq_lens's page counts against a plain Python ceil, for every code path, and
check_indexes' one-pass small path against the two general checks."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import hurray_wire as hw
from hurray_wire.model.layout import check_index_arrays, check_indexes
from hurray_wire.tensor import check_seq_lens


def _first_bad(lens: list[int], seq_ptr: list[int], page: int) -> int | None:
    for seq, tokens in enumerate(lens):
        if seq_ptr[seq + 1] - seq_ptr[seq] != -(-tokens // page):
            return seq
    return None


@settings(max_examples=300, deadline=None)
@given(
    page=st.sampled_from([1, 2, 3, 16, 24, 64, 1 << 20]),
    lens=st.lists(st.integers(0, 200), min_size=1, max_size=40),
    skew=st.lists(st.integers(-1, 1), min_size=1, max_size=40),
    index=st.sampled_from([np.uint32, np.uint64]),
)
def test_page_counts_match_a_plain_ceil(
    page: int, lens: list[int], skew: list[int], index: type[np.unsignedinteger]
) -> None:
    pages = [max(0, -(-t // page) + (skew[i % len(skew)] if i % 3 == 0 else 0))
             for i, t in enumerate(lens)]  # fmt: skip
    seq_ptr = np.concatenate([[0], np.cumsum(pages)]).astype(index)
    arr = np.array(lens, np.uint64)
    bad = _first_bad(lens, seq_ptr.tolist(), page)
    if bad is None:
        check_seq_lens(arr, seq_ptr, page, sum(lens))
    else:
        with pytest.raises(hw.errors.IndexBufferError) as info:
            check_seq_lens(arr, seq_ptr, page, sum(lens))
        assert info.value.position == bad


def test_lengths_near_two_to_the_64_take_the_exact_path() -> None:
    lens = np.array([2**64 - 5, 1], np.uint64)
    seq_ptr = np.array([0, 2**60 - 1, 2**60], np.uint64)  # seq 0 needs 2**60 pages
    with pytest.raises(hw.errors.IndexBufferError) as info:
        check_seq_lens(lens, seq_ptr, 16, 2**64 - 4)
    assert info.value.position == 0


def _verdict(call: Callable[[], None]) -> tuple[str, str | None, int | None] | None:
    try:
        call()
    except hw.errors.IndexBufferError as exc:
        return str(exc), exc.field, exc.position
    return None


_STARTS = [[0], [1], [0, 0], [0, 1], [0, 2], [1, 1], [0, 1, 1], [0, 2, 1], [0, 1, 3], [0, 1, 2]]
_TABLES = [[], [0], [2], [0, 1], [1, 0], [0, 3], [0, 1, 2], [2, 2, 2]]
_LENS = [None, [], [0], [1], [16], [17], [1, 0], [0, 1], [16, 1], [5, 20], [1, 1, 1]]


@pytest.mark.parametrize("starts", _STARTS)
@pytest.mark.parametrize("lens", _LENS)
def test_check_indexes_agrees_with_the_two_general_checks(
    starts: list[int], lens: list[int] | None
) -> None:
    """The one-pass small-integer path of check_indexes passes exactly what
    check_index_arrays + check_seq_lens pass, and otherwise raises their error (message,
    field, position), for every table, page count and total_tokens of a small grid."""
    seq_ptr = np.array(starts, np.uint32)
    num_seqs = len(starts) - 1
    for table in _TABLES:
        block_table = np.array(table, np.uint32)
        arr = None if lens is None else np.array(lens, np.uint64)
        for num_pages, claimed, total in itertools.product((2, 3), (num_seqs, num_seqs + 1),
                                                            (0, 1, 17, 21)):  # fmt: skip
            if arr is not None and total == 21:
                total = sum(lens or [])  # the consistent total as well as wrong ones

            def general() -> None:
                check_index_arrays(seq_ptr, block_table, num_pages, claimed)  # noqa: B023
                if arr is not None:  # noqa: B023
                    check_seq_lens(arr, seq_ptr, 16, total)  # noqa: B023

            expected = _verdict(general)
            got = _verdict(
                lambda: check_indexes(seq_ptr, block_table, num_pages, claimed, arr, 16, total)  # noqa: B023
            )
            assert got == expected, (starts, table, lens, num_pages, claimed, total)
