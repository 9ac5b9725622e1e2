"""The recipe's lock file, `<recipe>.lock` beside it (as dvc.lock is beside dvc.yaml): per node,
the artifact id, the digest of the code that built it, its inputs' ids and a digest of what it
holds. One line per node, in the recipe's order, so that a diff of two lock files (two commits,
two machines) shows which artifacts a change rebuilt, and whether the same id holds the same
bytes elsewhere (`content`: trainings on two kinds of CPU give the same ids, not always the
same weights).

`choices`: what a build chose by measuring the machine (a training's threads, precision,
attention kernel, fused Adam), recorded for its artifact id (`for`). A later build of the same id
with this lock beside its recipe is handed them (StageContext.recorded) instead of measuring
again, so that a busy machine cannot make another model under the same id. Remove the field (or
the line) to measure again."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .code_digest import combined


def lock_path(recipe_path: str | Path) -> Path:
    return Path(recipe_path).with_suffix(".lock")


# Files that record how a build went (minutes, tokens/s, timings, the notes written from them)
# rather than what it made: left out of `content`, so two builds of the same model compare equal.
RECORD_FILES = frozenset({"training.json", "scores.json", "package.json", "report.json"})
RECORD_SUFFIXES = (".md", ".png")


def content_digest(manifest: dict) -> str:
    """One digest of what an artifact holds (its files' manifest digests), records of the build
    left out (RECORD_FILES; the manifest itself says when and where)."""
    files = {
        path: entry
        for path, entry in (manifest.get("files") or {}).items()
        if Path(path).name not in RECORD_FILES and not path.endswith(RECORD_SUFFIXES)
    }
    return hashlib.sha256(
        "".join(f"{path} {entry['sha256']}\n" for path, entry in sorted(files.items())).encode()
    ).hexdigest()[:16]


def render(recipe_path: str | Path, order: list[str], nodes: dict[str, dict], kept: dict | None = None) -> str:
    """The lock's text: a row per node of `nodes` (the store's latest pointer), in `order`; a
    node this store has not built yet keeps its row from `kept` (the lock as it was), so that a
    run in a fresh store, or one stopped early, does not lose what another build recorded."""
    kept = kept or {}
    lines = [
        f"# {lock_path(recipe_path).name}: written by `pipeline run {Path(recipe_path).name}`, what each",
        "# artifact was built from; commit it to see in a diff what a change rebuilt.",
    ]
    for name in [n for n in order if n in nodes or n in kept]:
        if name not in nodes:
            lines.append(f"{name}: {json.dumps(kept[name], sort_keys=False, separators=(', ', ': '))}")
            continue
        entry = nodes[name]
        row = {
            "id": entry["id"],
            "code": combined(entry.get("code") or {}),
            "content": entry.get("content"),
            "inputs": entry.get("input_ids") or {},
        }
        if entry.get("choices"):
            row["choices"] = entry["choices"]
        lines.append(f"{name}: {json.dumps(row, sort_keys=False, separators=(', ', ': '))}")
    return "\n".join(lines) + "\n"


def write_lock(recipe_path: str | Path, order: list[str], nodes: dict[str, dict]) -> str | None:
    """Write the lock file atomically; the reason instead where the recipe's folder is read-only."""
    path = lock_path(recipe_path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(render(recipe_path, order, nodes, read_lock(recipe_path)), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        return f"lock file {path} not written: {exc.strerror or exc}"
    return None


def read_lock(recipe_path: str | Path) -> dict[str, dict]:
    """The lock file's rows by node name ({} where there is none; a line that does not parse is
    skipped: the lock is a record, never an input whose damage should stop a run)."""
    try:
        text = lock_path(recipe_path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    rows = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(": ")
        if not sep or line.startswith("#"):
            continue
        try:
            row = json.loads(rest)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows[name] = row
    return rows


def recorded_choices(rows: dict[str, dict], name: str, default_id: str) -> dict | None:
    """The choices the lock recorded for node `name`, where they were made for this artifact id."""
    choices = (rows.get(name) or {}).get("choices")
    return choices if isinstance(choices, dict) and choices.get("for") == default_id else None
