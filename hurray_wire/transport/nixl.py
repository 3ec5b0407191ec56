"""hurray-wire over NIXL: move blobs between two NIXL agents, validated, layer by layer.

docs/nixl.md is the guide (endpoints, registration, metadata exchange, publish / receive).
Importing this module loads NIXL (``nixl_cu12``, else ``nixl._api``) or raises
``TransportError``; every wait takes a ``deadline`` in seconds (``DEFAULT_DEADLINE``), and
every NIXL exception comes out as a ``TransportError`` whose ``__cause__`` is the original.
"""

from hurray_wire.transport.nixl_endpoint import DEFAULT_DEADLINE
from hurray_wire.transport.nixl_receiver import NixlReceiver
from hurray_wire.transport.nixl_sender import NixlSender

__all__ = [
    "DEFAULT_DEADLINE",
    "NixlReceiver",
    "NixlSender",
]
