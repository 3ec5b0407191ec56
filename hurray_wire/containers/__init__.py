"""Containers that carry blobs and descriptors: streams, reference streams, ``.hrry`` files."""
