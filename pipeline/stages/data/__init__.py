"""The data stage: see build.py."""
