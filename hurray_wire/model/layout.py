"""BlockPagedLayout (layout tag 0x0A: page geometry, kv role, layer, index type) and its
rules, the storage invariants of the index buffers and seq_lens included (block-paged.md
§§ 2-4, 7-8); ``hurray_wire.wire.descriptor`` holds its bytes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import FrozenInstanceError, astuple, dataclass, replace
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from hurray_wire.errors import IndexBufferError, InvalidDescriptorError
from hurray_wire.model._checks import U32_MAX, U64_MAX, check_uint
from hurray_wire.model.quantization import Quantization, check_block_paged_compatibility
from hurray_wire.wire.descriptor import INDEX_ITEMS, KV_ROLES
from hurray_wire.wire.fast import item_dtype

KV_ROLE_NAMES = tuple(KV_ROLES)  # in code order: key, value, fused
INDEX_TYPE_NAMES = ("uint32", "uint64")
DYNAMIC_DIM = U64_MAX  # the shape's "size unknown" sentinel: refused for block-paged ([A38])
_INDEX_DTYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(item_dtype(item)) for name, item in INDEX_ITEMS.items()
}


@dataclass(frozen=True, slots=True)
class BlockPagedLayout:
    """The block-paged payload: immutable, equal and hashable by value, validated on
    construction (so a layout that exists is one the wire can carry)."""

    page_size: int
    """Tokens per page (>= 1)."""
    num_pages: int
    """Physical pages in the pool."""
    paged_axis: int
    """Always 0 in this version."""
    num_seqs: int
    """Sequences in the batch (0 = the empty batch)."""
    kv_role: str = "key"
    """``"key"``, ``"value"`` or ``"fused"``."""
    layer_index: int | None = None
    """The layer, or None when not layer-scoped (wire 0xFFFFFFFF)."""
    block_table_index_type: str = "uint32"
    """``"uint32"`` or ``"uint64"``: the type of block_table and seq_ptr."""

    tag: ClassVar[int] = 0x0A
    name: ClassVar[str] = "block_paged"
    buffer_count: ClassVar[int] = 3
    is_dense: ClassVar[bool] = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise the checked values once, here
        set_(self, "page_size", check_uint(self.page_size, "page_size", U32_MAX, minimum=1))
        set_(self, "num_pages", check_uint(self.num_pages, "num_pages", U64_MAX))
        axis = check_uint(self.paged_axis, "paged_axis", U32_MAX)
        if axis != 0:
            raise InvalidDescriptorError(
                "must be 0 in this version", field="paged_axis", found=axis
            )
        set_(self, "paged_axis", 0)
        set_(self, "num_seqs", check_uint(self.num_seqs, "num_seqs", U32_MAX))
        for name, names in (
            ("kv_role", KV_ROLE_NAMES),
            ("block_table_index_type", INDEX_TYPE_NAMES),
        ):
            value = getattr(self, name)
            if not isinstance(value, str) or value not in names:
                raise InvalidDescriptorError(
                    f"unknown {name}", field=name, found=repr(value), expected=names
                )
        layer_index = self.layer_index
        if layer_index is not None:
            layer_index = check_uint(layer_index, "layer_index", U32_MAX)
            if layer_index == U32_MAX:
                raise InvalidDescriptorError(
                    "0xFFFFFFFF is the wire sentinel for None; pass layer_index=None",
                    field="layer_index",
                    found="0xFFFFFFFF",
                )
            set_(self, "layer_index", layer_index)
        if self.block_table_index_type == "uint32" and self.num_pages > U32_MAX:
            raise InvalidDescriptorError(
                "a pool of more than 0xFFFFFFFF pages needs block_table_index_type='uint64'",
                field="num_pages",
                found=self.num_pages,
            )

    def __reduce__(self) -> tuple[Any, ...]:
        return (BlockPagedLayout, astuple(self))

    def replace(self, **changes: Any) -> BlockPagedLayout:
        """A copy with some fields changed (validated like a new layout)."""
        return replace(self, **changes)

    @property
    def index_dtype(self) -> np.dtype[Any]:
        """Little-endian NumPy dtype of block_table and seq_ptr (buffers 1 and 2)."""
        return _INDEX_DTYPES[self.block_table_index_type]

    @property
    def index_max(self) -> int:
        """Largest value the index type can hold."""
        return (1 << 8 * self.index_dtype.itemsize) - 1

    @property
    def page_slots(self) -> int:
        """num_pages * page_size: page-slot count, the length of per-slot scale arrays."""
        return self.num_pages * self.page_size

    def validate_against_shape(self, shape: Sequence[int]) -> tuple[int, int, int]:
        """``shape`` as ints, or the error if it is not ``[total_tokens, num_heads, head_dim]``."""
        try:
            dims = list(shape)
        except TypeError:
            raise InvalidDescriptorError(
                "shape must be a sequence of integers", field="shape", found=repr(shape)
            ) from None
        if len(dims) != 3:
            raise InvalidDescriptorError(
                "block-paged tensors are rank 3 [total_tokens, num_heads, head_dim]",
                field="rank",
                found=len(dims),
                expected=3,
            )
        for axis, dim in enumerate(dims):
            value = dims[axis] = check_uint(dim, f"shape[{axis}]", U64_MAX)
            if value == DYNAMIC_DIM:
                raise InvalidDescriptorError(
                    "dynamic dimensions are not allowed in a block-paged shape",
                    field=f"shape[{axis}]",
                    found="0xFFFFFFFFFFFFFFFF",
                )
        if self.num_seqs == 0 and dims[0] != 0:
            raise InvalidDescriptorError(
                "an empty batch (num_seqs 0) has total_tokens 0", field="shape[0]", found=dims[0]
            )
        return dims[0], dims[1], dims[2]

    def validate_index_buffers(self, seq_ptr: Any, block_table: Any) -> None:
        """Check the storage invariants (block-paged.md § 4) of ``(seq_ptr, block_table)``,
        lists or integer arrays, vectorised; the message names the first offending entry."""
        sp = _as_index_array(seq_ptr, "seq_ptr", self.index_max)
        bt = _as_index_array(block_table, "block_table", self.index_max)
        check_indexes(sp, bt, self.num_pages, self.num_seqs)

    def validate_quantization_compatibility(self, quantization: Quantization | None) -> None:
        """Refuse a scheme that block-paged does not admit (block-paged.md § 7)."""
        check_block_paged_compatibility(quantization, self.page_size)


def _immutable(self: BlockPagedLayout, name: str, *value: object) -> None:
    raise FrozenInstanceError(f"BlockPagedLayout is immutable (tried to change {name!r})")


# The generated frozen __setattr__ of a slots dataclass fails with a TypeError on names that
# are not fields (CPython gh-90562); every change must be an AttributeError.
BlockPagedLayout.__setattr__ = _immutable  # type: ignore[assignment, method-assign]
BlockPagedLayout.__delattr__ = _immutable  # type: ignore[assignment, method-assign]


def _as_index_array(value: Any, name: str, index_max: int) -> npt.NDArray[Any]:
    """An integer array of any dtype whose values all fit the index type."""
    if type(value) is np.ndarray and value.ndim == 1 and value.size:
        given: npt.NDArray[Any] = value
        if given.dtype.kind == "u" and index_max >= (1 << (8 * given.dtype.itemsize)) - 1:
            return given  # every value of this dtype fits (the common case, checked first)
    try:
        array = np.asarray(value)
        inferred_float = array.dtype.kind == "f"
        if array.dtype.kind == "f" and not isinstance(value, np.ndarray):
            # NumPy infers float64 for lists mixing small ints with ints >= 2**63
            array = np.asarray(value, dtype=object)
    except (ValueError, TypeError, OverflowError) as exc:
        raise IndexBufferError(f"not an integer array ({exc})", field=name) from None
    if array.ndim != 1:
        raise IndexBufferError("must be one-dimensional", field=name, found=f"shape {array.shape}")
    if array.size == 0:
        return np.zeros(0, np.uint64)
    if array.dtype.kind == "O":
        items = array.tolist()
        floats = [p for p, item in enumerate(items) if isinstance(item, float)]
        if floats:  # a dtype problem, not a range one: say so
            raise IndexBufferError(
                "must hold integers",
                position=floats[0],
                field=name,
                found="float64" if inferred_float else f"float at position {floats[0]}",
                expected="integers",
            )
        for position, item in enumerate(items):
            if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item <= index_max:
                raise IndexBufferError(
                    f"value at position {position} does not fit the index type",
                    position=position,
                    field=name,
                    found=repr(item),
                    expected=f"0..{index_max}",
                )
        return np.asarray(array.tolist(), np.uint64)
    if array.dtype.kind not in "iu":
        raise IndexBufferError("must hold integers", field=name, found=str(array.dtype))
    if array.dtype.kind == "u" and index_max >= (1 << (8 * array.dtype.itemsize)) - 1:
        return array  # every value of this dtype fits: no reduction needed
    low = int(array.min())
    high = int(array.max())
    if low < 0 or high > index_max:
        bad = np.flatnonzero((array < 0) | (array > index_max))[0]
        raise IndexBufferError(
            f"value at position {bad} does not fit the index type",
            position=int(bad),
            field=name,
            found=int(array[bad]),
            expected=f"0..{index_max}",
        )
    return array


_SMALL = 512  # seq_ptr entries below which the ordering is checked on a Python list
_SMALL_TABLE = 64  # entries below which Python integers beat NumPy's calls (check_indexes)


def check_index_arrays(
    seq_ptr: npt.NDArray[Any], block_table: npt.NDArray[Any], num_pages: int, num_seqs: int
) -> None:
    """Storage invariants 1-3 on integer arrays whose values are already non-negative."""
    if len(seq_ptr) != num_seqs + 1:
        raise IndexBufferError(
            "seq_ptr must have num_seqs + 1 entries",
            field="seq_ptr",
            found=len(seq_ptr),
            expected=num_seqs + 1,
        )
    if num_seqs < _SMALL:  # small: Python on a list beats three NumPy calls
        values = seq_ptr.tolist()
        first, last = values[0], values[-1]
        ordered = values == sorted(values)
    else:
        first, last = int(seq_ptr[0]), int(seq_ptr[-1])
        ordered = not np.less(seq_ptr[1:], seq_ptr[:-1]).any()
    if first != 0:
        raise IndexBufferError("seq_ptr[0] must be 0", position=0, field="seq_ptr", found=first)
    if not ordered:
        drops = seq_ptr[1:] < seq_ptr[:-1]
        bad = int(np.argmax(drops)) + 1
        raise IndexBufferError(
            f"seq_ptr decreases at position {bad}",
            position=bad,
            field="seq_ptr",
            found=int(seq_ptr[bad]),
            expected=f">= seq_ptr[{bad - 1}] = {int(seq_ptr[bad - 1])}",
        )
    count = len(block_table)
    if last != count:
        raise IndexBufferError(
            f"seq_ptr[{num_seqs}] must equal the number of block_table entries",
            position=num_seqs,
            field="seq_ptr",
            found=last,
            expected=count,
        )
    if count and int(np.maximum.reduce(block_table)) >= num_pages:
        bad = int(np.argmax(block_table >= num_pages))
        raise IndexBufferError(
            f"page id at position {bad} is outside the pool",
            position=bad,
            field="block_table",
            found=int(block_table[bad]),
            expected=f"< num_pages = {num_pages}",
        )


def check_indexes(
    seq_ptr: npt.NDArray[Any],
    block_table: npt.NDArray[Any],
    num_pages: int,
    num_seqs: int,
    lens: npt.NDArray[Any] | None = None,
    page_size: int = 1,
    total_tokens: int = 0,
) -> None:
    """Storage invariants 1-3 and, with ``lens``, the seq_lens rule: a few sequences in one pass
    over Python integers (cheaper than NumPy), else (or to name a failure) the two checks."""
    if num_seqs < _SMALL_TABLE and len(seq_ptr) == num_seqs + 1 and len(block_table) < _SMALL_TABLE:
        starts, table = seq_ptr.tolist(), block_table.tolist()
        ok = starts[0] == 0 and starts[-1] == len(table) and starts == sorted(starts)
        ok = ok and (not table or max(table) < num_pages)
        if ok and lens is not None:
            values = lens.tolist()
            ok = len(values) == num_seqs and sum(values) == total_tokens
            for k in range(num_seqs if ok else 0):
                if -(-values[k] // page_size) != starts[k + 1] - starts[k]:
                    ok = False
                    break
        if ok:
            return
    check_index_arrays(seq_ptr, block_table, num_pages, num_seqs)
    if lens is not None:
        check_seq_lens(lens, seq_ptr, page_size, total_tokens)


def _page_count_mismatch(
    lens: npt.NDArray[Any], seq_ptr: npt.NDArray[Any], page_size: int, largest: int
) -> int | None:
    """The first sequence whose page count is not ceil(len / page_size), or None: a shift
    for a power-of-two page size, else ``pages * P - P < len <= pages * P`` (no uint64
    division), where no term can wrap; the exact division otherwise."""
    capacity = int(seq_ptr[-1]) * page_size
    exact = capacity + page_size >= 2**64 or largest + page_size >= 2**64
    size = np.uint64(page_size)
    if not exact and page_size & (page_size - 1) == 0:
        needed = (lens + np.uint64(page_size - 1)) >> np.uint64(page_size.bit_length() - 1)
        ok = needed == (seq_ptr[1:] - seq_ptr[:-1])
        return None if ok.all() else int(np.argmin(ok))
    for start in range(0, len(lens), _BLOCK):  # blocks: temporaries stay in cache, unfaulted
        stop = min(start + _BLOCK, len(lens))
        part = lens[start:stop]
        pages = (seq_ptr[start + 1 : stop + 1] - seq_ptr[start:stop]).astype(np.uint64)
        if exact:
            ok = pages == part // size + (part % size != 0)  # ceil without wrapping
        else:
            cap = pages * size
            ok = (part <= cap) & (part + size > cap)
        if not ok.all():
            return start + int(np.argmin(ok))
    return None


# Elements per block of the vectorised checks: 64 KiB of uint64 temporaries, which the
# allocator reuses (a fresh array of a whole 100k-sequence batch costs a page fault per 4 KiB).
_BLOCK = 8192


def check_seq_lens(
    lens: npt.NDArray[Any], seq_ptr: npt.NDArray[Any], page_size: int, total_tokens: int
) -> None:
    """seq_lens agree with shape[0] and with each sequence's page count (ceil(len / P))."""
    num_seqs = len(seq_ptr) - 1
    if len(lens) != num_seqs:
        raise IndexBufferError(
            "seq_lens needs one entry per sequence",
            field="seq_lens",
            found=len(lens),
            expected=num_seqs,
        )
    seq: int | None = None
    if num_seqs < _SMALL_TABLE:  # a few sequences: exact Python integers beat NumPy's calls
        values, starts = lens.tolist(), seq_ptr.tolist()
        total = sum(values)
        if total == total_tokens:
            for k in range(num_seqs):
                if -(-values[k] // page_size) != starts[k + 1] - starts[k]:
                    seq = k
                    break
    else:
        largest = int(lens.max())
        if largest * num_seqs < 2**64:  # the uint64 sum cannot wrap
            total = int(lens.sum(dtype=np.uint64))
        else:
            total = sum(lens.tolist())
        if total == total_tokens:
            seq = _page_count_mismatch(lens, seq_ptr, page_size, largest)
    if total != total_tokens:
        raise IndexBufferError(
            "sum(seq_lens) must equal shape[0] (total_tokens)",
            position=0,
            field="seq_lens",
            found=total,
            expected=total_tokens,
        )
    if seq is not None:
        tokens = int(lens[seq])
        needed = -(-tokens // page_size)
        pages = int(seq_ptr[seq + 1]) - int(seq_ptr[seq])
        raise IndexBufferError(
            f"sequence {seq} has {tokens} tokens, which need {needed} pages of {page_size}",
            position=seq,
            field="seq_lens",
            found=f"{pages} pages",
            expected=f"{needed} pages",
        )
