"""Containers that carry blobs and descriptors: blob streams, reference streams, ``.hrry`` files
(the modules and what each owns: docs/architecture.md)."""

from hurray_wire.containers.blob_stream import StreamFile, StreamReader, StreamWriter
from hurray_wire.containers.hrry import (
    FileHeader,
    FileTrailer,
    HrryFile,
    IndexEntry,
    read_file,
    read_file_metadata,
    write_file,
)
from hurray_wire.containers.model_cache import ModelCache, load_cache, save_cache
from hurray_wire.containers.records import (
    DEFAULT_MAX_BLOB_BYTES,
    StreamEntry,
    StreamHeader,
    decode_end_record,
    decode_stream_header,
    encode_end_record,
    encode_stream_header,
)
from hurray_wire.containers.reference_stream import (
    DEFAULT_MAX_DESCRIPTOR_BYTES,
    METADATA_KEY_PREFIX,
    SEQ_LENS_KEY_PREFIX,
    read_stream,
    write_stream,
)
from hurray_wire.containers.sniff import Format, identify

__all__ = [
    "DEFAULT_MAX_BLOB_BYTES",
    "DEFAULT_MAX_DESCRIPTOR_BYTES",
    "METADATA_KEY_PREFIX",
    "SEQ_LENS_KEY_PREFIX",
    "FileHeader",
    "FileTrailer",
    "Format",
    "HrryFile",
    "IndexEntry",
    "ModelCache",
    "StreamEntry",
    "StreamFile",
    "StreamHeader",
    "StreamReader",
    "StreamWriter",
    "decode_end_record",
    "decode_stream_header",
    "encode_end_record",
    "encode_stream_header",
    "identify",
    "load_cache",
    "read_file",
    "read_file_metadata",
    "read_stream",
    "save_cache",
    "write_file",
    "write_stream",
]
