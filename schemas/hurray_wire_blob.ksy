meta:
  id: hurray_wire_blob
  title: hurray-wire blob (version 1.0)
  license: MIT OR Apache-2.0
  ks-version: '0.11'
  endian: le
  imports:
    - hurray_descriptor
doc: |
  A hurray-wire blob carries one block-paged tensor (one {kv_role, layer} snapshot of a KV
  cache): a 32-byte fixed header, a table of 48-byte section entries, the Hurray tensor
  descriptor exactly as the reference writes it, an xxh3_64 header checksum, then the
  section payloads (every descriptor buffer, optionally seq_lens and metadata), each at its
  aligned offset with zero padding in between and up to total_length (a multiple of 64).

    0                    fixed header (32)
    32                   section table (48 x section_count)
    32 + 48n             descriptor (descriptor_length bytes; imported hurray_descriptor.ksy)
    header_length        header checksum (8) = xxh3_64 of bytes [0, header_length)
    header_length + 8    zero padding | section 0 | zero padding | section 1 | ... | zero padding
    total_length

  The blob is self-delimiting (the first 16 bytes give total_length), so blobs concatenate
  into a stream; this schema reads exactly total_length bytes.

  The descriptor is the imported hurray_descriptor type, so every descriptor rule of that
  schema applies here too (tools/kaitai/compile.js resolves the import; the generated Python
  does `import hurray_descriptor`).

  Validation written as `valid`: magic, versions, flags, reserved bytes, header_length,
  checksum type, section entry rules (kind, REQUIRED on unknown kinds, codec and its
  parameter, exact aligned offsets, bounds, raw sizes), zero padding everywhere, buffer
  sections first and in buffer-table order with the descriptor's byte sizes and alignments,
  seq_lens size, layout tag 0x0A, and the KV metadata encoding. The `check_*` fields are
  zero-byte fields that only state a rule (Kaitai attaches validations to fields).
  Not expressed here, so left to hurray_wire.blob.decode:
    - xxh3_64 checksums (header and sections) and zstd / shuffle decoding;
    - each known extension kind appearing at most once;
    - seq_lens summing to shape[0] and agreeing with seq_ptr; block_table / seq_ptr
      invariants; quantization parameter sizes; unique metadata keys; decode limits.
doc-ref: docs/wire-format.md (§§ 1-8)

seq:
  - id: header
    type: blob_header
  - id: sections
    type: 'section_entry(_index, _index == 0 ? header.header_length + 8 : sections[_index - 1].end, header)'
    repeat: expr
    repeat-expr: header.section_count
    doc: The section table, at offset 32. Payloads follow the header checksum in table order.
  - id: descriptor
    size: header.descriptor_length
    type: hurray_descriptor
    doc: |
      Bytes [32 + 48n, header_length): one Hurray Tensor Descriptor, byte for byte what the
      reference writes, with layout tag 0x0A.
    doc-ref: docs/wire-format.md § 3
  - id: check_descriptor
    size: 0
    valid:
      expr: >-
        descriptor.header.descriptor_length == header.descriptor_length
        and descriptor.header.layout_tag == 0x0a
        and header.section_count >= descriptor.body.buffer_count
    doc: |
      No bytes. The descriptor's own descriptor_length equals the header's; it is
      block-paged; there is a section for every descriptor buffer.
  - id: header_checksum
    type: u8
    doc: xxh3_64 (seed 0) of bytes [0, header_length). Not computed by this schema.
    doc-ref: docs/wire-format.md § 7
  - id: section_data
    type: section_data(sections[_index], _index, descriptor)
    repeat: expr
    repeat-expr: header.section_count
    doc: Each section's leading zero padding and stored bytes, in table order.
  - id: trailing_padding
    type: u1
    repeat: expr
    repeat-expr: header.total_length - data_end
    valid: 0
    doc: Zero bytes from the end of the last section up to total_length.
  - id: check_total_length
    size: 0
    valid:
      expr: header.total_length == (data_end + 63) / 64 * 64
    doc: No bytes. total_length is the end of the last section rounded up to 64.
instances:
  data_end:
    value: sections[header.section_count - 1].end
    doc: End of the last section's stored bytes.

types:
  blob_header:
    doc: |
      32 bytes at offset 0. The first 16 (magic, versions, flags, total_length) are all a
      stream reader needs to frame a blob.
    doc-ref: docs/wire-format.md § 1
    seq:
      - id: magic
        contents: HRWB
        doc: 48 52 57 42.
      - id: version_major
        type: u1
        valid: 1
      - id: version_minor
        type: u1
        doc: 0 here. Any minor is accepted; a newer one may only add section kinds.
      - id: header_flags
        type: u2
        valid: 0
      - id: total_length
        type: u8
        valid:
          expr: _ >= 40 and _ % 64 == 0
        doc: Bytes of the whole blob, this header included; a multiple of 64.
      - id: header_length
        type: u4
        valid:
          expr: _ + 8 <= total_length
        doc: 32 + 48 x section_count + descriptor_length; the header checksum sits here.
      - id: section_count
        type: u2
        valid:
          min: 3
        doc: At least 3 (page_pool, block_table, seq_ptr are sections).
      - id: checksum_type
        type: u1
        enum: checksum_type
        valid:
          in-enum: true
      - id: reserved1
        contents: [0]
      - id: descriptor_length
        type: u4
        valid:
          expr: _ >= 20 and header_length == 32 + 48 * section_count + _
        doc: Bytes of the embedded descriptor (equal to its own descriptor_length).
      - id: reserved2
        contents: [0, 0, 0, 0]

  section_entry:
    doc: One 48-byte entry of the section table.
    doc-ref: docs/wire-format.md § 2
    params:
      - id: position
        type: u2
        doc: This entry's number in the table.
      - id: previous_end
        type: u8
        doc: End of the previous section's stored bytes, or header_length + 8 for the first.
      - id: header
        type: blob_header
    seq:
      - id: kind
        type: u1
        valid:
          expr: _ != 0
        doc: Enum section_kind (see `section_kind`); unknown kinds are skipped unless REQUIRED.
      - id: section_flags
        type: u1
        valid:
          expr: >-
            (_ & 0xfe) == 0 and (is_known_kind or (_ & 0x01) == 0)
            and (kind != 4 or (_ & 0x01) == 0) and (kind != 5 or (_ & 0x01) == 1)
        doc: |
          Bit 0 REQUIRED: a reader that does not know `kind` must reject the blob (buffer,
          seq_lens and page_refs are written REQUIRED, metadata is not; page_digests must not
          be). Bits 1-7 are 0.
      - id: codec
        type: u1
        enum: codec
        valid:
          in-enum: true
      - id: codec_param
        type: u1
        valid:
          expr: >-
            (codec == codec::shuffle_zstd) ? (_ == 2 or _ == 4 or _ == 8)
            : ((codec == codec::chunked_shuffle_zstd) ? (_ == 1 or _ == 2 or _ == 4 or _ == 8)
            : _ == 0)
        doc: |
          The shuffle width in bytes (element size): 2, 4 or 8 for shuffle-zstd; 1 (no
          shuffle), 2, 4 or 8 for chunked-shuffle-zstd; otherwise 0.
      - id: index
        type: u4
        valid:
          expr: '(kind == 1) ? _ == position : _ == 0'
        doc: Buffer sections - the buffer's index in the descriptor (= its table position). Others 0.
      - id: offset
        type: u8
        doc: Where the stored bytes start; exactly align(previous_end, alignment) (checked below).
      - id: stored_size
        type: u8
        valid:
          expr: offset + _ <= header.total_length
      - id: raw_size
        type: u8
        valid:
          expr: codec != codec::raw or _ == stored_size
        doc: Bytes after decoding; equals stored_size for raw sections.
      - id: checksum
        type: u8
        valid:
          expr: header.checksum_type == checksum_type::xxh3_64 or _ == 0
        doc: xxh3_64 (seed 0) of the stored bytes when checksum_type is 1, else 0.
      - id: alignment
        type: u4
        valid:
          expr: >-
            _ >= 64 and (_ & (_ - 1)) == 0
            and offset == (previous_end + _ - 1) / _ * _
        doc: |
          A power of two >= 64 (for a buffer, >= the handle's alignment). The section starts
          at the previous section's end rounded up to it: minimal padding, one encoding.
      - id: reserved
        contents: [0, 0, 0, 0]
    instances:
      end:
        value: offset + stored_size
      section_kind:
        value: kind
        enum: section_kind
      is_known_kind:
        value: kind >= 1 and kind <= 5
      is_required:
        value: (section_flags & 0x01) != 0

  section_data:
    doc: The zero padding before one section, then its stored bytes.
    params:
      - id: entry
        type: section_entry
      - id: position
        type: u2
      - id: descriptor
        type: hurray_descriptor
    seq:
      - id: padding
        type: u1
        repeat: expr
        repeat-expr: entry.offset - entry.previous_end
        valid: 0
      - id: stored
        size: entry.stored_size
        type:
          switch-on: >-
            (entry.codec == codec::raw) ? entry.kind
            : ((entry.codec == codec::chunked_shuffle_zstd) ? 255 : 0)
          cases:
            2: seq_lens(num_seqs)
            3: kv_metadata
            255: chunked_frames(entry.raw_size)
        doc: |
          The stored bytes. Raw seq_lens and metadata sections are parsed, and so is the
          chunk table of chunked-shuffle-zstd sections; other stored bytes stay bytes.
      - id: check_against_descriptor
        size: 0
        valid:
          expr: >-
            (position < descriptor.body.buffer_count)
            ? (entry.kind == 1
               and entry.raw_size == descriptor.body.buffers[position].byte_size
               and entry.alignment >= descriptor.body.buffers[position].alignment)
            : (entry.kind != 1 and (entry.kind != 2 or entry.raw_size == 8 * num_seqs)
               and (entry.kind != 4 or entry.raw_size == 8 + 8 * num_pages))
        doc: |
          No bytes. The first buffer_count sections are the buffers in buffer-table order,
          each with the descriptor's byte_size and at least its alignment; no buffer section
          follows; seq_lens holds num_seqs u64 values.
    instances:
      num_seqs:
        value: descriptor.body.layout_payload.as<hurray_descriptor::layout_block_paged>.num_seqs
      num_pages:
        value: descriptor.body.layout_payload.as<hurray_descriptor::layout_block_paged>.num_pages

  chunked_frames:
    doc: |
      Stored bytes of a chunked-shuffle-zstd section (codec 3): a chunk table, then one
      zstd frame per chunk of chunk_size raw bytes (the last may be shorter), each
      chunk byte-shuffled on its own. The frames' own contents are left to a zstd library.
    params:
      - id: raw_size
        type: u8
    seq:
      - id: chunk_size
        type: u4
        valid:
          expr: _ >= 4096 and _ <= 0x40000000 and (_ & (_ - 1)) == 0
      - id: chunk_count
        type: u4
        valid:
          expr: _ == (raw_size + chunk_size - 1) / chunk_size
      - id: frame_sizes
        type: u4
        repeat: expr
        repeat-expr: chunk_count
      - id: frames
        size: frame_sizes[_index]
        repeat: expr
        repeat-expr: chunk_count
      - id: check_frames_fill_section
        size: 0
        valid:
          expr: _io.eof
        doc: No bytes. The frames end exactly where the stored bytes end.

  seq_lens:
    doc: Kind 2 (REQUIRED) - tokens of each sequence, which the Hurray descriptor lacks ([A14]).
    params:
      - id: num_seqs
        type: u4
    seq:
      - id: lengths
        type: u8
        repeat: expr
        repeat-expr: num_seqs

  kv_metadata:
    doc: |
      Kind 3 (optional) - user key/value metadata, encoded exactly like the .hrry KV metadata
      section (containers.md § B.4). Keys starting with `hurray.` are reserved.
    seq:
      - id: count
        type: u4
      - id: entries
        type: kv_entry
        repeat: expr
        repeat-expr: count
      - id: rest
        size-eos: true
        valid:
          expr: _.size == 0
        doc: The entries fill the section exactly.

  kv_entry:
    seq:
      - id: key_length
        type: u2
        valid:
          min: 1
      - id: key
        type: str
        size: key_length
        encoding: UTF-8
        doc: Non-empty and unique (uniqueness is not checked by this schema).
      - id: value_tag
        type: u1
        enum: kv_tag
        valid:
          in-enum: true
      - id: value
        type: kv_value(value_tag)

  kv_value:
    params:
      - id: tag
        type: u1
        enum: kv_tag
    seq:
      - id: value
        type:
          switch-on: tag
          cases:
            'kv_tag::string': kv_string
            'kv_tag::int64': s8
            'kv_tag::uint64': u8
            'kv_tag::float64': f8
            'kv_tag::bool': kv_bool
            'kv_tag::bytes': kv_bytes
            'kv_tag::array': kv_array

  kv_string:
    seq:
      - id: length
        type: u4
      - id: value
        type: str
        size: length
        encoding: UTF-8

  kv_bool:
    seq:
      - id: value
        type: u1
        valid:
          max: 1
        doc: 00 or 01 only.

  kv_bytes:
    seq:
      - id: length
        type: u4
      - id: value
        size: length

  kv_array:
    doc: Elements of one type back to back, without per-element tags.
    seq:
      - id: element_tag
        type: u1
        enum: kv_tag
        valid:
          any-of:
            - kv_tag::string
            - kv_tag::int64
            - kv_tag::uint64
            - kv_tag::float64
            - kv_tag::bool
            - kv_tag::bytes
      - id: count
        type: u4
      - id: elements
        type: kv_value(element_tag)
        repeat: expr
        repeat-expr: count

enums:
  checksum_type:
    0: {id: none, doc: 'sections carry no checksum (their checksum fields are 0)'}
    1: {id: xxh3_64, doc: 'xxh3_64 (seed 0) of each section''s stored bytes'}

  section_kind:
    1: {id: buffer, doc: 'one descriptor buffer (0 page_pool, 1 block_table, 2 seq_ptr, 3+ quantization parameters)'}
    2: {id: seq_lens, doc: 'num_seqs u64 token counts (REQUIRED)'}
    3: {id: metadata, doc: 'user key/value metadata in the .hrry KV encoding (optional)'}
    4: {id: page_digests, doc: 'one u64 xxh3_64 per physical page record (optional, not REQUIRED; docs/integrity.md)'}
    5: {id: page_refs, doc: 'pages taken from the receiver''s page store (REQUIRED). NOT expressed here: with it the page-row buffers hold only the sent pages, so such a blob fails check_against_descriptor'}

  codec:
    0: {id: raw, doc: 'the raw bytes'}
    1: {id: zstd, doc: 'one zstd frame (RFC 8878) of the raw bytes'}
    2: {id: shuffle_zstd, doc: 'byte shuffle of width codec_param, then one zstd frame'}
    3: {id: chunked_shuffle_zstd, doc: 'a chunk table, then per chunk one zstd frame of its byte-shuffled bytes'}

  kv_tag:
    1: string
    2: int64
    3: uint64
    4: float64
    5: bool
    6: bytes
    7: array
