"""Landing: the one place where a blob's bytes go into caller memory. The destination is a
value passed with the bytes (``decode(data, into=...)``, the stream readers, NIXL's
receiver), each under one protocol (``blob.decoder.Landing``): checked against the blob's
header before a section is read, written once as the pipeline's last step, so a refusal
leaves it untouched (``IntoArray(one_pass=True)`` trades that for one pass over memory,
docs/decisions.md).

* ``IntoArray`` (an engine array, whole) and ``IntoPages`` (page ids of an engine pool):
  the verified pool copied or scattered (``arrays.py``);
* ``InPlace``: a blob, delta or full, into the engine's own pool, its sent pages into free
  pages (``in_place.py``, docs/integrity.md § 5.3).
"""

from hurray_wire.blob.landing.arrays import IntoArray, IntoPages
from hurray_wire.blob.landing.in_place import InPlace, InPlaceReport, peek_in_place

__all__ = ["InPlace", "InPlaceReport", "IntoArray", "IntoPages", "peek_in_place"]
