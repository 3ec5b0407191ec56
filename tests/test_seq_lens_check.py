"""check_seq_lens's page counts against a plain Python ceil, for every code path."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import hurray_wire as hw
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
        with pytest.raises(hw.IndexBufferError) as info:
            check_seq_lens(arr, seq_ptr, page, sum(lens))
        assert info.value.position == bad


def test_lengths_near_two_to_the_64_take_the_exact_path() -> None:
    lens = np.array([2**64 - 5, 1], np.uint64)
    seq_ptr = np.array([0, 2**60 - 1, 2**60], np.uint64)  # seq 0 needs 2**60 pages
    with pytest.raises(hw.IndexBufferError) as info:
        check_seq_lens(lens, seq_ptr, 16, 2**64 - 4)
    assert info.value.position == 0
