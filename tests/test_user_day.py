"""The small things a new user meets (issue 23): warnings, typed refusals, names at the top."""

from __future__ import annotations

import gc
import io
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire import errors
from tests.conftest import FIXTURES, ROOT

STREAM = FIXTURES / "streams/whole_cache_2_layers.hrws"


def small(layer: int = 0, role: str = "key") -> hw.BlockPagedTensor:
    pool = np.zeros((2, 4, 1, 8), np.float16)
    return hw.BlockPagedTensor.from_arrays(pool, [0, 1], [0, 2], kv_role=role, layer_index=layer)


def test_a_stream_writer_never_closed_warns_and_leaves_no_file(tmp_path: Path) -> None:
    path = tmp_path / "out.hrws"
    writer = hw.StreamWriter(path)
    writer.write(small())
    with pytest.warns(ResourceWarning, match="never closed"):
        del writer
        gc.collect()
    assert not path.exists() and list(tmp_path.iterdir()) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # closed, aborted or failed writers say nothing
        with hw.StreamWriter(tmp_path / "ok.hrws") as ok:
            ok.write(small())
        del ok
        hw.StreamWriter(io.BytesIO()).abort()
        with pytest.raises(hw.errors.ArgumentTypeError):
            hw.StreamWriter(io.BytesIO(), header="no")  # type: ignore[arg-type]
        gc.collect()


@pytest.mark.parametrize(
    "content, error, match",
    [
        (b"", errors.StreamTruncatedError, "empty input"),
        (b"hello, this is a text file\n" * 4, hw.errors.InvalidStreamError, "no hurray-wire input"),
        ((FIXTURES / "conformance/block_paged/files/layer0_kv.hrry").read_bytes(),
         hw.errors.InvalidStreamError, r"a \.hrry file: use HrryFile or read_file"),
        ((FIXTURES / "conformance/block_paged/streams/multi_record.hrrs").read_bytes(),
         hw.errors.InvalidStreamError, "a reference stream: use"),
        ((FIXTURES / "conformance/block_paged/descriptors/bp_layer_none_f16_key.bin")
         .read_bytes(), hw.errors.InvalidStreamError, "a bare descriptor"),
    ],
)  # fmt: skip
def test_stream_file_refuses_what_is_no_stream_saying_what_it_is(
    tmp_path: Path, content: bytes, error: type[Exception], match: str
) -> None:
    path = tmp_path / "input"
    path.write_bytes(content)
    with pytest.raises(error, match=match):
        hw.StreamFile(path)
    with pytest.raises(error, match=match):
        hw.StreamFile(content)


def test_decode_of_a_stream_says_it_is_a_stream() -> None:
    with pytest.raises(hw.errors.InvalidBlobError, match=r"this is a blob stream .* StreamReader"):
        hw.decode(STREAM.read_bytes())
    with pytest.raises(hw.errors.InvalidBlobError, match=r"bare descriptor or a \.hrry file"):
        hw.decode((FIXTURES / "conformance/block_paged/files/layer0_kv.hrry").read_bytes())
    with pytest.raises(hw.errors.InvalidBlobError, match="bad blob magic"):
        hw.decode(b"NOPE" + bytes(60))


def test_stream_file_tensor_does_not_guess_the_role() -> None:
    with hw.StreamFile(STREAM) as stream:
        with pytest.raises(
            hw.errors.ArgumentTypeError, match=r"roles \['key', 'value'\]: pass kv_role"
        ):
            stream.tensor(0)
        assert stream.tensor(0, "value").kv_role == "value"
    out = io.BytesIO()
    with hw.StreamWriter(out) as writer:
        writer.write(small(0, "value"))
    with hw.StreamFile(out.getvalue()) as stream:
        assert stream.tensor(0).kv_role == "value"  # the one role there is


def test_dtypes_at_the_top_level_and_errors_in_one_namespace_typed() -> None:
    element: hw.ElementType = hw.float16  # mypy --strict checks this line: not Any
    assert element is hw.dtypes.float16
    names = dir(hw)
    for name in ("float16", "bfloat16", "float8_e4m3", "uint4", "bool_", "complex128"):
        assert name in names and isinstance(getattr(hw, name), hw.ElementType)
    for name in errors.__all__:
        assert getattr(hw.errors, name) is getattr(errors, name)
    truncated: type[hw.HurrayWireError] = hw.errors.StreamTruncatedError
    assert issubclass(truncated, hw.errors.TruncatedError) and issubclass(
        hw.errors.PageDigestError, hw.errors.IntegrityError
    )


def test_preload_warms_ml_dtypes_in_a_fresh_interpreter() -> None:
    code = (
        "import sys, hurray_wire as hw\n"
        "assert 'ml_dtypes' not in sys.modules\n"
        "hw.preload()\n"
        "assert 'ml_dtypes' in sys.modules\n"
        "assert hw.bfloat16.numpy_dtype.name == 'bfloat16'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": ""})  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_stream_reader_reports_bad_pages_when_asked() -> None:
    out = io.BytesIO()
    with hw.StreamWriter(out) as writer:
        pool = np.random.default_rng(1).random((4, 4, 1, 8)).astype(np.float16)
        tensor = hw.BlockPagedTensor.from_arrays(pool, [2, 0], [0, 2], layer_index=0)
        writer.write(tensor, page_digests=True, pages="all")
    data = bytearray(out.getvalue())
    data[data.index(pool[2].tobytes()) + 1] ^= 0x04  # physical page 2: logical (0, 0)
    with pytest.raises(errors.ChecksumError):
        list(hw.StreamReader(bytes(data)))
    reader = hw.StreamReader(bytes(data), report=True)
    (got,) = reader
    assert reader.page_report is not None and reader.page_report.pages.tolist() == [2]
    assert reader.page_report.positions == ((0, 0),)
    assert not np.array_equal(got.page_pool[2], pool[2])  # as it came: named, not hidden
    for bad in ("report", None):
        with pytest.raises(hw.errors.ArgumentTypeError, match="report"):
            hw.StreamReader(b"", report=bad)  # type: ignore[arg-type]
