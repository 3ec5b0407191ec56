"""hurray-wire: move PagedAttention KV caches between machines in the Hurray block-paged layout.

The public API mirrors the spec's names: ``BlockPagedLayout``, the quantization schemes,
``TensorDescriptor`` with ``encode_descriptor`` / ``decode_descriptor``, a
``BlockPagedTensor`` that ``encode`` frames into a blob and ``decode`` validates back into
NumPy views. ``BlockPagedTensor`` is the tensor every API takes and returns; ``Tensor`` is
only the reference implementation's raw-buffer class (for code written against
``hurray.Tensor``; ``Tensor.to_block_paged()`` converts). Element types live in
``hurray_wire.dtypes`` (``hurray_wire.float16`` works too, as the reference's Python API
spells them); the error tree is one namespace, ``hurray_wire.errors``
(``hw.errors.ChecksumError``; its base ``HurrayWireError`` is here too); everything else
importable from its module. This module only re-exports, and loads each name's module on
first use (``import hurray_wire`` costs the error tree alone; docs/performance.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hurray_wire import errors as errors
from hurray_wire._lazy import exports
from hurray_wire._version import __version__ as __version__
from hurray_wire.errors import HurrayWireError as HurrayWireError

if TYPE_CHECKING:
    from hurray_wire import dtypes as dtypes
    from hurray_wire.adapters import (
        from_flashinfer as from_flashinfer,
        from_sglang as from_sglang,
        from_sglang_mla as from_sglang_mla,
        from_torch as from_torch,
        from_vllm as from_vllm,
        into_vllm as into_vllm,
        to_flashinfer as to_flashinfer,
        to_sglang as to_sglang,
        to_sglang_mla as to_sglang_mla,
        to_torch as to_torch,
        to_vllm as to_vllm,
    )
    from hurray_wire.blob import (
        DecodeLimits as DecodeLimits,
        Decoder as Decoder,
        DecodeReport as DecodeReport,
        Encoder as Encoder,
        InPlace as InPlace,
        IntoArray as IntoArray,
        IntoPages as IntoPages,
        blob_length as blob_length,
        decode as decode,
        decode_report as decode_report,
        encode as encode,
        encode_into as encode_into,
        encode_parts as encode_parts,
    )
    from hurray_wire.codecs import Compression as Compression
    from hurray_wire.containers import (
        HrryFile as HrryFile,
        ModelCache as ModelCache,
        StreamFile as StreamFile,
        StreamHeader as StreamHeader,
        StreamReader as StreamReader,
        StreamWriter as StreamWriter,
        load_cache as load_cache,
        save_cache as save_cache,
    )
    from hurray_wire.dtypes import (  # typed module attributes, as the reference's API has them
        ElementType as ElementType,
        bfloat16 as bfloat16,
        bool_ as bool_,
        complex64 as complex64,
        complex128 as complex128,
        float4_e2m1 as float4_e2m1,
        float6_e2m3 as float6_e2m3,
        float6_e3m2 as float6_e3m2,
        float8_e4m3 as float8_e4m3,
        float8_e5m2 as float8_e5m2,
        float8_e8m0 as float8_e8m0,
        float16 as float16,
        float32 as float32,
        float64 as float64,
        float128 as float128,
        int2 as int2,
        int4 as int4,
        int8 as int8,
        int16 as int16,
        int32 as int32,
        int64 as int64,
        preload as preload,
        uint2 as uint2,
        uint4 as uint4,
        uint8 as uint8,
        uint16 as uint16,
        uint32 as uint32,
        uint64 as uint64,
    )
    from hurray_wire.fingerprint import EngineFingerprint as EngineFingerprint
    from hurray_wire.model.descriptor import (
        BufferHandle as BufferHandle,
        Statistics as Statistics,
        TensorDescriptor as TensorDescriptor,
    )
    from hurray_wire.model.descriptor_codec import (
        DescriptorHeader as DescriptorHeader,
        decode_descriptor as decode_descriptor,
        decode_header as decode_header,
        encode_descriptor as encode_descriptor,
    )
    from hurray_wire.model.layout import BlockPagedLayout as BlockPagedLayout
    from hurray_wire.model.quantization import (
        MXFP as MXFP,
        NF4 as NF4,
        PerBlockAffine as PerBlockAffine,
        PerChannelAffine as PerChannelAffine,
        PerTensorAffine as PerTensorAffine,
        Quantization as Quantization,
    )
    from hurray_wire.reference_api import Tensor as Tensor
    from hurray_wire.tensor import BlockPagedTensor as BlockPagedTensor
    from hurray_wire.transforms.heads import merge_heads as merge_heads


_SUBPACKAGES = frozenset(
    {"adapters", "blob", "cli", "codecs", "containers", "dtypes", "fingerprint", "integrity",
     "kv_scale", "metadata", "model", "parallel", "reference_api", "report", "tensor",
     "testing", "transforms", "transport", "wire"}
)  # fmt: skip


def _other(name: str) -> Any:
    """A subpackage; ``hurray_wire.float16`` and the other names of ``hurray_wire.dtypes``
    (the reference's Python API has them at its top level; not in ``__all__``); an error's
    old top-level name says where it went."""
    if name in _SUBPACKAGES:
        return importlib.import_module(f"hurray_wire.{name}")
    if not name.startswith("_"):
        types = importlib.import_module("hurray_wire.dtypes")
        if name in types.__all__:
            return getattr(types, name)
        if name in errors.__all__:
            raise AttributeError(f"module 'hurray_wire' has no attribute {name!r}: the errors"
                                 f" are in one namespace, hurray_wire.errors.{name}")  # fmt: skip
    raise AttributeError(f"module 'hurray_wire' has no attribute {name!r}")


#: Each public name but the errors, by the module that defines it (imported on first use).
_EXPORTS = {
    "hurray_wire.adapters": "from_flashinfer from_sglang from_sglang_mla from_torch from_vllm"
    " into_vllm to_flashinfer to_sglang to_sglang_mla to_torch to_vllm",
    "hurray_wire.blob.decoder": "DecodeReport Decoder decode decode_report",
    "hurray_wire.blob.encoder": "Encoder encode encode_into encode_parts",
    "hurray_wire.blob.envelope": "blob_length",
    "hurray_wire.blob.landing": "InPlace IntoArray IntoPages",
    "hurray_wire.blob.limits": "DecodeLimits",
    "hurray_wire.codecs": "Compression",
    "hurray_wire.containers": "HrryFile ModelCache StreamFile StreamHeader StreamReader"
    " StreamWriter load_cache save_cache",
    "hurray_wire.dtypes": "ElementType preload",
    "hurray_wire.fingerprint": "EngineFingerprint",
    "hurray_wire.model.descriptor": "BufferHandle Statistics TensorDescriptor",
    "hurray_wire.model.descriptor_codec": "DescriptorHeader decode_descriptor decode_header"
    " encode_descriptor",
    "hurray_wire.model.layout": "BlockPagedLayout",
    "hurray_wire.model.quantization": "MXFP NF4 PerBlockAffine PerChannelAffine"
    " PerTensorAffine Quantization",
    "hurray_wire.reference_api": "Tensor",
    "hurray_wire.tensor": "BlockPagedTensor",
    "hurray_wire.transforms.heads": "merge_heads",
}
__getattr__, _listing = exports(__name__, _EXPORTS, _other)
__all__ = sorted(
    ["HurrayWireError", "__version__", "dtypes", "errors", *" ".join(_EXPORTS.values()).split()]
)


def __dir__() -> list[str]:
    types = importlib.import_module("hurray_wire.dtypes")
    return sorted(set(_listing()) | set(__all__) | set(types.__all__))
