"""The engine fingerprint stays true through repage, split_heads and merge_heads (issue 23)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire.integrity import (
    EngineFingerprint,
    fingerprint_from_metadata,
    fingerprint_to_metadata,
)

FP = EngineFingerprint("llama", "vllm", "0.9.1", "NHD", "float16", 16, 1, 2)


def tensor(fp: EngineFingerprint | None = FP, heads: int = 8) -> hw.BlockPagedTensor:
    pool = np.random.default_rng(0).standard_normal((6, 16, heads, 4)).astype(np.float16)
    metadata = {"request": "r-1", **(fingerprint_to_metadata(fp) if fp else {})}
    return hw.BlockPagedTensor.from_arrays(pool, [0, 1, 2, 3, 1, 4], [0, 2, 4, 6],
                                           seq_lens=[20, 30, 17], metadata=metadata)  # fmt: skip


def fp_of(t: hw.BlockPagedTensor) -> EngineFingerprint | None:
    return fingerprint_from_metadata(t.metadata)


@pytest.mark.parametrize("size", [8, 32, 5])
def test_repage_sets_the_block_size(size: int) -> None:
    t = tensor().repage(size)
    assert fp_of(t) == dataclasses.replace(FP, block_size=size)
    assert t.metadata["request"] == "r-1"
    assert fp_of(tensor(None).repage(size)) is None


@pytest.mark.parametrize("n", [1, 2, 4, 16])  # 16 > 8 heads: replicated shards
def test_split_heads_gives_each_shard_its_rank(n: int) -> None:
    shards = tensor().split_heads(n)
    assert [fp_of(s) for s in shards] == [
        dataclasses.replace(FP, tp_rank=FP.tp_rank * n + r, tp_size=FP.tp_size * n)
        for r in range(n)
    ]
    merged = hw.merge_heads(shards, num_heads=8)
    assert fp_of(merged) == FP  # back to the source's rank and size
    np.testing.assert_array_equal(merged.page_pool, tensor().page_pool)


def test_merge_heads_accepts_shards_differing_only_in_tp_rank() -> None:
    shards = tensor(dataclasses.replace(FP, tp_rank=0, tp_size=1)).split_heads(2)
    merged = hw.merge_heads(shards)
    assert fp_of(merged) == dataclasses.replace(FP, tp_rank=0, tp_size=1)
    same = [tensor(FP, heads=4), tensor(FP, heads=4)]  # one rank on both: kept as it is
    assert fp_of(hw.merge_heads(same)) == FP


@pytest.mark.parametrize(
    "second, match",
    [
        (dataclasses.replace(FP, block_size=32, tp_rank=3, tp_size=4), "another engine"),
        (None, "another engine"),
        (dataclasses.replace(FP, tp_rank=3, tp_size=4), "consecutive"),
    ],
)
def test_merge_heads_refuses_other_engines_in_one_short_line(
    second: EngineFingerprint | None, match: str
) -> None:
    first = tensor(dataclasses.replace(FP, tp_rank=0, tp_size=4), heads=4)
    with pytest.raises(hw.errors.InvalidTensorError, match=match) as info:
        hw.merge_heads([first, tensor(second, heads=4)])
    assert len(str(info.value)) < 300 and "\\x" not in str(info.value)


def test_merge_heads_names_differing_metadata_keys_not_their_bytes() -> None:
    a = tensor(heads=4)
    b = hw.BlockPagedTensor.from_arrays(
        a.page_pool, a.block_table, a.seq_ptr, seq_lens=a.seq_lens,
        metadata={**a.metadata, "request": "r-2", "blob": bytes(500)},
    )  # fmt: skip
    with pytest.raises(hw.errors.InvalidTensorError, match=r"keys \['blob', 'request'\]") as info:
        hw.merge_heads([a, b])
    assert len(str(info.value)) < 200
