"""The ``kv_transfer_params`` of a HurrayConnector transfer and the prompt digest that names
what its pages are the keys and values of (docs/vllm.md § params); no vLLM, no I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from hurray_wire.errors import ArgumentTypeError
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.wire.fast import item_dtype
from hurray_wire.wire.transfer import PROMPT_TOKEN_ITEM

__all__ = ["TransferParams", "identity", "one_sequence", "prompt_digest", "sequence_pages"]


def prompt_digest(token_ids: Sequence[int]) -> str:
    """What the pages are the keys and values of: xxh3-128 of the prompt's token ids (int64
    little endian), hex. A transfer carries it; a decode request whose own prompt gives
    another digest is refused (the stale-reference case of vLLM #52234)."""
    ids = np.asarray(list(token_ids), dtype=item_dtype(PROMPT_TOKEN_ITEM))
    return xxhash.xxh3_128_hexdigest(ids.tobytes())


def identity(
    transfer_id: str, request_id: str, digest: str, first: int, held: int, num_tokens: int
) -> dict[str, Any]:
    """What a transfer's stream header (or each NIXL blob) says it is: the prefill side
    writes it, the decode side compares it with what it asked for."""
    return {
        "vllm.transfer_id": transfer_id,
        "vllm.request_id": request_id,
        "vllm.prompt_digest": digest,
        "vllm.first_page": first,
        "vllm.held_pages": held,
        "vllm.num_tokens": num_tokens,
    }


def one_sequence(pages: npt.NDArray[Any], num_tokens: int, **kwargs: Any) -> BlockPagedTensor:
    """Pages ``[pages, block_size, H, D]`` as one sequence of ``num_tokens`` tokens, page
    ``i`` its ``i``-th: the form a request's pages travel, are hashed and land in."""
    count = pages.shape[0]
    return BlockPagedTensor.from_arrays(
        pages,
        np.arange(count, dtype=np.uint32),
        np.array([0, count], dtype=np.uint32),
        seq_lens=np.array([num_tokens], dtype=np.uint32),
        **kwargs,
    )


def sequence_pages(tensor: BlockPagedTensor) -> npt.NDArray[Any]:
    """A one-sequence tensor's pages in sequence order, ``[pages, block_size, H, D]``: a view
    of its pool when they are consecutive pages of it (no copy), else a gathered copy."""
    pool = np.asarray(tensor.page_pool)
    table = np.asarray(tensor.block_table).reshape(-1).astype(np.int64)
    if table.size and (np.diff(table) == 1).all():
        return pool[int(table[0]) : int(table[0]) + table.size]
    pages: npt.NDArray[Any] = pool[table]
    return pages


@dataclass(frozen=True)
class TransferParams:
    """The ``kv_transfer_params`` a prefill engine returns and a decode request carries."""

    transfer_id: str
    request_id: str
    host: str
    port: int
    block_ids: tuple[int, ...]
    num_tokens: int
    block_size: int
    prompt_digest: str
    #: The prefill engine's TP degree: its rank ``r`` serves its heads on ``port + r``.
    tp_size: int = 1

    def to_params(self) -> dict[str, Any]:
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "hurray_transfer_id": self.transfer_id,
            "remote_request_id": self.request_id,
            "remote_host": self.host,
            "remote_port": self.port,
            "remote_block_ids": list(self.block_ids),
            "remote_num_tokens": self.num_tokens,
            "remote_block_size": self.block_size,
            "prompt_digest": self.prompt_digest,
            "remote_tp_size": self.tp_size,
        }

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> TransferParams:
        """Validated params; a missing or mistyped key raises ``ArgumentTypeError``."""

        def get(name: str, kind: type) -> Any:
            value = params.get(name)
            if type(value) is not kind:
                raise ArgumentTypeError(
                    f"kv_transfer_params[{name!r}] must be a {kind.__name__}",
                    field=name,
                    found=repr(value),
                )
            return value

        blocks = get("remote_block_ids", list)
        if not all(type(b) is int and b >= 0 for b in blocks):
            raise ArgumentTypeError(
                "kv_transfer_params['remote_block_ids'] must be non-negative ints",
                field="remote_block_ids",
                found=repr(blocks[:8]),
            )
        port = get("remote_port", int)
        tokens = get("remote_num_tokens", int)
        size = get("remote_block_size", int)
        tp_size = get("remote_tp_size", int)
        for name, value, low, high in (
            ("remote_tp_size", tp_size, 1, 1 << 16),
            ("remote_port", port, 1, 65535),
            ("remote_num_tokens", tokens, 0, 1 << 40),
            ("remote_block_size", size, 1, 1 << 20),
        ):
            if not low <= value <= high:
                raise ArgumentTypeError(f"{name} must be in {low}..{high}", field=name, found=value)
        if port + tp_size - 1 > 65535:
            raise ArgumentTypeError(
                "remote_port + remote_tp_size - 1 must be a port",
                field="remote_tp_size",
                found=tp_size,
            )
        return cls(
            transfer_id=get("hurray_transfer_id", str),
            request_id=get("remote_request_id", str),
            host=get("remote_host", str),
            port=port,
            block_ids=tuple(blocks),
            num_tokens=tokens,
            block_size=size,
            prompt_digest=get("prompt_digest", str),
            tp_size=tp_size,
        )
