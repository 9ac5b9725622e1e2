"""Errors the CLI turns into one readable line and an exit code (no traceback)."""


class PipelineError(Exception):
    """A failure the user can act on. Exit code 1 unless a subclass says otherwise."""

    exit_code = 1


class UserInputError(PipelineError):
    """Bad recipe, bad argument, bad data file: exit code 2."""

    exit_code = 2


class RecipeError(UserInputError):
    """One or more problems in a recipe; each line names the file and the dotted key."""

    def __init__(self, lines: list[str]):
        self.lines = lines
        super().__init__("\n".join(lines))


class DataError(UserInputError):
    """A data file that cannot be used as it is (wrong checksum, mismatched lines, bad bytes)."""


class OutputError(PipelineError):
    """Standard output cannot be written (a full disk, an I/O error): what was not written is
    dropped, so that the interpreter's own flush at exit does not fail again."""


class ReaderGone(Exception):
    """The reader of standard output went away (`| head -1`): the command ends quietly, with the
    status of a process SIGPIPE ended. Not an OSError, which click would turn into exit 1 itself."""


class StoreLockedError(PipelineError):
    """Another process holds the artifact store's lock."""


class IntegrityError(PipelineError):
    """An artifact's files do not match its manifest."""


class StageFailed(PipelineError):
    """A stage ran and failed (not a crash: a check it makes, e.g. parity or accuracy guard)."""
