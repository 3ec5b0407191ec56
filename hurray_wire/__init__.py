"""hurray-wire: move PagedAttention KV caches between machines in the Hurray block-paged layout.

The public API mirrors the spec's names: ``BlockPagedLayout``, the quantization schemes,
``TensorDescriptor`` with ``encode_descriptor`` / ``decode_descriptor``, a
``BlockPagedTensor`` that ``encode`` frames into a blob and ``decode`` validates back into
NumPy views. Element types live in ``hurray_wire.dtypes`` (``hurray_wire.float16`` works
too, as the reference's Python API spells them); every error class in
``hurray_wire.errors``; everything else importable from its module. This module only
re-exports.
"""

from __future__ import annotations

from typing import Any

from hurray_wire import dtypes
from hurray_wire._version import __version__
from hurray_wire.adapters import (
    from_flashinfer,
    from_sglang,
    from_torch,
    from_vllm,
    into_vllm,
    to_flashinfer,
    to_sglang,
    to_torch,
    to_vllm,
)
from hurray_wire.blob import (
    DecodeLimits,
    DecodeReport,
    blob_length,
    decode,
    decode_in_place,
    decode_in_place_report,
    decode_into,
    decode_report,
    encode,
    encode_into,
    encode_parts,
)
from hurray_wire.codecs import Compression
from hurray_wire.containers import HrryFile, StreamFile, StreamHeader, StreamReader, StreamWriter
from hurray_wire.dtypes import ElementType
from hurray_wire.errors import (
    ArgumentTypeError,
    ChecksumError,
    ClosedContainerError,
    HurrayWireError,
    IndexBufferError,
    InvalidBlobError,
    InvalidContainerError,
    InvalidDescriptorError,
    InvalidMetadataError,
    InvalidStreamError,
    InvalidTensorError,
    LimitExceededError,
    MissingTensorError,
    QuantizationNotDefinedError,
    TransportError,
    TruncatedError,
    UnsupportedLayoutError,
)
from hurray_wire.model.descriptor import BufferHandle, Statistics, TensorDescriptor
from hurray_wire.model.descriptor_codec import DescriptorHeader, decode_descriptor, decode_header
from hurray_wire.model.descriptor_encode import encode_descriptor
from hurray_wire.model.layout import BlockPagedLayout
from hurray_wire.model.quantization import (
    MXFP,
    NF4,
    PerBlockAffine,
    PerChannelAffine,
    PerTensorAffine,
    Quantization,
)
from hurray_wire.reference_api import Tensor
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.transforms.heads import merge_heads

__all__ = [
    "MXFP",
    "NF4",
    "ArgumentTypeError",
    "BlockPagedLayout",
    "BlockPagedTensor",
    "BufferHandle",
    "ChecksumError",
    "ClosedContainerError",
    "Compression",
    "DecodeLimits",
    "DecodeReport",
    "DescriptorHeader",
    "ElementType",
    "HrryFile",
    "HurrayWireError",
    "IndexBufferError",
    "InvalidBlobError",
    "InvalidContainerError",
    "InvalidDescriptorError",
    "InvalidMetadataError",
    "InvalidStreamError",
    "InvalidTensorError",
    "LimitExceededError",
    "MissingTensorError",
    "PerBlockAffine",
    "PerChannelAffine",
    "PerTensorAffine",
    "Quantization",
    "QuantizationNotDefinedError",
    "Statistics",
    "StreamFile",
    "StreamHeader",
    "StreamReader",
    "StreamWriter",
    "Tensor",
    "TensorDescriptor",
    "TransportError",
    "TruncatedError",
    "UnsupportedLayoutError",
    "__version__",
    "blob_length",
    "decode",
    "decode_descriptor",
    "decode_header",
    "decode_in_place",
    "decode_in_place_report",
    "decode_into",
    "decode_report",
    "dtypes",
    "encode",
    "encode_descriptor",
    "encode_into",
    "encode_parts",
    "from_flashinfer",
    "from_sglang",
    "from_torch",
    "from_vllm",
    "into_vllm",
    "merge_heads",
    "to_flashinfer",
    "to_sglang",
    "to_torch",
    "to_vllm",
]


def __getattr__(name: str) -> Any:
    """``hurray_wire.float16`` and the other names of ``hurray_wire.dtypes``, which the
    reference's Python API has at its top level; not in ``__all__``."""
    if name in dtypes.__all__:
        return getattr(dtypes, name)
    raise AttributeError(f"module 'hurray_wire' has no attribute {name!r}")
