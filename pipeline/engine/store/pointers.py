"""What runs used: runs/<run-id>.json, one log per `pipeline run`, and latest/, one pointer per
recipe file to the artifacts its latest run used (what gc keeps).

A recipe's latest pointer is keyed by its name and its resolved file, latest/<name>@<h>.json (h:
sha256 of the path, 12 hex digits), so that two recipes with the same stem (or the same `name:`)
in different folders never share one: each keeps its own artifacts from gc. A pointer written
before the key had the path in it, latest/<name>.json (legacy), is still read for the recipe file
it records, and replaced by the keyed one on that recipe's next run.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from ..errors import IntegrityError, PipelineError, UserInputError
from .commit import write_json_atomic
from .ids import safe_name


class Runs:
    """Run logs under `runs`."""

    def __init__(self, runs: Path):
        self.runs = runs

    def write(self, run: dict) -> Path:
        self.runs.mkdir(parents=True, exist_ok=True)
        path = self.runs / f"{run['run']}.json"
        write_json_atomic(path, run)
        return path

    def read(self, run_id: str) -> dict:
        path = self.runs / f"{run_id}.json"
        if not re.match(r"^[A-Za-z0-9_.-]+$", run_id) or not path.is_file():
            raise UserInputError(f"no run {run_id!r} in {self.runs}")
        return json.loads(path.read_text(encoding="utf-8"))


class Pointers:
    """Latest pointers under `latest_dir`."""

    def __init__(self, latest_dir: Path):
        self.latest_dir = latest_dir

    def _file(self, recipe_name: str, recipe_path: str | Path) -> Path:
        key = hashlib.sha256(str(Path(recipe_path).resolve()).encode()).hexdigest()[:12]
        return self.latest_dir / f"{safe_name(recipe_name)}@{key}.json"

    def _read(self, path: Path) -> dict | None:
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

    def _legacy(self, recipe_name: str, recipe_path: str | Path | None) -> dict | None:
        """The unkeyed pointer of the recipe, if it records that file (or any, without a path)."""
        pointer = self._read(self.latest_dir / f"{safe_name(recipe_name)}.json")
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
            return self._read(self._file(recipe_name, recipe_path)) or self._legacy(recipe_name, recipe_path)
        found = (
            [
                p
                for p in (self._read(f) for f in self.latest_dir.glob(f"{safe_name(recipe_name)}@*.json"))
                if p is not None
            ]
            if self.latest_dir.is_dir()
            else []
        )
        legacy = self._legacy(recipe_name, None)
        found += [legacy] if legacy else []
        return max(found, key=lambda p: str(p.get("updated", ""))) if found else None

    def set_latest(self, recipe_name: str, pointer: dict, recipe_path: str | Path | None = None) -> None:
        recipe_path = recipe_path if recipe_path is not None else pointer.get("recipe_path")
        if recipe_path is None:
            raise PipelineError(f"latest pointer of {recipe_name}: no recipe file to key it by")
        self.latest_dir.mkdir(parents=True, exist_ok=True)
        pointer = {**pointer, "recipe_file": str(Path(recipe_path).resolve())}
        write_json_atomic(self._file(recipe_name, recipe_path), pointer)
        legacy = self.latest_dir / f"{safe_name(recipe_name)}.json"
        if legacy.is_file() and self._legacy(recipe_name, recipe_path) is not None:
            legacy.unlink(missing_ok=True)

    def all_latest(self) -> list[dict]:
        """Every recipe's pointer, keyed and legacy alike."""
        if not self.latest_dir.is_dir():
            return []
        return [p for p in (self._read(f) for f in sorted(self.latest_dir.glob("*.json"))) if p is not None]
