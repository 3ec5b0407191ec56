"""A whole model's KV cache in one file, written atomically: a blob stream of one checksummed
blob per {layer, role}, so that every byte is covered (unlike ``.hrry``)."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, TypeVar, overload

from tqdm import tqdm  # type: ignore[import-untyped]

from hurray_wire._interop import tensor_to_torch
from hurray_wire.codecs import Compression
from hurray_wire.containers.blob_stream import StreamReader, StreamWriter
from hurray_wire.containers.records import StreamHeader, locate
from hurray_wire.errors import ArgumentTypeError, InvalidStreamError, MissingTensorError, flag
from hurray_wire.fingerprint import EngineFingerprint
from hurray_wire.tensor import BlockPagedTensor

__all__ = ["ModelCache", "Progress", "load_cache", "save_cache"]

#: ``progress=``: None (a bar on a terminal), False (none), or ``hook(done, total)`` bytes.
Progress = Callable[[int, int], object] | bool | None
CacheKey = tuple[int, str]
_V = TypeVar("_V")


@dataclass(frozen=True, eq=False)
class ModelCache(Mapping[CacheKey, _V]):
    """What ``load_cache`` returns, as safetensors' ``load_file`` does: a read-only mapping
    ``(layer_index, kv_role)`` -> tensor in layer then role order, and what the file says of
    them (the model, the caller's metadata, the engine fingerprint)."""

    tensors: Mapping[CacheKey, _V]
    model: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    fingerprint: EngineFingerprint | None = None

    def __post_init__(self) -> None:
        ordered = dict(sorted(self.tensors.items()))
        object.__setattr__(self, "tensors", MappingProxyType(ordered))

    @property
    def num_layers(self) -> int:
        return 1 + max((layer for layer, _ in self.tensors), default=-1)

    def __getitem__(self, key: CacheKey) -> _V:
        try:
            return self.tensors[key]
        except KeyError:
            raise MissingTensorError(
                f"the cache holds no {key!r}: its keys are (layer, role) pairs, layers "
                f"0..{self.num_layers - 1}, roles {sorted({r for _, r in self.tensors})}"
            ) from None

    def __iter__(self) -> Iterator[CacheKey]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)


@contextlib.contextmanager
def _reporting(progress: Progress, total: int, what: str) -> Iterator[Callable[[int], object]]:
    """``progress=`` as one function of the bytes done so far: a caller's hook, or a tqdm bar
    (None: on a terminal only; False: never)."""
    if not (progress is None or isinstance(progress, bool) or callable(progress)):
        raise ArgumentTypeError(
            "progress must be None, True, False or a callable (done, total)",
            field="progress",
            found=repr(progress),
        )
    if callable(progress) and not isinstance(progress, bool):
        yield lambda done: progress(done, total)
        return
    off = {None: None, True: False, False: True}[progress]
    with tqdm(total=total, desc=what, unit="B", unit_scale=True, disable=off, leave=False) as bar:
        yield lambda done: bar.update(done - bar.n)


def _tensors(cache: object) -> list[BlockPagedTensor]:
    """The tensors of ``cache`` (an iterable, or a mapping whose keys name each tensor's own
    layer and role), each {layer, role} once, in layer then role order."""
    mapping = isinstance(cache, Mapping)
    if isinstance(cache, Mapping):
        pairs: list[tuple[object, object]] = list(cache.items())
    elif isinstance(cache, Iterable) and not isinstance(cache, (str, bytes)):
        pairs = [(None, tensor) for tensor in cache]
    else:
        raise ArgumentTypeError("cache must be an iterable of BlockPagedTensor or a mapping "
                                "to them", field="cache", found=type(cache).__name__)  # fmt: skip
    keyed: dict[CacheKey, BlockPagedTensor] = {}
    for given, tensor in pairs:
        if not isinstance(tensor, BlockPagedTensor):
            raise ArgumentTypeError("cache holds something that is not a BlockPagedTensor",
                                    field="cache", found=type(tensor).__name__)  # fmt: skip
        if tensor.layer_index is None:
            raise InvalidStreamError("every tensor of a model cache needs a layer_index",
                                     field="layer_index", found=None)  # fmt: skip
        key = (tensor.layer_index, tensor.kv_role)
        if mapping and (not isinstance(given, tuple) or len(given) != 2):
            raise ArgumentTypeError("the keys of a cache mapping are (layer, kv_role) pairs",
                                    field="cache", found=repr(given))  # fmt: skip
        if mapping and given != key:  # the file keeps the tensor's own layer and role
            raise InvalidStreamError(
                f"key {given!r} maps to the tensor of layer {key[0]} {key[1]} (its layer_index "
                "and kv_role): the file keeps the tensor's own, so it would load back under "
                "another key",
                field="cache",
                expected=repr(given),
                found=repr(key),
            )
        if key in keyed:
            raise InvalidStreamError("the cache holds {layer, role} twice", field="cache",
                                     found=f"layer {key[0]} {key[1]}")  # fmt: skip
        keyed[key] = tensor
    if not keyed:
        raise InvalidStreamError("the cache holds no tensor", field="cache")
    return [keyed[key] for key in sorted(keyed)]


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
    page_digests: bool = False,
    progress: Progress = None,
) -> int:
    """Save every layer and role of a model's cache (every layer in ``0 .. max`` with the
    same roles) to ``path``, a ``.hrws`` blob stream; returns the file's size in bytes.
    ``pages="referenced"`` drops the pages no block table names; ``progress``: None (a bar
    on a terminal), False, or ``hook(done, total)``."""
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
    done = 0
    total = sum(t.nbytes for t in tensors)
    with _reporting(progress, total, "save") as report, StreamWriter(path, header) as writer:
        for tensor in tensors:
            writer.write(tensor, compression=compression, checksum=checksum, pages=pages,
                         page_digests=page_digests)  # fmt: skip
            done += tensor.nbytes
            report(done)
    return writer.position  # with the end record, written at close


def _check_whole(keys: set[CacheKey], layers: int, roles: tuple[str, ...]) -> None:
    """Every layer in ``0 .. layers`` has every role (counted: a header claiming 2**24
    layers costs no list of them)."""
    present = sum(1 for layer, role in keys if 0 <= layer < layers and role in roles)
    absent = layers * len(roles) - present
    if not absent:
        return
    every = ((layer, role) for layer in range(layers) for role in roles)
    missing = list(itertools.islice((k for k in every if k not in keys), 8))
    shown = ", ".join(f"layer {layer} {role}" for layer, role in missing)
    raise InvalidStreamError(f"not a whole model's cache: missing {shown}"
                             f"{' ...' if absent > 8 else ''} ({absent} in all)",
                             field="cache", expected=f"{layers} layers x {list(roles)}",
                             found=f"{len(keys)} tensors")  # fmt: skip


@overload
def load_cache(
    path: Any,
    *,
    verify: bool = ...,
    expect_fingerprint: EngineFingerprint | None = ...,
    progress: Progress = ...,
    as_torch: Literal[False] = ...,
    device: None = ...,
) -> ModelCache[BlockPagedTensor]: ...


@overload
def load_cache(
    path: Any,
    *,
    verify: bool = ...,
    expect_fingerprint: EngineFingerprint | None = ...,
    progress: Progress = ...,
    as_torch: bool = ...,
    device: Any = ...,
) -> ModelCache[Any]: ...


def load_cache(
    path: Any,
    *,
    verify: bool = True,
    expect_fingerprint: EngineFingerprint | None = None,
    progress: Progress = None,
    as_torch: bool = False,
    device: Any = None,
) -> ModelCache[Any]:
    """Load a cache ``save_cache`` wrote, every blob checked and every {layer, role} the
    header promises present; tensors view the mapped file, or with ``as_torch=True`` (or a
    ``device``) are dicts of torch tensors as ``to_torch`` gives them."""
    as_torch = flag(as_torch, "as_torch") or device is not None
    with StreamReader(path, verify=verify, expect_fingerprint=expect_fingerprint) as reader:
        header = reader.header
        if header is None:  # a lone blob, or blobs without a stream header
            lone = next(reader, None) is not None and next(reader, None) is None
            raise InvalidStreamError(
                "this is a blob, not a blob stream: hw.decode reads one blob; load_cache reads "
                "the stream save_cache writes"
                if lone
                else "not a model cache: blobs without a stream header (which states "
                "num_layers and kv_roles)",
                section="stream",
            )
        if header.num_layers is None or not header.kv_roles:
            raise InvalidStreamError(
                "not a model cache: the stream header does not state num_layers and kv_roles",
                section="stream header",
            )
        tensors: dict[CacheKey, BlockPagedTensor] = {}
        total = os.path.getsize(path) if isinstance(path, (str, os.PathLike)) else 0
        with _reporting(progress, total, "load") as report:
            for tensor in reader:
                key = (tensor.layer_index if tensor.layer_index is not None else -1,
                       tensor.kv_role)  # fmt: skip
                if key in tensors:
                    entry = reader.entries[-1]
                    raise locate(InvalidStreamError("the cache holds {layer, role} twice",
                                                    found=f"layer {key[0]} {key[1]}"),
                                 len(tensors), entry.offset, layer=key[0], role=key[1])  # fmt: skip
                tensors[key] = tensor
                report(reader.position)
    _check_whole(set(tensors), header.num_layers, header.kv_roles)
    values: dict[CacheKey, Any] = dict(tensors)
    if as_torch:
        values = {key: tensor_to_torch(tensor, device) for key, tensor in tensors.items()}
    return ModelCache(values, header.model, dict(header.metadata), header.fingerprint)
