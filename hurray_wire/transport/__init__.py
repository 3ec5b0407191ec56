"""Transports that move blobs between machines through an RDMA-capable engine.

``hurray_wire.transport.nixl`` moves blobs with NVIDIA NIXL (the optional extra
``hurray-wire[nixl]``, installed with ``--no-deps`` on CPU machines: docs/nixl.md). Importing
this package, or ``hurray_wire``, never imports NIXL; only ``hurray_wire.transport.nixl`` does.
``hurray_wire.transport.records`` is the engine-independent control-record codec.
"""
