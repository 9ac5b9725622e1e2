"""The one path from a PyTorch model to a package (pipeline/export/float_graphs.py, package_builder.py), figures written
into a finished package, and the interleaved timer every in-process comparison uses."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import shutil
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from mt_runtime.search import beam_search, greedy_search
from mt_runtime.translator import Translator

from model.onnx_passes.top_k import chunked_top_k
from model.subword_training import train_subword
from model.torch_decoder import TorchDecoder
from model.transformer import Transformer, TransformerConfig
from pipeline.export.float_graphs import float32_graphs, variant_graphs
from pipeline.export.package_builder import build_package
from pipeline.export.packages import set_figures
from pipeline.measure.timing import interleaved
from tests.helpers import multi30k_head, one_layer_config


@pytest.fixture(scope="module")
def built(tmp_path_factory, data_dir):
    folder = tmp_path_factory.mktemp("build")
    en, fr = multi30k_head(data_dir, "en"), multi30k_head(data_dir, "fr")
    tokenizer = train_subword(en[:300] + fr[:300], vocab_size=200)
    tokenizer.save(folder / "tokenizer.json")
    torch.manual_seed(3)
    cfg = TransformerConfig(
        vocab_size=tokenizer.vocab_size,
        d_model=32,
        head_dim=8,
        enc_heads=[4, 2],
        dec_self_heads=[2, 1],
        dec_cross_heads=[4, 4],
        enc_ffn=[64, 48],
        dec_ffn=[48, 64],
        max_positions=64,
        dropout=0.0,
    )
    model = Transformer(cfg).eval()
    with torch.no_grad():  # sharper outputs than the init gives: fewer near-ties between runtimes
        for p in model.parameters():
            p.mul_(1.5)
    packages = {p: folder / p for p in ("fp32", "fp16", "int8_dynamic")}
    for precision, dest in packages.items():
        build_package(model, precision, dest, tokenizer=folder / "tokenizer.json", work=folder / "work" / precision)
    return model, tokenizer, packages, en[:12]


def test_fp32_package_decodes_as_pytorch_does(built, tmp_path):
    model, tokenizer, packages, sentences = built
    translator = Translator(packages["fp32"], threads=1)  # verifies every file's digest
    sources = [ids + [model.cfg.eos_id] for ids in tokenizer.encode(sentences)]
    gen = dataclasses.replace(translator.generation, beam=1)
    assert translator.search == "graph"
    assert greedy_search(translator.decoder, sources, gen) == greedy_search(TorchDecoder(model), sources, gen)
    assert translator.graph_search(sources, gen) == greedy_search(TorchDecoder(model), sources, gen)
    # Several sentences at once: the search loop over decoder_batch.onnx (top k in the graph,
    # finished sentences dropped) gives what PyTorch gives, greedy and beam.
    assert translator.batch_search == "python" and translator.decoder.many_rows is not None
    # Greedy steps run decoder_greedy_inplace.onnx (the cache written in place, rows of ended
    # sentences gathered in NumPy): decoder_greedy.onnx is not even opened, and decoder.onnx is let
    # go until something runs it (each session holds a copy of the weights).
    decoder = translator.decoder
    assert decoder.greedy is None and not decoder.decoder.opened
    counts = _counted(decoder, sources, gen, translator.searcher, TorchDecoder(model))
    assert counts["inplace"] > 0 and counts["batch"] == counts["greedy"] == 0, counts
    assert not decoder.decoder.opened
    # A package without it (format 2.0): decoder_greedy.onnx, and decoder_batch.onnx to reorder
    # after a sentence has ended.
    older = Translator(_without_inplace(packages["fp32"], tmp_path / "older"), threads=1)
    assert older.decoder.inplace is None and older.decoder.greedy is not None
    counts = _counted(older.decoder, sources, gen, older.searcher, TorchDecoder(model))
    assert counts["greedy"] > 0 and counts["batch"] > 0, counts
    beam = dataclasses.replace(gen, beam=4)
    assert translator.searcher(sources, beam) == beam_search(TorchDecoder(model), sources, beam)


def _ops_after_loading(path, tmp_path) -> list[str]:
    """The op types of `path` as onnxruntime runs it on the CPU (its optimized graph, If and
    BeamSearch subgraphs included)."""
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / f"optimized_{path.name}")
    options.log_severity_level = 3
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def walk(graph):
        for node in graph.node:
            yield node.op_type
            for attribute in node.attribute:
                for sub in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs:
                    yield from walk(sub)

    return list(walk(onnx.load(options.optimized_model_filepath, load_external_data=False).graph))


def test_every_graph_runs_residual_norms_unfused(built, tmp_path):
    """onnxruntime fuses Add + LayerNormalization into SkipLayerNormalization on the CPU, whose
    kernel is several times slower past one row and rounds differently from the standard ops
    (model/onnx_passes/edit.py): every CPU graph, one row or many, keeps the residual norms apart as
    Sum (which it does not fuse), so that a sentence's numbers are the same alone and in a batch."""
    _, _, packages, _ = built
    for precision in ("fp32", "int8_dynamic"):
        folder = packages[precision]
        for name in ("decoder.onnx", "decoder_batch.onnx", "decoder_greedy.onnx", "decoder_greedy_inplace.onnx"):
            ops = _ops_after_loading(folder / name, tmp_path)
            assert "SkipLayerNormalization" not in ops and ops.count("Sum") == ops.count("LayerNormalization"), (
                precision,
                name,
            )
    graph = onnx.load(packages["int8_dynamic"] / "decoder_greedy.onnx", load_external_data=False).graph
    producer = {out: node.op_type for node in graph.node for out in node.output}
    assert {producer[node.input[0]] for node in graph.node if node.op_type == "LayerNormalization"} == {"Sum"}


@pytest.mark.parametrize("k", [1, 8, 300])
def test_chunked_top_k_is_top_k(k):
    """decoder_batch.onnx's top k over chunk maxima (model/onnx_passes/top_k.py) against a full sort,
    with k beyond the number of chunks too (300 > 125)."""
    nodes = chunked_top_k("x", 8000, "p")
    graph = onnx.helper.make_graph(
        nodes,
        "g",
        [
            onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["rows", 8000]),
            onnx.helper.make_tensor_value_info("top_k", onnx.TensorProto.INT64, [1]),
        ],
        [
            onnx.helper.make_tensor_value_info("p/values", onnx.TensorProto.FLOAT, None),
            onnx.helper.make_tensor_value_info("p/ids", onnx.TensorProto.INT64, None),
        ],
    )
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(k).standard_normal((5, 8000)).astype(np.float32)
    x[0, 7990:] += 10  # a row's best all in one chunk
    values, ids = session.run(None, {"x": x, "top_k": np.array([k], np.int64)})
    order = np.argsort(-x, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(ids, order)
    np.testing.assert_array_equal(values, np.take_along_axis(x, order, 1))


def test_each_precision_is_what_its_name_says(built):
    _, _, packages, sentences = built
    meta = {p: json.loads((folder / "package.json").read_text()) for p, folder in packages.items()}
    assert {p: m["variant"] for p, m in meta.items()} == {p: p for p in packages}
    # The weights' graphs; the search graphs are structure (at d_model 32, a third of the bytes), and
    # so is each int8 product's row quantizer (eight nodes) and a float scale per column of 32.
    weights = {p: sum(m["files"][g]["bytes"] for g in ("encoder.onnx", "decoder.onnx")) for p, m in meta.items()}
    assert weights["int8_dynamic"] < 0.5 * weights["fp32"]
    assert meta["int8_dynamic"]["onnx_bytes"] < 0.7 * meta["fp32"]["onnx_bytes"]

    def op_types(folder, graph):
        return {n.op_type for n in onnx.load(str(folder / graph), load_external_data=False).graph.node}

    assert "MatMulIntegerToFloat" in op_types(packages["int8_dynamic"], "decoder.onnx")
    assert "MatMulIntegerToFloat" not in op_types(packages["fp32"], "decoder.onnx")
    fp16 = onnx.load(str(packages["fp16"] / "decoder.onnx"))
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in fp16.graph.initializer)
    # The fp32 graphs compute the position table; the fp16 ones keep it as a table (in float16 the
    # formula's angles would lose their precision), whichever precision was built first.
    assert "Sin" in op_types(packages["fp32"], "decoder.onnx")
    assert "Sin" not in op_types(packages["fp16"], "decoder.onnx")
    for precision in packages:
        assert len(Translator(packages[precision], threads=1).translate(sentences[:2], beam=2)) == 2


def test_variant_graphs_leave_the_float32_graphs_as_they_were(tmp_path):
    torch.manual_seed(0)
    model = Transformer(one_layer_config(50, head_dim=8, max_positions=32)).eval()
    graphs, done = float32_graphs(model, tmp_path)
    assert done["tied_embedding"]

    def digests():
        return {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in graphs.items()}

    before = digests()
    fp32, fp32_done = variant_graphs(graphs, "fp32", tmp_path, model.cfg.d_model)
    assert fp32_done["positions_as_formula"] == {"encoder": True, "decoder": True}
    variant_graphs(graphs, "fp16", tmp_path, model.cfg.d_model)
    assert digests() == before
    assert all(path.parent == tmp_path / "fp32" for path in fp32.values())
    with pytest.raises(ValueError, match="unknown float precision 'int8_dynamic'"):
        variant_graphs(graphs, "int8_dynamic", tmp_path, model.cfg.d_model)
    with pytest.raises(ValueError, match="unknown precision 'int4'"):
        build_package(model, "int4", tmp_path / "p", tokenizer=tmp_path / "t.json", work=tmp_path)


def test_set_figures_changes_the_card_and_manifest_only(built, tmp_path):
    _, _, packages, sentences = built
    folder = tmp_path / "pkg"
    shutil.copytree(packages["fp32"], folder)
    before = json.loads((folder / "package.json").read_text())
    after = set_figures(folder, {"validation BLEU": "12.34"})
    assert after["figures"] == {"validation BLEU": "12.34"}
    assert "- validation BLEU: 12.34" in (folder / "MODEL_CARD.md").read_text()
    changed = {f for f in before["files"] if before["files"][f] != after["files"][f]}
    assert changed == {"MODEL_CARD.md"}
    assert {k: v for k, v in after.items() if k not in ("files", "figures", "created")} == {
        k: v for k, v in before.items() if k not in ("files", "figures", "created")
    }
    assert len(Translator(folder, threads=1).translate(sentences[:1])) == 1  # digests still verify


def test_interleaved_alternates_warms_up_and_times_only_the_call():
    calls: list[str] = []

    def contestant(name, cost):
        def run(item):
            calls.append(f"{name}{item}")
            time.sleep(cost)
            return item * 10

        return run

    slept = []
    timed = interleaved(
        {"a": contestant("a", 0.0), "b": contestant("b", 0.02)},
        [1, 2, 3],
        repeats=2,
        warmup=1,
        prepare={"a": lambda item: (slept.append(item), time.sleep(0.03))},
    )
    # Warm-up on the first item each, then turn about with the order alternating per item and per repeat.
    assert calls == ["a1", "b1", "a1", "b1", "b2", "a2", "a3", "b3", "b1", "a1", "a2", "b2", "b3", "a3"]
    assert slept == [1, 1, 2, 3, 1, 2, 3]
    assert timed.outputs == {"a": [10, 20, 30], "b": [10, 20, 30]}  # the first repeat's
    assert len(timed.seconds["a"]) == 2
    assert timed.median_s("a") < 0.02 <= timed.median_s("b")  # prepare's 30 ms are not timed
    assert timed.ratio("a", "b") < 0.5


def test_onnxruntime_fuses_no_residual_norm_of_an_int8_package(tmp_path, built):
    """Every residual norm is Sum + LayerNormalization, which onnxruntime leaves as it is. Where
    an int8 encoder kept an Add + LayerNormalization, onnxruntime fused it into
    SkipLayerNormalization in encoder.onnx's own session but not in the search op's copy of the
    encoder (shapes it could not infer there): a sentence's encoder numbers then depended on the
    graph that ran it (a factorised student: 1 of 1000 beam-4 sentences translated differently
    alone than in a batch). Fails with the encoder's residuals as Add (checked)."""
    _, tokenizer, packages, sentences = built
    torch.manual_seed(0)
    cfg = one_layer_config(tokenizer.vocab_size, head_dim=8, embed_dim=8, max_positions=64, dropout=0.0)
    calibration = [ids + [tokenizer.eos_id] for ids in tokenizer.encode(sentences)]
    package = tmp_path / "int8_static"
    build_package(
        Transformer(cfg).eval(),
        "int8_static",
        package,
        tokenizer=packages["fp32"].parent / "tokenizer.json",
        work=tmp_path / "work",
        calibration=calibration,
    )
    for name in ("encoder", "decoder"):
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = str(tmp_path / f"{name}_as_loaded.onnx")
        ort.InferenceSession(str(package / f"{name}.onnx"), options, providers=["CPUExecutionProvider"])
        ops = [
            n.op_type for n in onnx.load(str(tmp_path / f"{name}_as_loaded.onnx"), load_external_data=False).graph.node
        ]
        assert "SkipLayerNormalization" not in ops, name
        norms = {"encoder": 2 * cfg.encoder_layers, "decoder": 3 * cfg.decoder_layers}[name]
        assert ops.count("LayerNormalization") == norms, name


def _counted(decoder, sources, gen, searcher, reference) -> dict:
    """Runs of decoder_batch.onnx, decoder_greedy.onnx and decoder_greedy_inplace.onnx while
    `searcher` translates `sources` as `reference` does."""
    calls = {"batch": 0, "greedy": 0, "inplace": 0}
    inplace = decoder.inplace.session if decoder.inplace is not None else None
    methods = {"batch": (decoder.many_rows, "run"), "greedy": (decoder.greedy, "run")}
    methods["inplace"] = (inplace, "run_with_iobinding")
    for name, (session, method) in methods.items():
        if session is not None:
            setattr(session, method, functools.partial(_count, calls, name, getattr(session, method)))
    try:
        assert searcher(sources, gen) == greedy_search(reference, sources, gen)
    finally:
        for session, method in methods.values():
            if session is not None:
                delattr(session, method)
    return calls


def _count(calls: dict, name: str, run, *args, **kwargs):
    calls[name] += 1
    return run(*args, **kwargs)


def _without_inplace(package: Path, dest: Path) -> Path:
    """A copy of `package` as format 2.0 wrote it: no decoder_greedy_inplace.onnx."""
    shutil.copytree(package, dest)
    (dest / "decoder_greedy_inplace.onnx").unlink()
    meta = json.loads((dest / "package.json").read_text())
    del meta["files"]["decoder_greedy_inplace.onnx"]
    meta["format"] = "mt-onnx-package/2.0"
    (dest / "package.json").write_text(json.dumps(meta, indent=2))
    return dest
