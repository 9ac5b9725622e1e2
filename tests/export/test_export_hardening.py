"""`pipeline export-package` and the shipped graphs (issue 27): a store artifact whose digests
were rewritten to match is still refused by its graphs' check, and the real packages' graphs read
only their own files."""

from __future__ import annotations

import pytest
from mt_runtime.files import check_external_data, verify_package

from tests.helpers import cli
from tests.helpers.files import _one_error_line, _point_outside, _rehash, _store_with

pytestmark = pytest.mark.slow  # the exported fixture trains and exports the smoke student


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
