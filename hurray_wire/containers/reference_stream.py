"""The reference stream (containers.md Part A, hurray-io's ``StreamWriter`` / ``StreamReader``)
and what the ``.hrry`` file shares with it. Its records stand back to back, each a descriptor
and its buffers: the descriptor's 10-byte prefix (with ``descriptor_length``) frames one.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any, NoReturn

from hurray_wire.containers.io import (
    DEFAULT_RECORD_DEADLINE,
    Source,
    check_limit,
    open_sink,
    open_source,
)
from hurray_wire.errors import (
    ContainerTruncatedError,
    HurrayWireError,
    InvalidContainerError,
    InvalidTensorError,
    UnsupportedLayoutError,
    instance,
)
from hurray_wire.model.descriptor import TensorDescriptor
from hurray_wire.model.descriptor_codec import (
    decode_descriptor,
    encode_descriptor,
    peek_descriptor_length,
)
from hurray_wire.tensor import BlockPagedTensor, assemble
from hurray_wire.wire import descriptor as wd

DEFAULT_MAX_DESCRIPTOR_BYTES = 16 << 20  # hurray-io DEFAULT_MAX_DESCRIPTOR_BYTES
SEQ_LENS_KEY_PREFIX = "hurray.seq_lens."  # + tensor name: uint64 array, one per sequence
METADATA_KEY_PREFIX = "hurray.metadata."  # + tensor name: bytes, a KV section (§ B.4)
RESERVED_PREFIXES = (SEQ_LENS_KEY_PREFIX, METADATA_KEY_PREFIX)
MIN_DESCRIPTOR_LENGTH = wd.FIXED_HEADER.sizeof()  # the descriptor decoder refuses less


def tensor_pieces(tensor: BlockPagedTensor) -> tuple[bytes, list[list[memoryview]]]:
    """The encoded descriptor and, per buffer in table order, views of its bytes (no copy)."""
    instance(tensor, BlockPagedTensor, "tensor")
    buffers = []
    for index, (arrays, handle) in enumerate(
        zip(tensor.buffer_arrays(), tensor.descriptor.buffers, strict=True)
    ):
        size = sum(a.nbytes for a in arrays)
        if size != handle.byte_size:  # StreamWriter::write_tensor's check
            raise InvalidTensorError(
                "buffer length disagrees with its handle's byte_size",
                field=f"buffers[{index}]",
                expected=handle.byte_size,
                found=size,
            )
        buffers.append([a.data.cast("B") for a in arrays if a.nbytes])
    return encode_descriptor(tensor.descriptor), buffers


def check_cross_machine(descriptor: TensorDescriptor, **where: Any) -> None:
    """interchange.md: a cross-machine transfer needs producer-synced buffers."""
    for index, handle in enumerate(descriptor.buffers):
        if handle.sync_mode != 0:
            raise InvalidContainerError(
                "cross-machine transfer needs producer-synced buffers (sync_mode 0)",
                field=f"buffers[{index}].sync_mode",
                expected=0,
                found=handle.sync_mode,
                **where,
            )


def container_error(exc: HurrayWireError, section: str, offset: int | None) -> HurrayWireError:
    """A descriptor / index / KV error as a container error at a place in the container
    (``UnsupportedLayoutError``, a valid tensor of another layout, keeps its type)."""
    if isinstance(exc, UnsupportedLayoutError):
        return exc.relocated(section=section, offset=offset)
    inner = f"{type(exc).__name__}: {exc}"
    return InvalidContainerError(inner, section=section, field=exc.field, offset=offset)


# A.2 step 2: magic, version and descriptor_length frame a record; flags is the next field.
_PREFIX_LEN = wd.AT["flags"]


def write_stream(
    sink: Any,
    tensors: Iterable[BlockPagedTensor] | BlockPagedTensor,
    *,
    cross_machine: bool = False,
) -> int:
    """Write one record per tensor exactly as hurray-io's ``StreamWriter::write_tensor``
    (no ``seq_lens`` or ``metadata``: a record has no place for them); bytes written."""
    out = open_sink(sink, allow_path=False)
    if isinstance(tensors, BlockPagedTensor):
        tensors = (tensors,)
    total = 0
    for number, tensor in enumerate(tensors):
        descriptor, buffers = tensor_pieces(tensor)
        if cross_machine:
            check_cross_machine(tensor.descriptor, section=f"record {number}")
        total += out.write([memoryview(descriptor)] + [p for pieces in buffers for p in pieces])
    return total


def read_stream(
    source: Any,
    *,
    max_descriptor_length: int = DEFAULT_MAX_DESCRIPTOR_BYTES,
    max_buffer_size: int | None = None,
    cross_machine: bool = False,
    record_deadline: float | None = DEFAULT_RECORD_DEADLINE,
) -> Iterator[BlockPagedTensor]:
    """The records of a reference stream (bytes-like: arrays view it; or a file / socket read
    a record at a time), each checked as the blob decoder checks one, as a tensor.

    The stream may end only at a record boundary (else ``ContainerTruncatedError``).
    ``max_buffer_size`` caps each buffer (default: none, as the reference);
    ``record_deadline`` bounds each record read from a socket or file (``containers.io``).
    """
    check_limit("max_descriptor_length", max_descriptor_length, MIN_DESCRIPTOR_LENGTH)
    if max_buffer_size is not None:
        check_limit("max_buffer_size", max_buffer_size, 0)
    src = open_source(source, allow_path=False, record_deadline=record_deadline)
    return _records(src, max_descriptor_length, max_buffer_size, cross_machine)


def _records(
    src: Source, max_length: int, max_buffer: int | None, cross_machine: bool
) -> Iterator[BlockPagedTensor]:
    """A.2: prefix, descriptor, buffers; a clean end only at a record boundary."""
    for number in itertools.count():
        start = src.offset
        src.begin_record()
        prefix, cause = src.read(_PREFIX_LEN)
        if not len(prefix) and cause is None:
            return  # clean end of stream, at a record boundary
        if len(prefix) < _PREFIX_LEN:
            _cut(number, "descriptor prefix", src.offset, _PREFIX_LEN, len(prefix), cause)
        where = f"record {number}"
        try:  # A.2 step 3: descriptor_length from the first 10 bytes, within the limit
            length = peek_descriptor_length(prefix)
        except HurrayWireError as exc:
            raise container_error(exc, where, start + (exc.offset or 0)) from exc
        if length > max_length:
            raise InvalidContainerError(
                "descriptor_length above the limit",
                section=where,
                field="descriptor_length",
                offset=start + wd.AT["descriptor_length"],
                expected=f"<= {max_length}",
                found=length,
            )
        body, got, cause = src.read_array(length - _PREFIX_LEN)
        if got < length - _PREFIX_LEN:
            _cut(number, "descriptor", src.offset, length, _PREFIX_LEN + got, cause)
        try:  # A.2 steps 4-6
            descriptor = decode_descriptor(bytes(prefix) + body[:got].tobytes())
        except HurrayWireError as exc:
            at = None if exc.offset is None else start + exc.offset
            raise container_error(exc, where, at) from exc
        for index, handle in enumerate(descriptor.buffers):
            if max_buffer is not None and handle.byte_size > max_buffer:
                raise InvalidContainerError(
                    "buffer byte_size above the limit",
                    section=where,
                    field=f"buffers[{index}].byte_size",
                    offset=start + wd.handle_at(index) + wd.HANDLE.offsets["byte_size"],
                    expected=f"<= {max_buffer}",
                    found=handle.byte_size,
                )
        if cross_machine:
            check_cross_machine(descriptor, section=where)
        buffers = []
        for index, handle in enumerate(descriptor.buffers):
            array, got, cause = src.read_array(handle.byte_size)
            if got < handle.byte_size:
                _cut(number, f"buffers[{index}]", src.offset, handle.byte_size, got, cause)
            buffers.append(array)
        try:
            tensor = assemble(descriptor, buffers)
        except HurrayWireError as exc:
            raise container_error(exc, where, start) from exc
        yield tensor


def _cut(
    number: int, what: str, at: int, needed: int, got: int, cause: BaseException | None
) -> NoReturn:
    """Refuse a stream cut inside record ``number`` (``cause``: why the input ended)."""
    reason = f" ({cause!r})" if cause is not None else ""
    raise ContainerTruncatedError(
        f"stream ends inside record {number} ({what}){reason}",
        section=f"record {number}",
        field=what,
        offset=at,
        expected=f"{needed} bytes",
        found=f"{got} bytes",
    ) from cause
