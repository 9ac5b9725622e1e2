"""Packages of a test model built side by side; a copy of a package to change, and a file in it
rewritten with its digest re-signed in package.json, as the package's author could (the `package`
fixture is in tests/runtime/conftest.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

POSITIONS = 32  # the test model's position table: what generation.json's max_positions may reach


def build_packages(model, folder: Path, wanted: dict, calibration: list[list[int]] | None = None) -> dict:
    """One package of `model` per key of `wanted`, whose value is (variant, shortlist.npz or None),
    in folder/<the key, or its parts joined by '-'>, with folder/tokenizer.json; the key -> its folder."""
    from pipeline.export.package_builder import build_package  # torch and onnx: only where building

    built = {}
    for key, (variant, shortlist) in wanted.items():
        name = "-".join(map(str, key)) if isinstance(key, tuple) else str(key)
        built[key] = folder / name
        build_package(
            model,
            variant,
            built[key],
            tokenizer=folder / "tokenizer.json",
            work=folder / "work" / name,
            calibration=calibration,
            shortlist=shortlist,
        )
    return built


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


def streamed_shortlist(path: Path, vocab: int, offsets, words_dtype: str, words: int, compresslevel: int) -> None:
    """A shortlist.npz written member by member, its `words` member `words` zero ids of
    `words_dtype` streamed in 4 MiB blocks: a file far smaller than what it inflates to."""
    import zipfile

    import numpy as np

    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=compresslevel) as z:
        for name, array in (("vocab_size", np.array(vocab, np.int64)), ("always", np.arange(4)), ("offsets", offsets)):
            with z.open(f"{name}.npy", "w") as f:
                np.lib.format.write_array(f, array)
        with z.open("words.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array_header_1_0(f, {"descr": words_dtype, "fortran_order": False, "shape": (words,)})
            for _ in range(words * np.dtype(words_dtype).itemsize >> 22):
                f.write(bytes(1 << 22))
