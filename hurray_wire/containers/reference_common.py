"""What the two reference containers (containers.md Parts A and B) share: limits, reserved
KV keys, a tensor as its descriptor and buffers, and their errors placed in the container."""

from __future__ import annotations

from typing import Any

from hurray_wire.errors import (
    ArgumentTypeError,
    HurrayWireError,
    InvalidContainerError,
    InvalidTensorError,
    UnsupportedLayoutError,
)
from hurray_wire.model.descriptor import TensorDescriptor
from hurray_wire.model.descriptor_encode import encode_descriptor
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.wire import descriptor as wd

__all__ = [
    "DEFAULT_MAX_DESCRIPTOR_BYTES",
    "METADATA_KEY_PREFIX",
    "MIN_DESCRIPTOR_LENGTH",
    "RESERVED_PREFIXES",
    "SEQ_LENS_KEY_PREFIX",
    "check_cross_machine",
    "check_limit",
    "container_error",
    "tensor_pieces",
]

DEFAULT_MAX_DESCRIPTOR_BYTES = 16 << 20  # hurray-io DEFAULT_MAX_DESCRIPTOR_BYTES
SEQ_LENS_KEY_PREFIX = "hurray.seq_lens."  # + tensor name: uint64 array, one per sequence
METADATA_KEY_PREFIX = "hurray.metadata."  # + tensor name: bytes, a KV section (§ B.4)
RESERVED_PREFIXES = (SEQ_LENS_KEY_PREFIX, METADATA_KEY_PREFIX)
MIN_DESCRIPTOR_LENGTH = wd.FIXED_HEADER.sizeof()  # the descriptor decoder refuses less


def check_limit(name: str, value: object, minimum: int) -> None:
    """A reader limit argument: an int (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ArgumentTypeError(f"{name} must be an int >= {minimum}", found=repr(value))


def tensor_pieces(tensor: BlockPagedTensor) -> tuple[bytes, list[list[memoryview]]]:
    """The encoded descriptor and, per buffer in table order, views of its bytes (no copy)."""
    if not isinstance(tensor, BlockPagedTensor):
        raise ArgumentTypeError("expected a BlockPagedTensor", found=type(tensor).__name__)
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
    """A descriptor / index / KV error as a container error at a place in the container.

    ``UnsupportedLayoutError`` (a valid tensor of another layout) keeps its type.
    """
    if isinstance(exc, UnsupportedLayoutError):
        return exc.relocated(section=section, offset=offset)
    inner = f"{type(exc).__name__}: {exc}"
    return InvalidContainerError(inner, section=section, field=exc.field, offset=offset)
