"""Engine adapters: one module per engine, pure NumPy, no engine imported.

``vllm``, ``flashinfer`` and ``sglang`` convert between an engine's per-layer cache and
index tables and ``BlockPagedTensor``; ``torch`` moves arrays through DLPack and imports
torch only when called. Every adapter accepts torch tensors as well as NumPy arrays.
"""

from hurray_wire.adapters.flashinfer import from_flashinfer, to_flashinfer
from hurray_wire.adapters.sglang import from_sglang, to_sglang
from hurray_wire.adapters.torch import from_torch, to_torch
from hurray_wire.adapters.vllm import from_vllm, to_vllm
from hurray_wire.adapters.vllm_landing import into_vllm

__all__ = [
    "from_flashinfer",
    "from_sglang",
    "from_torch",
    "from_vllm",
    "into_vllm",
    "to_flashinfer",
    "to_sglang",
    "to_torch",
    "to_vllm",
]
