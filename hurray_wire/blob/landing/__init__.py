"""Landing: the one place where a blob's bytes go into caller memory, a target passed with
the bytes (``decode(data, into=...)``, the stream readers, NIXL's receiver) under one
protocol (``blob.decoder.Landing``): checked against the blob's header before a section is
read, written once as the pipeline's last step, so a refusal leaves it untouched
(``IntoArray(one_pass=True)`` trades that for one pass over memory, docs/decisions.md).
``arrays.py``: ``IntoArray``, ``IntoPages``; ``in_place.py``: ``InPlace``.
"""

from hurray_wire.blob.landing.arrays import IntoArray, IntoPages
from hurray_wire.blob.landing.in_place import InPlace, InPlaceReport, peek_in_place

__all__ = ["InPlace", "InPlaceReport", "IntoArray", "IntoPages", "peek_in_place"]
