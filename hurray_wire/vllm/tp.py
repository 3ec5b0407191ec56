"""TP degree conversion (docs/vllm.md § 6): which prefill ranks a decode rank pulls, and their
pages as its heads. vLLM shards KV heads as ``QKVParallelLinear`` loads them
(``vllm/model_executor/layers/linear.py``), which is ``transforms.heads.head_ranges``; the
decode side converts, so a prefill rank serves its own heads without knowing the decode TP.
"""

from __future__ import annotations

from collections.abc import Sequence

from hurray_wire.errors import HurrayWireError, IncompatibleFingerprintError
from hurray_wire.fingerprint import (
    EngineFingerprint,
    differences,
    fingerprint_from_metadata,
    fingerprint_to_metadata,
)
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.transforms._common import rebuild
from hurray_wire.transforms.heads import head_ranges, merge_heads, split_heads

__all__ = ["check_convertible", "convert_heads", "pullers", "refuse_differences", "sources"]


def sources(prefill_tp: int, decode_tp: int, decode_rank: int) -> list[int]:
    """The prefill ranks decode rank ``decode_rank`` of ``decode_tp`` pulls from."""
    if prefill_tp == decode_tp:
        return [decode_rank]
    if decode_tp % prefill_tp == 0:
        return [decode_rank // (decode_tp // prefill_tp)]
    if prefill_tp % decode_tp == 0:
        k = prefill_tp // decode_tp
        return list(range(decode_rank * k, decode_rank * k + k))
    return list(range(prefill_tp))


def pullers(prefill_tp: int, decode_tp: int, prefill_rank: int) -> set[int]:
    """The decode ranks of ``decode_tp`` that pull prefill rank ``prefill_rank``'s transfer
    (a prefill worker serves each of them once)."""
    return {d for d in range(decode_tp) if prefill_rank in sources(prefill_tp, decode_tp, d)}


def _tp_refusal(message: str, ours: int, theirs: int, heads: int) -> IncompatibleFingerprintError:
    return IncompatibleFingerprintError(
        f"{message}: tp_size {ours!r} here, {theirs!r} there, num_kv_heads {heads}",
        differences={"tp_size": (ours, theirs)},
        field="tp_size",
    )


def check_convertible(num_kv_heads: int, prefill_tp: int, decode_tp: int) -> None:
    """Refuse a TP pair vLLM's head sharding cannot map onto each other."""
    try:
        head_ranges(num_kv_heads, prefill_tp)
        head_ranges(num_kv_heads, decode_tp)
    except HurrayWireError:
        raise _tp_refusal(
            "the KV heads cannot be re-sharded between these TP degrees",
            decode_tp,
            prefill_tp,
            num_kv_heads,
        ) from None


def _with_fp(tensor: BlockPagedTensor, fp: EngineFingerprint) -> BlockPagedTensor:
    meta = {**tensor.metadata, **fingerprint_to_metadata(fp)}
    return rebuild(tensor, page_pool=tensor.unpacked_page_pool(), metadata=meta)


def convert_heads(
    shards: Sequence[tuple[BlockPagedTensor, EngineFingerprint]],
    ours: EngineFingerprint,
    num_kv_heads: int,
) -> BlockPagedTensor:
    """Decode rank ``ours.tp_rank``'s heads from the shards of its ``sources``, each with its
    fingerprint; the converted fingerprint must equal ``ours`` but for ``block_size``
    (repaged after this) and ``kv_cache_layout`` (pages travel backend-free)."""
    prefill_tp = shards[0][1].tp_size
    check_convertible(num_kv_heads, prefill_tp, ours.tp_size)
    want = sources(prefill_tp, ours.tp_size, ours.tp_rank)
    ranks = [fp.tp_rank for _, fp in shards]
    if ranks != want or any(fp.tp_size != prefill_tp for _, fp in shards):
        raise IncompatibleFingerprintError(
            f"decode rank {ours.tp_rank} of {ours.tp_size} needs prefill ranks {want} of "
            f"{prefill_tp}, got {ranks}",
            differences={"tp_rank": (want, ranks)},
            field="tp_rank",
        )
    expected = head_ranges(num_kv_heads, prefill_tp)
    for tensor, fp in shards:
        first, stop = expected[fp.tp_rank]
        if tensor.shape[1] != stop - first:
            raise _tp_refusal(
                f"prefill rank {fp.tp_rank} sent {tensor.shape[1]} KV heads, not {stop - first}",
                ours.tp_size,
                prefill_tp,
                num_kv_heads,
            )
    tagged = [_with_fp(tensor, fp) for tensor, fp in shards]
    if prefill_tp == ours.tp_size:
        out = tagged[0]
    elif ours.tp_size % prefill_tp == 0:
        k = ours.tp_size // prefill_tp
        out = split_heads(tagged[0], k)[ours.tp_rank % k]
    else:
        first, stop = head_ranges(num_kv_heads, ours.tp_size)[ours.tp_rank]
        if prefill_tp % ours.tp_size == 0:
            out = merge_heads(tagged, num_heads=stop - first)
        else:
            full = merge_heads(tagged, num_heads=num_kv_heads)
            out = split_heads(full, ours.tp_size)[ours.tp_rank]
    got = fingerprint_from_metadata(out.metadata)
    assert got is not None  # every shard was tagged
    diff = differences(ours, got, ignore=("block_size", "kv_cache_layout"))
    if diff:
        raise refuse_differences("the converted pages are not this rank's", diff)
    return out


def refuse_differences(
    message: str, diff: dict[str, tuple[object, object]]
) -> IncompatibleFingerprintError:
    """The refusal of fingerprints that differ, naming each field here and there."""
    listed = ", ".join(f"{k} {a!r} here, {b!r} there" for k, (a, b) in diff.items())
    return IncompatibleFingerprintError(f"{message}: {listed}", differences=diff)
