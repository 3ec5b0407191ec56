"""Vectorised algorithms behind ``BlockPagedTensor``'s helper methods, one module each; each
builds through ``from_arrays``, so a transformed tensor is validated like a new one."""
