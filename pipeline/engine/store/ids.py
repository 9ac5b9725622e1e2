"""What names an artifact and what its manifest records: fingerprints over canonical JSON, the
id `<stage>-<fingerprint16>` they give, the tool versions a manifest lists, and `Artifact`, the
read-only handle stages get. Nothing here touches the disk but reading a package's version."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import IntegrityError, UserInputError

MANIFEST = "manifest.json"
FORMAT = 1
MAX_MANIFEST_BYTES = 16 << 20  # a manifest lists file names and digests: far below this
ID_RE = re.compile(r"^[a-z][a-z0-9_.]*-[0-9a-f]{16}$")
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


def check_id(artifact: str) -> str:
    """`artifact` if it is an artifact id (so it is safe as a folder name); else a one-line error."""
    if not ID_RE.match(artifact):
        raise UserInputError(f"not an artifact id: {artifact!r} (expected e.g. teacher-0123456789abcdef)")
    return artifact


def safe_name(name: str) -> str:
    """A recipe or run name as a file name: no path separator, no leading dot."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip(".") or "recipe"


def tool_versions() -> dict[str, str]:
    from importlib import metadata

    versions = {"python": sys.version.split()[0]}
    for name in _TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


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
