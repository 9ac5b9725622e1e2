"""The evaluate stage: see build.py."""
