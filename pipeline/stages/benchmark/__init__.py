"""The benchmark stage: see build.py."""
