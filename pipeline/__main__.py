"""`python -m pipeline`: the command line (pipeline/commands/cli.py)."""

from pipeline.commands.cli import main

main()
