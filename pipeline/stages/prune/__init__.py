"""The prune stage: see build.py."""
