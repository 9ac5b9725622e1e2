"""A child process of Translator(processes=N) (mt_runtime/processes.py): load the package, then
search each batch the parent sends over its pipe."""

from __future__ import annotations

import os
import signal
from multiprocessing.connection import Connection

from .translator import Translator


def child_main(read_fd: int, write_fd: int) -> None:
    """The child's loop: load the package named in the first message, then search each batch sent
    until told to stop (None) or the parent's pipe closes."""
    # Ctrl-C reaches the whole foreground group: the parent answers it (one line, exit 130) and its
    # exit closes the pipes, which ends this loop; a child's own KeyboardInterrupt would only print
    # a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from_parent = Connection(read_fd, writable=False)
    to_parent = Connection(write_fd, readable=False)
    try:
        folder, options = from_parent.recv()
        translator = Translator(folder, **options)
    except BaseException as exc:  # the parent shows it as the reason; nothing else can
        to_parent.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    to_parent.send(("ready", os.getpid()))
    while True:
        try:
            job = from_parent.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        batch, gen, shortlist = job
        try:
            translator.decoder.use_shortlist = shortlist
            answer = ("ok", translator.searcher(batch, gen))
        except Exception as exc:
            answer = ("error", f"{type(exc).__name__}: {exc}")
        try:
            to_parent.send(answer)
        except OSError:
            return
