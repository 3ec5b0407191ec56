"""The validated model: layout, quantization, descriptor, and the descriptor codec.

Bytes become model objects here (``descriptor_codec``) and nowhere else; the model knows no
framing (blobs, streams, files).
"""
