"""The Python examples of spec/block-paged-kv-cache-guide.md, as written.

Each example's ``import hurray`` is the only change: ``import hurray_wire as hurray``.
"""


def test_building_a_descriptor() -> None:
    import hurray_wire as hurray

    # One snapshot: keys for layer 3, a batch of 2 sequences, 4 tokens per page.
    layout = hurray.BlockPagedLayout(
        page_size=4,  # tokens per page
        num_pages=5,  # pool capacity
        paged_axis=0,  # MUST be 0 in this version
        num_seqs=2,
        kv_role="key",  # "value" and "fused" also exist
        layer_index=3,  # None = not layer-scoped
        block_table_index_type="uint32",  # "uint64" for huge pools
    )

    assert layout.tag == 0x0A
    assert layout.buffer_count == 3

    # Block-paged is rank-3 only.
    layout.validate_against_shape([9, 2, 8])  # [total_tokens, num_heads, head_dim]
    try:
        layout.validate_against_shape([9, 2])
        raise AssertionError("rank-2 should be refused")
    except hurray.errors.InvalidDescriptorError:
        pass


def test_element_lookup_fields() -> None:
    import hurray_wire as hurray

    # Python has no element_offset: resolving one logical coordinate at a time is
    # indexing, and Hurray is an interchange format rather than a compute library
    # (and a Python loop over elements would be the wrong tool regardless). The
    # formula above is what a consumer implements in its own kernel; what Python
    # gives you is the descriptor that says how to read it.
    layout = hurray.BlockPagedLayout(page_size=4, num_pages=5, paged_axis=0, num_seqs=2)
    print(layout.page_size, layout.num_pages, layout.num_seqs)


def test_prefix_sharing() -> None:
    import hurray_wire as hurray

    layout = hurray.BlockPagedLayout(page_size=4, num_pages=5, paged_axis=0, num_seqs=2)

    seq_ptr = [0, 2, 3]
    block_table = [0, 1, 0]  # seq 1's page 0 aliases seq 0's page 0

    # Aliasing is not an error — it is the point. The validator accepts it.
    layout.validate_index_buffers(seq_ptr=seq_ptr, block_table=block_table)


def test_validating_the_storage_invariants() -> None:
    import hurray_wire as hurray

    layout = hurray.BlockPagedLayout(page_size=4, num_pages=5, paged_axis=0, num_seqs=2)

    layout.validate_index_buffers(seq_ptr=[0, 2, 3], block_table=[0, 1, 0])

    # A page id outside [0, num_pages) is rejected.
    try:
        layout.validate_index_buffers(seq_ptr=[0, 2, 3], block_table=[0, 5, 0])
        raise AssertionError("page 5 == num_pages should be refused")
    except hurray.errors.InvalidDescriptorError as exc:
        print(exc)


def test_quantization_compatibility() -> None:
    import hurray_wire as hurray

    layout = hurray.BlockPagedLayout(page_size=4, num_pages=5, paged_axis=0, num_seqs=2)

    # per-block-affine: valid only when axis == 0 and block_size == page_size.
    layout.validate_quantization_compatibility(
        hurray.PerBlockAffine.symmetric(
            axis=0, block_size=4, scale_buffer_index=3, scale_type=hurray.float32
        )
    )

    for incompatible in (
        hurray.PerBlockAffine.symmetric(  # block_size != page_size
            axis=0, block_size=8, scale_buffer_index=3, scale_type=hurray.float32
        ),
        hurray.PerChannelAffine.symmetric(  # per-channel on the paged axis
            axis=0, scale_buffer_index=3
        ),
    ):
        try:
            layout.validate_quantization_compatibility(incompatible)
            raise AssertionError("should be refused")
        except hurray.errors.InvalidDescriptorError:
            pass
