"""Files from other people: a private folder to point links at, a store holding a copy of an
artifact, a manifest or package.json rewritten to list a changed file, a graph whose weights name
a file outside its package."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import onnx

from pipeline.engine.store import Store


def _private(tmp_path: Path) -> Path:
    private = tmp_path / "private"
    private.mkdir()
    (private / "id_rsa").write_text("PRIVATE KEY\n")
    return private


def _one_error_line(proc, code: int = 1) -> str:
    err = proc.stderr.decode()
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == code, err
    assert "Traceback" not in err and lines and lines[0].startswith("error: "), err
    return err


def _store_with(tmp_path: Path, art) -> tuple[Store, Path]:
    """A store of its own holding a copy of the artifact (the session's store stays untouched)."""
    store = Store(tmp_path / "store")
    copy = store.objects / art.id
    shutil.copytree(art.path, copy)
    return store, copy


def _rehash(folder: Path, rel: str, index: str) -> None:
    """Rewrite `index` (manifest.json or package.json, in `folder`) so that it lists rel's new digest,
    as someone handing out a modified folder would."""
    meta = json.loads((folder / index).read_text())
    data = (folder / rel).read_bytes()
    meta["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (folder / index).write_text(json.dumps(meta))


def _point_outside(graph: Path, location: str, subgraph: bool = False) -> None:
    """Make one initializer of `graph` (or of its BeamSearch encoder subgraph) external data at `location`."""
    model = onnx.load(str(graph), load_external_data=False)
    target = model.graph
    if subgraph:
        node = next(n for n in model.graph.node if n.op_type == "BeamSearch")
        target = next(a.g for a in node.attribute if a.name == "encoder")
    tensor = (
        next(t for t in target.initializer if t.data_location != onnx.TensorProto.EXTERNAL and t.raw_data)
        if not subgraph
        else next(t for t in target.initializer if t.external_data)
    )
    size = (
        len(tensor.raw_data)
        if tensor.raw_data
        else int(next(e.value for e in tensor.external_data if e.key == "length"))
    )
    del tensor.external_data[:]
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(size))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    graph.write_bytes(model.SerializeToString())
