"""Quantize and gate: quantization settings, the accuracy gate and its sequential looks, variants on disk, export checks, served accuracy."""
