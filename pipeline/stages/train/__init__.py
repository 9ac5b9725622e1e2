"""The train stage: see build.py."""
