"""Pieces every engine adapter needs: array intake, index tables, pair checks."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from hurray_wire._interop import _torch, as_numpy, is_device_tensor, is_torch, numpy_to_torch
from hurray_wire.dtypes import element_type_of
from hurray_wire.errors import ArgumentTypeError, IndexBufferError, InvalidTensorError, flag
from hurray_wire.tensor import BlockPagedTensor

Array = npt.NDArray[Any]
Pair = tuple[BlockPagedTensor, BlockPagedTensor]


def array(value: Any, name: str) -> Array:
    """A NumPy array of ``value`` (torch tensors through DLPack, no copy on CPU)."""
    value = as_numpy(value, name)
    if isinstance(value, np.ndarray):
        return value
    raise ArgumentTypeError(
        "expected a NumPy array or torch tensor", field=name, found=type(value).__name__
    )


def int_vector(value: Any, name: str) -> Array:
    """A 1-D array of non-negative integers as int64 (lists, NumPy, torch)."""
    value = as_numpy(value, name)
    try:
        result = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise IndexBufferError(f"not an integer array ({exc})", field=name) from None
    if result.size == 0:
        return np.zeros(0, np.int64)
    if result.ndim != 1 or result.dtype.kind not in "iu":
        raise IndexBufferError(
            "must be a 1-D integer array",
            field=name,
            found=f"dtype {result.dtype}, shape {result.shape}",
        )
    refuse_first(result < 0, result, "negative value at position {}", name)
    return result.astype(np.int64)


def refuse_first(broken: Array, values: Array, message: str, name: str, **kw: Any) -> None:
    """An ``IndexBufferError`` at the first True of ``broken`` (its position fills ``{}`` in
    ``message``), naming the value there: the one form of every per-entry refusal."""
    if broken.any():
        bad = int(np.argmax(broken))
        raise IndexBufferError(message.format(bad), position=bad, field=name,
                               found=int(values[bad]), **kw)  # fmt: skip


def from_table(
    block_table: Any, lens: Array, page_size: int, name: str = "block_table"
) -> tuple[Array, Array]:
    """``(block_table, seq_ptr)`` from ragged per-sequence lists or a padded 2-D table.

    Row ``s`` uses its first ``ceil(seq_lens[s] / page_size)`` entries; the rest (padding or
    blocks allocated ahead) is ignored. ``name``: the caller's argument, named by errors.
    """
    need = -(-lens // page_size)  # pages per sequence
    seq_ptr = np.concatenate(([0], np.cumsum(need))).astype(np.int64)
    block_table = as_numpy(block_table, name)
    if (
        isinstance(block_table, (str, bytes))
        or getattr(block_table, "ndim", 1) == 0
        or not hasattr(block_table, "__len__")
    ):
        raise ArgumentTypeError(
            f"{name} must be a 2-D table or a list of lists",
            field=name,
            found=type(block_table).__name__,
        )
    if len(block_table) != len(lens):
        raise IndexBufferError(
            f"{name} needs one row per sequence",
            field=name,
            found=len(block_table),
            expected=len(lens),
        )
    if isinstance(block_table, np.ndarray) and block_table.ndim == 2:
        width = block_table.shape[1]
        if block_table.dtype.kind not in "iu" and block_table.size:
            raise IndexBufferError(
                f"{name} must hold integers", field=name, found=f"dtype {block_table.dtype}"
            )
        if len(need) and int(need.max()) > width:
            seq = int(np.argmax(need > width))
            raise IndexBufferError(
                f"sequence {seq} needs more blocks than the table has columns",
                position=seq,
                field=name,
                found=width,
                expected=f">= {int(need[seq])}",
            )
        return int_vector(block_table[np.arange(width)[None, :] < need[:, None]], name), seq_ptr
    rows = [int_vector(row, f"{name}[{s}]") for s, row in enumerate(block_table)]
    short = [s for s, row in enumerate(rows) if len(row) < need[s]]
    if short:
        s = short[0]
        raise IndexBufferError(
            f"sequence {s} has {int(lens[s])} tokens but {len(rows[s])} blocks",
            position=s,
            field=name,
            found=len(rows[s]),
            expected=f">= {int(need[s])}",
        )
    used = [r[:n] for r, n in zip(rows, need.tolist(), strict=True)]
    return np.concatenate(used or [np.zeros(0, np.int64)]), seq_ptr


def padded_rows(values: Array, seq_ptr: Array, width: int | None = None) -> Array:
    """Ragged rows (``values[seq_ptr[s]:seq_ptr[s + 1]]``) as ``[num_seqs, width]`` int32
    padded with zeros."""
    sp = seq_ptr.astype(np.int64)
    counts = np.diff(sp)
    longest = int(counts.max()) if counts.size else 0
    width = longest if width is None else width
    if width < longest:
        raise InvalidTensorError(
            "the table is narrower than the longest sequence",
            field="max_blocks",
            found=width,
            expected=f">= {longest}",
        )
    table = np.zeros((len(counts), width), np.int32)
    rows = np.repeat(np.arange(len(counts)), counts)
    cols = np.arange(len(values)) - np.repeat(sp[:-1], counts)
    table[rows, cols] = int32(values, "block_table")
    return table


def int32(values: Array, name: str) -> Array:
    """``values`` as int32 (engines' index type); a view when already uint32/int32 and fit."""
    if values.size and int(values.max()) > 0x7FFFFFFF:
        raise IndexBufferError("values do not fit int32", field=name, found=int(values.max()))
    if values.dtype == np.dtype("<u4") or values.dtype == np.dtype("<i4"):
        return values.view(np.int32)
    return values.astype(np.int32)


def lens_of(tensor: BlockPagedTensor) -> Array:
    """Sequence lengths as int32 (every page full when the tensor carries none)."""
    if tensor.seq_lens is not None:
        return int32(tensor.seq_lens, "seq_lens")
    return int32(np.diff(tensor.seq_ptr.astype(np.int64)) * tensor.layout.page_size, "seq_lens")


def last_page_tokens(tensor: BlockPagedTensor) -> tuple[Array, Array]:
    """``(pages, tokens in the last page)`` per sequence, int64 (0 tokens without pages)."""
    counts = np.diff(tensor.seq_ptr.astype(np.int64))
    lens = lens_of(tensor).astype(np.int64)
    return counts, np.where(counts > 0, lens - (counts - 1) * tensor.layout.page_size, 0)


def role_tensors(
    pools: list[tuple[str, Any]],
    table: Array,
    seq_ptr: Array,
    lens: Array,
    layer_index: int | None,
    scales: dict[str, float | None],
    metadata: dict[str, Any] | None = None,
) -> BlockPagedTensor | Pair:
    """One tensor per ``(role, pool)`` over one index: the tensor alone, or the pair."""
    tensors = tuple(
        BlockPagedTensor.from_arrays(
            pool,
            table,
            seq_ptr,
            seq_lens=lens,
            kv_role=role,
            layer_index=layer_index,
            kv_scale=scales.get(role),
            metadata=metadata,
        )
        for role, pool in pools
    )
    return tensors[0] if len(tensors) == 1 else (tensors[0], tensors[1])


def check_pair(value: Any, name: str) -> Pair:
    """A ``(key, value)`` pair of tensors over one batch and pool geometry."""
    if not (
        isinstance(value, tuple)
        and len(value) == 2
        and all(isinstance(t, BlockPagedTensor) for t in value)
    ):
        raise ArgumentTypeError(
            "expected a BlockPagedTensor or a (key, value) pair of them",
            field=name,
            found=type(value).__name__,
        )
    key, val = value
    if (key.kv_role, val.kv_role) != ("key", "value"):
        raise InvalidTensorError(
            "the pair must be (key, value)", field=name, found=(key.kv_role, val.kv_role)
        )
    for what, mine, theirs in (
        ("shape", key.shape, val.shape),
        ("element_type", key.element_type, val.element_type),
        ("their layout", key.layout.replace(kv_role="value"), val.layout),
    ):
        if mine != theirs:
            expected = key.layout if what == "their layout" else mine
            raise InvalidTensorError(
                f"key and value differ in {what}", field=name, found=theirs, expected=expected
            )
    for attr in ("block_table", "seq_ptr", "seq_lens"):
        a, b = getattr(key, attr), getattr(val, attr)
        if (a is None) != (b is None) or (a is not None and not np.array_equal(a, b)):
            raise InvalidTensorError(f"key and value differ in {attr}", field=name)
    return key, val


def check_choice(value: object, name: str, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ArgumentTypeError(
            f"{name} must be one of {choices}", field=name, found=repr(value), expected=choices
        )
    return value


# -- engine element types, scales and outputs (shared by every engine adapter) -------------

# Engine dtype names (torch's, and the engines' cache-dtype settings) -> hurray element types.
_ENGINE_DTYPES = {
    alias: element
    for element, aliases in (
        ("float16", "float16 half fp16"),
        ("bfloat16", "bfloat16 bf16"),
        ("float32", "float32 float fp32"),
        ("float8_e4m3", "float8_e4m3fn float8_e4m3 fp8_e4m3 fp8"),
        ("float8_e5m2", "float8_e5m2 fp8_e5m2"),
    )
    for alias in aliases.split()
}


def engine_dtype_name(value: Any) -> str:
    """A dtype name from a torch dtype, a NumPy dtype or a string (``torch.`` dropped)."""
    if isinstance(value, (np.dtype, type)):
        return str(np.dtype(value).name)
    return str(value).removeprefix("torch.")


def engine_buffer(values: Any, name: str, dtype: Any) -> Any:
    """An engine's cache buffer viewed as the element type it holds, without a copy (a device
    tensor stays where it is). Engines store fp8 as uint8 (``index_put`` lacks float8): such a
    buffer needs ``dtype``, the engine's cache dtype, so that fp8 travels as float8 (spec [A12])."""
    if not is_device_tensor(values):
        values = array(values, name)
    stored = engine_dtype_name(values.dtype)
    if dtype is None:
        if stored in ("uint8", "int8"):
            raise InvalidTensorError(
                f"a {stored} cache is how engines store fp8 (as uint8): pass dtype= the "
                "engine's cache dtype (e.g. pool.dtype: torch.float8_e4m3fn or "
                "torch.float8_e5m2) so that it travels as float8",
                field="dtype",
                found=f"{name} of {stored}, dtype None",
            )
        if stored not in _ENGINE_DTYPES:
            raise InvalidTensorError(
                "no engine KV cache has this element type",
                field=name,
                found=stored,
                expected=sorted(set(_ENGINE_DTYPES.values())),
            )
        return values
    want_name = _ENGINE_DTYPES.get(engine_dtype_name(dtype))
    if want_name is None:
        raise ArgumentTypeError(
            "dtype is not an engine KV cache dtype hurray-wire carries",
            field="dtype",
            found=repr(dtype),
            expected=sorted(_ENGINE_DTYPES),
        )
    if _ENGINE_DTYPES.get(stored) == want_name:
        return values
    width = element_type_of(want_name).itemsize
    if stored != "uint8" or width != 1:
        raise InvalidTensorError(
            f"the buffer's dtype {stored} does not hold {want_name} (only fp8 is stored as uint8)",
            field=name,
            found=stored,
            expected=want_name,
        )
    if is_torch(values):  # torch's names: float8_e4m3fn, float8_e5m2
        return values.view(getattr(_torch(), want_name + "fn" * (want_name == "float8_e4m3")))
    return values.view(element_type_of(want_name).numpy_dtype)


def per_tensor_scale(value: Any, name: str, why: str, per_head: bool = False) -> float | None:
    """An engine's per-tensor fp8 scale as a float (a number, or a one-element tensor as the
    attention layer keeps it; ``per_head``: one equal value per KV head too, as vLLM's
    checkpoints hold it). Several values are refused with ``why``, the engine's rule."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name} must be a number", field=name, found=repr(value))
    if isinstance(value, (int, float, np.integer, np.floating)):
        return float(value)
    try:
        values = np.asarray(as_numpy(value, name))
    except (ValueError, TypeError):  # ragged nesting
        values = np.asarray(None)
    if values.dtype.kind not in "fiu" or (per_head and (values.ndim > 1 or values.size == 0)):
        raise ArgumentTypeError(
            f"{name} must be a number or a one-element tensor"
            + (", or one value per KV head" if per_head else ""),
            field=name,
            found=type(value).__name__ if values.ndim < 2 else f"shape {values.shape}",
        )
    flat = values.astype(np.float64).reshape(-1)
    if per_head and flat.size > 1:
        if not np.all(flat == flat[0]):
            raise InvalidTensorError(f"{name} differs between KV heads: {why}", field=name,
                                     found=flat.tolist())  # fmt: skip
        flat = flat[:1]
    if flat.size != 1:
        raise InvalidTensorError(
            f"{name} must be one per-tensor scale: {why}",
            field=name,
            found=f"shape {values.shape}",
        )
    return float(flat[0])


def engine_outputs(values: tuple[Any, ...], names: tuple[str, ...], as_torch: bool) -> Any:
    """``values`` as they are (NumPy), or as CPU torch tensors of the same dtypes (tuples
    inside mapped too; ``_interop.numpy_to_torch``): the one way adapters hand torch out."""
    if not flag(as_torch, "as_torch"):
        return values

    def convert(value: Any, name: str) -> Any:
        if isinstance(value, tuple):
            return tuple(convert(v, f"{name}[{i}]") for i, v in enumerate(value))
        return numpy_to_torch(np.asarray(value), name)

    return tuple(convert(v, n) for v, n in zip(values, names, strict=True))
