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

from .errors import IntegrityError, PipelineError, StoreLockedError, UserInputError

MANIFEST = "manifest.json"
FORMAT = 1
_ID_RE = re.compile(r"^[a-z][a-z0-9_.]*-[0-9a-f]{16}$")
_TRACKED_PACKAGES = ("torch", "onnx", "onnxruntime", "onnxruntime-gpu", "tokenizers", "sacrebleu",
                     "numpy", "safetensors", "ctranslate2")


def default_root() -> Path:
    return Path(os.environ.get("PIPELINE_ARTIFACTS", "artifacts"))


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def fingerprint(stage: str, code_version: int, config: Any, input_fingerprints: dict[str, str]) -> str:
    payload = canonical_json({"stage": stage, "version": code_version, "config": config,
                              "inputs": input_fingerprints})
    return hashlib.sha256(payload.encode()).hexdigest()


def artifact_id(stage: str, fp: str) -> str:
    return f"{stage}-{fp[:16]}"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


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
            manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
            return Artifact(manifest.get("id", path.name), path, manifest)
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
            for path in sorted(p for p in tmp.rglob("*") if p.is_file() or p.is_symlink()):
                if path.is_symlink():
                    raise PipelineError(f"stage wrote a symbolic link {path.name}; artifacts hold plain files")
                rel = path.relative_to(tmp).as_posix()
                if rel == MANIFEST:
                    raise PipelineError("a stage may not write manifest.json itself")
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
                files[rel] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
            manifest = {**manifest, "format": FORMAT, "id": artifact, "files": files,
                        "bytes": sum(f["bytes"] for f in files.values())}
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
        """Scratch space kept across crashes (checkpoints), removed once the artifact is complete."""
        path = self.work / self._check_id(artifact)
        path.mkdir(parents=True, exist_ok=True)
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
            raise IntegrityError(f"{path}: unreadable record of rebuilds ({exc}); the store writes it "
                                 "atomically, so it was edited by hand") from None
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

    def latest(self, recipe_name: str) -> dict | None:
        path = self.latest_dir / f"{safe_name(recipe_name)}.json"
        if not path.is_file():
            return None
        return json.loads(path.read_text(encoding="utf-8"))

    def set_latest(self, recipe_name: str, pointer: dict) -> None:
        self.latest_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.latest_dir / f"{safe_name(recipe_name)}.json", pointer)

    def all_latest(self) -> list[dict]:
        if not self.latest_dir.is_dir():
            return []
        return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(self.latest_dir.glob("*.json"))]

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
                            "wait for it to finish or pass --wait") from None
                    if not told and on_wait:
                        on_wait(holder)
                        told = True
                    time.sleep(0.5)
            previous = _read_holder(path)
            if previous.get("pid") and previous.get("pid") != os.getpid() and not _pid_alive(previous["pid"]):
                if on_stale:
                    on_stale(previous)
            info = {"pid": os.getpid(), "host": socket.gethostname(), "since": now_iso(),
                    "command": " ".join(Path(sys.argv[0]).name.split() + sys.argv[1:])[:200]}
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


def verify_folder(path: Path, manifest: dict) -> list[str]:
    problems = []
    files = manifest.get("files")
    if not isinstance(files, dict):
        return [f"{path / MANIFEST}: no file list"]
    root = path.resolve()
    for rel, meta in sorted(files.items()):
        target = (path / rel)
        if Path(rel).is_absolute() or ".." in Path(rel).parts or not target.resolve().is_relative_to(root):
            problems.append(f"{path}: manifest names a file outside the artifact: {rel!r}")
            continue
        if not target.is_file():
            problems.append(f"{target}: missing")
            continue
        size = target.stat().st_size
        if size != meta.get("bytes"):
            problems.append(f"{target}: size {size} bytes, manifest says {meta.get('bytes')}")
            continue
        if sha256_file(target) != meta.get("sha256"):
            problems.append(f"{target}: content changed (sha256 differs from manifest)")
    listed = set(files) | {MANIFEST}
    for extra in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = extra.relative_to(path).as_posix()
        if rel not in listed:
            problems.append(f"{extra}: not in the manifest")
    return problems


def _write_error(exc: OSError, artifact: str) -> PipelineError:
    if exc.errno == errno.ENOSPC:
        return PipelineError(f"disk full while writing artifact {artifact}; the store is unchanged "
                             "(free some space, e.g. `pipeline artifacts gc`, and run again)")
    return PipelineError(f"could not write artifact {artifact}: {exc.strerror or exc} "
                         f"({exc.filename or ''}); the store is unchanged")


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
