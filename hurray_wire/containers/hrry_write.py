"""Writing a ``.hrry`` file byte for byte as the reference ``FileWriter`` does (§ B.3-B.7)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from hurray_wire.buffers import align
from hurray_wire.containers.atomic import atomic_output
from hurray_wire.containers.hrry import (
    COUNT,
    ENTRY_FIXED,
    HEADER,
    NAME_LENGTH,
    TRAILER,
    check_alignment,
)
from hurray_wire.containers.reference_stream import (
    METADATA_KEY_PREFIX,
    RESERVED_PREFIXES,
    SEQ_LENS_KEY_PREFIX,
    tensor_pieces,
)
from hurray_wire.crc32c import crc32c
from hurray_wire.errors import ArgumentTypeError, InvalidContainerError, InvalidMetadataError
from hurray_wire.metadata import MetadataInput, UInt64, encode_metadata
from hurray_wire.model._checks import U16_MAX
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.wire import containers as wc

__all__ = ["write_file"]


def _name_bytes(name: object) -> bytes:
    if not isinstance(name, str):
        raise ArgumentTypeError("tensor names must be str", found=type(name).__name__)
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidContainerError(
            "tensor name is not encodable as UTF-8", section="index", found=repr(name)
        ) from None
    if not 1 <= len(raw) <= U16_MAX:
        raise InvalidContainerError(
            "tensor name must be 1..65535 UTF-8 bytes",
            section="index",
            found=f"{len(raw)} bytes",
        )
    return raw


def _file_kv(
    tensors: Mapping[str, BlockPagedTensor], metadata: Mapping[str, MetadataInput] | None
) -> dict[str, MetadataInput]:
    """The file's KV entries: the user's, in order, then each tensor's reserved keys."""
    if metadata is not None and not isinstance(metadata, Mapping):
        raise ArgumentTypeError("metadata must be a mapping", found=type(metadata).__name__)
    entries: dict[str, MetadataInput] = dict(metadata or {})
    for key in entries:
        if isinstance(key, str) and key.startswith(RESERVED_PREFIXES):
            raise InvalidMetadataError(
                "key prefix reserved for tensor seq_lens / metadata",
                section="kv_metadata",
                field=key,
                expected=f"no key starting with {' or '.join(RESERVED_PREFIXES)}",
            )
    for name, tensor in tensors.items():
        if tensor.seq_lens is not None and len(tensor.seq_lens):
            entries[SEQ_LENS_KEY_PREFIX + name] = [UInt64(int(v)) for v in tensor.seq_lens]
        if tensor.metadata:
            entries[METADATA_KEY_PREFIX + name] = encode_metadata(tensor.metadata)
    return entries


def write_file(
    path: str | os.PathLike[str],
    tensors: Mapping[str, BlockPagedTensor],
    metadata: Mapping[str, MetadataInput] | None = None,
    *,
    data_buffer_alignment: int = wc.MIN_DATA_BUFFER_ALIGNMENT,
    sorted_index: bool = False,
    progress: Callable[[int], object] | None = None,
) -> int:
    """Write a ``.hrry`` file exactly as the reference ``FileWriter`` does; its size in bytes.

    ``.hrry`` has no data checksums (only an index CRC-32C): it is for exchange with the
    reference, ``save_cache`` for keeping a cache. The layout is docs/reference-containers.md's.
    Written through ``atomic_output``: arrays mapping an older file at ``path`` stay valid
    and a failure leaves it as it was. ``progress`` gets each tensor's data bytes.
    """
    if not isinstance(tensors, Mapping):
        raise ArgumentTypeError("tensors must be a mapping of name to BlockPagedTensor")
    check_alignment(data_buffer_alignment)
    records = [(_name_bytes(name), tensor_pieces(tensor)) for name, tensor in tensors.items()]
    kv_entries = _file_kv(tensors, metadata)
    kv = encode_metadata(kv_entries) if kv_entries else b""
    flags = wc.FILE_FLAG_HAS_INDEX_CRC32C | (wc.FILE_FLAG_SORTED_INDEX if sorted_index else 0)
    header = HEADER.pack(
        container_version_major=1,
        container_version_minor=0,
        file_flags=flags,
        data_buffer_alignment=data_buffer_alignment,
        first_descriptor_offset=wc.HEADER_SIZE,
        tensor_count_hint=wc.TENSOR_COUNT_UNKNOWN,
    )
    with atomic_output(path) as out:  # § B.3-B.6, into a file that becomes ``path``
        pos = 0

        def put(piece: bytes | memoryview) -> None:
            nonlocal pos
            out.write(piece)
            pos += len(piece)

        def pad_to(alignment: int) -> None:
            put(bytes(align(pos, alignment) - pos))  # < 2 MiB: the largest alignment

        put(header)
        index: list[tuple[bytes, int, int, int, int]] = []
        for raw_name, (descriptor, buffers) in records:
            descriptor_offset = pos
            put(descriptor)
            pad_to(data_buffer_alignment)  # step 2, even before an empty buffer 0
            data_offset = pos
            for number, pieces in enumerate(buffers):
                if number:
                    pad_to(data_buffer_alignment)  # between buffers only, none after the last [A18]
                for piece in pieces:
                    put(piece)
            index.append(
                (raw_name, descriptor_offset, len(descriptor), data_offset, pos - data_offset)
            )
            if progress is not None:
                progress(pos - data_offset)
            pad_to(wc.SECTION_ALIGNMENT)
        kv_offset = kv_length = 0
        if kv:
            kv_offset, kv_length = pos, len(kv)
            put(kv)
            pad_to(wc.SECTION_ALIGNMENT)
        if sorted_index:
            index.sort(key=lambda entry: entry[0])
        rows = [COUNT.pack(entry_count=len(index))]  # § B.5: the entry fields in wire order
        for raw_name, *fields in index:  # descriptor offset, length; data offset, length
            rows += (NAME_LENGTH.pack(len(raw_name)), raw_name, ENTRY_FIXED.pack(*fields, 0))
        index_bytes = b"".join(rows)
        index_offset = pos
        put(index_bytes)
        put(
            TRAILER.pack(
                index_offset=index_offset,
                index_length=len(index_bytes),
                kv_offset=kv_offset,
                kv_length=kv_length,
                index_crc32c=crc32c(index_bytes),
            )
        )
    return pos
