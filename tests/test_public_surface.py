"""The public surface: at most 60 names, every one resolves, the errors are one namespace
(``hurray_wire.errors``, its base also at the top level), the error tree lets ``except``
clauses catch what they mean, and ``import hurray_wire`` is cheap."""

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


def test_the_surface_has_at_most_60_names() -> None:
    """Issue 31: a newcomer reads the whole surface; 88 names (36 of them errors) was too
    many. Each name resolves to one object, listed once."""
    assert len(hw.__all__) <= 60, len(hw.__all__)
    assert len(set(hw.__all__)) == len(hw.__all__)


def test_the_errors_are_one_namespace() -> None:
    """Every error is ``hw.errors.X``; only the base is also at the top level. An old
    top-level spelling says where the error went."""
    assert hw.errors is errors and "errors" in hw.__all__
    assert hw.HurrayWireError is errors.HurrayWireError and "HurrayWireError" in hw.__all__
    for name in errors.__all__:
        assert issubclass(getattr(hw.errors, name), hw.HurrayWireError), name
        if name != "HurrayWireError":
            assert name not in hw.__all__, name
    with pytest.raises(AttributeError, match=r"hurray_wire\.errors\.ChecksumError"):
        _ = hw.ChecksumError


def test_a_page_digest_failure_is_an_invalid_blob() -> None:
    t = hw.BlockPagedTensor.from_arrays(
        np.ones((2, 4, 1, 8), np.float16), [0, 1], [0, 2], kv_role="key", layer_index=0
    )
    blob = bytearray(hw.encode(t, page_digests=True, checksum=False))
    blob[blob.find(t.page_pool.tobytes())] ^= 1
    with pytest.raises(hw.errors.InvalidBlobError) as info:
        hw.decode(blob)
    assert isinstance(info.value, hw.errors.PageDigestError) and info.value.pages == (0,)
    assert issubclass(hw.errors.PageStoreMissError, hw.errors.InvalidBlobError)
    assert not issubclass(hw.errors.IncompatibleFingerprintError, hw.errors.InvalidBlobError)


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
    assert out[0] == "['hurray_wire._lazy', 'hurray_wire._version', 'hurray_wire.errors'] False"
    assert out[1] == "True"


def test_the_decode_path_loads_only_what_decode_and_encode_need() -> None:
    """Issue 31: ``from hurray_wire import decode, encode, BlockPagedTensor`` loads the
    decoder, the encoder and their imports; the packages re-export lazily, so the landings,
    the Bloom filter, the engine pool store and every layer above ``blob/`` stay unloaded."""
    code = (
        "import sys\n"
        "from hurray_wire import decode, encode, BlockPagedTensor\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('hurray_wire'))))\n"
    )
    loaded = set(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
        ).stdout.split()
    )
    assert {"hurray_wire.blob.decoder", "hurray_wire.blob.encoder", "hurray_wire.tensor"} <= loaded
    unloaded = {"blob.landing", "integrity.bloom", "integrity.pool_store"}
    assert not loaded & {f"hurray_wire.{m}" for m in unloaded}
    above = ("containers", "adapters", "reference_api", "transport", "vllm", "report", "cli")
    assert not [m for m in loaded if m.partition(".")[2].startswith(above)]
