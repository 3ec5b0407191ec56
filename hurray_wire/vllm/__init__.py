"""hurray-wire inside vLLM: ``HurrayConnector``, a KV connector for prefill/decode
disaggregation (docs/vllm.md). Importing this package imports vLLM; the core never does.

Enable it with ``--kv-transfer-config '{"kv_connector": "HurrayConnector",
"kv_connector_module_path": "hurray_wire.vllm", "kv_role": "kv_producer", ...}'``.
"""

from __future__ import annotations

from hurray_wire.vllm.connector import HurrayConnector

__all__ = ["HurrayConnector"]
