"""`Store`: one object for a store root. It finds and reads artifacts itself (get, resolve,
listing, verify) and hands every other job to the module that does it: commit (writing),
rebuilds (forced rebuilds' ids), pointers (run logs and latest pointers), gc, locks."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

from mt_runtime.files import read_bounded

from ..errors import IntegrityError, UserInputError
from . import commit as _commit
from . import gc as _gc
from . import locks as _locks
from .ids import ID_RE, MANIFEST, MAX_MANIFEST_BYTES, Artifact, check_id, default_root
from .pointers import Pointers, Runs
from .rebuilds import Rebuilds
from .verify import verify_folder


class Store:
    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else default_root()
        self.objects = self.root / "objects"
        self.tmp = self.root / "tmp"
        self.work = self.root / "work"
        self.quarantine = self.root / "quarantine"
        self.runs = self.root / "runs"
        self.latest_dir = self.root / "latest"
        self.builds = self.root / "builds"
        self._rebuilds = Rebuilds(self.builds, self.exists)
        self._pointers = Pointers(self.latest_dir)
        self._runs = Runs(self.runs)

    # ------------------------------------------------------------------ reading
    def path_of(self, artifact: str) -> Path:
        return self.objects / check_id(artifact)

    def exists(self, artifact: str) -> bool:
        return (self.path_of(artifact) / MANIFEST).is_file()

    def get(self, artifact: str) -> Artifact:
        path = self.path_of(artifact)
        try:
            manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UserInputError(f"no artifact {artifact} in {self.root}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise IntegrityError(f"{path / MANIFEST}: unreadable manifest ({exc})") from None
        return Artifact(artifact, path, manifest)

    def resolve(self, ref: str) -> Artifact:
        """An artifact id, a unique id prefix, or a path to an artifact folder."""
        if ID_RE.match(ref) and self.exists(ref):
            return self.get(ref)
        path = Path(ref)
        if (path / MANIFEST).is_file():
            try:
                manifest = json.loads(read_bounded(path / MANIFEST, MAX_MANIFEST_BYTES, follow_links=False))
            except (ValueError, OSError) as exc:  # UnsafeFile is a ValueError
                raise IntegrityError(f"{path / MANIFEST}: unreadable manifest ({exc})") from None
            if not isinstance(manifest, dict):
                raise IntegrityError(f"{path / MANIFEST}: unreadable manifest (not a JSON object)")
            aid = manifest.get("id")
            return Artifact(aid if isinstance(aid, str) else path.name, path, manifest)
        matches = [p.name for p in self.list_dirs() if p.name.startswith(ref) and (p / MANIFEST).is_file()]
        if len(matches) == 1:
            return self.get(matches[0])
        if len(matches) > 1:
            raise UserInputError(f"{ref!r} matches {len(matches)} artifacts: {', '.join(sorted(matches)[:5])}")
        raise UserInputError(f"no artifact {ref!r} in {self.root} (and no manifest.json at that path)")

    def list_dirs(self) -> list[Path]:
        if not self.objects.is_dir():
            return []
        return sorted(p for p in self.objects.iterdir() if p.is_dir())

    def listing(self) -> list[dict]:
        """One row per artifact folder: id, stage, path, created (None: incomplete), bytes,
        build time, and which artifact a forced rebuild replaced."""
        rows = []
        for path in self.list_dirs():
            manifest: dict = {}
            complete = (path / MANIFEST).is_file()
            if complete:
                try:
                    manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
                except (OSError, json.JSONDecodeError):
                    complete = False
            rows.append(
                {
                    "id": path.name,
                    "stage": manifest.get("stage", path.name.rsplit("-", 1)[0]),
                    "path": str(path),
                    "created": manifest.get("created"),
                    "complete": complete,
                    "bytes": manifest.get("bytes"),
                    "duration_s": manifest.get("duration_s"),
                    "rebuild_of": manifest.get("rebuild_of"),
                }
            )
        return rows

    def in_store(self, artifact: Artifact) -> bool:
        """Whether `artifact` is this store's own folder for its id (not a copy elsewhere)."""
        return bool(ID_RE.match(artifact.id)) and artifact.path.resolve() == self.path_of(artifact.id).resolve()

    def verify_artifact(self, artifact: Artifact) -> list[str]:
        """The folder the artifact names, against its own manifest; a folder outside the store is
        also checked against the digests this store holds for its id, when it holds that id (a
        copy whose files and manifest were both rewritten still fails)."""
        if self.in_store(artifact):
            return self.verify(artifact)
        trusted = None
        if ID_RE.match(artifact.id) and self.exists(artifact.id):
            try:
                trusted = self.get(artifact.id).manifest.get("files")
            except IntegrityError as exc:
                return [str(exc)]
            if not isinstance(trusted, dict):
                trusted = None
        return verify_folder(artifact.path, artifact.manifest, trusted)

    def verify(self, artifact: Artifact | str) -> list[str]:
        """Problems found (empty when every file matches the manifest's size and sha256)."""
        if isinstance(artifact, str):
            try:
                artifact = self.get(artifact)
            except IntegrityError as exc:
                return [str(exc)]
        return verify_folder(artifact.path, artifact.manifest)

    # ------------------------------------------------------------------ writing (commit.py)
    def writing(self, artifact: str) -> contextlib.AbstractContextManager[Path]:
        """A fresh temporary folder for a new artifact; removed if the body raises."""
        return _commit.writing(self.tmp, artifact)

    def commit(self, artifact: str, tmp: Path, manifest: dict) -> Artifact:
        """Digest every file, write the manifest last, then rename the folder into place."""
        return _commit.commit(self.objects, self.quarantine, artifact, tmp, manifest)

    def quarantine_artifact(self, artifact: str) -> Path:
        return _commit.quarantine(self.path_of(artifact), self.quarantine)

    def work_dir(self, artifact: str) -> Path:
        """Scratch space kept across crashes (checkpoints), removed once the artifact is complete;
        refused while a process still holds the folder's lock."""
        return _commit.work_dir(self.work, artifact)

    def drop_work_dir(self, artifact: str) -> None:
        shutil.rmtree(self.work / check_id(artifact), ignore_errors=True)

    def clean_tmp(self) -> list[str]:
        """Remove half-written artifacts left by crashed runs (call with the lock held)."""
        return _commit.clean_tmp(self.tmp)

    # ------------------------------------------------------------------ forced rebuilds (rebuilds.py)
    def current_build(self, default_id: str) -> str:
        """The id a fingerprint resolves to: its newest rebuild still in the store, else its own."""
        return self._rebuilds.current(default_id)

    def next_build(self, default_id: str) -> str:
        return self._rebuilds.next(default_id)

    def record_build(self, default_id: str, build_id: str, run_id: str) -> None:
        """Make build_id the current build of default_id's fingerprint (call with the lock held)."""
        self._rebuilds.record(default_id, build_id, run_id)

    # ------------------------------------------------------------------ runs and pointers (pointers.py)
    def write_run(self, run: dict) -> Path:
        return self._runs.write(run)

    def read_run(self, run_id: str) -> dict:
        return self._runs.read(run_id)

    def latest(self, recipe_name: str, recipe_path: str | Path | None = None) -> dict | None:
        """What the latest run of the recipe file at recipe_path used; without a path, the most
        recently updated pointer of any recipe with that name."""
        return self._pointers.latest(recipe_name, recipe_path)

    def set_latest(self, recipe_name: str, pointer: dict, recipe_path: str | Path | None = None) -> None:
        self._pointers.set_latest(recipe_name, pointer, recipe_path)

    def all_latest(self) -> list[dict]:
        return self._pointers.all_latest()

    # ------------------------------------------------------------------ clean-up (gc.py)
    def collect_garbage(self, dry_run: bool = False, drop_checkpoints: bool = False, on_remove=None) -> _gc.Garbage:
        """Remove the artifacts no recipe's latest run uses, quarantined folders and stale tmp/
        entries; work folders (resume checkpoints) only with `drop_checkpoints`."""
        with self.lock(), self.no_readers():
            keep = {node["id"] for pointer in self.all_latest() for node in pointer.get("nodes", {}).values()}
            return _gc.collect_garbage(
                keep, self.list_dirs(), self.work, self.quarantine, self.tmp, dry_run, drop_checkpoints, on_remove
            )

    # ------------------------------------------------------------------ locks (locks.py)
    def reading(self) -> contextlib.AbstractContextManager[None]:
        """Shared lock held while a command reads artifacts it did not build (translate,
        export-package): `artifacts gc` takes it exclusively, so it never deletes an artifact
        while one is being read. Readers never wait on `pipeline run`, only on a gc in progress."""
        return _locks.reading(self.root)

    def no_readers(self) -> contextlib.AbstractContextManager[None]:
        """Exclusive side of `reading` (for gc): waits for readers to finish their reads."""
        return _locks.no_readers(self.root)

    def lock(self, wait: bool = False, on_wait=None, on_stale=None) -> contextlib.AbstractContextManager[None]:
        """Exclusive lock on the store. flock dies with its process, so a crashed holder
        never blocks anyone; the pid file only tells the user who holds it."""
        return _locks.store_lock(self.root, wait, on_wait, on_stale)
