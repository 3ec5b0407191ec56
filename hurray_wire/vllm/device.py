"""KV caches in device memory: the request's blocks gathered on the device and copied to the
host once per layer, and landed with one host-to-device copy per layer (docs/vllm.md
§ device memory). Plain torch, device-agnostic: CUDA (or any accelerator torch drives
through ``torch.get_device_module``) and CPU tensors take the same path.

Saving: ``gather`` enqueues, on a side stream that first waits for the forward pass's
stream, an ``index_select`` of each role's pages on the backend's own views (the wire's
page layout, C order: the role split is done on the device, the host only reads and
digests) and a non-blocking copy into pinned host memory, then records an event; the
forward pass goes on. ``Staged.host()`` waits for that event only (the connector calls it
from ``wait_for_save``, after the forward), before anything reads the copy.

Landing: ``land_pages`` (the connector's): every check runs on the host against a stand-in
of the cache (``stand_in``), the pages stay in the wire's layout, and the commit copies each
role's pages host-to-device once per layer and scatters them on the device into the
backend's views (``index_copy_``; a partial last block: only its valid token slots), on the
side stream; the forward stream waits for it (``wait_stream``), the host does not.
``land``, the host-staged landing (the target blocks gathered into a host copy, written
there, copied back whole), is the reference it is tested and benchmarked against.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from hurray_wire._interop import _torch
from hurray_wire.errors import TransportError

__all__ = ["Staged", "gather", "land", "land_pages", "memory_order", "needs_staging", "stand_in"]

T = TypeVar("T")


def needs_staging(cache: Any) -> bool:
    """A cache the host cannot address in place (``from_vllm`` / ``into_vllm`` read and
    write host memory only; a NumPy array's ``device`` is the string "cpu")."""
    return getattr(cache.device, "type", "cpu") != "cpu"


def memory_order(tensor: Any) -> list[int]:
    """The tensor's axes outermost first in memory (larger stride first; ties keep order)."""
    strides = tensor.stride()
    return sorted(range(tensor.dim()), key=lambda a: (-strides[a], a))


def _module(device: Any) -> Any:
    return None if device.type == "cpu" else _torch().get_device_module(device.type)


@dataclass
class Staged:
    """A host copy of some of a cache's blocks (block axis first: position ``i`` holds the
    ``i``-th block gathered), complete once ``host()`` returns."""

    _host: Any
    _event: Any = None
    _device: Any = None  # the gathered device tensor, alive until the copy is done

    def host(self) -> Any:
        if self._event is not None:
            self._event.synchronize()
            self._event, self._device = None, None
        return self._host


def _index(ids: npt.NDArray[np.int64], device: Any) -> Any:
    return _torch().from_numpy(np.ascontiguousarray(ids, np.int64)).to(device, non_blocking=True)


def gather(
    cache: Any,
    block_ids: npt.NDArray[np.int64],
    stream: Any = None,
    *,
    views: Callable[[Any], list[Any]] | None = None,
) -> Staged:
    """Start copying ``cache``'s blocks ``block_ids`` to host memory (pinned on a device)
    on ``stream`` (``side_stream``'s); with ``views`` (``CacheForm.page_views``) each
    role's pages in the wire's layout (a tuple, one C-ordered tensor per role)."""

    def pick(module: Any, side: Any) -> Staged:
        index = _index(block_ids, cache.device)
        if views is not None:
            picked = tuple(v.index_select(0, index).contiguous() for v in views(cache))
        else:  # whole blocks, gathered in the cache's memory order
            order = memory_order(cache)
            picked = cache.permute(order).index_select(order.index(0), index)
            picked = picked.permute([order.index(a) for a in range(cache.dim())])
        if module is None:
            return Staged(picked)
        host = tuple(map(_pinned, picked)) if views is not None else _pinned(picked)
        event = module.Event()
        event.record(side)
        return Staged(host, event, picked)

    return _on_side(cache.device, stream, pick, join=False)  # once the layer's KV is written


def _pinned(picked: Any) -> Any:
    """A non-blocking copy of ``picked`` into pinned host memory (its strides kept)."""
    host = _torch().empty_strided(picked.shape, picked.stride(), dtype=picked.dtype,
                                  device="cpu", pin_memory=True)  # fmt: skip
    host.copy_(picked, non_blocking=True)
    return host


def land(
    cache: Any,
    block_ids: npt.NDArray[np.int64],
    write: Callable[[Any], None],
    stream: Any = None,
    *,
    skip: int = 0,
) -> Callable[[], None]:
    """Stage ``cache``'s blocks ``block_ids`` on the host, let ``write`` check and write
    pages into that host copy (it raises to refuse: nothing reaches ``cache`` then), and
    return the commit: the blocks after the first ``skip`` (read for ``write``'s numbering
    only) copied back whole."""
    staged = gather(cache, block_ids, stream).host()
    write(staged)
    ids = block_ids[skip:]

    def run(*_: Any) -> None:
        order = memory_order(cache)
        source = staged[skip:].permute(order).to(cache.device, non_blocking=True)
        cache.permute(order).index_copy_(order.index(0), _index(ids, cache.device), source)

    return partial(_on_side, cache.device, stream, run)


def _on_side(device: Any, stream: Any, run: Callable[[Any, Any], T], *, join: bool = True) -> T:
    """``run(module, side)`` on the side stream (``stream`` or a new one) once the forward
    stream's work is done, the forward stream then made to wait for it if ``join`` (the
    host does not); on the CPU, ``run(None, None)`` at once."""
    module = _module(device)
    if module is None:
        return run(None, None)
    side = stream if stream is not None else module.Stream(device)
    side.wait_stream(module.current_stream(device))
    with module.stream(side):
        result = run(module, side)
    if join:
        module.current_stream(device).wait_stream(side)
    return result


def stand_in(cache: Any) -> Any:
    """A host tensor of ``cache``'s shape, strides and dtype for the landing's checks to
    inspect: backed by an anonymous mapping the kernel fills with zero pages only when
    touched, so it costs address space, not memory or a copy (nothing writes it; no swap
    reserved for it either)."""
    span = 1 + sum((n - 1) * s for n, s in zip(cache.shape, cache.stride(), strict=True))
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
    try:
        memory = mmap.mmap(-1, max(span, 1) * cache.element_size(), flags=flags)
    except (OSError, OverflowError) as err:  # e.g. overcommit off: no address space for it
        raise TransportError(
            f"no host address space for the landing's stand-in of the cache: {err}",
            field="kv_cache", found=f"{span * cache.element_size()} bytes",
        ) from err  # fmt: skip
    flat = _torch().frombuffer(memory, dtype=cache.dtype)
    return flat.as_strided(tuple(cache.shape), tuple(cache.stride()))


def land_pages(
    cache: Any,
    views: Callable[[Any], list[Any]],
    ids: npt.NDArray[np.int64],
    pages: Sequence[npt.NDArray[Any]],
    valid: int,
    stream: Any = None,
) -> Callable[[], None]:
    """The commit of checked pages (per role, ``[len(ids), kernel_block_size, H, D]``) into
    the backend's ``views`` at kernel blocks ``ids``, the inverse of ``gather(views=)``;
    the last block's first ``valid`` token slots only (module docstring)."""

    def run(*_: Any) -> None:
        index = _index(ids, cache.device)
        whole = len(ids) if valid == pages[0].shape[1] else len(ids) - 1
        for view, role in zip(views(cache), pages, strict=True):
            raw = _torch().from_numpy(np.ascontiguousarray(role).view(np.uint8))
            source = raw.to(cache.device, non_blocking=True).view(cache.dtype)
            view.index_copy_(0, index[:whole], source[:whole])
            if whole < len(ids):
                view[int(ids[-1]), :valid] = source[-1, :valid]

    return partial(_on_side, cache.device, stream, run)


def side_stream(device: Any) -> Any:
    """The stream a device's connector copies run on (None for the CPU)."""
    module = _module(device)
    return None if module is None else module.Stream(device)
