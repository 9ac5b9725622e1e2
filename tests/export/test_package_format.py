"""The package format has one source, mt_runtime/layout.py: docs/package-format.md (the contract for
other languages) shows its tables, the writer makes graphs with exactly its inputs and outputs, and
the reader refuses a format it does not know in one line (issue 51)."""

from __future__ import annotations

import json
import re
import shutil
import warnings

import onnx
import pytest
from mt_runtime import PackageError, Translator, __version__, layout

from tests.helpers import REPO, tiny_model
from tests.helpers.packages import build_packages

SPEC = REPO / "docs" / "package-format.md"
ONNX_TYPES = {"float": "float", "int64": "int64", "int32": "int32", "bool": "bool", "int8": "int8"}


def test_the_spec_shows_the_layouts_tables():
    text = SPEC.read_text(encoding="utf-8")
    assert text.splitlines()[0].endswith(f"(`{layout.FORMAT}`)")
    assert layout.generation_table() in text
    assert layout.graph_tables() in text
    # Each graph has its section, and no section the layout lacks.
    assert re.findall(r"^### `([^`]+)`$", text, re.M) == list(layout.GRAPH_FILES)
    files = re.search(r"^## Files\n\n(.*?)\n\n", text, re.S | re.M).group(1)
    listed = re.findall(r"^\| `([^`]+)` \|", files, re.M)
    made = {layout.PACKAGE_JSON, layout.GENERATION, layout.TOKENIZER, layout.MODEL_CARD, layout.SHORTLIST_FILE}
    assert sorted(listed) == sorted(made | set(layout.GRAPH_FILES))
    assert set(layout.REQUIRED) <= set(listed)


def test_format_versions_are_read_as_the_spec_says():
    assert layout.format_version("mt-onnx-package/2") == (2, 0)
    assert layout.format_version("mt-onnx-package/2.1") == (2, 1)
    for bad in (
        "mt-onnx-package/",
        "mt-onnx-package/two",
        "mt-onnx-package/2.x",
        "other/2",
        2,
        None,
        "mt-onnx-package/²",
    ):
        with pytest.raises(ValueError):
            layout.format_version(bad)


@pytest.fixture(scope="module")
def written(tmp_path_factory, data_dir):
    """A float32 package and an int8 one with a shortlist: between them every graph of the format."""
    folder = tmp_path_factory.mktemp("format")
    model, _, _, _ = tiny_model(data_dir, folder)
    out = build_packages(model, folder, {v: (v, folder / "shortlist.npz") for v in ("fp32", "int8_dynamic")})
    return model, out


def _io(path):
    graph = onnx.load(str(path), load_external_data=False).graph

    def describe(values):
        return {
            v.name: (
                onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name,
                [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim],
            )
            for v in values
        }

    return describe(graph.input), describe(graph.output)


def test_the_writer_makes_the_graphs_the_layout_describes(written):
    model, packages = written
    layers = model.cfg.decoder_layers
    seen = set()
    for variant, folder in packages.items():
        meta = json.loads((folder / layout.PACKAGE_JSON).read_text())
        assert meta["format"] == layout.FORMAT_WRITTEN and meta["runtime"].startswith(f"mt-runtime>={__version__[:3]}")
        shortlisted = variant.startswith("int8")
        for graph in layout.GRAPHS:
            if not (folder / graph.file).is_file():
                assert graph.made_for == "int8 packages with a shortlist" and not shortlisted, (variant, graph.file)
                continue
            seen.add(graph.file)
            assert graph.file in meta["files"]
            for declared, found in zip((graph.inputs, graph.outputs), _io(folder / graph.file)):
                expected = {}
                for tensor in declared:
                    if tensor.where and not shortlisted:
                        continue
                    for name in tensor.names(layers):
                        expected[name] = tensor
                assert sorted(found) == sorted(expected), (variant, graph.file)
                for name, (dtype, dims) in found.items():
                    tensor = expected[name]
                    assert dtype == {"float": "float32"}.get(tensor.dtype, tensor.dtype), (graph.file, name, dtype)
                    assert len(dims) == len(tensor.shape), (graph.file, name, dims)
                    for dim, declared_dim in zip(dims, tensor.shape):
                        if declared_dim.isdigit():
                            assert dim == int(declared_dim), (graph.file, name, dims)
    assert seen == set(layout.GRAPH_FILES)


def _with_format(source, dest, value):
    shutil.copytree(source, dest)
    meta = json.loads((dest / layout.PACKAGE_JSON).read_text())
    meta["format"] = value
    (dest / layout.PACKAGE_JSON).write_text(json.dumps(meta))
    return dest


def test_the_reader_refuses_a_newer_major_and_loads_version_one_with_a_warning(written, tmp_path):
    _, packages = written
    newer = _with_format(packages["fp32"], tmp_path / "v3", "mt-onnx-package/3")
    with pytest.raises(PackageError, match=r"format mt-onnx-package/3 is newer than mt-runtime .*: upgrade") as err:
        Translator(newer)
    assert "\n" not in str(err.value)
    for bad in ("mt-onnx-package/zero", 7):
        with pytest.raises(PackageError, match="is not mt-onnx-package/<major>"):
            Translator(_with_format(packages["fp32"], tmp_path / f"bad{bad}", bad))
    minor = Translator(_with_format(packages["fp32"], tmp_path / "v2.1", "mt-onnx-package/2.1"), threads=1)
    current = Translator(packages["fp32"], threads=1)
    text = ["A man is riding a bicycle.", "Two dogs play in the snow."]
    assert minor.translate(text, beam=2) == current.translate(text, beam=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = Translator(_with_format(packages["fp32"], tmp_path / "v1", "mt-onnx-package/1"), threads=1)
    assert any("mt-onnx-package/1" in str(w.message) and "re-export" in str(w.message) for w in caught)
    assert old.translate(text, beam=2) == current.translate(text, beam=2)


def test_a_package_of_format_2_0_without_the_in_place_greedy_graph_translates_the_same(written, tmp_path):
    """2.1 only adds decoder_greedy_inplace.onnx: a package without it (as 2.0 wrote them) loads,
    greedy batches go through decoder_greedy.onnx, and every sentence comes out the same."""
    _, packages = written
    for variant in ("fp32", "int8_dynamic"):
        old = _with_format(packages[variant], tmp_path / variant, "mt-onnx-package/2")
        meta = json.loads((old / layout.PACKAGE_JSON).read_text())
        del meta["files"][layout.DECODER_GREEDY_INPLACE]
        (old / layout.PACKAGE_JSON).write_text(json.dumps(meta))
        (old / layout.DECODER_GREEDY_INPLACE).unlink()
        before, now = Translator(old, threads=1), Translator(packages[variant], threads=1)
        assert before.decoder.inplace is None and now.decoder.inplace is not None
        text = ["A man is riding a bicycle.", "Two dogs play in the snow.", "A girl.", "People walk down a street."]
        for beam in (1, 2):
            assert before.translate(text, beam=beam) == now.translate(text, beam=beam), (variant, beam)
