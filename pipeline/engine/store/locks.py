"""The store's three kinds of lock, all flock(2), so that a crashed holder never blocks anyone:

- `lock`: exclusive, held by the process writing to the store (`pipeline run`, gc); the pid file
  only tells the user who holds it.
- `reading` / `no_readers`: shared and exclusive sides of readers.lock. Commands reading artifacts
  they did not build hold it shared; gc takes it exclusively, so it never deletes what is being read.
- a work folder's `.lock` (hold_work_dir / work_dir_holder): held shared by every process writing
  a stage's checkpoints, so that neither a second run nor gc writes into or removes it under them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Iterator

from ..errors import StoreLockedError
from .ids import now_iso


@contextlib.contextmanager
def store_lock(root: Path, wait: bool = False, on_wait=None, on_stale=None) -> Iterator[None]:
    """Exclusive lock on the store at `root` (Store.lock)."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                holder = _read_holder(path)
                if not wait:
                    raise StoreLockedError(
                        f"artifact store {root} is in use by pid {holder.get('pid', '?')} "
                        f"({holder.get('command', 'unknown command')}, since {holder.get('since', '?')}); "
                        "wait for it to finish or pass --wait"
                    ) from None
                if not told and on_wait:
                    on_wait(holder)
                    told = True
                time.sleep(0.5)
        previous = _read_holder(path)
        if previous.get("pid") and previous.get("pid") != os.getpid() and not _pid_alive(previous["pid"]):
            if on_stale:
                on_stale(previous)
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": now_iso(),
            "command": " ".join(Path(sys.argv[0]).name.split() + sys.argv[1:])[:200],
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextlib.contextmanager
def reading(root: Path) -> Iterator[None]:
    """Shared side of readers.lock (Store.reading). A store that does not exist has nothing to
    collect: no lock, and no folder made for one."""
    if not root.is_dir():
        yield
        return
    fd = os.open(root / "readers.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for `pipeline artifacts gc` to finish with {root}", file=sys.stderr)
            fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def no_readers(root: Path) -> Iterator[None]:
    """Exclusive side of readers.lock (for gc): waits for readers to finish their reads."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / "readers.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(
                f"waiting for commands reading {root} (translate, export-package) to finish loading",
                file=sys.stderr,
            )
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# A work folder (work/<id>/) is written by the runner and by the worker processes it starts.
# Every worker holds a shared flock on work/<id>/.lock for as long as it lives; the runner
# refuses a work folder whose lock it cannot take exclusively, and gc never deletes one. So a
# worker left running by a killed run (one that escaped its parent-death signal) can never have
# a second run, or gc, write into or remove the folder under it.
WORK_LOCK = ".lock"
_held_work: dict[str, int] = {}


def hold_work_dir(path: Path, role: str) -> None:
    """Take this process's shared lock on a work folder, held until it exits."""
    key = str(Path(path).resolve())
    if key in _held_work:
        return
    fd = os.open(Path(path) / WORK_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)
    with contextlib.suppress(OSError):
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "role": role}).encode().ljust(200), 0)
    _held_work[key] = fd


def work_dir_holder(path: Path) -> dict | None:
    """None when no live process holds the work folder's lock; else what the holder wrote."""
    lock = Path(path) / WORK_LOCK
    if not lock.is_file() or str(Path(path).resolve()) in _held_work:
        return None
    fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                return json.loads(os.pread(fd, 200, 0).decode().strip() or "{}")
            except (ValueError, UnicodeDecodeError):
                return {}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _read_holder(path: Path) -> dict:
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, json.JSONDecodeError):
        return {}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError):
        return True
    return True
