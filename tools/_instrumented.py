"""Import every module of ``hurray_wire`` now, for the atheris harnesses.

``import hurray_wire`` is lazy (a public name loads its module on first use), and atheris
instruments only the modules imported inside ``atheris.instrument_imports()``: a harness
that imported the package alone fuzzed an uninstrumented decoder (libFuzzer saw 32 edges
of the descriptor codec instead of about 600). Each harness calls ``import_all()`` inside
that block. Skipped: the engine-facing modules that are no reader of hostile bytes here
(adapters, NIXL bindings, the vLLM connector class and its metrics, the test strategies)
and ``__main__``.
"""

from __future__ import annotations

import importlib
import pkgutil

SKIP = (".adapters", ".nixl", ".testing", ".vllm.connector", ".vllm.metrics", ".__main__")


def import_all() -> list[str]:
    """Import the package's modules (but ``SKIP``); returns their names."""
    import hurray_wire

    names = []
    for module in pkgutil.walk_packages(hurray_wire.__path__, "hurray_wire."):
        if any(part in module.name for part in SKIP):
            continue
        importlib.import_module(module.name)
        names.append(module.name)
    return names
