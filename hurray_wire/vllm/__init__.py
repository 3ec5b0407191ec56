"""hurray-wire inside vLLM: ``HurrayConnector``, a KV connector for prefill/decode
disaggregation (docs/vllm.md). ``HurrayConnector`` imports vLLM when first looked up (vLLM's
``kv_connector_module_path`` does exactly that); ``hurray_wire.vllm.transfer`` does not.

Enable it with ``--kv-transfer-config '{"kv_connector": "HurrayConnector",
"kv_connector_module_path": "hurray_wire.vllm", "kv_role": "kv_producer", ...}'``.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["HurrayConnector"]


def __getattr__(name: str) -> Any:
    if name == "HurrayConnector":
        return importlib.import_module("hurray_wire.vllm.connector").HurrayConnector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
