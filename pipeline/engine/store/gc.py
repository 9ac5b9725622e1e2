"""Garbage collection: remove the artifacts no recipe's latest run uses, quarantined folders and
stale tmp/ entries (the facade, Store.collect_garbage, holds the store's lock and the exclusive
readers' lock around it, and says what the latest pointers keep)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from .commit import clean_tmp
from .locks import work_dir_holder


@dataclass
class Garbage:
    """What `Store.collect_garbage` removed (or would remove) and what it kept."""

    removed: int
    freed_bytes: int
    kept: int
    busy: list[Path]
    kept_checkpoints: list[Path]
    kept_checkpoint_bytes: int


def tree_bytes(path: Path) -> int:
    if path.is_symlink() or not path.is_dir():
        return 0
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def collect_garbage(
    keep: set[str],
    artifacts: list[Path],
    work_root: Path,
    quarantine_dir: Path,
    tmp_root: Path,
    dry_run: bool = False,
    drop_checkpoints: bool = False,
    on_remove=None,
) -> Garbage:
    """Remove the artifact folders whose id is not in `keep`, everything quarantined, and tmp/;
    call with the store's lock and the exclusive readers' lock held (Store.collect_garbage).
    Work folders hold an interrupted stage's resume checkpoints: removed only with
    `drop_checkpoints`, and never while a live process holds one. `on_remove(path, bytes)` is
    called per folder as it goes (or would go, with `dry_run`)."""
    doomed = [p for p in artifacts if p.name not in keep]
    work = list(work_root.iterdir()) if work_root.is_dir() else []
    busy = [p for p in work if p.is_dir() and work_dir_holder(p) is not None]
    kept_work = [p for p in work if p not in busy and not drop_checkpoints]
    extra = (list(quarantine_dir.iterdir()) if quarantine_dir.is_dir() else []) + [
        p for p in work if p not in busy and drop_checkpoints
    ]
    freed = 0
    for path in doomed + extra:
        size = tree_bytes(path)
        freed += size
        if on_remove:
            on_remove(path, size)
        if not dry_run:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() and not path.is_symlink() else path.unlink(
                missing_ok=True
            )
    if not dry_run:
        clean_tmp(tmp_root)
    return Garbage(
        removed=len(doomed),
        freed_bytes=freed,
        kept=len(keep),
        busy=busy,
        kept_checkpoints=kept_work,
        kept_checkpoint_bytes=sum(tree_bytes(p) for p in kept_work),
    )
