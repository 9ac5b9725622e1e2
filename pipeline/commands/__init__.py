"""The command line and what only it uses: the dry-run estimate, translating a stream, showing
reports."""
