"""Issue 22: ``HrryFile.tensor`` read a later name's descriptor before checking the file's
size, so a file another process truncated killed the process with SIGBUS on every name but
the first. Each read of the mapping now checks the size first; the crash-prone part runs
in a child process so that a regression kills the child, not the test session."""

from __future__ import annotations

import signal
import subprocess
import sys

import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire.containers import HrryFile, write_file
from tests.conftest import ROOT

_CHILD = """
import os, sys
from hurray_wire.containers import HrryFile
from hurray_wire.errors import ContainerTruncatedError
from hurray_wire.containers.io import FileShrankError
path, keep = sys.argv[1], int(sys.argv[2])
with HrryFile(path) as f:
    os.truncate(path, keep)  # another process cuts the file while we hold it mapped
    out = []
    for name in f.names:  # descriptors first (not cached yet), then the tensor
        for read in (f.descriptor_header, f.descriptor, f.buffer_spans, f.tensor):
            try:
                read(name)
            except ContainerTruncatedError as exc:
                assert isinstance(exc.__cause__, FileShrankError), exc
                out.append("T")
            else:
                out.append(".")
print("".join(out), flush=True)
"""


def _tensor(seed: int) -> hw.BlockPagedTensor:
    pool = np.random.default_rng(seed).standard_normal((64, 16, 2, 64)).astype(np.float16)
    return hw.BlockPagedTensor.from_arrays(pool, np.arange(64), [0, 64])


@pytest.mark.skipif(not hasattr(signal, "SIGBUS"), reason="no SIGBUS on this platform")
@pytest.mark.parametrize("keep", [0, 4096, 300_000, 600_000])
def test_every_name_of_a_truncated_file_is_a_typed_error(tmp_path: object, keep: int) -> None:
    path = f"{tmp_path}/t.hrry"
    write_file(path, {f"t{k}": _tensor(k) for k in range(4)})  # 256 KiB each
    expected = ""  # per name: descriptor header, descriptor, spans, tensor: "." read, "T" typed
    with HrryFile(path) as whole:
        for name in whole.names:
            entry = whole.entry(name)
            head = "." if entry.descriptor_offset + entry.descriptor_length <= keep else "T"
            end = max(at + size for at, size in whole.buffer_spans(name))
            expected += head * 3 + ("." if head == "." and end <= keep else "T")
    assert "T" in expected
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, path, str(keep)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert child.returncode == 0, (child.returncode, child.stdout, child.stderr[-800:])
    assert child.stdout == expected + "\n"
