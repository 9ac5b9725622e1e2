"""The kd_corpus stage: see build.py."""
