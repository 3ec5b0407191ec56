"""A whole model's KV cache in one file: ``save_cache`` and ``load_cache``.

The file is a blob stream (docs/streaming.md) with one checksummed blob per {layer, role},
so every byte is covered by a checksum (unlike ``.hrry``), and it is written atomically.
``progress``: None (a tqdm bar when stderr is a terminal), False, or ``hook(done, total)``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm  # type: ignore[import-untyped]

from hurray_wire.codecs import Compression
from hurray_wire.containers.blob_stream import StreamReader, StreamWriter
from hurray_wire.containers.records import StreamHeader
from hurray_wire.errors import ArgumentTypeError, InvalidStreamError
from hurray_wire.fingerprint import EngineFingerprint
from hurray_wire.tensor import BlockPagedTensor

__all__ = ["ModelCache", "Progress", "load_cache", "save_cache"]

#: ``progress=``: None (a bar on a terminal), False (none), or ``hook(done, total)`` bytes.
Progress = Callable[[int, int], object] | bool | None
CacheKey = tuple[int, str]


@dataclass(frozen=True)
class ModelCache:
    """What ``load_cache`` returns: every tensor by ``(layer_index, kv_role)``, and what
    the file says about them (the model, the caller's metadata, the engine fingerprint)."""

    tensors: dict[CacheKey, BlockPagedTensor]
    model: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    fingerprint: EngineFingerprint | None = None

    @property
    def num_layers(self) -> int:
        return 1 + max((layer for layer, _ in self.tensors), default=-1)

    def __getitem__(self, key: CacheKey) -> BlockPagedTensor:
        return self.tensors[key]


class _Reporter:
    """``progress=`` as one object: a tqdm bar, a caller's hook, or nothing."""

    def __init__(self, progress: Progress, total: int, what: str) -> None:
        if not (progress is None or isinstance(progress, bool) or callable(progress)):
            raise ArgumentTypeError(
                "progress must be None, True, False or a callable (done, total)",
                field="progress",
                found=repr(progress),
            )
        self._hook = progress if callable(progress) and not isinstance(progress, bool) else None
        self._total = total
        self.done = 0  # bytes reported so far
        self._bar = None
        if self._hook is None and progress is not False:
            self._bar = tqdm(total=total, desc=what, unit="B", unit_scale=True,
                             disable=None if progress is None else False, leave=False)  # fmt: skip

    def update(self, size: int) -> None:
        self.done += size
        if self._hook is not None:
            self._hook(self.done, self._total)
        elif self._bar is not None:
            self._bar.update(size)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _tensors(cache: object) -> list[BlockPagedTensor]:
    """The tensors of ``cache`` (a mapping's values or an iterable), each once per
    {layer, role}, in layer then role order."""
    items = cache.values() if isinstance(cache, Mapping) else cache
    if not isinstance(items, Iterable) or isinstance(items, (str, bytes)):
        raise ArgumentTypeError("cache must be an iterable of BlockPagedTensor or a mapping "
                                "to them", field="cache", found=type(cache).__name__)  # fmt: skip
    tensors = list(items)
    seen: set[CacheKey] = set()
    for tensor in tensors:
        if not isinstance(tensor, BlockPagedTensor):
            raise ArgumentTypeError("cache holds something that is not a BlockPagedTensor",
                                    field="cache", found=type(tensor).__name__)  # fmt: skip
        if tensor.layer_index is None:
            raise InvalidStreamError("every tensor of a model cache needs a layer_index",
                                     field="layer_index", found=None)  # fmt: skip
        key = (tensor.layer_index, tensor.kv_role)
        if key in seen:
            raise InvalidStreamError("the cache holds {layer, role} twice", field="cache",
                                     found=f"layer {key[0]} {key[1]}")  # fmt: skip
        seen.add(key)
    if not tensors:
        raise InvalidStreamError("the cache holds no tensor", field="cache")
    return sorted(tensors, key=lambda t: (t.layer_index, t.kv_role))


def save_cache(
    path: Any,
    cache: Mapping[Any, BlockPagedTensor] | Iterable[BlockPagedTensor],
    *,
    model: str = "",
    metadata: Mapping[str, Any] | None = None,
    fingerprint: EngineFingerprint | None = None,
    compression: Compression | str | None = None,
    checksum: bool = True,
    pages: str = "all",
    progress: Progress = None,
) -> int:
    """Save every layer and role of a model's cache to ``path`` (a ``.hrws`` blob stream),
    atomically, with section checksums; returns the file's size in bytes.

    ``cache``: the tensors (each with its ``layer_index`` and ``kv_role``), or a mapping
    whose values they are. Every layer in ``0 .. max`` must have the same roles (a whole
    model, not a part: ``load_cache`` checks the same). ``pages="all"`` (the default) keeps
    the engine's pools as they are; ``"referenced"`` drops the pages no block table names.
    """
    tensors = _tensors(cache)
    layers = 1 + max(t.layer_index for t in tensors if t.layer_index is not None)
    roles = tuple(sorted({t.kv_role for t in tensors}))
    _check_whole({(t.layer_index or 0, t.kv_role) for t in tensors}, layers, roles)
    element_types = {t.element_type for t in tensors}
    header = StreamHeader(
        model=model, num_layers=layers, kv_roles=roles,
        element_type=element_types.pop() if len(element_types) == 1 else None,
        metadata=dict(metadata or {}), fingerprint=fingerprint,
    )  # fmt: skip
    reporter = _Reporter(progress, sum(t.nbytes for t in tensors), "save")
    try:
        with StreamWriter(path, header) as writer:
            for tensor in tensors:
                writer.write(tensor, compression=compression, checksum=checksum, pages=pages)
                reporter.update(tensor.nbytes)
    finally:
        reporter.close()
    return writer.position  # with the end record, written at close


def _check_whole(keys: set[CacheKey], layers: int, roles: tuple[str, ...]) -> None:
    """Every {layer, role} of ``layers x roles`` in ``keys``. Work and memory grow with
    ``keys`` (what arrived), not with ``layers`` (what a header claims): the first missing
    ones are found among the first ``len(keys) + 8`` positions."""
    inside = sum(1 for layer, role in keys if 0 <= layer < layers and role in roles)
    if inside == layers * len(roles):
        return
    wanted = ((layer, role) for layer in range(layers) for role in roles)
    missing = list(itertools.islice((k for k in wanted if k not in keys), 9))
    shown = ", ".join(f"layer {layer} {role}" for layer, role in missing[:8])
    raise InvalidStreamError(f"not a whole model's cache: missing {shown}"
                             f"{' ...' if len(missing) > 8 else ''}",
                             field="cache", expected=f"{layers} layers x {list(roles)}",
                             found=f"{len(keys)} tensors")  # fmt: skip


def load_cache(
    path: Any,
    *,
    verify: bool = True,
    expect_fingerprint: EngineFingerprint | None = None,
    progress: Progress = None,
) -> ModelCache:
    """Load a cache ``save_cache`` wrote: every blob checked (checksums, the stream's
    framing and end record, the fingerprint when ``expect_fingerprint`` is given) and
    every {layer, role} the header promises present. Tensors view the mapped file."""
    with StreamReader(path, verify=verify, expect_fingerprint=expect_fingerprint) as reader:
        header = reader.header
        if header is None or header.num_layers is None or not header.kv_roles:
            raise InvalidStreamError(
                "not a model cache: the stream header does not state num_layers and kv_roles",
                section="stream header",
            )
        tensors: dict[CacheKey, BlockPagedTensor] = {}
        total = os.path.getsize(path) if isinstance(path, (str, os.PathLike)) else 0
        reporter = _Reporter(progress, total, "load")
        try:
            for tensor in reader:
                key = (tensor.layer_index if tensor.layer_index is not None else -1,
                       tensor.kv_role)  # fmt: skip
                if key in tensors:
                    raise InvalidStreamError("the cache holds {layer, role} twice",
                                             found=f"layer {key[0]} {key[1]}")  # fmt: skip
                tensors[key] = tensor
                reporter.update(reader.position - reporter.done)
        finally:
            reporter.close()
    _check_whole(set(tensors), header.num_layers, header.kv_roles)
    return ModelCache(tensors, header.model, dict(header.metadata), header.fingerprint)
