"""Errors the CLI turns into one readable line and an exit code (no traceback)."""

import errno
import os


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


# A write that found no room: the disk or the quota full, or a file over the size limit
# (RLIMIT_FSIZE). Libraries that write in native code report it in their own exception types
# (safetensors: "IoError(Os { code: 28, kind: StorageFull, ... })"), so their text is read too.
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_NO_ROOM_TEXT = tuple(os.strerror(code) for code in NO_ROOM) + tuple(f"code: {code}," for code in NO_ROOM)


def no_room(exc: BaseException | None) -> str | None:
    """The reason in words where `exc`, or an exception it came from, is a write that found no
    room (None otherwise)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in NO_ROOM:
            return os.strerror(exc.errno) + (f": {exc.filename}" if exc.filename else "")
        text = str(exc)
        for marker in _NO_ROOM_TEXT:
            if marker in text:
                code = next((c for c in NO_ROOM if marker in (os.strerror(c), f"code: {c},")), errno.ENOSPC)
                return os.strerror(code)
        exc = exc.__cause__ or exc.__context__
    return None
