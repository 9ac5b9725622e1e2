"""Checking a folder against the file list that records it: a manifest for an artifact, a work
folder's own record for a stage's checkpoints. A record lists, per file, its size and sha256
(`file_record`); what a folder may hold is mt_runtime/files.py's rule."""

from __future__ import annotations

from pathlib import Path

from mt_runtime.files import listed_file_faults, sha256_file, walk

from .ids import MANIFEST


def file_record(path: Path) -> dict:
    """{"bytes", "sha256"} of a file, as manifests and work folders' records list it."""
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


def verify_folder(path: Path, manifest: dict, trusted: dict | None = None) -> list[str]:
    """Problems found in the folder at `path` against `manifest` (empty when every file it lists is
    a regular file inside the folder with the listed size and sha256, and nothing else is there).

    What the folder may hold is mt_runtime/files.py's rule: regular files and folders only, no link,
    device or fifo, reached without following a link. `trusted`, when given, is the file list the
    user already holds for this id (the store's copy): each file must also match its digest there,
    so a folder that rewrote its own manifest still fails."""
    files = manifest.get("files")
    if not isinstance(files, dict):
        return [f"{path / MANIFEST}: no file list"]
    present, problems = walk(path)
    problems += listed_file_problems(path, files, trusted=trusted)
    if trusted is not None:
        for rel in sorted(set(trusted) - set(files)):
            problems.append(f"{path / rel}: missing (the store's copy of this artifact has it)")
    listed = set(files) | {MANIFEST}
    for rel in present:
        if rel not in listed:
            problems.append(f"{path / rel}: not in the manifest")
    return problems


def listed_file_problems(
    path: Path, files: dict, record: str = "manifest", trusted: dict | None = None, folder: str = "artifact"
) -> list[str]:
    """Problems of the files a record (`files`: relative path -> {"bytes", "sha256"}) lists in the
    folder at `path`: each must be a regular file inside it, of that size and digest. Also what a
    work folder's own record (written last, at the end of its build) is checked with."""
    problems = []
    for rel, verdict, detail in listed_file_faults(path, files):
        target = path / rel
        if verdict == "missing":
            problems.append(f"{target}: missing")
        elif verdict == "outside":
            problems.append(f"{path}: {record} names a file outside the {folder} or not a regular file: {detail}")
        elif verdict == "entry":
            problems.append(f"{target}: {record} entry is not a mapping")
        elif verdict == "size":
            problems.append(f"{target}: size {detail} bytes, {record} says {files[rel].get('bytes')}")
        elif verdict == "content":
            problems.append(f"{target}: content changed (sha256 differs from {record})")
        elif trusted is not None and detail != (trusted.get(rel) or {}).get("sha256"):
            problems.append(
                f"{target}: differs from the store's copy of this artifact "
                "(sha256 differs from the digest the store holds)"
            )
    return problems
