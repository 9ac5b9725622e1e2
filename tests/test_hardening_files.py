"""Hardening, second round (issue 27), files from other people: artifacts and packages hold
regular files only, `artifacts verify PATH` checks that folder against the digests the store
holds, and no ONNX graph may read external data from outside its package."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import onnx
import pytest
from mt_runtime.files import (
    PackageError,
    UnsafeFile,
    check_external_data,
    external_data_locations,
    member_problem,
    read_bounded,
    verify_package,
)

from pipeline.engine.store import Store

from .conftest import cli


@pytest.fixture(scope="module")
def exported(smoke):
    _, arts = smoke.build("export", "prune=null")
    return arts["export.student"]


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


# ---------------------------------------------------------------------- 1. regular files only
@pytest.mark.parametrize("what", ["folder_link", "file_link", "fifo"])
def test_artifact_with_a_link_or_fifo_fails_verify_and_export_copies_nothing(exported, tmp_path, what):
    private = _private(tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(exported.path, copy)
    if what == "folder_link":
        (copy / "fp32" / "keys").symlink_to(private)
    elif what == "file_link":
        (copy / "fp32" / "notes.txt").symlink_to(private / "id_rsa")
    else:
        os.mkfifo(copy / "fp32" / "pipe")
    empty = tmp_path / "no-store"
    verify = cli("artifacts", "verify", str(copy), store=empty, timeout=60)
    assert verify.returncode == 1, verify.stderr.decode()
    assert ("a symbolic link" if what != "fifo" else "a fifo") in verify.stderr.decode()
    dest = tmp_path / "dest"
    err = _one_error_line(cli("export-package", str(copy), str(dest), store=empty, timeout=60))
    assert "failed verification" in err and ("symbolic link" in err or "fifo" in err)
    assert not dest.exists()
    # The same inside a store: its own verify and `run` reuse refuse it too.
    store, inside = _store_with(tmp_path, exported)
    (inside / "fp16" / "keys").symlink_to(private)
    assert any("symbolic link" in p for p in store.verify(exported.id))


def test_package_with_a_link_is_refused_by_the_runtime(exported, tmp_path):
    private = _private(tmp_path)
    package = tmp_path / "pkg"
    shutil.copytree(exported.path / "fp32", package)
    (package / "extra").mkdir()
    (package / "extra" / "keys").symlink_to(private)
    with pytest.raises(PackageError, match="symbolic link"):
        verify_package(package)


def test_the_rule_refuses_every_way_out(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "ok.bin").write_bytes(b"x")
    (tmp_path / "outside.txt").write_text("secret")
    (root / "link").symlink_to(tmp_path / "outside.txt")
    (root / "dirlink").symlink_to(root / "sub")
    os.mkfifo(root / "fifo")
    assert member_problem(root, "sub/ok.bin") is None
    for rel, why in [
        ("../outside.txt", ".."),
        ("/etc/passwd", "absolute"),
        ("link", "symbolic link"),
        ("dirlink/ok.bin", "symbolic link"),
        ("fifo", "fifo"),
        ("sub", "folder"),
        ("sub//ok.bin", "empty part"),
        ("nothere", "missing"),
        ("a\\b", "backslash"),
    ]:
        problem = member_problem(root, rel)
        assert problem and why in problem, (rel, problem)
    with pytest.raises(UnsafeFile, match="fifo"):
        read_bounded(root / "fifo", 10)  # refused without blocking on the fifo
    with pytest.raises(UnsafeFile, match="character device"):
        read_bounded("/dev/zero", 10)


# --------------------------------------------------------------- 2. verify PATH checks PATH
def test_verify_path_checks_that_folder_against_the_stores_digests(exported, tmp_path):
    store, _ = _store_with(tmp_path, exported)
    copy = tmp_path / "copy"
    shutil.copytree(exported.path, copy)
    weights = copy / "fp32" / "decoder.onnx"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    # The copy's own manifest already catches it (the store's copy, untouched, is not what is checked).
    proc = cli("artifacts", "verify", str(copy), store=store.root, timeout=60)
    assert proc.returncode == 1 and "decoder.onnx: content changed" in proc.stderr.decode()
    # A copy whose manifest was rewritten to match fails against the digests the store holds ...
    _rehash(copy, "fp32/decoder.onnx", "manifest.json")
    proc = cli("artifacts", "verify", str(copy), store=store.root, timeout=60)
    err = proc.stderr.decode()
    assert proc.returncode == 1 and "differs from the store's copy" in err and "0 ok, 1 failed" in err
    # ... and with no copy in the store it passes on its own manifest, saying so.
    proc = cli("artifacts", "verify", str(copy), store=tmp_path / "empty", timeout=60)
    err = proc.stderr.decode()
    assert proc.returncode == 0 and "own manifest only" in err
    # translate refuses the rewritten copy too (it holds no model at the top: the store check comes first).
    proc = cli("translate", "--model", str(copy), store=store.root, input=b"hi\n", timeout=60)
    assert "differs from the store's copy" in _one_error_line(proc)


def test_verify_path_with_an_unreadable_manifest_is_one_line(tmp_path):
    folder = tmp_path / "art"
    folder.mkdir()
    (folder / "manifest.json").write_text("{not json")
    err = _one_error_line(cli("artifacts", "verify", str(folder), store=tmp_path / "s", timeout=60))
    assert "unreadable manifest" in err


# ------------------------------------------------------------------ 3. external data locations
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


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink", "subgraph"])
def test_a_graph_naming_a_file_outside_its_package_is_refused_before_onnxruntime(exported, tmp_path, how):
    from mt_runtime.translator import Translator

    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"s" * 100_000)
    package = tmp_path / "pkg"
    shutil.copytree(exported.path / "fp32", package)
    graph, location = package / "encoder.onnx", "../secret.txt"
    if how == "absolute":
        location = str(secret)
    elif how == "symlink":
        (package / "weights.bin").symlink_to(secret)
        location = "weights.bin"
    elif how == "subgraph":
        graph = package / "generate.onnx"
    _point_outside(graph, location, subgraph=how == "subgraph")
    assert location in external_data_locations(graph.read_bytes())
    _rehash(package, graph.name, "package.json")
    with pytest.raises(UnsafeFile, match="external data"):
        check_external_data(graph)
    with pytest.raises(PackageError, match="external data|symbolic link"):
        Translator(package)
    proc = cli("translate", "--model", str(package), input=b"A dog.\n", timeout=60)
    err = _one_error_line(proc)
    assert "external data" in err or "symbolic link" in err


def test_export_package_checks_the_graphs_of_a_rewritten_store_artifact(exported, tmp_path):
    store, inside = _store_with(tmp_path, exported)
    (tmp_path / "secret.txt").write_bytes(b"s" * 100_000)
    _point_outside(inside / "fp32" / "encoder.onnx", "../../../../secret.txt")
    _rehash(inside / "fp32", "encoder.onnx", "package.json")
    _rehash(inside, "fp32/encoder.onnx", "manifest.json")
    _rehash(inside, "fp32/package.json", "manifest.json")
    assert store.verify(exported.id) == []  # every digest matches: only the graph check can tell
    dest = tmp_path / "dest"
    err = _one_error_line(
        cli("export-package", exported.id, str(dest), "--package", "fp32", store=store.root, timeout=60)
    )
    assert "external data" in err and not dest.exists()


def test_shipped_graphs_read_only_their_own_files(exported, tmp_path):
    """The real packages pass: the int8-style shared bytes and generate.onnx's subgraphs point at
    files inside the package, found in every subgraph (as onnx itself sees them)."""
    dest = tmp_path / "out"
    proc = cli("export-package", str(exported.path), str(dest), store=tmp_path / "s", timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    meta = verify_package(dest / "fp32")
    assert "generate.onnx" in meta["files"]
    assert set(check_external_data(dest / "fp32" / "generate.onnx")) == {"encoder.onnx", "decoder.onnx"}
