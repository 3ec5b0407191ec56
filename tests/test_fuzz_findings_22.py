"""A finding of the issue-22 campaign (docs/fuzzing.md, F8): with ``verify=False`` the
decoder skipped the page-digests section entirely, so a section of an unsupported version
was accepted (the harness saw ``verify=True`` and ``verify=False`` refuse one blob for
different reasons). ``verify=False`` skips only the comparison of pages with digests."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire.errors import InvalidIntegrityRecordError
from hurray_wire.integrity import encode_digest_section, page_digests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import fuzz_blob


@pytest.mark.parametrize("verify", [True, False])
def test_a_page_digests_section_of_another_version_is_refused(verify: bool) -> None:
    tensor = hw.BlockPagedTensor.from_arrays(np.ones((4, 4, 2, 8), np.float16), [0, 1, 2], [0, 3])
    blob = bytearray(hw.encode(tensor, page_digests=True))
    at = bytes(blob).index(encode_digest_section(page_digests(tensor)))
    blob[at] = 68  # the section's version
    data = fuzz_blob.fix_checksums(bytes(blob))
    with pytest.raises(InvalidIntegrityRecordError, match="version") as info:
        hw.decode(data, verify=verify)
    assert info.value.field == "version"


def test_verify_false_still_skips_the_page_comparison() -> None:
    tensor = hw.BlockPagedTensor.from_arrays(np.ones((4, 4, 2, 8), np.float16), [0, 1, 2], [0, 3])
    blob = bytearray(hw.encode(tensor, page_digests=True))
    blob[bytes(blob).index(bytes(tensor.page_pool[0].tobytes()[:16]))] ^= 1  # a page byte
    data = fuzz_blob.fix_checksums(bytes(blob))
    with pytest.raises(hw.HurrayWireError):
        hw.decode(data)
    assert hw.decode(data, verify=False).page_pool.shape == (4, 4, 2, 8)
