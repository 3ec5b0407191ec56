"""Torch tensors <-> NumPy arrays through DLPack, without importing torch unless given one.

A torch tensor is recognised by its type's module name, so NumPy callers never import
torch. CPU tensors are shared, not copied; tensors on another device are never moved whole
(``take_pages`` copies only the pages a block table names). NumPy's DLPack cannot carry
bfloat16 or the float8 types: those cross as a same-width unsigned integer. Torch has no
read-only tensors: no torch tensor is ever a writable alias of memory that must not change
(``numpy_to_torch``).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from hurray_wire.errors import ArgumentTypeError, InvalidTensorError
from hurray_wire.model._checks import U64_MAX
from hurray_wire.model.layout import _as_index_array, check_index_arrays

__all__ = [
    "PageSink",
    "as_numpy",
    "consecutive",
    "digesting",
    "engine_array",
    "first_reference_order",
    "gather_many",
    "gather_rows",
    "is_device_tensor",
    "is_strided_pool",
    "is_torch",
    "numpy_to_torch",
    "referenced_pages",
    "rows_at",
    "scatter_rows",
    "take_pages",
    "tensor_to_torch",
    "torch_to_numpy",
]

# torch dtypes that cross both DLPacks as the same-width unsigned integer; the NumPy dtype is
# the ml_dtypes type of the same name (imported with the first torch tensor, not before).
_CARRIED = "bfloat16 float8_e4m3fn float8_e5m2 float8_e4m3fnuz float8_e5m2fnuz float8_e8m0fnu"


@functools.cache
def _via_integer() -> dict[str, tuple[np.dtype[Any], str]]:
    """torch dtype name -> (NumPy dtype, carrier integer type)."""
    ml_dtypes = importlib.import_module("ml_dtypes")
    named = {name: np.dtype(getattr(ml_dtypes, name)) for name in _CARRIED.split()}
    return {name: (d, f"uint{8 * d.itemsize}") for name, d in named.items()}


@functools.cache
def _by_numpy() -> dict[np.dtype[Any], tuple[str, str]]:
    return {dtype: (name, carrier) for name, (dtype, carrier) in _via_integer().items()}


def _torch() -> Any:
    """torch, imported on first use (typed Any: its stubs are not ours to check)."""
    return importlib.import_module("torch")


def is_torch(value: object) -> bool:
    """True for a torch tensor, decided without importing torch."""
    return type(value).__module__.startswith("torch") and hasattr(value, "__dlpack__")


def is_device_tensor(value: object) -> bool:
    """True for a torch tensor that is not in host memory (its pages are gathered there)."""
    return is_torch(value) and getattr(getattr(value, "device", None), "type", "cpu") != "cpu"


def take_pages(pool: Any, page_ids: npt.NDArray[Any]) -> Any:
    """``pool[page_ids]`` as a new C-contiguous NumPy array: only those pages are read (a
    torch tensor indexed on its own device, only the gathered pages brought to host)."""
    if is_torch(pool):
        index = _torch().from_numpy(np.ascontiguousarray(page_ids, np.int64)).to(pool.device)
        return torch_to_numpy(pool.detach().index_select(0, index).contiguous(), "page_pool")
    return gather_rows(pool, page_ids)


#: Bytes per chunk of rows (``gather_many`` / ``scatter_rows`` where rows are not copied one
#: call each): the chunk and its reordered copy both stay in a core's L2 (measured best at
#: 256 KiB-1 MiB, tools/bench_connector_host.py).
GATHER_CHUNK = 1 << 19
#: Strided rows of at least this many bytes are copied one NumPy call per row (each
#: array's row in turn), smaller ones a chunk of rows at a time by fancy indexing. Measured
#: for a layer's keys and values (32 MiB, 2 shared cores): 4 KiB rows 13.1 ms per row
#: against 15.4 ms in chunks, 32 KiB rows 8.5 against 13.9 ms (docs/performance.md); 4 KiB
#: is the smallest row measured, below it the calls' own cost grows per byte.
ROW_CALL_MIN = 4 << 10


@dataclass
class PageSink:
    """Where :func:`gather_many` puts each output's page digests, taken right after the
    page's rows are copied, while in cache (issue 30). A page is ``rows_per_page`` output
    rows (a scheduler block of kernel blocks); ``digest`` hashes ``[pages, bytes]`` uint8
    rows (the integrity module's, passed in so that this module imports nothing above it).
    ``outputs``: ``(output array, its digests)``."""

    rows_per_page: int
    digest: Callable[[npt.NDArray[np.uint8]], npt.NDArray[np.uint64]]
    outputs: list[tuple[npt.NDArray[Any], npt.NDArray[np.uint64]]] = field(default_factory=list)

    def pages(
        self, outs: list[npt.NDArray[Any]], digests: list[Any], start: int, stop: int
    ) -> None:
        """Digest rows ``[start, stop)`` (whole pages) of each output into its digests."""
        per = self.rows_per_page
        for out, into in zip(outs, digests, strict=True):
            rows = out[start:stop].reshape((stop - start) // per, -1).view(np.uint8)
            into[start // per : stop // per] = self.digest(rows)


_SINK: ContextVar[PageSink | None] = ContextVar("hurray_wire_page_sink", default=None)


@contextmanager
def digesting(sink: PageSink) -> Iterator[PageSink]:
    """:func:`gather_many` calls inside the block digest their outputs into ``sink``."""
    token = _SINK.set(sink)
    try:
        yield sink
    finally:
        _SINK.reset(token)


def consecutive(ids: npt.NDArray[Any]) -> slice | None:
    """``ids`` (1-D, not empty) as the slice they are when consecutive ascending (a
    sequence's pages in order, an engine's freshly allocated blocks), else None."""
    if ids.size and (np.diff(ids) == 1).all():
        return slice(int(ids[0]), int(ids[0]) + ids.size)
    return None


def rows_at(pool: npt.NDArray[Any], ids: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``pool[ids]``: a view when the ids are consecutive (a sequence's pages in order)."""
    run = consecutive(ids)
    taken: npt.NDArray[Any] = pool[ids if run is None else run]
    return taken


def gather_rows(array: npt.NDArray[Any], ids: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``array[ids]`` (axis 0, ids checked) as a new C-contiguous array (:func:`gather_many`)."""
    return gather_many([array], ids)[0]


def gather_many(
    arrays: Sequence[npt.NDArray[Any]], ids: npt.NDArray[Any]
) -> list[npt.NDArray[Any]]:
    """``[array[ids] for array in arrays]`` (axis 0, ids checked), each a new C-contiguous
    array, in one pass over memory: views of one memory (a layer's K and V, rows
    interleaved) a row of each in turn, so that a row's memory is read once (17.7 against
    22.2 ms for 64 MiB a pass per array: the prefetcher pulls the other array's lines too).
    NumPy's fancy indexing keeps a strided row's memory order (C order would cost a second
    copy): strided rows of contiguous runs go one call per run of consecutive ids
    (:data:`ROW_CALL_MIN`; a layer's K and V into one allocation, a row's roles in one call
    through :func:`_joined`: FLASH_ATTN's 64 MiB saves 1.23-1.28x the limit against
    1.32-1.38x a call per role), element-strided rows (CPU_ATTN's key slabs, one element
    per 64 bytes) a chunk at a time reordered in cache, C-contiguous rows in one gather;
    arrays of both kinds (a CPU_ATTN slab's halves) one route after the other (25.8 against
    29.1 ms taking turns). Inside :func:`digesting`, each output's pages are digested a
    chunk (~:data:`GATHER_CHUNK`) at a time as their rows are copied."""
    shapes = [(len(ids), *a.shape[1:]) for a in arrays]
    if not ids.size:
        return [np.empty(shape, a.dtype) for shape, a in zip(shapes, arrays, strict=True)]
    probe = int(ids[0])
    sink = _SINK.get()
    if sink is not None and (len(ids) % sink.rows_per_page or not arrays[0][probe].nbytes):
        sink = None  # not whole pages, or empty ones: the caller digests the copy itself
    run = consecutive(ids)
    contiguous = all(a[probe].flags.c_contiguous for a in arrays)
    if run is None and contiguous and sink is None:  # one gather each
        return [np.ascontiguousarray(a[ids]) for a in arrays]
    runs = [a.strides[-1] == a.itemsize for a in arrays]  # not CPU_ATTN's key slabs
    if len(arrays) > 1 and not all(runs):  # each on its own route, one after the other
        return [gather_many([a], ids)[0] for a in arrays]
    joined = _joined(arrays)  # then one output allocation
    if joined is None:
        outs = [np.empty(shape, a.dtype) for shape, a in zip(shapes, arrays, strict=True)]
        copies = list(zip(arrays, outs, strict=True))
    else:  # each row's roles in one call
        block = np.empty((len(arrays), *shapes[0]), arrays[0].dtype)
        outs, copies = list(block), [(joined, block.swapaxes(0, 1))]
    row_nbytes = sum(out[0].nbytes for out in outs)
    per = 1 if sink is None else sink.rows_per_page
    digests = [np.empty(len(ids) // per, np.uint64) for _ in outs]
    # a chunk of whole pages, ~GATHER_CHUNK bytes: digested while in cache (measured with
    # 64 KiB-1 MiB chunks: 512 KiB is as good as any, 64 KiB slower than no fusion)
    step = max(per, GATHER_CHUNK // max(1, row_nbytes) // per * per)
    rows_each = run is None and runs[0] and not contiguous
    if rows_each and min(out[0].nbytes for out in outs) >= ROW_CALL_MIN:
        done = 0
        for at, to, stop in _runs(ids, step):  # no run crosses a chunk's end
            for array, out in copies:
                out[to] = array[at]
            if sink is not None and (stop % step == 0 or stop == len(ids)):
                sink.pages(outs, digests, done, stop)
                done = stop
    else:
        for start in range(0, len(ids), step):
            part = ids[start : start + step]
            slot = consecutive(part)
            for array, out in zip(arrays, outs, strict=True):
                out[start : start + step] = array[part if slot is None else slot]
            if sink is not None:
                sink.pages(outs, digests, start, start + len(part))
    if sink is not None:
        sink.outputs.extend(zip(outs, digests, strict=True))
    return outs


def scatter_rows(
    arrays: Sequence[npt.NDArray[Any]], ids: npt.NDArray[Any], rows: Sequence[npt.NDArray[Any]]
) -> None:
    """``array[ids] = rows`` for each array (axis 0, ids checked, distinct; the arrays views
    of one memory, e.g. a layer's K and V). Rows of at least :data:`ROW_CALL_MIN` bytes,
    and runs of consecutive ids, go a run per NumPy call (at most ~:data:`GATHER_CHUNK`
    bytes): arrays and rows of one form as one view with a role axis (:func:`_joined`: a
    vLLM layer's K and V lines in the block's memory order; 64 MiB at random targets 13.0
    against 14.2 ms a row per array), other arrays in turn, each block's lines written
    while in cache (CPU_ATTN's slabs: 17.6 against 19.2 ms for 64 MiB putting chunks in
    memory order first; a pass per array 19.8). Smaller rows at scattered ids go a chunk
    of ids at a time, arrays of contiguous runs in turn, element-strided ones (CPU_ATTN's
    keys) put in memory order in cache first, one array after the other (2x NumPy's
    element-wise scatter; taking turns was slower)."""
    if not ids.size:
        return
    row_nbytes = arrays[0][ids[:1]].nbytes
    step = max(1, GATHER_CHUNK // max(1, row_nbytes))
    pairs = list(zip(arrays, rows, strict=True))
    if row_nbytes >= ROW_CALL_MIN or consecutive(ids) is not None:
        joined, sources = _joined(arrays), _joined(rows)
        if joined is not None and sources is not None:
            pairs = [(joined, sources)]
        for at, to, _ in _runs(ids, step):
            for array, source in pairs:
                array[at] = source[to]
        return
    held = [
        None if a.strides[-1] == a.itemsize else np.empty_like(a[ids[:step]])  # order="K"
        for a in arrays
    ]
    if all(buffer is None for buffer in held):
        for start in range(0, len(ids), step):
            for array, source in pairs:
                array[ids[start : start + step]] = source[start : start + step]
        return
    for (array, source), buffer in zip(pairs, held, strict=True):
        if buffer is None:  # one NumPy scatter of the whole: chunks only add calls here
            array[ids] = source
            continue
        for start in range(0, len(ids), step):
            part = ids[start : start + step]
            buffer[: len(part)] = source[start : start + step]
            array[part] = buffer[: len(part)]


def _joined(arrays: Sequence[npt.NDArray[Any]]) -> npt.NDArray[Any] | None:
    """Arrays of one shape, strides and dtype as one view ``[rows, len(arrays), ...]`` (the
    role axis strided by their addresses' spacing): one NumPy call copies a row of each,
    in the destination's memory order (a vLLM layer's interleaved K and V in one pass).
    None for one array, or arrays of other forms or not evenly spaced. Over separate
    allocations (two roles' received pages) it is only read, while the caller holds them."""
    first = arrays[0]
    if first.dtype.itemsize not in (1, 2, 4, 8) or any(
        a.shape != first.shape or a.strides != first.strides or a.dtype != first.dtype
        for a in arrays
    ):
        return None
    starts = [int(a.__array_interface__["data"][0]) for a in arrays]
    step = starts[1] - starts[0] if len(arrays) > 1 else 0
    if step == 0 or any(at != starts[0] + k * step for k, at in enumerate(starts)):
        return None
    bits = first.view(f"u{first.dtype.itemsize}")  # as_strided cannot take ml_dtypes
    return np.lib.stride_tricks.as_strided(
        bits,
        (first.shape[0], len(arrays), *first.shape[1:]),
        (first.strides[0], step, *first.strides[1:]),
        writeable=first.flags.writeable,
    ).view(first.dtype)


def _runs(ids: npt.NDArray[Any], most: int) -> list[tuple[int | slice, int | slice, int]]:
    """``(ids' index, positions' index, stop)`` of each run of consecutive ascending ids, of
    at most ``most`` ids ending at position ``stop``: integers for a run of one (a third of
    a slice's cost per NumPy call), else slices."""
    cut = np.ones(len(ids), bool)
    cut[1:] = np.diff(ids) != 1
    cut[::most] = True
    at = np.flatnonzero(cut)
    starts = at.tolist()
    return [
        (first, start, stop)
        if stop - start == 1
        else (slice(first, first + stop - start), slice(start, stop), stop)
        for first, start, stop in zip(
            ids[at].tolist(), starts, [*starts[1:], len(ids)], strict=True
        )
    ]


def first_reference_order(
    block_table: npt.NDArray[Any], axis: int | None = None
) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """``(old_ids, new_table)``: the distinct page ids (rows of a 2-D table with ``axis=0``)
    in first-reference order, and the table renumbered so that ``old_ids[new_table] ==
    block_table``."""
    ids, first, inverse = np.unique(block_table, return_index=True, return_inverse=True, axis=axis)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(ids), np.int64)
    rank[order] = np.arange(len(ids))
    return ids[order].astype(np.int64), rank[inverse.reshape(-1)]


def is_strided_pool(pool: npt.NDArray[Any]) -> bool:
    """A 4-D pool whose pages are not one C-contiguous block (gathered, not copied whole)."""
    return pool.ndim == 4 and not pool.flags.c_contiguous and pool.size > 0


def referenced_pages(
    page_pool: Any, block_table: Any, per_slot: bool, scales: Any, zero_points: Any
) -> tuple[Any, Any, Any, Any]:
    """The pool reduced to the pages ``block_table`` names (a compact copy) with the table
    renumbered, for a strided host pool or a device tensor; a contiguous host torch tensor
    comes back as its NumPy view. Per-page-slot scales move with their pages."""
    if is_torch(page_pool) and not is_device_tensor(page_pool):
        page_pool = as_numpy(page_pool, "page_pool")
        if not is_strided_pool(page_pool):
            return page_pool, block_table, scales, zero_points
    if page_pool.ndim != 4:
        raise InvalidTensorError(
            "page_pool must be 4-D [num_pages, page_size, num_heads, head_dim]",
            field="page_pool",
            found=f"shape {tuple(page_pool.shape)}",
        )
    table = _as_index_array(as_numpy(block_table, "block_table"), "block_table", U64_MAX)
    num_pages = int(page_pool.shape[0])
    check_index_arrays(np.array([0, len(table)]), table, num_pages, 1)  # ids inside the pool
    old_ids, new_table = first_reference_order(table.astype(np.int64))
    if per_slot:  # per-block quantization: one scale per page slot moves with its page
        page_size = int(page_pool.shape[1])
        moved = []
        for value in (scales, zero_points):
            values = None if value is None else np.asarray(as_numpy(value, "scales"))
            if values is not None and values.size == num_pages * page_size:
                values = values.reshape(num_pages, page_size)[old_ids].reshape(-1)
            moved.append(values)
        scales, zero_points = moved
    return take_pages(page_pool, old_ids), new_table, scales, zero_points


def engine_array(value: object, name: str, *, contiguous: bool = True) -> npt.NDArray[Any]:
    """One of the engine's arrays, to be written in place: a NumPy array, a CPU torch
    tensor or any host DLPack tensor (shared, never copied), writable, of plain data and
    (unless ``contiguous=False``: a vLLM cache's strided role views) C-contiguous. The one
    intake of every landing target (``decode(into=)``, in place, NIXL, ``into_vllm``)."""

    def refuse(message: str, found: object) -> ArgumentTypeError:
        return ArgumentTypeError(message, field=name, found=found)

    array = value
    if not isinstance(value, np.ndarray):
        kind = type(value).__name__
        if is_device_tensor(value):
            message = f"{name} must be in host memory (it is written in place, never moved)"
            raise refuse(message, str(value.device))  # type: ignore[attr-defined]
        if is_torch(value):
            array = torch_to_numpy(value, name)
        elif hasattr(value, "__dlpack__"):
            try:
                array = np.from_dlpack(value)
            except (BufferError, TypeError, RuntimeError, ValueError) as exc:
                raise refuse(f"{name}: no host DLPack view ({exc})", kind) from None
        else:
            message = (
                f"{name} must be the engine's array (NumPy, torch or DLPack; written in place)"
            )
            raise refuse(message, kind)
    assert isinstance(array, np.ndarray)
    if array.dtype.hasobject or array.dtype.fields is not None:
        raise refuse(f"{name} must hold plain data", str(array.dtype))
    if contiguous and not array.flags.c_contiguous:
        raise refuse(f"{name} must be C-contiguous", f"contiguous False, strides {array.strides}")
    if not array.flags.writeable:
        message = f"{name} must be writable (new pages are written into it)"
        raise refuse(message, "a read-only array")
    return array


def as_numpy(value: Any, name: str) -> Any:
    """``value`` unchanged, or as a NumPy array when it is a torch tensor."""
    return torch_to_numpy(value, name) if is_torch(value) else value


def torch_to_numpy(tensor: Any, name: str = "tensor") -> npt.NDArray[Any]:
    """A NumPy view of a CPU torch tensor (strides kept); other devices are copied to CPU."""
    if not is_torch(tensor):
        raise ArgumentTypeError("expected a torch.Tensor", field=name, found=type(tensor).__name__)
    t = tensor.detach().cpu().resolve_conj().resolve_neg()  # each a no-op when not needed
    dtype_name = str(t.dtype).removeprefix("torch.")
    via = _via_integer().get(dtype_name)
    try:
        if via is None:
            return np.from_dlpack(t)
        torch = _torch()
        return np.from_dlpack(t.view(getattr(torch, via[1]))).view(via[0])
    except (BufferError, TypeError, RuntimeError) as exc:
        raise ArgumentTypeError(
            f"torch dtype {t.dtype} has no NumPy equivalent ({exc})", field=name, found=str(t.dtype)
        ) from None


def numpy_to_torch(array: npt.NDArray[Any], name: str = "array") -> Any:
    """A CPU torch tensor of ``array``'s dtype (bfloat16 / float8 through an integer view):
    sharing its memory when the array is writable, a copy when it is read-only (``bytes``,
    a ``StreamFile``'s mapping: torch tensors are always writable)."""
    torch = _torch()
    if not array.flags.writeable:
        array = array.copy()
    via = _by_numpy().get(array.dtype)
    try:
        if via is None:
            return torch.from_dlpack(array)
        return torch.from_dlpack(array.view(via[1])).view(getattr(torch, via[0]))
    except (BufferError, TypeError, RuntimeError) as exc:
        raise ArgumentTypeError(
            f"NumPy dtype {array.dtype} has no torch equivalent ({exc})",
            field=name,
            found=str(array.dtype),
        ) from None


def tensor_to_torch(tensor: Any, device: Any = None) -> dict[str, Any]:
    """A ``BlockPagedTensor``'s arrays as torch tensors by name (``adapters.to_torch``, and
    ``load_cache(as_torch=True)``): shared or copied as :func:`numpy_to_torch` decides, a
    packed pool unpacked first (one element per byte), then moved to ``device`` if given."""
    pool = tensor.unpacked_page_pool()
    if tensor.element_type.is_packed and pool.dtype.kind != "b":
        pool = pool.astype("int8" if tensor.element_type.name.startswith("int") else "uint8")
    names = ("block_table", "seq_ptr", "scales", "zero_points", "seq_lens")
    arrays = {"page_pool": pool, **{name: getattr(tensor, name) for name in names}}
    out = {name: numpy_to_torch(a, name) for name, a in arrays.items() if a is not None}
    if device is None:
        return out
    try:
        return {name: value.to(device) for name, value in out.items()}
    except (RuntimeError, TypeError, ValueError) as exc:  # an unknown or absent device
        raise ArgumentTypeError(f"cannot move the tensors to device {device!r}: {exc}",
                                field="device", found=repr(device)) from None  # fmt: skip
