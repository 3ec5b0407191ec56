"""The public surface: every name resolves, every error is at the top level, the error tree
lets ``except`` clauses catch what they mean, and ``import hurray_wire`` is cheap."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire import errors


def test_every_public_name_resolves() -> None:
    for name in hw.__all__:
        assert getattr(hw, name) is not None, name
    assert set(dir(hw)) >= set(hw.__all__)
    with pytest.raises(AttributeError):
        _ = hw.no_such_name


def test_every_error_is_importable_from_the_top_level() -> None:
    for name in errors.__all__:
        assert getattr(hw, name) is getattr(errors, name), name
        assert name in hw.__all__


def test_a_page_digest_failure_is_an_invalid_blob() -> None:
    t = hw.BlockPagedTensor.from_arrays(
        np.ones((2, 4, 1, 8), np.float16), [0, 1], [0, 2], kv_role="key", layer_index=0
    )
    blob = bytearray(hw.encode(t, page_digests=True, checksum=False))
    blob[blob.find(t.page_pool.tobytes())] ^= 1
    with pytest.raises(hw.InvalidBlobError) as info:
        hw.decode(blob)
    assert isinstance(info.value, hw.PageDigestError) and info.value.pages == (0,)
    assert issubclass(hw.PageStoreMissError, hw.InvalidBlobError)
    assert not issubclass(hw.IncompatibleFingerprintError, hw.InvalidBlobError)


def test_import_loads_no_subpackage() -> None:
    """``import hurray_wire`` loads the error tree only (not even NumPy); each name loads
    its module on first use."""
    code = (
        "import sys, hurray_wire as hw\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('hurray_wire.'))\n"
        "print(loaded, 'numpy' in sys.modules)\n"
        "hw.decode\n"
        "print('hurray_wire.blob' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split("\n")
    assert out[0] == "['hurray_wire._version', 'hurray_wire.errors'] False"
    assert out[1] == "True"
