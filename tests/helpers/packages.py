"""A copy of a package to change, and a file in it rewritten with its digest re-signed in
package.json, as the package's author could (the `package` fixture is in tests/runtime/conftest.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

POSITIONS = 32  # the test model's position table: what generation.json's max_positions may reach


def _copy(package: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "pkg"
    shutil.copytree(package, copy)
    return copy


def _resign(folder: Path, rel: str, data: bytes) -> None:
    """Write `rel` and list its digest in package.json, as the package's author could."""
    (folder / rel).write_bytes(data)
    meta = json.loads((folder / "package.json").read_text())
    meta["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (folder / "package.json").write_text(json.dumps(meta))
