"""Vectorised algorithms behind the helper methods of ``BlockPagedTensor``.

One module per helper (select, compact, dequantize, repage, heads); each builds its result
through ``BlockPagedTensor.from_arrays``, so every transformed tensor is validated like a
new one. No module loops over tokens or pages.
"""
