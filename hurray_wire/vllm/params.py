"""A transfer's ``kv_transfer_params`` and prompt digest (docs/vllm.md § params)."""

from __future__ import annotations

import contextlib
import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from hurray_wire._interop import rows_at
from hurray_wire.errors import ArgumentTypeError
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.wire.fast import item_dtype
from hurray_wire.wire.transfer import PROMPT_TOKEN_ITEM

__all__ = [
    "TransferParams",
    "check_host",
    "identity",
    "one_sequence",
    "prompt_digest",
    "refusal",
    "request_kind",
    "sequence_pages",
]


def prompt_digest(token_ids: Sequence[int]) -> str:
    """xxh3-128 (hex) of the prompt's token ids as int64 LE: a decode request whose prompt
    gives another is refused (vLLM #52234's stale reference)."""
    ids = np.asarray(list(token_ids), dtype=item_dtype(PROMPT_TOKEN_ITEM))
    return xxhash.xxh3_128_hexdigest(ids.tobytes())


def identity(
    transfer_id: str, request_id: str, digest: str, first: int, held: int, num_tokens: int
) -> dict[str, Any]:
    """What a transfer's stream header (or NIXL blob) says it is, checked by the decode side."""
    return {
        "vllm.transfer_id": transfer_id,
        "vllm.request_id": request_id,
        "vllm.prompt_digest": digest,
        "vllm.first_page": first,
        "vllm.held_pages": held,
        "vllm.num_tokens": num_tokens,
    }


def one_sequence(pages: npt.NDArray[Any], num_tokens: int, **kwargs: Any) -> BlockPagedTensor:
    """Pages ``[pages, block_size, H, D]`` as one sequence of ``num_tokens`` tokens: the form
    a request's pages travel, are hashed and land in."""
    count = pages.shape[0]
    return BlockPagedTensor.from_arrays(
        pages,
        np.arange(count, dtype=np.uint32),
        np.array([0, count], dtype=np.uint32),
        seq_lens=np.array([num_tokens], dtype=np.uint32),
        **kwargs,
    )


def sequence_pages(tensor: BlockPagedTensor) -> npt.NDArray[Any]:
    """A one-sequence tensor's pages in order: a view of its pool when consecutive."""
    table = np.asarray(tensor.block_table).reshape(-1).astype(np.int64)
    return rows_at(np.asarray(tensor.page_pool), table)


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
    def from_params(cls, params: object) -> TransferParams:
        """Every field's type and range checked (bool is not an int), the block ids those
        ``num_tokens`` need; else an ``ArgumentTypeError`` naming the field."""
        params = _mapping(params)
        if params.get("do_remote_prefill") is not True or params.get("do_remote_decode") not in (
            None,
            False,
        ):
            raise ArgumentTypeError(
                "kv_transfer_params of a pull need do_remote_prefill true and "
                "do_remote_decode false", field="do_remote_decode",
                found=repr((params.get("do_remote_prefill"), params.get("do_remote_decode"))),
            )  # fmt: skip
        ints = {name: _int(params, name, low, high) for name, (low, high) in _INT_FIELDS.items()}
        port, tp_size = ints["remote_port"], ints["remote_tp_size"]
        tokens, size = ints["remote_num_tokens"], ints["remote_block_size"]
        if port + tp_size - 1 > 65535:
            raise ArgumentTypeError(
                "remote_port + remote_tp_size - 1 must be a port",
                field="remote_tp_size",
                found=tp_size,
            )
        blocks = params.get("remote_block_ids")
        needed = -(-tokens // size)
        if type(blocks) is not list or len(blocks) != needed:
            raise ArgumentTypeError(
                "kv_transfer_params['remote_block_ids'] must list the blocks "
                "remote_num_tokens / remote_block_size need", field="remote_block_ids",
                expected=f"a list of {needed}", found=_brief(blocks),
            )  # fmt: skip
        if not all(type(b) is int and 0 <= b <= MAX_BLOCK_ID for b in blocks):
            raise ArgumentTypeError(
                f"kv_transfer_params['remote_block_ids'] must be ints in 0..{MAX_BLOCK_ID}",
                field="remote_block_ids",
                found=_brief(blocks),
            )
        return cls(
            transfer_id=_text(params, "hurray_transfer_id", _TOKEN),
            request_id=_text(params, "remote_request_id", _PRINTABLE),
            host=check_host(params.get("remote_host"), "remote_host"),
            port=port,
            block_ids=tuple(blocks),
            num_tokens=tokens,
            block_size=size,
            prompt_digest=_text(params, "prompt_digest", _DIGEST),
            tp_size=tp_size,
        )


MAX_TEXT = 256  # characters of an id in the params
MAX_BLOCK_ID = (1 << 31) - 1  # vLLM's block tables are int32
MAX_TOKENS = 1 << 24  # a prompt's tokens (16 M: over every model's context)
MAX_TP = 1024
_INT_FIELDS = {
    "remote_port": (1, 65535),
    "remote_num_tokens": (1, MAX_TOKENS),
    "remote_block_size": (1, 1 << 16),
    "remote_tp_size": (1, MAX_TP),
}
_TOKEN = re.compile(rf"[A-Za-z0-9._:-]{{1,{MAX_TEXT}}}")
_PRINTABLE = re.compile(rf"[\x21-\x7e]{{1,{MAX_TEXT}}}")  # printable ASCII, no space
_DIGEST = re.compile(r"[0-9a-f]{32}")
_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")  # "_": docker service names


def _brief(value: object) -> str:
    """A bounded repr of a value a peer sent (an int of 4,300 digits, a list of millions)."""
    if isinstance(value, list):
        return f"list of {len(value)}: " + ", ".join(_brief(v) for v in value[:4])[:120]
    if type(value) is int and not -(10**18) < value < 10**18:
        return f"an int of {value.bit_length()} bits"
    text = repr(value) if isinstance(value, (str, int, float, bool, type(None))) else None
    return text[:120] if text is not None else type(value).__name__


def _mapping(params: object) -> Mapping[str, Any]:
    if not isinstance(params, Mapping):
        raise ArgumentTypeError(
            "kv_transfer_params must be a mapping",
            field="kv_transfer_params",
            found=type(params).__name__,
        )
    return params


def _int(params: Mapping[str, Any], name: str, low: int, high: int) -> int:
    value = params.get(name)
    if type(value) is not int or not low <= value <= high:
        raise ArgumentTypeError(f"kv_transfer_params[{name!r}] must be an int in {low}..{high}",
                                field=name, found=_brief(value))  # fmt: skip
    return value


def _text(params: Mapping[str, Any], name: str, pattern: re.Pattern[str]) -> str:
    value = params.get(name)
    if type(value) is not str or not pattern.fullmatch(value):
        raise ArgumentTypeError(f"kv_transfer_params[{name!r}] must match {pattern.pattern}",
                                field=name, found=_brief(value))  # fmt: skip
    return value


def check_host(value: object, name: str, *, bind: bool = False) -> str:
    """An IP address or DNS name to connect to (``bind``: to listen on, where ``0.0.0.0`` and
    ``::`` mean every interface); unspecified and multicast addresses name no peer."""
    text = value if type(value) is str and 0 < len(value) <= 253 else ""
    address = None
    with contextlib.suppress(ValueError):
        address = ipaddress.ip_address(text)
    if address is None and not (text and all(map(_LABEL.fullmatch, text.split(".")))):
        raise ArgumentTypeError(f"{name} must be an IP address or a DNS name",
                                field=name, found=_brief(value))  # fmt: skip
    if address is not None and ((address.is_unspecified and not bind) or address.is_multicast):
        raise ArgumentTypeError(f"{name} names no single peer", field=name, found=value)
    return text


#: The key a connector puts in place of params that are not a mapping (``refusal``), so
#: that vLLM, which reads them with ``.get`` right after ``on_new_request``, sees a dict.
REFUSED_KEY = "hurray_refused"


def refusal(params: object) -> dict[str, str] | None:
    """A stand-in for params that are neither None nor a mapping (vLLM 0.32 / 0.33 would end
    their engine core on ``params.get``), which ``request_kind`` refuses; else None."""
    if params is None or isinstance(params, Mapping):
        return None
    return {REFUSED_KEY: f"kv_transfer_params must be a mapping, not {type(params).__name__}"}


def request_kind(params: object) -> str:
    """``"local"``, ``"save"`` (``do_remote_decode``) or ``"load"`` (``do_remote_prefill``,
    checked in full); bad params raise ``ArgumentTypeError`` (the scheduler's load error)."""
    if params is None or (isinstance(params, Mapping) and not params):
        return "local"
    params = _mapping(params)
    if REFUSED_KEY in params:
        raise ArgumentTypeError(str(params[REFUSED_KEY]), field="kv_transfer_params")
    flags = {name: params.get(name) for name in ("do_remote_prefill", "do_remote_decode")}
    for name, value in flags.items():
        if value is not None and type(value) is not bool:
            raise ArgumentTypeError(f"kv_transfer_params[{name!r}] must be a bool",
                                    field=name, found=_brief(value))  # fmt: skip
    if flags["do_remote_prefill"] and flags["do_remote_decode"]:
        raise ArgumentTypeError(
            "kv_transfer_params ask for both a remote prefill and a remote decode",
            field="do_remote_decode", found=True,
        )  # fmt: skip
    if flags["do_remote_prefill"]:
        TransferParams.from_params(params)
        return "load"
    return "save" if flags["do_remote_decode"] else "local"
