"""`python -m mt_runtime`: the `mt-runtime` command (mt_runtime/cli.py)."""

from .cli import main

main()
