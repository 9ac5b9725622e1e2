"""The report stage: see build.py."""
