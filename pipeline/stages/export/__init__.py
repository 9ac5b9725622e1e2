"""The export stage: see build.py."""
