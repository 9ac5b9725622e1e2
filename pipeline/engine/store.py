"""The artifact store: immutable, content-verified folders named by stage and fingerprint.

Layout under the store root:
    objects/<stage>-<fingerprint16>/   complete artifacts (manifest.json written last)
    tmp/                                artifacts being written (renamed into objects/ when done)
    work/<id>/                          a stage's scratch space that survives a crash (checkpoints)
    quarantine/                         artifacts that failed verification, kept for inspection
    runs/<run-id>.json                  one log per `pipeline run`
    latest/<recipe>.json                what the latest run of each recipe used
    builds/<stage>-<fingerprint16>.json forced rebuilds of that fingerprint, each under its own id
    lock                                held (flock) by the process writing to the store
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from mt_runtime.files import listed_file_faults, read_bounded, sha256_file, walk

from .errors import IntegrityError, PipelineError, StoreLockedError, UserInputError

MANIFEST = "manifest.json"
FORMAT = 1
MAX_MANIFEST_BYTES = 16 << 20  # a manifest lists file names and digests: far below this
_ID_RE = re.compile(r"^[a-z][a-z0-9_.]*-[0-9a-f]{16}$")
_TRACKED_PACKAGES = (
    "mt-runtime",
    "torch",
    "onnx",
    "onnxruntime",
    "onnxruntime-gpu",
    "tokenizers",
    "sacrebleu",
    "numpy",
    "safetensors",
    "ctranslate2",
)


def default_root() -> Path:
    return Path(os.environ.get("PIPELINE_ARTIFACTS", "artifacts"))


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def fingerprint(stage: str, code_version: int, code: str, config: Any, input_fingerprints: dict[str, str]) -> str:
    """`code`: the digest of the source the stage runs (pipeline.engine.code_digest); `code_version`: a
    number to bump only for what that cannot see (a changed data file, a dependency's behaviour)."""
    payload = canonical_json(
        {"stage": stage, "version": code_version, "code": code, "config": config, "inputs": input_fingerprints}
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def artifact_id(stage: str, fp: str) -> str:
    return f"{stage}-{fp[:16]}"


def tool_versions() -> dict[str, str]:
    from importlib import metadata

    versions = {"python": sys.version.split()[0]}
    for name in _TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


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


@dataclass(frozen=True)
class Artifact:
    """A complete artifact, read-only. Stages get these as their inputs."""

    id: str
    path: Path
    manifest: dict

    @property
    def stage(self) -> str:
        return self.manifest["stage"]

    @property
    def metrics(self) -> dict:
        return self.manifest.get("metrics", {})

    @property
    def config(self) -> Any:
        return self.manifest.get("config")

    def file(self, relative: str) -> Path:
        if relative not in self.manifest.get("files", {}):
            raise IntegrityError(f"artifact {self.id} has no file {relative!r}")
        return self.path / relative


def training_cut(metrics: dict) -> str | None:
    """ "cut by time at step N of M" where a max_minutes cap stopped a training, or one of a
    pruning's fine-tunes, before its budget: that model is not the one the recipe trains."""
    cuts = [metrics.get("cut_by_time")]
    if isinstance(metrics.get("steps"), list):  # pruning: a fine-tune per step
        cuts += [(step.get("finetune") or {}).get("cut_by_time") for step in metrics["steps"]]
    return "; ".join(c for c in cuts if c) or None


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

    # ------------------------------------------------------------------ reading
    def _check_id(self, artifact: str) -> str:
        if not _ID_RE.match(artifact):
            raise UserInputError(f"not an artifact id: {artifact!r} (expected e.g. teacher-0123456789abcdef)")
        return artifact

    def path_of(self, artifact: str) -> Path:
        return self.objects / self._check_id(artifact)

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
        if _ID_RE.match(ref) and self.exists(ref):
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

    def in_store(self, artifact: Artifact) -> bool:
        """Whether `artifact` is this store's own folder for its id (not a copy elsewhere)."""
        return bool(_ID_RE.match(artifact.id)) and artifact.path.resolve() == self.path_of(artifact.id).resolve()

    def verify_artifact(self, artifact: Artifact) -> list[str]:
        """The folder the artifact names, against its own manifest; a folder outside the store is
        also checked against the digests this store holds for its id, when it holds that id (a
        copy whose files and manifest were both rewritten still fails)."""
        if self.in_store(artifact):
            return self.verify(artifact)
        trusted = None
        if _ID_RE.match(artifact.id) and self.exists(artifact.id):
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

    # ------------------------------------------------------------------ writing
    @contextlib.contextmanager
    def writing(self, artifact: str) -> Iterator[Path]:
        """A fresh temporary folder for a new artifact; removed if the body raises."""
        self._check_id(artifact)
        self.tmp.mkdir(parents=True, exist_ok=True)
        tmp = self.tmp / f"{artifact}.{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        try:
            yield tmp
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def commit(self, artifact: str, tmp: Path, manifest: dict) -> Artifact:
        """Digest every file, write the manifest last, then rename the folder into place."""
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
            self.objects.mkdir(parents=True, exist_ok=True)
            final = self.path_of(artifact)
            if final.exists():
                self._quarantine(final)
            os.rename(tmp, final)
            _fsync_dir(self.objects)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise _write_error(exc, artifact) from None
        return Artifact(artifact, final, manifest)

    def _quarantine(self, path: Path) -> Path:
        self.quarantine.mkdir(parents=True, exist_ok=True)
        dest = self.quarantine / f"{path.name}.{int(time.time())}"
        os.rename(path, dest)
        return dest

    def quarantine_artifact(self, artifact: str) -> Path:
        return self._quarantine(self.path_of(artifact))

    def work_dir(self, artifact: str) -> Path:
        """Scratch space kept across crashes (checkpoints), removed once the artifact is complete.
        Refused while a process still holds the folder's lock (see hold_work_dir)."""
        path = self.work / self._check_id(artifact)
        path.mkdir(parents=True, exist_ok=True)
        holder = work_dir_holder(path)
        if holder is not None:
            raise PipelineError(
                f"work folder {path} is in use by pid {holder.get('pid', '?')} ({holder.get('role', 'a worker')}), "
                "a process of an earlier run that is still writing its checkpoints: stop it "
                f"(kill {holder.get('pid', 'it')}) or wait for it to end, then run again"
            )
        return path

    def drop_work_dir(self, artifact: str) -> None:
        shutil.rmtree(self.work / self._check_id(artifact), ignore_errors=True)

    def clean_tmp(self) -> list[str]:
        """Remove half-written artifacts left by crashed runs (call with the lock held)."""
        removed = []
        if self.tmp.is_dir():
            for path in self.tmp.iterdir():
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
                removed.append(path.name)
        return removed

    # ------------------------------------------------------------------ forced rebuilds
    # `run --force` must not overwrite an artifact (a report, a comparison or another recipe may
    # name it), so a rebuild gets an id of its own: the n-th rebuild of a fingerprint is
    # <stage>-sha256("<default id>:rebuild:<n>")[:16]. n counts committed rebuilds only, so a
    # rebuild that crashed gets the same id, and its work folder, when forced again. Records are kept
    # after gc, so that an id never names two different contents.
    def _builds_file(self, default_id: str) -> Path:
        return self.builds / f"{self._check_id(default_id)}.json"

    def _rebuilds(self, default_id: str) -> list[dict]:
        path = self._builds_file(default_id)
        if not path.is_file():
            return []
        try:
            rebuilds = json.loads(path.read_text(encoding="utf-8"))["rebuilds"]
            if not all(_ID_RE.match(b["id"]) for b in rebuilds):
                raise ValueError("an id that is not an artifact id")
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as exc:
            raise IntegrityError(
                f"{path}: unreadable record of rebuilds ({exc}); the store writes it "
                "atomically, so it was edited by hand"
            ) from None
        return rebuilds

    def current_build(self, default_id: str) -> str:
        """The id a fingerprint resolves to: its newest rebuild still in the store, else its own."""
        for build in reversed(self._rebuilds(default_id)):
            if self.exists(build["id"]):
                return build["id"]
        return default_id

    def next_build(self, default_id: str) -> str:
        n = len(self._rebuilds(default_id)) + 1
        stage = default_id.rsplit("-", 1)[0]
        return artifact_id(stage, hashlib.sha256(f"{default_id}:rebuild:{n}".encode()).hexdigest())

    def record_build(self, default_id: str, build_id: str, run_id: str) -> None:
        """Make build_id the current build of default_id's fingerprint (call with the lock held)."""
        rebuilds = self._rebuilds(default_id)
        if any(b["id"] == build_id for b in rebuilds):
            return
        rebuilds.append({"id": build_id, "run": run_id, "created": now_iso()})
        self.builds.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self._builds_file(default_id), {"default": default_id, "rebuilds": rebuilds})

    # ------------------------------------------------------------------ runs and pointers
    def write_run(self, run: dict) -> Path:
        self.runs.mkdir(parents=True, exist_ok=True)
        path = self.runs / f"{run['run']}.json"
        write_json_atomic(path, run)
        return path

    def read_run(self, run_id: str) -> dict:
        path = self.runs / f"{run_id}.json"
        if not re.match(r"^[A-Za-z0-9_.-]+$", run_id) or not path.is_file():
            raise UserInputError(f"no run {run_id!r} in {self.runs}")
        return json.loads(path.read_text(encoding="utf-8"))

    # A recipe's latest pointer is keyed by its name and its resolved file, latest/<name>@<h>.json
    # (h: sha256 of the path, 12 hex digits), so that two recipes with the same stem (or the same
    # `name:`) in different folders never share one: each keeps its own artifacts from gc. A
    # pointer written before the key had the path in it, latest/<name>.json, is still read for
    # the recipe file it records, and replaced by the keyed one on that recipe's next run.
    def _latest_file(self, recipe_name: str, recipe_path: str | Path) -> Path:
        key = hashlib.sha256(str(Path(recipe_path).resolve()).encode()).hexdigest()[:12]
        return self.latest_dir / f"{safe_name(recipe_name)}@{key}.json"

    def _read_pointer(self, path: Path) -> dict | None:
        try:
            pointer = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise IntegrityError(
                f"{path}: unreadable latest pointer ({exc}); the store writes it atomically, "
                "so it was edited by hand (delete it and run the recipe again)"
            ) from None
        if not isinstance(pointer, dict):
            raise IntegrityError(f"{path}: unreadable latest pointer (not a JSON object)")
        return pointer

    def _legacy_pointer(self, recipe_name: str, recipe_path: str | Path | None) -> dict | None:
        pointer = self._read_pointer(self.latest_dir / f"{safe_name(recipe_name)}.json")
        if pointer is None or recipe_path is None:
            return pointer
        recorded = pointer.get("recipe_file") or pointer.get("recipe_path")
        if recorded and Path(recorded).resolve() != Path(recipe_path).resolve():
            return None
        return pointer

    def latest(self, recipe_name: str, recipe_path: str | Path | None = None) -> dict | None:
        """What the latest run of the recipe file at recipe_path used; without a path, the most
        recently updated pointer of any recipe with that name."""
        if recipe_path is not None:
            return self._read_pointer(self._latest_file(recipe_name, recipe_path)) or self._legacy_pointer(
                recipe_name, recipe_path
            )
        found = (
            [
                p
                for p in (self._read_pointer(f) for f in self.latest_dir.glob(f"{safe_name(recipe_name)}@*.json"))
                if p is not None
            ]
            if self.latest_dir.is_dir()
            else []
        )
        legacy = self._legacy_pointer(recipe_name, None)
        found += [legacy] if legacy else []
        return max(found, key=lambda p: str(p.get("updated", ""))) if found else None

    def set_latest(self, recipe_name: str, pointer: dict, recipe_path: str | Path | None = None) -> None:
        recipe_path = recipe_path if recipe_path is not None else pointer.get("recipe_path")
        if recipe_path is None:
            raise PipelineError(f"latest pointer of {recipe_name}: no recipe file to key it by")
        self.latest_dir.mkdir(parents=True, exist_ok=True)
        pointer = {**pointer, "recipe_file": str(Path(recipe_path).resolve())}
        write_json_atomic(self._latest_file(recipe_name, recipe_path), pointer)
        legacy = self.latest_dir / f"{safe_name(recipe_name)}.json"
        if legacy.is_file() and self._legacy_pointer(recipe_name, recipe_path) is not None:
            legacy.unlink(missing_ok=True)

    def all_latest(self) -> list[dict]:
        if not self.latest_dir.is_dir():
            return []
        return [p for p in (self._read_pointer(f) for f in sorted(self.latest_dir.glob("*.json"))) if p is not None]

    # ------------------------------------------------------------------ listing and clean-up
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

    def collect_garbage(self, dry_run: bool = False, drop_checkpoints: bool = False, on_remove=None) -> "Garbage":
        """Remove the artifacts no recipe's latest run uses, quarantined folders and stale tmp/
        entries. Work folders hold an interrupted stage's resume checkpoints: removed only with
        `drop_checkpoints`, and never while a live process holds one. `on_remove(path, bytes)` is
        called per folder as it goes (or would go, with `dry_run`)."""
        with self.lock(), self.no_readers():
            keep = {node["id"] for pointer in self.all_latest() for node in pointer.get("nodes", {}).values()}
            doomed = [p for p in self.list_dirs() if p.name not in keep]
            work = list(self.work.iterdir()) if self.work.is_dir() else []
            busy = [p for p in work if p.is_dir() and work_dir_holder(p) is not None]
            kept_work = [p for p in work if p not in busy and not drop_checkpoints]
            extra = (list(self.quarantine.iterdir()) if self.quarantine.is_dir() else []) + [
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
                self.clean_tmp()
        return Garbage(
            removed=len(doomed),
            freed_bytes=freed,
            kept=len(keep),
            busy=busy,
            kept_checkpoints=kept_work,
            kept_checkpoint_bytes=sum(tree_bytes(p) for p in kept_work),
        )

    # ------------------------------------------------------------------ readers
    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Shared lock held while a command reads artifacts it did not build (translate,
        export-package): `artifacts gc` takes it exclusively, so it never deletes an artifact
        while one is being read. Readers never wait on `pipeline run`, only on a gc in progress.
        A store that does not exist has nothing to collect: no lock, and no folder made for one."""
        if not self.root.is_dir():
            yield
            return
        fd = os.open(self.root / "readers.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                print(f"waiting for `pipeline artifacts gc` to finish with {self.root}", file=sys.stderr)
                fcntl.flock(fd, fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def no_readers(self) -> Iterator[None]:
        """Exclusive side of `reading` (for gc): waits for readers to finish their reads."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / "readers.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(
                    f"waiting for commands reading {self.root} (translate, export-package) to finish loading",
                    file=sys.stderr,
                )
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ lock
    @contextlib.contextmanager
    def lock(self, wait: bool = False, on_wait=None, on_stale=None) -> Iterator[None]:
        """Exclusive lock on the store. flock dies with its process, so a crashed holder
        never blocks anyone; the pid file only tells the user who holds it."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / "lock"
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
                            f"artifact store {self.root} is in use by pid {holder.get('pid', '?')} "
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


def file_record(path: Path) -> dict:
    """{"bytes", "sha256"} of a file, as manifests and work folders' records list it."""
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


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


def _write_error(exc: OSError, artifact: str) -> PipelineError:
    if exc.errno == errno.ENOSPC:
        return PipelineError(
            f"disk full while writing artifact {artifact}; the store is unchanged "
            "(free some space, e.g. `pipeline artifacts gc`, and run again)"
        )
    return PipelineError(
        f"could not write artifact {artifact}: {exc.strerror or exc} ({exc.filename or ''}); the store is unchanged"
    )


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip(".") or "recipe"


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
