"""Forced rebuilds: builds/<stage>-<fingerprint16>.json records the rebuilds of one fingerprint.

`run --force` must not overwrite an artifact (a report, a comparison or another recipe may name
it), so a rebuild gets an id of its own: the n-th rebuild of a fingerprint is
<stage>-sha256("<default id>:rebuild:<n>")[:16]. n counts committed rebuilds only, so a rebuild
that crashed gets the same id, and its work folder, when forced again. Records are kept after gc,
so that an id never names two different contents.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

from ..errors import IntegrityError
from .commit import write_json_atomic
from .ids import ID_RE, artifact_id, check_id, now_iso


class Rebuilds:
    """The records under `builds`; `exists(id)` says whether the store still holds an artifact."""

    def __init__(self, builds: Path, exists: Callable[[str], bool]):
        self.builds, self.exists = builds, exists

    def _file(self, default_id: str) -> Path:
        return self.builds / f"{check_id(default_id)}.json"

    def _rebuilds(self, default_id: str) -> list[dict]:
        path = self._file(default_id)
        if not path.is_file():
            return []
        try:
            rebuilds = json.loads(path.read_text(encoding="utf-8"))["rebuilds"]
            if not all(ID_RE.match(b["id"]) for b in rebuilds):
                raise ValueError("an id that is not an artifact id")
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as exc:
            raise IntegrityError(
                f"{path}: unreadable record of rebuilds ({exc}); the store writes it "
                "atomically, so it was edited by hand"
            ) from None
        return rebuilds

    def current(self, default_id: str) -> str:
        """The id a fingerprint resolves to: its newest rebuild still in the store, else its own."""
        for build in reversed(self._rebuilds(default_id)):
            if self.exists(build["id"]):
                return build["id"]
        return default_id

    def next(self, default_id: str) -> str:
        """The id the fingerprint's next forced rebuild gets."""
        n = len(self._rebuilds(default_id)) + 1
        stage = default_id.rsplit("-", 1)[0]
        return artifact_id(stage, hashlib.sha256(f"{default_id}:rebuild:{n}".encode()).hexdigest())

    def record(self, default_id: str, build_id: str, run_id: str) -> None:
        """Make build_id the current build of default_id's fingerprint (call with the lock held)."""
        rebuilds = self._rebuilds(default_id)
        if any(b["id"] == build_id for b in rebuilds):
            return
        rebuilds.append({"id": build_id, "run": run_id, "created": now_iso()})
        self.builds.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self._file(default_id), {"default": default_id, "rebuilds": rebuilds})
