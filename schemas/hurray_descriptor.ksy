meta:
  id: hurray_descriptor
  title: Hurray Tensor Descriptor (version 1.x)
  license: MIT OR Apache-2.0
  ks-version: '0.11'
  endian: le
  bit-endian: le
doc: |
  The Hurray Tensor Descriptor: one self-delimiting byte string that says what a tensor is
  (element type, shape), how its elements are laid out in memory (the layout payload) and
  which buffers hold them (the buffer table), optionally with quantization, shard,
  statistics, extension-type and composite-member sections.

  Everything is little-endian. There is no padding and no alignment anywhere inside a
  descriptor (the block-paged `layer_index` sits at an odd offset). The parts follow each
  other in this fixed order:

    fixed header (20) | shape (8 x rank) | byte_offset (8) | layout payload (per layout_tag)
    | buffer table (1 + 16 x buffer_count) | quantization (4 + L, flag bit 0)
    | shard (16 x rank, bit 1) | statistics (72, bit 3) | extension type (20, bit 2)
    | composite member (16, bit 4) | unknown trailing bytes (version_minor > 0 only)

  Note the trap: statistics (flag bit 3) come BEFORE the extension-type section (bit 2).

  Everything after the fixed header is parsed from a substream of exactly
  `descriptor_length - 20` bytes, so a reader never reads past descriptor_length, and bytes
  after it (the next record of a stream) are never touched.

  Validation. Every rule that attaches to one field, or to fields parsed before it, is
  written as `valid`: magic, versions, reserved flag bits and bytes, tag ranges and closed
  enumerations, rank <= 64, buffer-handle rules and colocation, the per-layout buffer count,
  the quantization scheme rules (storage types, flags, indices, block sizes), and the
  block-paged rules (rank 3, byte_offset 0, no shard, paged_axis 0, page_size >= 1, kv_role,
  index type vs num_pages, no dynamic dimensions, per-block axis 0 and block_size ==
  page_size, per-channel axis != 0, no NF4/MXFP). Not expressed here, so left to
  hurray_wire.decode_descriptor:
    - buffer byte sizes implied by shape, element type and layout (descriptor.md § 4,
      block-paged.md § 3), and byte_offset <= the byte size of buffer 0;
    - with quantization, buffer_count == the layout's buffers + the number of DISTINCT
      parameter buffers (here: at least the layout's buffers, and every parameter index
      inside the table and outside the layout's buffers);
    - CSF mode_order being a permutation (here: each entry < rank);
    - anything that needs buffer contents (seq_ptr / block_table invariants).
doc-ref:
  - shared/spec/descriptor.md (byte-level encoding; §§ 1-10)
  - shared/spec/block-paged.md (layout tag 0x0A)
  - Hurray docs/spec/metadata.md, element-types.md, memory-layout.md, buffer-protocol.md, quantization.md

seq:
  - id: header
    type: fixed_header
  - id: body
    size: header.descriptor_length - 20
    type: descriptor_body(header)
    doc: Everything after the 20-byte header, bounded by descriptor_length.

types:
  # ---------------------------------------------------------------------------------------
  # § 2 Fixed header (20 bytes) and § 3 flags
  # ---------------------------------------------------------------------------------------
  fixed_header:
    doc: |
      The first 20 bytes. The first 10 alone (magic, versions, descriptor_length) frame a
      descriptor in a stream without parsing it.
    doc-ref: descriptor.md § 2
    seq:
      - id: magic
        contents: HRRY
        doc: 48 52 52 59.
      - id: version_major
        type: u1
        valid: 1
        doc: |
          Current major version 1. Greater values are rejected (no reader knows them), and so
          is 0 ([A5]; the reference accepts 0).
      - id: version_minor
        type: u1
        doc: |
          Current minor version 0. Larger values are accepted: the reader parses what it knows
          and skips the rest up to descriptor_length (see `unknown_trailing`).
      - id: descriptor_length
        type: u4
        valid:
          min: 20
        doc: Size of the whole descriptor in bytes, including these 20 header bytes.
      - id: flags
        type: descriptor_flags
      - id: type_tag
        type: u1
        valid:
          expr: >-
            ((_ >= 0x01 and _ <= 0x04) or (_ >= 0x10 and _ <= 0x17) or _ == 0x20
             or (_ >= 0x40 and _ <= 0x46) or (_ >= 0x48 and _ <= 0x4b) or _ == 0x50 or _ == 0x51
             or (_ >= 0xf0 and _ <= 0xfe))
            and flags.has_extension_type == (_ >= 0xf0 and _ <= 0xfe)
        doc: |
          Element type (enum element_type; see the instance `element_type`). F0-FE are private
          extension types described by the extension-type section: HAS_EXTENSION_TYPE is set
          if and only if the tag is in F0-FE. 00 and FF are invalid, 47 and 80-EF reserved,
          any other unassigned value unknown: all rejected.
      - id: layout_tag
        type: u1
        valid:
          expr: >-
            ((_ >= 0x01 and _ <= 0x0b) or _ == 0x40 or (_ >= 0xf0 and _ <= 0xfe))
            and not (flags.has_shard and (_ == 0x09 or _ == 0x0a))
            and not (flags.has_composite_member and _ == 0x0b)
        doc: |
          Memory layout (enum layout_tag; see the instance `layout`). It selects the layout
          payload, which has no length prefix, so an unknown tag cannot be skipped ([A26]):
          00/FF invalid and 0C-3F, 41-EF reserved are rejected. CSF (09) and block-paged (0A)
          descriptors must not carry a shard section; a composite head (0B) never carries a
          composite-member section.
      - id: rank
        type: u4
        valid:
          expr: _ <= 64 and (layout_tag != 0x0a or _ == 3)
        doc: |
          Number of dimensions, 0..64. A block-paged tensor has rank exactly 3:
          [total_tokens, num_heads, head_dim].
    instances:
      element_type:
        value: type_tag
        enum: element_type
        doc: type_tag as an enum (private F0-FE tags are not enum members).
      layout:
        value: layout_tag
        enum: layout_tag
        doc: layout_tag as an enum (private F0-FE tags are not enum members).
      is_private_layout:
        value: layout_tag >= 0xf0 and layout_tag <= 0xfe
      layout_kind:
        value: 'is_private_layout ? 0xf0 : layout_tag'
        enum: layout_tag
        doc: layout_tag with the private range F0-FE folded onto `private_range`; the switch key.

  descriptor_flags:
    doc: |
      u32 at offset 10, read as little-endian bits: bit 0 is the least significant bit of the
      first byte. The optional sections appear in wire order quantization, shard, statistics,
      extension type, composite member - not in bit order.
    doc-ref: descriptor.md § 3
    seq:
      - id: has_quantization
        type: b1
        doc: Bit 0 (0x01) - quantization section present.
      - id: has_shard
        type: b1
        doc: Bit 1 (0x02) - shard section present (forbidden for CSF and block-paged).
      - id: has_extension_type
        type: b1
        doc: Bit 2 (0x04) - extension-type section present; set iff type_tag is in F0-FE.
      - id: has_statistics
        type: b1
        doc: Bit 3 (0x08) - statistics section present (on the wire BEFORE the extension type).
      - id: has_composite_member
        type: b1
        doc: Bit 4 (0x10) - composite-member section present.
      - id: reserved
        type: b27
        valid: 0
        doc: Bits 5-31 (0xFFFFFFE0). Any set bit is rejected, also at newer minor versions.
    instances:
      value:
        value: >-
          (has_quantization ? 0x01 : 0) | (has_shard ? 0x02 : 0)
          | (has_extension_type ? 0x04 : 0) | (has_statistics ? 0x08 : 0)
          | (has_composite_member ? 0x10 : 0) | (reserved << 5)
        doc: The flags as the u32 it is on the wire.

  # ---------------------------------------------------------------------------------------
  # §§ 5-10: everything after the fixed header
  # ---------------------------------------------------------------------------------------
  descriptor_body:
    doc: The descriptor after its fixed header; this substream is descriptor_length - 20 bytes.
    params:
      - id: header
        type: fixed_header
    seq:
      - id: shape
        type: u8
        repeat: expr
        repeat-expr: header.rank
        valid:
          expr: _ != 0xffffffffffffffff or header.layout_tag != 0x0a
        doc: |
          Dimension sizes, dimension 0 first. 0 is a legal size (empty tensor);
          0xFFFFFFFFFFFFFFFF is the dynamic-dimension sentinel (size unknown), refused in
          block-paged descriptors ([A38]).
        doc-ref: descriptor.md § 5
      - id: byte_offset
        type: u8
        valid:
          expr: _ == 0 or not needs_zero_byte_offset
        doc: |
          Offset in bytes of logical element [0, ..., 0] inside buffer 0. Sparse (06-09),
          indirect (block-paged 0A) and composite (0B) layouts require 0.
      - id: layout_payload
        doc: Layout-specific fields, immediately after byte_offset; no length prefix.
        doc-ref: descriptor.md § 6
        type:
          switch-on: header.layout_kind
          cases:
            'layout_tag::row_major': layout_none
            'layout_tag::column_major': layout_none
            'layout_tag::strided': layout_strided(header.rank)
            'layout_tag::tiled': layout_tiled(header.rank, 1)
            'layout_tag::morton': layout_morton(header.rank)
            'layout_tag::coo': layout_coo
            'layout_tag::csr': layout_csr_csc
            'layout_tag::csc': layout_csr_csc
            'layout_tag::csf': layout_csf(header.rank)
            'layout_tag::block_paged': layout_block_paged
            'layout_tag::composite_head': layout_composite_head
            'layout_tag::hilbert': layout_hilbert(header.rank)
            'layout_tag::private_range': layout_private

      # § 7 Buffer table
      - id: buffer_count
        type: u1
        valid:
          expr: >-
            header.layout_tag == 0x0b ? _ == 0
            : header.is_private_layout ? true
            : header.flags.has_quantization ? _ >= layout_buffer_count
            : _ == layout_buffer_count
        doc: |
          Number of 16-byte buffer handles (max 255). Exactly the layout's own buffers when
          unquantized (dense 1, COO 2, CSR/CSC 3, CSF 2 x rank + 1, block-paged 3); a
          quantization scheme adds its parameter buffers after them. Only a composite head has
          0, and it must.
        doc-ref: descriptor.md § 7
      - id: buffers
        type: buffer_handle
        repeat: expr
        repeat-expr: buffer_count
        valid:
          expr: >-
            _.device_tag == buffers[0].device_tag and _.memory_class == buffers[0].memory_class
        doc: |
          Buffer 0 holds the data (block-paged: page_pool), then the layout's index buffers
          (block-paged: 1 block_table, 2 seq_ptr), then quantization parameter buffers
          (block-paged: from index 3). Colocation: all buffers share one device_tag and one
          memory_class.

      # § 8 Quantization (flag bit 0)
      - id: quantization_length
        type: u4
        if: header.flags.has_quantization
        valid:
          min: 4
        doc: |
          Size of the quantization bytes that follow. May exceed what the scheme needs (writer
          padding, kept verbatim in `quantization.padding`); shorter is rejected.
        doc-ref: descriptor.md § 8
      - id: quantization
        size: quantization_length
        type: quantization(header.type_tag, shape, buffer_count, first_param_buffer, paged_page_size)
        if: header.flags.has_quantization

      # § 9 Other optional sections, in WIRE order (statistics before extension type)
      - id: shard
        type: shard_section(shape)
        if: header.flags.has_shard
      - id: statistics
        type: statistics_section
        if: header.flags.has_statistics
        doc: Flag bit 3. Comes BEFORE the extension-type section (bit 2) on the wire.
      - id: extension_type
        type: extension_type_section
        if: header.flags.has_extension_type
      - id: composite_member
        type: composite_member_section
        if: header.flags.has_composite_member

      # § 10 Unknown content of newer minor versions
      - id: unknown_trailing
        size-eos: true
        valid:
          expr: _.size == 0 or header.version_minor > 0
        doc: |
          Bytes up to descriptor_length that a 1.0 reader does not know. Must be empty at
          version_minor 0 (parsed size == descriptor_length, [A6]); skipped at a newer minor.
          (Kaitai identifiers cannot start with "_", hence no leading underscore.)
        doc-ref: descriptor.md § 10
    instances:
      needs_zero_byte_offset:
        value: header.layout_tag >= 0x06 and header.layout_tag <= 0x0b
      layout_buffer_count:
        value: >-
          header.layout_tag == 0x06 ? 2
          : (header.layout_tag == 0x07 or header.layout_tag == 0x08) ? 3
          : header.layout_tag == 0x09 ? 2 * header.rank + 1
          : header.layout_tag == 0x0a ? 3
          : header.layout_tag == 0x0b ? 0
          : 1
        doc: Buffers the layout itself owns (data + index buffers); private layouts unknown.
      first_param_buffer:
        value: 'header.layout_tag == 0x0a ? 3 : 1'
        doc: |
          Lowest buffer index a quantization parameter buffer may use: never the data buffer 0;
          for block-paged never the block_table (1) or seq_ptr (2).
      paged_page_size:
        value: 'header.layout_tag == 0x0a ? layout_payload.as<layout_block_paged>.page_size : 0'
        doc: page_size of a block-paged layout, 0 for any other layout (page_size is never 0).

  # ---------------------------------------------------------------------------------------
  # § 6 Layout payloads
  # ---------------------------------------------------------------------------------------
  layout_none:
    doc: Row-major (01) and column-major (02) have no payload.
    seq: []

  layout_strided:
    doc: Strided (03) - one signed stride per dimension, in elements.
    params:
      - id: rank
        type: u4
    seq:
      - id: strides
        type: s8
        repeat: expr
        repeat-expr: rank

  layout_tiled:
    doc: |
      Tiled (04): tile shape, the order of the tiles (outer) and of the elements inside a tile
      (inner). Explicit strides follow for the `strided` orders; an inner order `tiled`
      nests another tiled payload, at most 8 tiled payloads deep counting this one.
    params:
      - id: rank
        type: u4
      - id: depth
        type: u1
        doc: 1 for the payload that follows byte_offset, +1 per nesting level.
    seq:
      - id: tile_shape
        type: u8
        repeat: expr
        repeat-expr: rank
        valid:
          min: 1
      - id: outer_order
        type: u1
        enum: tile_order
        valid:
          any-of:
            - tile_order::row_major
            - tile_order::column_major
            - tile_order::strided
      - id: inner_order
        type: u1
        enum: tile_order
        valid:
          expr: >-
            _ == tile_order::row_major or _ == tile_order::column_major
            or _ == tile_order::strided or (_ == tile_order::tiled and depth < 8)
      - id: reserved
        contents: [0, 0]
      - id: outer_strides
        type: s8
        repeat: expr
        repeat-expr: rank
        if: outer_order == tile_order::strided
      - id: inner_strides
        type: s8
        repeat: expr
        repeat-expr: rank
        if: inner_order == tile_order::strided
      - id: nested
        type: layout_tiled(rank, depth + 1)
        if: inner_order == tile_order::tiled

  layout_morton:
    doc: Morton / Z-order (05) - the number of index bits per dimension.
    params:
      - id: rank
        type: u4
    seq:
      - id: bits
        type: u4
        repeat: expr
        repeat-expr: rank
        valid:
          min: 1

  layout_coo:
    doc: COO (06) - buffers 0 values, 1 coordinates.
    seq:
      - id: nnz
        type: u8
      - id: is_sorted
        type: u1
        valid:
          max: 1
        doc: '0 or 1 ([A30]: the reference reads any non-zero as true; strict readers reject 2-255).'
      - id: reserved
        contents: [0, 0, 0, 0, 0, 0, 0]

  layout_csr_csc:
    doc: CSR (07) and CSC (08) - buffers 0 values, 1 and 2 index arrays.
    seq:
      - id: nnz
        type: u8
      - id: reserved
        contents: [0, 0, 0, 0, 0, 0, 0, 0]

  layout_csf:
    doc: CSF (09) - 2 x rank + 1 buffers.
    params:
      - id: rank
        type: u4
    seq:
      - id: nnz
        type: u8
      - id: mode_order
        type: u4
        repeat: expr
        repeat-expr: rank
        valid:
          expr: _ < rank
        doc: A permutation of 0..rank-1 (uniqueness is not checked by this schema).
      - id: reserved
        contents: [0, 0, 0, 0, 0, 0, 0, 0]

  layout_block_paged:
    doc: |
      Block-paged (0A), 32 bytes: a PagedAttention KV cache. Pool of num_pages fixed-size pages
      (buffer 0, `[num_pages, page_size, num_heads, head_dim]`), a block table of physical
      page ids (buffer 1) and per-sequence offsets into it (buffer 2, num_seqs + 1 entries).
      shape is [total_tokens, num_heads, head_dim]; byte_offset 0; no shard section.
    doc-ref:
      - descriptor.md § 6.1
      - block-paged.md
    seq:
      - id: page_size
        type: u4
        valid:
          min: 1
        doc: '+0 (absolute 52). Tokens per page (vLLM block_size), >= 1; 16 or 32 are typical.'
      - id: num_pages
        type: u8
        doc: '+4 (56). Physical pages in the pool (vLLM num_blocks); 0 is an empty pool.'
      - id: paged_axis
        type: u4
        valid: 0
        doc: '+12 (64). The axis that is paged; must be 0 in this version.'
      - id: num_seqs
        type: u4
        doc: '+16 (68). Sequences in the batch; 0 is an empty batch.'
      - id: kv_role
        type: u1
        enum: kv_role
        valid:
          in-enum: true
        doc: '+20 (72). Which tensor of the attention layer this is.'
      - id: layer_index
        type: u4
        doc: |
          +21 (73, an odd offset). Model layer this snapshot belongs to. 0xFFFFFFFF is the None sentinel ("not
          layer-scoped"); 0 is a real layer, 0xFFFFFFFE the largest one. See `has_layer`.
      - id: block_table_index_type
        type: u1
        enum: index_type
        valid:
          expr: >-
            _ == index_type::uint64 or (_ == index_type::uint32 and num_pages <= 0xffffffff)
        doc: |
          +25 (77). Element type of block_table and seq_ptr. uint32 cannot address pools of more than
          0xFFFFFFFF pages ([A13]); such pools must use uint64.
      - id: reserved
        contents: [0, 0, 0, 0, 0, 0]
        doc: '+26 (78). Six zero bytes; any non-zero byte is rejected.'
    instances:
      has_layer:
        value: layer_index != 0xffffffff
        doc: False when layer_index is the None sentinel 0xFFFFFFFF.
      index_bytes:
        value: 'block_table_index_type == index_type::uint64 ? 8 : 4'
        doc: Bytes per block_table / seq_ptr entry.

  layout_composite_head:
    doc: |
      Composite head (0B): describes a tensor made of member descriptors that follow it; owns
      no data (buffer_count 0, byte_offset 0).
    seq:
      - id: rule
        type: u1
        enum: composite_rule
        valid:
          in-enum: true
      - id: combine_op
        type: u1
        valid:
          expr: '(rule == composite_rule::overlay) ? (_ == 1 or _ == 2) : _ == 0'
        doc: 1 or 2 for an overlay, 0 for the other rules.
      - id: reserved
        contents: [0, 0]
      - id: member_count
        type: u4
        valid:
          expr: _ != 0xffffffff

  layout_hilbert:
    doc: Hilbert curve (40).
    params:
      - id: rank
        type: u4
    seq:
      - id: order
        type: u4
        valid:
          min: 1
      - id: hilbert_rank
        type: u4
        valid:
          expr: _ == rank and _ >= 2

  layout_private:
    doc: Private layouts (F0-FE) carry their own length, so they can be skipped.
    seq:
      - id: extension_layout_id
        type: u8
      - id: length
        type: u4
      - id: data
        size: length

  # ---------------------------------------------------------------------------------------
  # § 7.1 Buffer handle (16 bytes)
  # ---------------------------------------------------------------------------------------
  buffer_handle:
    doc: Where one buffer lives and how big it is; the bytes themselves travel elsewhere.
    doc-ref: descriptor.md § 7.1 (buffer-protocol.md § Buffer Handle, [A2])
    seq:
      - id: byte_size
        type: u8
        doc: Size in bytes; 0 is an empty buffer.
      - id: alignment
        type: u4
        valid:
          expr: _ != 0 and (_ & (_ - 1)) == 0 and (byte_size == 0 or _ >= 64)
        doc: |
          A power of two; at least 64 for a non-empty buffer, any power of two (even 1) for
          an empty one ([A3]). GPU/IPC/RDMA writers use >= 4096.
      - id: device_tag
        type: u1
        valid:
          expr: _ <= 0x08 or (_ >= 0xf0 and _ <= 0xfe)
        doc: Enum device_tag; F0-FE private; 09-EF reserved and FF invalid are rejected.
      - id: sync_mode
        type: u1
        enum: sync_mode
        valid:
          expr: >-
            _ == sync_mode::producer_synced
            or (device_tag != 0 and (_ == sync_mode::event or _ == sync_mode::consumer_stream))
        doc: CPU buffers (device 0) must be producer-synced; 03-FF are rejected.
      - id: memory_class
        type: u1
        valid:
          expr: >-
            (device_tag >= 0xf0) ? (_ == 0 or (_ >= 0xf0 and _ <= 0xfe))
            : device_tag == 0x05 ? _ == 0
            : (device_tag == 0x01 or device_tag == 0x02 or device_tag == 0x04 or device_tag == 0x07) ? _ <= 3
            : _ <= 2
        doc: |
          Enum memory_class; F0-FE private. Allowed (device, class) pairs:
          CPU, Metal, Hexagon, OpenCL - standard, host-pinned, unified;
          CUDA, ROCm, Vulkan, Level Zero - also peer; WebGPU - standard only;
          private devices - standard or a private class F0-FE.
      - id: reserved
        contents: [0]
    instances:
      device:
        value: device_tag
        enum: device_tag
      memory:
        value: memory_class
        enum: memory_class

  # ---------------------------------------------------------------------------------------
  # § 8 Quantization section
  # ---------------------------------------------------------------------------------------
  quantization:
    doc: |
      The `quantization_length` bytes: a 4-byte header, the scheme's payload, then any writer
      padding (kept verbatim so that re-encoding preserves it, [A31]). Shorter than the
      scheme needs is rejected (the payload runs out of bytes).
    doc-ref: descriptor.md § 8
    params:
      - id: storage_type
        type: u1
        doc: The descriptor's type_tag (the quantized storage type).
      - id: shape
        type: u8[]
      - id: buffer_count
        type: u1
      - id: first_param_buffer
        type: u1
        doc: Lowest index a parameter buffer may use (1; 3 for block-paged).
      - id: paged_page_size
        type: u4
        doc: page_size of a block-paged tensor, 0 otherwise.
    seq:
      - id: scheme_tag
        type: u1
        enum: scheme_tag
        valid:
          expr: >-
            _ == scheme_tag::per_tensor_affine ? integer_storage
            : _ == scheme_tag::per_channel_affine ? integer_storage
            : _ == scheme_tag::per_block_affine ? (storage_type == 0x10 or storage_type == 0x11
                or (storage_type >= 0x48 and storage_type <= 0x4b))
            : _ == scheme_tag::nf4 ? (storage_type == 0x49 and paged_page_size == 0)
            : _ == scheme_tag::mxfp ? (paged_page_size == 0 and (storage_type == 0x40
                or storage_type == 0x41 or storage_type == 0x43 or storage_type == 0x44
                or storage_type == 0x45 or storage_type == 0x10 or storage_type == 0x48))
            : false
        doc: |
          01-05 assigned. 00/FF invalid, 06-5F unassigned, 60-EF reserved and F0-FE private are
          all rejected (strict). Each scheme allows only some storage types:
          per-tensor / per-channel - int8, uint8, int16, uint16, int32, uint32, int4, uint4,
          int2, uint2; per-block - int8, uint8, int4, uint4, int2, uint2 (no float8);
          NF4 - uint4; MXFP - float8_e4m3, float8_e5m2, float4_e2m1, float6_e2m3,
          float6_e3m2, int8, int4. NF4 and MXFP are not defined for block-paged ([A11]).
      - id: scheme_version
        type: u1
        valid:
          max: 1
        doc: 1 for every current scheme; newer is rejected (0 is accepted, [A28]).
      - id: flags
        type: u2
        valid:
          expr: >-
            (_ & ((scheme_tag == scheme_tag::per_channel_affine
                   or scheme_tag == scheme_tag::per_block_affine) ? 0xfffe : 0xffff)) == 0
        doc: |
          Bit 0 = SYMMETRIC (per-channel and per-block affine only: no zero points). All other
          bits, and every bit for the other schemes, must be 0.
      - id: payload
        type:
          switch-on: scheme_tag
          cases:
            'scheme_tag::per_tensor_affine': quant_per_tensor_affine(storage_type)
            'scheme_tag::per_channel_affine': quant_per_channel_affine(is_symmetric, shape.size, buffer_count, first_param_buffer, paged_page_size)
            'scheme_tag::per_block_affine': quant_per_block_affine(is_symmetric, shape, buffer_count, first_param_buffer, paged_page_size)
            'scheme_tag::nf4': quant_nf4(shape, buffer_count, first_param_buffer)
            'scheme_tag::mxfp': quant_mxfp(shape, buffer_count, first_param_buffer)
      - id: padding
        size-eos: true
        doc: Writer padding up to quantization_length; kept as-is.
    instances:
      is_symmetric:
        value: (flags & 1) != 0
      integer_storage:
        value: >-
          (storage_type >= 0x10 and storage_type <= 0x15) or (storage_type >= 0x48 and storage_type <= 0x4b)
        doc: int8, uint8, int16, uint16, int32, uint32, int4, uint4, int2, uint2.

  quant_per_tensor_affine:
    doc: Per-tensor affine (01), 16 bytes in all; x = scale * (q - zero_point).
    params:
      - id: storage_type
        type: u1
    seq:
      - id: scale
        type: f4
        valid:
          expr: _ != 0 and _ >= -3.4028234663852886e38 and _ <= 3.4028234663852886e38
        doc: Finite and non-zero (NaN fails every comparison).
      - id: zero_point
        type: s4
        valid:
          expr: _ >= storage_min and _ <= storage_max
        doc: Within the range of the storage type.
      - id: reserved
        contents: [0, 0, 0, 0]
    instances:
      storage_min:
        value: >-
          storage_type == 0x10 ? -128 : storage_type == 0x12 ? -32768
          : storage_type == 0x14 ? -2147483648 : storage_type == 0x48 ? -8
          : storage_type == 0x4a ? -2 : 0
      storage_max:
        value: >-
          storage_type == 0x10 ? 127 : storage_type == 0x11 ? 255
          : storage_type == 0x12 ? 32767 : storage_type == 0x13 ? 65535
          : (storage_type == 0x14 or storage_type == 0x15) ? 2147483647
          : storage_type == 0x48 ? 7 : storage_type == 0x49 ? 15
          : storage_type == 0x4a ? 1 : storage_type == 0x4b ? 3 : 0

  quant_per_channel_affine:
    doc: |
      Per-channel affine (02), 20 bytes in all: one f32 scale (and optionally one int32 zero
      point) per index along `axis`. On block-paged only axis 1 (heads) or 2 (head_dim).
    params:
      - id: is_symmetric
        type: bool
      - id: rank
        type: u4
      - id: buffer_count
        type: u1
      - id: first_param_buffer
        type: u1
      - id: paged_page_size
        type: u4
    seq:
      - id: axis
        type: u4
        valid:
          expr: _ < rank and (paged_page_size == 0 or _ != 0)
      - id: scale_buffer_index
        type: u4
        valid:
          expr: _ >= first_param_buffer and _ < buffer_count
        doc: Never 0xFFFFFFFF; never the data buffer or a layout buffer.
      - id: zero_point_buffer_index
        type: u4
        valid:
          expr: >-
            is_symmetric ? _ == 0xffffffff : (_ >= first_param_buffer and _ < buffer_count)
        doc: 0xFFFFFFFF if and only if SYMMETRIC. May equal scale_buffer_index ([scales | zero_points]).
      - id: scale_type_tag
        type: u1
        valid: 0x03
        doc: Always float32.
      - id: reserved
        contents: [0, 0, 0]

  quant_per_block_affine:
    doc: |
      Per-block affine (03), 24 bytes in all: one scale (and zero point) per block of
      `block_size` elements along `axis`. On block-paged: axis 0 and block_size == page_size,
      and the parameters are per page slot (num_pages x page_size entries, block-paged.md § 7).
    params:
      - id: is_symmetric
        type: bool
      - id: shape
        type: u8[]
      - id: buffer_count
        type: u1
      - id: first_param_buffer
        type: u1
      - id: paged_page_size
        type: u4
    seq:
      - id: axis
        type: u4
        valid:
          expr: _ < shape.size and (paged_page_size == 0 or _ == 0)
      - id: block_size
        type: u4
        valid:
          expr: >-
            _ >= 2 and (_ & (_ - 1)) == 0
            and (paged_page_size == 0 ? (shape[axis] == 0 or _ <= shape[axis]) : _ == paged_page_size)
        doc: |
          A power of two >= 2, and <= shape[axis] when shape[axis] > 0. On block-paged it
          equals page_size instead (the "<= shape[axis]" rule is not applied there, [A8]).
      - id: scale_buffer_index
        type: u4
        valid:
          expr: _ >= first_param_buffer and _ < buffer_count
      - id: zero_point_buffer_index
        type: u4
        valid:
          expr: >-
            is_symmetric ? _ == 0xffffffff : (_ >= first_param_buffer and _ < buffer_count)
        doc: 0xFFFFFFFF if and only if SYMMETRIC ([A29]). Zero points are int32.
      - id: scale_type_tag
        type: u1
        enum: element_type
        valid:
          any-of:
            - element_type::float16
            - element_type::bfloat16
            - element_type::float32
      - id: reserved
        contents: [0, 0, 0]

  quant_nf4:
    doc: NF4 (04), 16 bytes in all; uint4 storage, one f32 absmax per block.
    params:
      - id: shape
        type: u8[]
      - id: buffer_count
        type: u1
      - id: first_param_buffer
        type: u1
    seq:
      - id: axis
        type: u4
        valid:
          expr: _ < shape.size
      - id: block_size
        type: u4
        valid:
          expr: _ >= 8 and (_ & (_ - 1)) == 0 and (shape[axis] == 0 or _ <= shape[axis])
        doc: A power of two >= 8.
      - id: scale_buffer_index
        type: u4
        valid:
          expr: _ >= first_param_buffer and _ < buffer_count

  quant_mxfp:
    doc: MXFP (05), 16 bytes in all; one float8_e8m0 scale per block.
    params:
      - id: shape
        type: u8[]
      - id: buffer_count
        type: u1
      - id: first_param_buffer
        type: u1
    seq:
      - id: axis
        type: u4
        valid:
          expr: _ < shape.size
      - id: block_size
        type: u4
        valid:
          expr: >-
            _ >= 16 and _ <= 2048 and (_ & (_ - 1)) == 0
            and shape[axis] > 0 and shape[axis] % _ == 0
        doc: A power of two in 16..2048; shape[axis] is a positive multiple of it.
      - id: scale_buffer_index
        type: u4
        valid:
          expr: _ >= first_param_buffer and _ < buffer_count

  # ---------------------------------------------------------------------------------------
  # § 9 Shard, statistics, extension type, composite member
  # ---------------------------------------------------------------------------------------
  shard_section:
    doc: Shard (flag bit 1), 16 x rank bytes. This tensor is the window at shard_offset of a parent.
    doc-ref: descriptor.md § 9.1
    params:
      - id: shape
        type: u8[]
    seq:
      - id: parent_shape
        type: u8
        repeat: expr
        repeat-expr: shape.size
      - id: shard_offset
        type: u8
        repeat: expr
        repeat-expr: shape.size
        valid:
          expr: _ + shape[_index] <= parent_shape[_index]

  statistics_section:
    doc: Statistics (flag bit 3), 72 bytes, advisory only.
    doc-ref: descriptor.md § 9.2
    seq:
      - id: computed
        type: statistics_mask
      - id: reserved1
        contents: [0, 0, 0, 0]
      - id: nnz
        type: u8
      - id: sparsity_ratio
        type: f8
      - id: value_min
        type: f8
      - id: value_max
        type: f8
      - id: value_abs_max
        type: f8
      - id: value_mean
        type: f8
      - id: value_stddev
        type: f8
      - id: nm_n
        type: u1
      - id: nm_m
        type: u1
      - id: has_nan
        type: u1
        valid:
          max: 1
        doc: 0 or 1 ([A30]).
      - id: has_inf
        type: u1
        valid:
          max: 1
        doc: 0 or 1 ([A30]).
      - id: reserved2
        contents: [0, 0, 0, 0]

  statistics_mask:
    doc: u32 computed_mask - which statistics fields hold values.
    seq:
      - id: nnz
        type: b1
      - id: sparsity
        type: b1
      - id: min_max_absmax
        type: b1
      - id: mean_stddev
        type: b1
      - id: n_m
        type: b1
      - id: nan_inf
        type: b1
      - id: reserved
        type: b26
        valid: 0
        doc: Bits 6-31 must be 0.

  extension_type_section:
    doc: |
      Extension type (flag bit 2), 20 bytes: describes a private element type F0-FE. Buffer
      sizing uses bit_width and packing_factor.
    doc-ref: descriptor.md § 9.3
    seq:
      - id: bit_width
        type: u4
        valid:
          min: 1
      - id: packing_factor
        type: u1
        valid:
          expr: >-
            bit_width >= 8 ? _ == 1
            : (bit_width == 1 or bit_width == 2 or bit_width == 4) and _ * bit_width == 8
        doc: 1 when bit_width >= 8; otherwise bit_width is 1, 2 or 4 and this is 8 / bit_width.
      - id: is_float
        type: u1
      - id: is_signed
        type: u1
      - id: sign_bits
        type: u1
      - id: exponent_bits
        type: u1
      - id: mantissa_bits
        type: u1
      - id: reserved1
        contents: [0, 0]
      - id: exponent_bias
        type: u4
      - id: has_nan
        type: u1
      - id: has_inf
        type: u1
      - id: reserved2
        contents: [0, 0]

  composite_member_section:
    doc: Composite member (flag bit 4), 16 bytes. Never on a composite head.
    doc-ref: descriptor.md § 9.4
    seq:
      - id: member_role
        type: u1
        enum: member_role
        valid:
          in-enum: true
      - id: reserved
        contents: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]

enums:
  element_type:
    # § 4. Tier 1 (< 0x40) is mandatory, Tier 2 (0x40-0x7F) optional but rejected cleanly.
    0x01: {id: float16, doc: 'IEEE binary16; 2 bytes'}
    0x02: {id: bfloat16, doc: 'bfloat16; 2 bytes'}
    0x03: {id: float32, doc: 'IEEE binary32; 4 bytes'}
    0x04: {id: float64, doc: 'IEEE binary64; 8 bytes'}
    0x10: {id: int8, doc: '1 byte'}
    0x11: {id: uint8, doc: '1 byte'}
    0x12: {id: int16, doc: '2 bytes'}
    0x13: {id: uint16, doc: '2 bytes'}
    0x14: {id: int32, doc: '4 bytes'}
    0x15: {id: uint32, doc: '4 bytes'}
    0x16: {id: int64, doc: '8 bytes'}
    0x17: {id: uint64, doc: '8 bytes'}
    0x20: {id: bool, doc: '1 bit; ceil(N/8) bytes, LSB first'}
    0x40: {id: float8_e4m3, doc: 'OCP E4M3 (no infinities); 1 byte'}
    0x41: {id: float8_e5m2, doc: '1 byte'}
    0x42: {id: float8_e8m0, doc: '1 byte; bytes 00 and FF are invalid data'}
    0x43: {id: float4_e2m1, doc: '4 bits; ceil(N/2) bytes, low nibble first'}
    0x44: {id: float6_e2m3, doc: '6 bits; ceil(N/4) x 3 bytes ([A27])'}
    0x45: {id: float6_e3m2, doc: '6 bits; ceil(N/4) x 3 bytes'}
    0x46: {id: float128, doc: '16 bytes'}
    0x48: {id: int4, doc: '4 bits; ceil(N/2) bytes, low nibble first'}
    0x49: {id: uint4, doc: '4 bits; ceil(N/2) bytes, low nibble first'}
    0x4a: {id: int2, doc: '2 bits; ceil(N/4) bytes, element j of a byte in bits 2j+1..2j'}
    0x4b: {id: uint2, doc: '2 bits; ceil(N/4) bytes'}
    0x50: {id: complex64, doc: '8 bytes (re f32, im f32)'}
    0x51: {id: complex128, doc: '16 bytes (re f64, im f64)'}

  layout_tag:
    # § 6. 00/FF invalid; 0C-3F, 41-EF reserved; F0-FE private.
    0x01: {id: row_major, doc: 'C order; no payload'}
    0x02: {id: column_major, doc: 'Fortran order; no payload'}
    0x03: {id: strided, doc: 'explicit element strides'}
    0x04: {id: tiled, doc: 'tiles of tile_shape, possibly nested'}
    0x05: {id: morton, doc: 'Z-order curve'}
    0x06: {id: coo, doc: 'sparse coordinate list'}
    0x07: {id: csr, doc: 'compressed sparse rows'}
    0x08: {id: csc, doc: 'compressed sparse columns'}
    0x09: {id: csf, doc: 'compressed sparse fibers'}
    0x0a: {id: block_paged, doc: 'paged KV cache (pool + block table + seq_ptr)'}
    0x0b: {id: composite_head, doc: 'head of a composite tensor; owns no data'}
    0x40: {id: hilbert, doc: 'Hilbert curve'}
    0xf0: {id: private_range, doc: 'stands for the whole private range F0-FE in header.layout_kind'}

  tile_order:
    # Orders of the tiled layout; the numbers follow the layout tags they stand for.
    1: row_major
    2: column_major
    3: {id: strided, doc: 'explicit strides follow the tiled payload''s fixed part'}
    4: {id: tiled, doc: 'inner order only - a nested tiled payload follows'}

  kv_role:
    0: {id: key, doc: 'the attention keys'}
    1: {id: value, doc: 'the attention values'}
    2: {id: fused, doc: 'fused K/V or a generic non-KV paged tensor'}

  index_type:
    0: {id: uint32, doc: '4-byte block_table / seq_ptr entries (default)'}
    1: {id: uint64, doc: '8-byte entries; required when num_pages > 0xFFFFFFFF'}

  device_tag:
    # 09-EF reserved, FF invalid; F0-FE private.
    0x00: cpu
    0x01: cuda
    0x02: rocm
    0x03: metal
    0x04: vulkan
    0x05: webgpu
    0x06: hexagon
    0x07: level_zero
    0x08: opencl

  sync_mode:
    0: {id: producer_synced, doc: 'the producer finished writing before handing over (CPU always)'}
    1: {id: event, doc: 'the consumer waits on an event'}
    2: {id: consumer_stream, doc: 'ordered on the consumer''s stream'}

  memory_class:
    # 04-EF and FF rejected; F0-FE private (only with a private device).
    0x00: standard
    0x01: host_pinned
    0x02: unified
    0x03: {id: peer, doc: 'another device''s memory (CUDA, ROCm, Vulkan, Level Zero only)'}

  scheme_tag:
    1: {id: per_tensor_affine, doc: 'one scale and zero point inline'}
    2: {id: per_channel_affine, doc: 'one scale (and zero point) per index along an axis'}
    3: {id: per_block_affine, doc: 'one scale (and zero point) per block along an axis'}
    4: {id: nf4, doc: '4-bit NormalFloat with f32 absmax per block'}
    5: {id: mxfp, doc: 'OCP microscaling, float8_e8m0 scale per block'}

  composite_rule:
    1: partition
    2: overlay
    3: group

  member_role:
    0: correction
    1: base
