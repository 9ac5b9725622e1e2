"""The quantize stage: see build.py."""
