"""Writing to the store so that a reader never sees half of anything: an artifact is built in
tmp/, digested, its manifest written last, then renamed into objects/ (`commit`); a JSON record
is replaced whole (`write_json_atomic`). Also the folders a build writes besides: work/<id>/,
scratch space kept across crashes, and quarantine/, where a failed artifact is moved aside."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Iterator

from mt_runtime.files import walk

from ..errors import PipelineError
from .ids import FORMAT, MANIFEST, Artifact, check_id
from .locks import work_dir_holder
from .verify import file_record


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def writing(tmp_root: Path, artifact: str) -> Iterator[Path]:
    """A fresh folder under tmp_root for a new artifact; removed if the body raises."""
    check_id(artifact)
    tmp_root.mkdir(parents=True, exist_ok=True)
    tmp = tmp_root / f"{artifact}.{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def commit(objects: Path, quarantine_dir: Path, artifact: str, tmp: Path, manifest: dict) -> Artifact:
    """Digest every file, write the manifest last, then rename the folder into objects/ (a folder
    already there under that id is quarantined first)."""
    try:
        files = {}
        written, problems = walk(tmp)
        if problems:
            raise PipelineError(f"stage wrote {problems[0].replace(str(tmp) + '/', '')}")
        for rel in written:
            path = tmp / rel
            if rel == MANIFEST:
                raise PipelineError("a stage may not write manifest.json itself")
            with open(path, "rb") as f:
                os.fsync(f.fileno())
            files[rel] = file_record(path)
        manifest = {
            **manifest,
            "format": FORMAT,
            "id": artifact,
            "files": files,
            "bytes": sum(f["bytes"] for f in files.values()),
        }
        write_json_atomic(tmp / MANIFEST, manifest)
        _fsync_dir(tmp)
        objects.mkdir(parents=True, exist_ok=True)
        final = objects / check_id(artifact)
        if final.exists():
            quarantine(final, quarantine_dir)
        os.rename(tmp, final)
        _fsync_dir(objects)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _write_error(exc, artifact) from None
    return Artifact(artifact, final, manifest)


def quarantine(path: Path, quarantine_dir: Path) -> Path:
    """Move a folder aside, kept for inspection, out of objects/."""
    quarantine_dir.mkdir(parents=True, exist_ok=True)
    dest = quarantine_dir / f"{path.name}.{int(time.time())}"
    os.rename(path, dest)
    return dest


def work_dir(work_root: Path, artifact: str) -> Path:
    """Scratch space kept across crashes (checkpoints), removed once the artifact is complete.
    Refused while a process still holds the folder's lock (see locks.hold_work_dir)."""
    path = work_root / check_id(artifact)
    path.mkdir(parents=True, exist_ok=True)
    holder = work_dir_holder(path)
    if holder is not None:
        raise PipelineError(
            f"work folder {path} is in use by pid {holder.get('pid', '?')} ({holder.get('role', 'a worker')}), "
            "a process of an earlier run that is still writing its checkpoints: stop it "
            f"(kill {holder.get('pid', 'it')}) or wait for it to end, then run again"
        )
    return path


def clean_tmp(tmp_root: Path) -> list[str]:
    """Remove half-written artifacts left by crashed runs (call with the store's lock held)."""
    removed = []
    if tmp_root.is_dir():
        for path in tmp_root.iterdir():
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


def _write_error(exc: OSError, artifact: str) -> PipelineError:
    if exc.errno == errno.ENOSPC:
        return PipelineError(
            f"disk full while writing artifact {artifact}; the store is unchanged "
            "(free some space, e.g. `pipeline artifacts gc`, and run again)"
        )
    return PipelineError(
        f"could not write artifact {artifact}: {exc.strerror or exc} ({exc.filename or ''}); the store is unchanged"
    )
