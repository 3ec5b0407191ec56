"""Torch tensors <-> NumPy arrays through DLPack, without importing torch unless given one.

Every entry point that takes arrays (``from_arrays`` and the engine adapters) passes its
arguments through ``as_numpy``: a torch tensor is recognised by its type's module name, so
hurray-wire never imports torch for NumPy callers. CPU tensors are shared, not copied.
NumPy's DLPack cannot carry bfloat16 or the float8 types, so those cross as a same-width
unsigned integer and are viewed back as the ``ml_dtypes`` type.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import numpy as np
import numpy.typing as npt

from hurray_wire.errors import ArgumentTypeError

__all__ = ["as_numpy", "is_torch", "numpy_to_torch", "torch_to_numpy"]

# torch dtype name -> the same-width integer type both DLPacks carry; the NumPy dtype is the
# ml_dtypes type of the same name (imported with the first torch tensor, not before).
_CARRIERS = {
    "bfloat16": "uint16",
    "float8_e4m3fn": "uint8",
    "float8_e5m2": "uint8",
    "float8_e4m3fnuz": "uint8",
    "float8_e5m2fnuz": "uint8",
    "float8_e8m0fnu": "uint8",
}


@functools.cache
def _via_integer() -> dict[str, tuple[np.dtype[Any], str]]:
    """torch dtype name -> (NumPy dtype, carrier integer type)."""
    ml_dtypes = importlib.import_module("ml_dtypes")
    return {name: (np.dtype(getattr(ml_dtypes, name)), c) for name, c in _CARRIERS.items()}


@functools.cache
def _by_numpy() -> dict[np.dtype[Any], tuple[str, str]]:
    return {dtype: (name, carrier) for name, (dtype, carrier) in _via_integer().items()}


def _torch() -> Any:
    """torch, imported on first use (typed Any: its stubs are not ours to check)."""
    return importlib.import_module("torch")


def is_torch(value: object) -> bool:
    """True for a torch tensor, decided without importing torch."""
    return type(value).__module__.startswith("torch") and hasattr(value, "__dlpack__")


def as_numpy(value: Any, name: str) -> Any:
    """``value`` unchanged, or as a NumPy array when it is a torch tensor."""
    return torch_to_numpy(value, name) if is_torch(value) else value


def torch_to_numpy(tensor: Any, name: str = "tensor") -> npt.NDArray[Any]:
    """A NumPy view of a CPU torch tensor (strides kept); other devices are copied to CPU."""
    if not is_torch(tensor):
        raise ArgumentTypeError("expected a torch.Tensor", field=name, found=type(tensor).__name__)
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    dtype_name = str(t.dtype).removeprefix("torch.")
    via = _via_integer().get(dtype_name)
    try:
        if via is None:
            return np.from_dlpack(t)
        torch = _torch()
        return np.from_dlpack(t.view(getattr(torch, via[1]))).view(via[0])
    except (BufferError, TypeError, RuntimeError) as exc:
        raise ArgumentTypeError(
            f"torch dtype {t.dtype} has no NumPy equivalent ({exc})", field=name, found=str(t.dtype)
        ) from None


def numpy_to_torch(array: npt.NDArray[Any], name: str = "array") -> Any:
    """A torch tensor sharing ``array``'s memory (bfloat16 / float8 through an integer view)."""
    torch = _torch()
    via = _by_numpy().get(array.dtype)
    try:
        if via is None:
            return torch.from_dlpack(array)
        return torch.from_dlpack(array.view(via[1])).view(getattr(torch, via[0]))
    except (BufferError, TypeError, RuntimeError) as exc:
        raise ArgumentTypeError(
            f"NumPy dtype {array.dtype} has no torch equivalent ({exc})",
            field=name,
            found=str(array.dtype),
        ) from None
