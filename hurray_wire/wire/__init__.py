"""Wire structs: construct definitions of every byte layout, and nothing else.

Modules here know no rules: validation lives next to the model it protects.
"""
