"""The import_teacher stage: see build.py."""
