"""Wire structs: construct definitions of every byte layout, and nothing else.

Modules here know no rules: validation lives next to the model it protects. Each derives
its fixed records once (``FAST_*``, ``wire/fast.py``): struct formats, field offsets and sizes,
packing with the Const fields filled in; other modules use these, never derive their own.
"""
