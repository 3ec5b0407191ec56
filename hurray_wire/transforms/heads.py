"""Head re-sharding for tensor parallelism. With ``n`` ranks and ``H`` heads, rank ``r`` holds
heads ``r*H/n .. (r+1)*H/n - 1`` when ``n`` divides ``H``, else (GQA, ``H`` divides ``n``)
the one head ``r // (n // H)``; indexes, metadata and per-block / per-tensor parameters go
to every shard, per-channel scales on the head axis are sliced with the heads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hurray_wire.errors import ArgumentTypeError, InvalidTensorError
from hurray_wire.fingerprint import (
    FINGERPRINT_METADATA_KEY,
    differences,
    fingerprint_from_metadata,
)
from hurray_wire.model.quantization import PerChannelAffine
from hurray_wire.tensor_core import TensorCore, TensorT
from hurray_wire.transforms._common import check_int, check_tensor, rebuild, with_fingerprint

__all__ = ["MAX_RANKS", "head_ranges", "merge_heads", "split_heads"]

#: The most ranks ``split_heads`` splits into: the result is a list of ``n`` tensors, so
#: ``n = 2**40`` ran for ever (and no engine runs 65,536 tensor-parallel ranks).
MAX_RANKS = 1 << 16


def head_ranges(num_heads: int, n: int) -> list[tuple[int, int]]:
    """``(first, stop)`` heads of each of ``n`` ranks, or a typed error."""
    if num_heads and num_heads % n == 0:
        per = num_heads // n
        return [(r * per, (r + 1) * per) for r in range(n)]
    if num_heads and n % num_heads == 0:
        group = n // num_heads
        return [(r // group, r // group + 1) for r in range(n)]
    raise InvalidTensorError(
        "the rank count must divide num_heads or be a multiple of it",
        field="n",
        found=n,
        expected=f"a divisor or multiple of num_heads = {num_heads}",
    )


def _slice(tensor: TensorT, first: int, stop: int, metadata: dict[str, Any]) -> TensorT:
    pool = tensor.unpacked_page_pool()[:, :, first:stop, :]
    scales, zero_points = tensor.scales, tensor.zero_points
    quant = tensor.quantization
    if isinstance(quant, PerChannelAffine) and quant.axis == 1:
        assert scales is not None
        scales = scales[first:stop]
        zero_points = None if zero_points is None else zero_points[first:stop]
    return rebuild(tensor, page_pool=pool, scales=scales, zero_points=zero_points,
                   metadata=metadata)  # fmt: skip


def split_heads(tensor: TensorT, n: object) -> list[TensorT]:
    """One tensor per rank (see the module docstring for which heads each holds).

    An engine fingerprint in the metadata is made each shard's own: a source at rank ``a``
    of ``s`` split ``n`` ways gives ranks ``a * n + r`` of ``s * n``."""
    check_tensor(tensor)
    ranks = check_int(n, "n", minimum=1, maximum=MAX_RANKS)
    ranges = head_ranges(tensor.shape[1], ranks)
    fp = fingerprint_from_metadata(tensor.metadata)
    out = []
    built: dict[tuple[int, int], TensorT] = {}
    for rank, heads in enumerate(ranges):
        if fp is None:  # replicas are one tensor, built once
            if heads not in built:
                built[heads] = _slice(tensor, *heads, dict(tensor.metadata))
            out.append(built[heads])
        else:
            metadata = with_fingerprint(tensor, tp_rank=fp.tp_rank * ranks + rank,
                                        tp_size=fp.tp_size * ranks)  # fmt: skip
            out.append(_slice(tensor, *heads, metadata))
    return out


def _equal(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return bool(np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8)))


def _check_agree(base: TensorCore, other: TensorCore, rank: int) -> None:
    checks: list[tuple[str, Any, Any]] = [
        ("layout", base.layout, other.layout),
        ("element_type", base.element_type, other.element_type),
        ("head_dim", base.shape[2], other.shape[2]),
        ("total_tokens", base.shape[0], other.shape[0]),
        ("num_heads", base.shape[1], other.shape[1]),
        ("quantization", base.quantization, other.quantization),
    ]
    differing = sorted(k for k in set(base.metadata) | set(other.metadata)
                       if k != FINGERPRINT_METADATA_KEY
                       and base.metadata.get(k) != other.metadata.get(k))  # fmt: skip
    if differing:
        raise InvalidTensorError(f"shard {rank} differs from shard 0 in metadata",
                                 field="metadata", found=f"keys {differing}")  # fmt: skip
    a, b = fingerprint_from_metadata(base.metadata), fingerprint_from_metadata(other.metadata)
    if (a is None) != (b is None) or (a and b and differences(a, b, ignore=("tp_rank",))):
        fields = "a fingerprint" if a is None or b is None else differences(a, b)
        raise InvalidTensorError(f"shard {rank} is of another engine than shard 0",
                                 field="hurray.engine_fingerprint", found=fields)  # fmt: skip
    for name, a, b in checks:
        if a != b:
            raise InvalidTensorError(
                f"shard {rank} differs from shard 0 in {name}", field=name, found=b, expected=a
            )
    quant = base.quantization
    shared: tuple[str, ...] = ("block_table", "seq_ptr", "seq_lens")
    if not (isinstance(quant, PerChannelAffine) and quant.axis == 1):  # else sliced with heads
        shared += ("scales", "zero_points")
    for name in shared:
        if not _equal(getattr(base, name), getattr(other, name)):
            raise InvalidTensorError(f"shard {rank} differs from shard 0 in {name}", field=name)


def merge_heads(tensors: Sequence[TensorT], *, num_heads: int | None = None) -> TensorT:
    """The inverse of ``split_heads``; ``num_heads`` (default: the shards' sum) when the
    shards are replicas: each group of ``len(tensors) // num_heads`` must be identical."""
    if isinstance(tensors, TensorCore) or not isinstance(tensors, Sequence):
        raise ArgumentTypeError(
            "merge_heads takes a sequence of BlockPagedTensor",
            field="tensors",
            found=type(tensors).__name__,
        )
    shards = [check_tensor(shard, f"tensors[{rank}]") for rank, shard in enumerate(tensors)]
    if not shards:
        raise InvalidTensorError("merge_heads needs at least one tensor", field="tensors")
    base = shards[0]
    for rank, shard in enumerate(shards[1:], start=1):
        _check_agree(base, shard, rank)
    n = len(shards)
    per = base.shape[1]
    total = n * per if num_heads is None else check_int(num_heads, "num_heads", minimum=1)
    if total != n * per:
        if per != 1 or n % total:
            raise InvalidTensorError(
                "replicated shards hold one head each and num_heads must divide their count",
                field="num_heads",
                found=total,
                expected=f"a divisor of {n} (shards of one head)",
            )
        group = n // total
        for rank in range(n):
            keeper = shards[rank - rank % group]
            if not _equal(keeper.page_pool, shards[rank].page_pool) or not _equal(
                keeper.scales, shards[rank].scales
            ):
                raise InvalidTensorError(
                    f"shard {rank} should replicate shard {rank - rank % group}",
                    field="tensors",
                    found=rank,
                )
        shards = shards[::group]
    pool = np.concatenate([s.unpacked_page_pool() for s in shards], axis=2)
    scales, zero_points = base.scales, base.zero_points
    quant = base.quantization
    if isinstance(quant, PerChannelAffine) and quant.axis == 1:
        scales = np.concatenate([s.scales for s in shards if s.scales is not None])
        if zero_points is not None:
            zero_points = np.concatenate(
                [s.zero_points for s in shards if s.zero_points is not None]
            )
    return rebuild(base, page_pool=pool, scales=scales, zero_points=zero_points,
                   metadata=_merged_metadata(base, [fingerprint_from_metadata(t.metadata)
                                                    for t in tensors]))  # fmt: skip


def _merged_metadata(base: TensorCore, fps: list[Any]) -> dict[str, Any]:
    """The shards' metadata with the fingerprint of the merged tensor: shards at ranks
    ``k * n .. k * n + n - 1`` of ``s`` merge to rank ``k`` of ``s / n``; shards that all
    carry one rank (made without the split's renumbering) keep it."""
    if fps[0] is None:
        return dict(base.metadata)
    n = len(fps)
    ranks = [fp.tp_rank for fp in fps]
    first, size = ranks[0], fps[0].tp_size
    if len(set(ranks)) == 1:
        return dict(base.metadata)
    if ranks != list(range(first, first + n)) or first % n or size % n:
        raise InvalidTensorError(
            f"the shards' tp_rank must be {n} consecutive ranks starting at a multiple of {n}",
            field="tp_rank",
            found=ranks[:16],
            expected=f"k*{n} .. k*{n}+{n - 1} of a tp_size divisible by {n}",
        )
    return with_fingerprint(base, tp_rank=first // n, tp_size=size // n)
