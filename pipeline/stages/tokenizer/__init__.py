"""The tokenizer stage: see build.py."""
