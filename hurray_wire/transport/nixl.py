"""hurray-wire over NIXL: move blobs between two NIXL agents, validated, layer by layer.

docs/nixl.md is the guide. In short: each side creates one endpoint (``NixlSender`` /
``NixlReceiver``), registers its long-lived memory (the engine's KV pools, and the
endpoint's own arena or landing region, which it registers itself), then the two exchange
NIXL agent metadata (``metadata()`` / ``add_peer()``; metadata taken before registration
is stale, so ``register`` refuses once it has been taken). Per blob the sender
``publish``es a tensor and the receiver ``receive``s it; hurray-wire's own control records
(``hurray_wire.transport.records``, sent as NIXL notifications) say what lies where.

Importing this module loads NIXL (``nixl_cu12``, else the ``nixl`` package's ``nixl._api``)
and raises ``TransportError`` if neither loads. Every wait takes a ``deadline`` in seconds
(default ``DEFAULT_DEADLINE``); every NIXL exception comes out as a ``TransportError`` whose
``__cause__`` is the original.
"""

from hurray_wire.transport.nixl_endpoint import DEFAULT_DEADLINE
from hurray_wire.transport.nixl_receiver import NixlReceiver
from hurray_wire.transport.nixl_sender import NixlSender

__all__ = [
    "DEFAULT_DEADLINE",
    "NixlReceiver",
    "NixlSender",
]
