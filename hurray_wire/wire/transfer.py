"""construct structs of the transfer control records (docs/nixl.md § 3): bytes only, no rules.

A control record tells the other side of a NIXL transfer which blob is where: an offer of a
layer's blob (its length, where its page pool sits, the memory segments that hold it), the
receiver's grant of landing memory, "header ready", "done" and "abort". Every record is
``TRANSFER_RECORD`` (64 bytes), ``segment_count`` ``TRANSFER_SEGMENT`` (32 bytes each), a
tail of ``tail_length`` bytes (an abort's UTF-8 reason; a ready record's blob header, since
version 2) and the xxh3_64 of all bytes before it (``RECORD_CHECKSUM``).
Magic and reserved bytes are ``Const``; which kinds, flags, roles and lengths are allowed is
decided by ``hurray_wire.transport.records``.
"""

from __future__ import annotations

import construct as c

from hurray_wire.wire.fast import derive
from hurray_wire.wire.records import Record

TRANSFER_MAGIC = b"HRWT"
#: version_major of the records written and read. 2: a ready record carries the blob's
#: final header (1: the receiver READ it from the sender's memory after the ready record).
RECORD_VERSION = 2

KIND_OFFER = 0x01  # sender -> receiver: a blob, its layout and its source segments
KIND_READY = 0x02  # sender -> receiver: the final bytes of the header segment (segment 0)
KIND_GRANT = 0x03  # receiver -> sender (WRITE): the landing segments for an offered blob
KIND_DONE = 0x04  # READ: receiver -> sender, blob read; WRITE: sender -> receiver, blob written
KIND_ABORT = 0x05  # either way: the transfer (or one layer of it) failed; reason says why
RECORD_KINDS = dict(enumerate(("offer", "ready", "grant", "done", "abort"), 1))  # by KIND_*

FLAG_WRITE = 0x01  # offer: the sender writes into granted memory (else the receiver reads)
FLAG_READY = 0x02  # offer: the header segment is final already (no ready record follows)
RECORD_FLAGS_KNOWN = FLAG_WRITE | FLAG_READY

ROLE_NONE = 0xFF  # kv_role of a record about the whole transfer (an abort of everything)
LAYER_NONE = 0xFFFFFFFF  # layer_index of such a record, or of a blob without a layer

# The fixed 64-byte part of every record.
TRANSFER_RECORD = c.Struct(
    "magic" / c.Const(TRANSFER_MAGIC),
    "version_major" / c.Int8ul,
    "version_minor" / c.Int8ul,
    "kind" / c.Int8ul,
    "flags" / c.Int8ul,
    "record_length" / c.Int32ul,  # every byte of the record, checksum included
    "session" / c.Int64ul,  # the sender's id of this transfer: records of another are refused
    "layer_index" / c.Int32ul,
    "kv_role" / c.Int8ul,  # the descriptor's code: 0 key, 1 value, 2 fused; 0xFF none
    "_reserved0" / c.Const(bytes(3)),
    "total_length" / c.Int64ul,  # the blob's total_length (offer, grant)
    "pool_offset" / c.Int64ul,  # where the page pool section starts in the blob
    "pool_length" / c.Int64ul,  # its stored size; 0: not splittable (compressed)
    "segment_count" / c.Int16ul,
    "tail_length" / c.Int16ul,  # abort: its reason; ready: the blob header
    "_reserved1" / c.Const(bytes(8)),
)

# One contiguous piece of the blob in the memory of the record's author.
TRANSFER_SEGMENT = c.Struct(
    "blob_offset" / c.Int64ul,
    "length" / c.Int64ul,
    "address" / c.Int64ul,
    "device_id" / c.Int32ul,
    "_reserved" / c.Const(bytes(4)),
)

# xxh3_64 (seed 0) of every byte of the record before it.
RECORD_CHECKSUM = c.Struct("checksum" / c.Int64ul)

#: One token id of the prompt digest a vLLM transfer carries (hurray_wire.vllm.transfer:
#: xxh3-128 over the prompt's token ids as this item, in order).
PROMPT_TOKEN_ITEM = c.Int64sl


FAST_TRANSFER_RECORD = derive(TRANSFER_RECORD)
FAST_TRANSFER_SEGMENT = derive(TRANSFER_SEGMENT)
#: The whole record (wire/records.py): its seal, its parts' places.
TRANSFER = Record("transfer record", FAST_TRANSFER_RECORD, derive(RECORD_CHECKSUM))
