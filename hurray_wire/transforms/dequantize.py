"""Real values of a pool by the spec's formulas: ``x = scale * (q - zero_point)`` (integer
subtraction, float32 multiply), per channel along heads or head_dim, per block one per page
slot (block-paged.md § 7); unquantized fp8 with ``kv_scale``: ``float32(q) * kv_scale``.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from hurray_wire.errors import ArgumentTypeError, InvalidTensorError
from hurray_wire.model.quantization import PerBlockAffine, PerChannelAffine, PerTensorAffine
from hurray_wire.tensor_core import TensorCore
from hurray_wire.transforms._common import Array, check_tensor

__all__ = ["dequantize", "dequantize_slots"]

_F32 = np.dtype(np.float32)


def dequantize(tensor: TensorCore, dtype: Any = np.float32) -> Array:
    """The whole pool ``[num_pages, page_size, num_heads, head_dim]`` in ``dtype``."""
    out: np.dtype[Any] | None = None
    if dtype is not None:  # NumPy would read None as float64: say what is meant instead
        with contextlib.suppress(TypeError):
            out = np.dtype(dtype)
    if out is None or out.kind != "f":
        found = repr(dtype) if out is None else str(out)
        raise ArgumentTypeError("dtype must be a NumPy floating dtype", field="dtype", found=found)
    pool = check_tensor(tensor).unpacked_page_pool()
    layout = tensor.layout
    slots = np.arange(layout.page_slots, dtype=np.int64).reshape(layout.num_pages, -1)
    return dequantize_slots(tensor, pool, slots, out)


def dequantize_slots(
    tensor: TensorCore, values: Array, slots: Array, dtype: np.dtype[Any]
) -> Array:
    """Dequantize ``values`` (``slots.shape + [heads, head_dim]``) read from ``slots``."""
    if values.dtype.kind == "c":
        raise InvalidTensorError(
            "complex tensors have no real dequantized form", field="element_type"
        )
    quant = tensor.quantization
    if quant is None:
        real = values.astype(_F32)
        scale = tensor.kv_scale
        if scale is not None:
            real *= np.float32(scale)
    elif isinstance(quant, PerTensorAffine):
        shifted = values.astype(np.int64) - quant.zero_point
        real = shifted.astype(_F32) * np.float32(quant.scale)
    elif isinstance(quant, PerChannelAffine):
        assert tensor.scales is not None
        shape = (-1, 1) if quant.axis == 1 else (-1,)  # broadcast over [..., heads, head_dim]
        scales = tensor.scales.astype(_F32).reshape(shape)
        shifted = values.astype(np.int64)
        if tensor.zero_points is not None:
            shifted = shifted - tensor.zero_points.astype(np.int64).reshape(shape)
        real = shifted.astype(_F32) * scales
    elif isinstance(quant, PerBlockAffine):
        assert tensor.scales is not None
        scales = tensor.scales.astype(_F32)[slots][..., None, None]
        shifted = values.astype(np.int64)
        if tensor.zero_points is not None:
            shifted = shifted - tensor.zero_points.astype(np.int64)[slots][..., None, None]
        real = shifted.astype(_F32) * scales
    else:  # NF4 / MXFP never reach a block-paged tensor ([A11])
        raise InvalidTensorError("no dequantization for this scheme", field="quantization")
    return real.astype(dtype, copy=False)
