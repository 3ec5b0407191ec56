"""hurray-wire: move PagedAttention KV caches between machines in the Hurray block-paged layout.

The public API mirrors the spec's names: ``BlockPagedLayout``, the quantization schemes,
``TensorDescriptor`` with ``encode_descriptor`` / ``decode_descriptor``, a
``BlockPagedTensor`` that ``encode`` frames into a blob and ``decode`` validates back into
NumPy views. Element types live in ``hurray_wire.dtypes`` and, as the reference's Python
API spells them, here (``hurray_wire.float16``; ``preload()`` resolves them all at
start-up); every error class is here and in ``hurray_wire.errors``; everything else
importable from its module. This module only re-exports.
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
from hurray_wire.containers import (
    HrryFile,
    ModelCache,
    StreamFile,
    StreamHeader,
    StreamReader,
    StreamWriter,
    load_cache,
    save_cache,
)
from hurray_wire.dtypes import (
    ElementType,
    preload,
)
from hurray_wire.dtypes import (  # typed module attributes, as the reference's API has them
    bfloat16 as bfloat16,
)
from hurray_wire.dtypes import (
    bool_ as bool_,
)
from hurray_wire.dtypes import (
    complex64 as complex64,
)
from hurray_wire.dtypes import (
    complex128 as complex128,
)
from hurray_wire.dtypes import (
    float4_e2m1 as float4_e2m1,
)
from hurray_wire.dtypes import (
    float6_e2m3 as float6_e2m3,
)
from hurray_wire.dtypes import (
    float6_e3m2 as float6_e3m2,
)
from hurray_wire.dtypes import (
    float8_e4m3 as float8_e4m3,
)
from hurray_wire.dtypes import (
    float8_e5m2 as float8_e5m2,
)
from hurray_wire.dtypes import (
    float8_e8m0 as float8_e8m0,
)
from hurray_wire.dtypes import (
    float16 as float16,
)
from hurray_wire.dtypes import (
    float32 as float32,
)
from hurray_wire.dtypes import (
    float64 as float64,
)
from hurray_wire.dtypes import (
    float128 as float128,
)
from hurray_wire.dtypes import (
    int2 as int2,
)
from hurray_wire.dtypes import (
    int4 as int4,
)
from hurray_wire.dtypes import (
    int8 as int8,
)
from hurray_wire.dtypes import (
    int16 as int16,
)
from hurray_wire.dtypes import (
    int32 as int32,
)
from hurray_wire.dtypes import (
    int64 as int64,
)
from hurray_wire.dtypes import (
    uint2 as uint2,
)
from hurray_wire.dtypes import (
    uint4 as uint4,
)
from hurray_wire.dtypes import (
    uint8 as uint8,
)
from hurray_wire.dtypes import (
    uint16 as uint16,
)
from hurray_wire.dtypes import (
    uint32 as uint32,
)
from hurray_wire.dtypes import (
    uint64 as uint64,
)
from hurray_wire.errors import (
    ArgumentTypeError,
    BlobTruncatedError,
    ChecksumError,
    ClosedContainerError,
    CodecConfigError,
    ContainerTruncatedError,
    DecompressionError,
    DescriptorTruncatedError,
    FileAccessError,
    HurrayWireError,
    IncompatibleFingerprintError,
    IndexBufferError,
    IntegrityError,
    IntegrityRecordTruncatedError,
    InvalidBlobError,
    InvalidContainerError,
    InvalidDescriptorError,
    InvalidIntegrityRecordError,
    InvalidMetadataError,
    InvalidStreamError,
    InvalidTensorError,
    InvalidTransferRecordError,
    LimitExceededError,
    MissingTensorError,
    PaddingError,
    PageDigestError,
    PageStoreError,
    PageStoreMissError,
    QuantizationNotDefinedError,
    SectionError,
    StreamBlobTruncatedError,
    StreamTruncatedError,
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
    "BlobTruncatedError",
    "BlockPagedLayout",
    "BlockPagedTensor",
    "BufferHandle",
    "ChecksumError",
    "ClosedContainerError",
    "CodecConfigError",
    "Compression",
    "ContainerTruncatedError",
    "DecodeLimits",
    "DecodeReport",
    "DecompressionError",
    "DescriptorHeader",
    "DescriptorTruncatedError",
    "ElementType",
    "FileAccessError",
    "HrryFile",
    "HurrayWireError",
    "IncompatibleFingerprintError",
    "IndexBufferError",
    "IntegrityError",
    "IntegrityRecordTruncatedError",
    "InvalidBlobError",
    "InvalidContainerError",
    "InvalidDescriptorError",
    "InvalidIntegrityRecordError",
    "InvalidMetadataError",
    "InvalidStreamError",
    "InvalidTensorError",
    "InvalidTransferRecordError",
    "LimitExceededError",
    "MissingTensorError",
    "ModelCache",
    "PaddingError",
    "PageDigestError",
    "PageStoreError",
    "PageStoreMissError",
    "PerBlockAffine",
    "PerChannelAffine",
    "PerTensorAffine",
    "Quantization",
    "QuantizationNotDefinedError",
    "SectionError",
    "Statistics",
    "StreamBlobTruncatedError",
    "StreamFile",
    "StreamHeader",
    "StreamReader",
    "StreamTruncatedError",
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
    "load_cache",
    "merge_heads",
    "preload",
    "save_cache",
    "to_flashinfer",
    "to_sglang",
    "to_torch",
    "to_vllm",
]


def __getattr__(name: str) -> Any:
    """The rest of ``hurray_wire.dtypes`` (``ELEMENT_TYPES``, ``element_type_of``, ...)."""
    if name in dtypes.__all__:
        return getattr(dtypes, name)
    raise AttributeError(f"module 'hurray_wire' has no attribute {name!r}")
