"""int8 quantization (issue 7): weight groups, dynamic and static QDQ graphs, the accuracy guard,
and the quantize stage through the smoke recipe."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from mt_runtime.layout import DECODER_BATCH, GENERATE
from mt_runtime.search import GenerationConfig, beam_search, greedy_search
from mt_runtime.translator import GraphSearch, OnnxDecoder, Translator

from model.onnx_passes import derive_graphs
from model.onnx_passes.external import EXTERNAL_MIN_BYTES
from model.onnx_quantize import (
    TABLE,
    RecordingDecoder,
    node_groups,
    onnx_bytes,
    quantize_rows,
    quantize_static,
    weight_nodes,
)
from model.transformer import Transformer, TransformerConfig
from pipeline.corpora.splits import read_split
from pipeline.engine.errors import StageFailed
from pipeline.export.float_graphs import float32_graphs, variant_graphs
from pipeline.measure.translators import open_model
from pipeline.quantize.guard import guarded_search

NO_PRUNE = "prune=null"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return export_tiny(tmp_path_factory.mktemp("q"))


def export_tiny(folder, d_model: int = 32, biases: float = 0.0, pre_ln: bool = False):
    """A small model with uneven heads, exported and optimised like the export stage does;
    `biases`: the scale of random biases instead of the zeros a new model starts with; `pre_ln`:
    pre-LN blocks and GELU instead of post-LN and ReLU."""
    torch.manual_seed(5)
    cfg = TransformerConfig(
        vocab_size=300,
        d_model=d_model,
        head_dim=8,
        enc_heads=[4, 2],
        dec_self_heads=[1, 3],
        dec_cross_heads=[2, 4],
        enc_ffn=[64, 48],
        dec_ffn=[40, 64],
        max_positions=64,
        pre_ln=pre_ln,
        activation="gelu" if pre_ln else "relu",
    )
    model = Transformer(cfg).eval()
    if biases:
        with torch.no_grad():
            for name, tensor in model.named_parameters():
                if name.endswith(".bias"):
                    tensor.normal_(0.0, biases)
    graphs, done = float32_graphs(model, folder)
    assert done["tied_embedding"]
    paths, done = variant_graphs(graphs, "fp32", folder, d_model)
    assert all(done["positions_as_formula"].values())
    return model, paths, folder


def _decoder(paths) -> OnnxDecoder:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return OnnxDecoder(
        *(
            ort.InferenceSession(str(paths[g]), options, providers=["CPUExecutionProvider"])
            for g in ("encoder", "decoder")
        ),
        pad_id=0,
    )


def _sources(n=6, seed=0):
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(4, 300, rng.integers(3, 12))] + [2] for _ in range(n)]


def assert_same_but_near_ties(
    decoder, sources, ours, theirs, beam: bool = False, min_agree: float = 0.6, tie: float = 0.05
):
    """What two int8 kernels promise each other (their rounding differs with the CPU's instruction
    set: AVX2 and AVX-512 machines take different int8 paths): most outputs identical, and where
    one differs, a near-tie under `decoder`: greedy, the two tokens where they part, after the
    shared prefix, within `tie` in log-probability; beam search, the two whole outputs."""
    same = [a == b for a, b in zip(ours, theirs)]
    assert np.mean(same) >= min_agree, (ours, theirs)

    def log_probs_after(src, prefix):
        decoder.encode([src], 1)
        out = decoder.step(np.array([1]), None)  # BOS
        for token in prefix:
            out = decoder.step(np.array([token]), None)
        return out[0]

    def score(src, seq):
        return sum(float(log_probs_after(src, seq[:i])[t]) for i, t in enumerate(seq + [2]))

    for src, a, b, equal in zip(sources, ours, theirs, same):
        if equal:
            continue
        if beam:
            assert abs(score(src, a) - score(src, b)) <= tie, (src, a, b)
            continue
        at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        after = log_probs_after(src, a[:at])
        first = [seq[at] if at < len(seq) else 2 for seq in (a, b)]  # EOS where one ended
        assert abs(float(after[first[0]] - after[first[1]])) <= tie, (src, a, b)


def test_every_weight_belongs_to_a_named_group(tiny):
    model, paths, _ = tiny
    groups = node_groups(paths)
    assert set(groups) == {
        "embeddings",
        "output_projection",
        "encoder.0.attention",
        "encoder.0.ffn",
        "encoder.1.attention",
        "encoder.1.ffn",
        "decoder.0.self_attention",
        "decoder.0.cross_attention",
        "decoder.0.ffn",
        "decoder.1.self_attention",
        "decoder.1.cross_attention",
        "decoder.1.ffn",
    }
    # The cross-attention K/V projections run in the encoder graph but belong to their decoder layer.
    assert groups["decoder.1.cross_attention"]["encoder"] == ["/decoder.1/cross_attn/kv/MatMul"]
    assert groups["output_projection"] == {"decoder": ["/logits/MatMul"]}
    total = sum(len(weight_nodes(onnx.load(str(p)))) for p in paths.values())
    assert sum(len(n) for g in groups.values() for n in g.values()) == total


def _next_token_agreement(paths, int8_paths) -> tuple[float, float, float]:
    """Over real decoding steps of the fp32 graphs: how often the int8 graphs pick the same next
    token, their mean |log p| error, and the fp32 log-probabilities' spread."""
    fp32, int8 = RecordingDecoder(_decoder(paths)), _decoder(int8_paths)
    greedy_search(fp32, _sources(), GenerationConfig(beam=1, max_len_b=3, max_positions=64))
    agree, error, spread = [], [], []
    for feed in fp32.feeds["decoder"]:
        a = fp32.inner.decoder.run(["log_probs"], feed)[0]
        b = int8.decoder.run(["log_probs"], feed)[0]
        agree.append((a.argmax(-1) == b.argmax(-1)).mean())
        error.append(np.abs(a - b).mean())
        spread.append(a.std(-1).mean())
    assert len(agree) > 3
    return float(np.mean(agree)), float(np.mean(error)), float(np.mean(spread))


def _quantize(form: str, paths, folder, groups, keep_float=()):
    if form == "rows":
        return quantize_rows(paths, folder, groups, keep_float)
    recorder = RecordingDecoder(_decoder(paths))
    greedy_search(recorder, _sources(4, seed=1), GenerationConfig(beam=1, max_len_b=3, max_positions=64))
    return quantize_static(paths, folder, groups, recorder.feeds, "minmax", keep_float)


def _row(feed: dict, i: int) -> dict:
    """Row i of a decoder step's feed, as a feed of one row."""
    return {k: (np.zeros(1, np.int64) if k == "cache_index" else v[i : i + 1]) for k, v in feed.items()}


@pytest.mark.parametrize("form", ["rows", "static"])
def test_int8_products_give_each_row_the_numbers_it_gets_alone(tiny, tmp_path, form):
    """Both int8 forms: every product is MatMulIntegerToFloat over int8 weights per column, and a
    row's activations are quantized by that row alone (per-row scales) or by a fixed scale
    (static): a row's outputs are bit for bit those it gets alone, in the encoder (padded
    sentences) and the decoder, and close to fp32's."""
    model, paths, _ = tiny
    groups = node_groups(paths)
    out = _quantize(form, paths, tmp_path / form, groups)
    assert onnx_bytes(out) < 0.6 * onnx_bytes(paths)
    products = sum(
        n.op_type == "MatMul" for graph in ("encoder", "decoder") for n in weight_nodes(onnx.load(str(paths[graph])))
    )
    ops = [n.op_type for graph in ("encoder", "decoder") for n in onnx.load(str(out[graph])).graph.node]
    assert ops.count("MatMulIntegerToFloat") == products > 10
    for batch_dependent in (
        "DynamicQuantizeLinear",
        "MatMulInteger",
        "DynamicQuantizeMatMul",
        "MatMulNBits",
        "MatMul",
        "DequantizeLinear",
    ):
        assert batch_dependent not in ops
    recorder = RecordingDecoder(_decoder(paths))
    greedy_search(recorder, _sources(6, seed=7), GenerationConfig(beam=1, max_len_b=3, max_positions=64))
    int8 = _decoder(out)
    checked = 0
    for feed in recorder.feeds["decoder"]:
        rows = feed["tokens"].shape[0]
        batched = int8.decoder.run(["log_probs"], feed)[0]
        for i in range(rows):
            np.testing.assert_array_equal(int8.decoder.run(["log_probs"], _row(feed, i))[0][0], batched[i])
            checked += 1
    assert checked > 12
    src = _sources(5, seed=3)
    width = max(map(len, src))
    ids = np.array([s + [0] * (width - len(s)) for s in src], dtype=np.int64)
    batched = int8.encoder.run(None, {"src_ids": ids})
    for i, s in enumerate(src):
        alone = int8.encoder.run(None, {"src_ids": np.array([s], dtype=np.int64)})
        for a, b in zip(alone, batched):  # cross K/V [rows, heads, positions, dim]: the real positions
            np.testing.assert_array_equal(a[0], b[i][:, : len(s)])
    agree, error, spread = _next_token_agreement(paths, out)
    assert agree > 0.75 and error < 0.3 * spread


@pytest.mark.parametrize("form", ["rows", "static"])
def test_int8_stores_the_token_table_once(tiny, tmp_path, form):
    """The tied table is stored once, in decoder.onnx, as uint8 rows with a scale per word: both
    lookups read it (the encoder by reference to decoder.onnx's bytes) and give exactly the
    projection's own int8 columns; with the embeddings kept in float the encoder keeps its table
    and the decoder's lookup reads the int8 projection."""
    model, paths, _ = tiny
    groups = node_groups(paths)
    out = _quantize(form, paths, tmp_path / form, groups)
    vocab, d = model.cfg.vocab_size, model.cfg.d_model
    encoder = onnx.load(str(out["encoder"]), load_external_data=False)
    external = {
        t.name: {e.key: e.value for e in t.external_data}
        for t in encoder.graph.initializer
        if t.data_location == onnx.TensorProto.EXTERNAL
    }
    assert TABLE in external and external[TABLE]["location"] == "decoder.onnx"
    assert not _float_tables(out["encoder"], model.cfg) and not _float_tables(out["decoder"], model.cfg)
    tokens = np.array([[5], [17], [299]], dtype=np.int64)
    enc_rows = _lookup_alone(onnx.load(str(out["encoder"])), "/embed/Gather", tokens)
    dec_rows = _lookup_alone(onnx.load(str(out["decoder"])), "/embed/Gather_tied", tokens)
    np.testing.assert_array_equal(enc_rows, dec_rows)
    decoder = onnx.load(str(out["decoder"]))
    table = {t.name: onnx.numpy_helper.to_array(t) for t in decoder.graph.initializer}
    rows = table[TABLE][tokens[:, 0], :d].astype(np.float32) - 128
    np.testing.assert_array_equal(dec_rows, rows * table["token_table/scales"][tokens[:, 0]])
    assert np.abs(enc_rows - model.embed.weight.detach().numpy()[tokens[:, 0]]).max() < 0.05
    kept = _quantize(form, paths, tmp_path / f"{form}_keep", groups, keep_float=["embeddings"])
    assert _float_tables(kept["encoder"], model.cfg)
    assert out["encoder"].stat().st_size < kept["encoder"].stat().st_size - 0.9 * vocab * d * 4
    assert "/embed/Gather_tied_int8" in {n.name for n in onnx.load(str(kept["decoder"])).graph.node}
    agree, error, spread = _next_token_agreement(paths, kept)
    assert agree > 0.75 and error < 0.3 * spread


def _lookup_alone(proto: onnx.ModelProto, prefix: str, tokens: np.ndarray) -> np.ndarray:
    """Run the nodes named `prefix`* of a graph (a token lookup) on `tokens` [n, 1]."""
    nodes = [n for n in proto.graph.node if n.name.startswith(prefix)]
    needed = {i for n in nodes for i in n.input}
    sub = onnx.helper.make_model(
        onnx.helper.make_graph(
            nodes,
            "lookup",
            [onnx.helper.make_tensor_value_info(nodes[0].input[1], onnx.TensorProto.INT64, [None, 1])],
            [onnx.helper.make_tensor_value_info(nodes[-1].output[0], onnx.TensorProto.FLOAT, None)],
            [t for t in proto.graph.initializer if t.name in needed],
        ),
        opset_imports=proto.opset_import,
        ir_version=proto.ir_version,
    )
    session = ort.InferenceSession(sub.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {nodes[0].input[1]: tokens})[0].reshape(len(tokens), -1)


def _float_tables(path, cfg) -> list[str]:
    return [
        i.name
        for i in onnx.load(str(path)).graph.initializer
        if i.data_type == onnx.TensorProto.FLOAT and sorted(i.dims) == sorted([cfg.vocab_size, cfg.d_model])
    ]


def test_int8_keeps_float_groups_in_float(tiny, tmp_path):
    model, paths, _ = tiny
    groups = node_groups(paths)
    kept = quantize_rows(paths, tmp_path / "keep", groups, keep_float=["output_projection", "embeddings"])
    decoder_graph = onnx.load(str(kept["decoder"]))
    float_names = {n.name for n in decoder_graph.graph.node if n.op_type in ("MatMul", "Gather")}
    assert {"/logits/MatMul", "/embed/Gather_tied"} <= float_names
    assert "/decoder.0/ffn/fc1/MatMul" not in float_names  # quantized: an integer product now


def test_static_int8_takes_a_products_bias_in(tmp_path):
    """A static product's bias goes into MatMulIntegerToFloat (one node and pass less), the same
    numbers as the Add after it; per-row products keep the Add (onnxruntime 1.31 would scale
    the bias by the row's scale)."""
    _, paths, _ = export_tiny(tmp_path, biases=0.5)
    static = _quantize("static", paths, tmp_path / "static", node_groups(paths))
    rows = quantize_rows(paths, tmp_path / "rows", node_groups(paths))
    graph = onnx.load(str(static["decoder"])).graph
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    with_bias = [n for n in graph.node if n.op_type == "MatMulIntegerToFloat" and len(n.input) == 7 and n.input[6]]
    assert with_bias and all(np.abs(weights[n.input[6]]).max() > 0.01 for n in with_bias)
    assert not any(
        len(n.input) == 7 and n.input[6]
        for n in onnx.load(str(rows["decoder"])).graph.node
        if n.op_type == "MatMulIntegerToFloat"
    )
    for out in (static, rows):
        agree, error, spread = _next_token_agreement(paths, out)
        assert agree > 0.75 and error < 0.3 * spread


def test_static_int8_quantizes_every_product_of_a_gelu_model(tmp_path):
    """Behind onnxruntime's fused GELU (BiasGelu, an op ONNX's shape inference has no schema
    for) every product still gets a calibrated activation scale: all are MatMulIntegerToFloat,
    none is left as a float-activation MatMul over a DequantizeLinear (which onnxruntime runs
    as a slow weight-only MatMulNBits), and the int8 graphs still pick fp32's next tokens."""
    _, paths, _ = export_tiny(tmp_path, pre_ln=True)
    assert "BiasGelu" in {n.op_type for n in onnx.load(str(paths["decoder"])).graph.node}
    static = _quantize("static", paths, tmp_path / "static", node_groups(paths))
    for graph in ("encoder", "decoder"):
        float_ops = {n.op_type for n in onnx.load(str(paths[graph])).graph.node}
        ops = [n.op_type for n in onnx.load(str(static[graph])).graph.node]
        assert "MatMul" in float_ops and "MatMul" not in ops and "DequantizeLinear" not in ops, graph
    agree, error, spread = _next_token_agreement(paths, static)
    assert agree > 0.75 and error < 0.3 * spread


@pytest.mark.parametrize("method", ["minmax", "entropy", "percentile"])
def test_static_int8_calibrates_on_recorded_decoding(tiny, method):
    model, paths, folder = tiny
    groups = node_groups(paths)
    recorder = RecordingDecoder(_decoder(paths))
    greedy_search(recorder, _sources(4, seed=1), GenerationConfig(beam=1, max_len_b=3, max_positions=64))
    static = quantize_static(
        paths, folder / f"static_{method}", groups, recorder.feeds, method, cache=folder / f"cache_{method}"
    )
    ops = {n.op_type for n in onnx.load(str(static["decoder"])).graph.node}
    assert {"QuantizeLinear", "MatMulIntegerToFloat"} <= ops and "DequantizeLinear" not in ops
    agree, error, spread = _next_token_agreement(paths, static)
    assert agree > 0.75 and error < 0.3 * spread
    # Re-quantizing with a group kept in float reuses the cached ranges (no reader needed).
    again = quantize_static(
        paths,
        folder / f"static_{method}_2",
        groups,
        {"encoder": [], "decoder": []},
        method,
        keep_float=["output_projection"],
        cache=folder / f"cache_{method}",
    )
    assert onnx_bytes(again) > onnx_bytes(static)


def test_guard_keeps_the_most_sensitive_groups_in_float():
    groups = ["embeddings", "encoder.0.ffn", "decoder.0.self_attention", "output_projection"]
    cost = {"embeddings": 0.1, "encoder.0.ffn": 0.2, "decoder.0.self_attention": 0.15, "output_projection": 1.5}
    calls = []

    def evaluate(keep):
        calls.append(keep)
        return round(30.0 - sum(c for g, c in cost.items() if g not in keep), 2)

    result = guarded_search(groups, evaluate, 30.0, max_drop=0.5, variant="int8_dynamic", log=lambda m: None)
    assert result["float_groups"] == ["output_projection"]
    assert result["sensitivity"]["output_projection"] == 1.5
    assert [a["float_groups"] for a in result["attempts"]] == [[], ["output_projection"]]
    assert result["attempts"][0]["drop"] == 1.95 and result["bleu"] == 29.55
    # Within tolerance from the start: one evaluation, nothing kept in float.
    calls.clear()
    assert guarded_search(groups, evaluate, 30.0, 5.0, "x", log=lambda m: None)["float_groups"] == []
    assert calls == [()]


def test_guard_fails_with_the_table_when_nothing_is_within_tolerance():
    groups = ["a", "b", "c"]

    def evaluate(keep):
        return 20.0 - (3 - len(keep))  # every quantized group costs one point

    with pytest.raises(StageFailed) as info:
        guarded_search(groups, evaluate, 20.0, max_drop=0.5, variant="int8_static", log=lambda m: None)
    message = str(info.value)
    assert "int8_static" in message and "19.00" in message and "18.00" in message and "17.00" in message
    assert "float: a, b" in message


# ----------------------------------------------------------------- through the smoke recipe
@pytest.fixture(scope="module")
def quantized(smoke):
    return smoke.build("quantize", NO_PRUNE)


@pytest.mark.slow
def test_quantize_stage_writes_guarded_packages(quantized):
    _, arts = quantized
    art = arts["quantize"]
    m = art.metrics
    assert set(m["variants"]) == {"int8_dynamic", "int8_static"}
    assert m["calibration"]["method"] == "minmax" and m["calibration"]["decoder_feeds"] > 0
    # Both forms run every product as MatMulIntegerToFloat; the package says how activations are quantized.
    dynamic = json.loads((art.path / "int8_dynamic" / "package.json").read_text())
    for variant in m["variants"]:
        decoder_ops = {n.op_type for n in onnx.load(str(art.path / variant / "decoder.onnx")).graph.node}
        assert (
            "MatMulIntegerToFloat" in decoder_ops
            and not {"MatMul", "MatMulNBits", "DynamicQuantizeMatMul"} & decoder_ops
        )
    assert dynamic["kernel"]["activations"].startswith("int8 per row") and "per row" in dynamic["precision"]
    src, _ = read_split(arts["data"].path, "valid")
    fp32 = Translator(arts["export.student"].path / "fp32", threads=1)
    for variant, report in m["variants"].items():
        assert report["attempts"][0]["float_groups"] == [] and report["bleu"] == report["attempts"][-1]["bleu"]
        package = json.loads((art.path / variant / "package.json").read_text())
        files, fp32_files = package["files"], fp32.package["files"]
        graphs = ["encoder.onnx", "decoder.onnx", "generate.onnx", "decoder_batch.onnx", "decoder_greedy.onnx"]
        graphs.append("decoder_greedy_inplace.onnx")
        assert report["onnx_bytes"] == package["onnx_bytes"] == sum(files[g]["bytes"] for g in graphs)
        assert set(graphs) == {f for f in files if f.endswith(".onnx")}  # no shortlist: no output vocabulary graph
        # Smoke-sized, structure weighs a lot (generate.onnx is all structure): the weights' graphs
        steps = sum(files[g]["bytes"] for g in ("encoder.onnx", "decoder.onnx"))
        assert steps < 0.9 * sum(fp32_files[g]["bytes"] for g in ("encoder.onnx", "decoder.onnx"))
        assert report["latency_ratio"] > 0 and report["latency_search"] == "graph"
        assert package["variant"] == variant and package["float_groups"] == report["float_groups"]
        assert "weight groups kept in float" in (art.path / variant / "MODEL_CARD.md").read_text()
        translator = open_model(art.path / variant)
        assert translator.runtime == "onnxruntime"
        out = translator.translate(src[:8], beam=2)
        assert len(out) == 8 and all(isinstance(s, str) for s in out)
        # Same search code and length limits as fp32: outputs are never longer than fp32 allows.
        assert out != [""] * 8 or fp32.translate(src[:8], beam=2) == [""] * 8


@pytest.mark.parametrize("form", ["rows", "static"])
def test_int8_search_graphs_run_the_step_graphs_numbers(tiny, tmp_path, form):
    """generate.onnx and decoder_batch.onnx run decoder.onnx's own int8 nodes: the op (one
    sentence) finds exactly what mt_runtime/search.py finds over the step graphs, greedy and beam, and
    decoder_batch.onnx's top k are decoder.onnx's log-probabilities to the bit."""
    model, paths, _ = tiny
    folder = tmp_path / form
    out = _quantize(form, paths, folder, node_groups(paths))
    gen = GenerationConfig(beam=1, max_len_b=3, max_positions=64)
    written = derive_graphs(folder, dataclasses.asdict(gen))
    # No shortlist: no output vocabulary graph.
    assert list(written) == [GENERATE, DECODER_BATCH, "decoder_greedy.onnx", "decoder_greedy_inplace.onnx"]
    proto = onnx.load(str(folder / GENERATE), load_external_data=False)
    [decoder] = [a.g for a in proto.graph.node[-1].attribute if a.name == "decoder"]
    # The output projection: with a fixed activation scale (static) the op's few rows run it as
    # MatMulInteger and a Mul by the combined scale (model/onnx_passes/few_rows.py); with per-row
    # scales the fused op stays. Either way the numbers below are the step graphs'.
    producer = {o: n for n in decoder.node for o in n.output}
    logits = producer["logits"]
    if form == "static":
        assert logits.op_type == "Mul" and producer[producer[logits.input[0]].input[0]].op_type == "MatMulInteger"
    else:
        assert logits.op_type == "MatMulIntegerToFloat"
    assert not any(len(t.raw_data) >= EXTERNAL_MIN_BYTES for t in decoder.initializer)  # read from decoder.onnx
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    graph = GraphSearch(ort.InferenceSession(str(folder / GENERATE), options, providers=["CPUExecutionProvider"]))
    src = _sources(8, seed=11)
    for beam in (1, 3):
        g = dataclasses.replace(gen, beam=beam)
        assert [graph([s], g)[0] for s in src] == [beam_search(_decoder(out), [s], g)[0] for s in src]
    many_rows = folder / DECODER_BATCH
    plain = _decoder(out)
    fast = OnnxDecoder(
        plain.encoder,
        plain.decoder,
        pad_id=0,
        many_rows=ort.InferenceSession(str(many_rows), options, providers=["CPUExecutionProvider"]),
    )
    for d in (plain, fast):
        d.encode(src, 1)
    tokens = np.full(len(src), 1, dtype=np.int64)
    full = plain.step(tokens, None)
    values, ids = fast.step_top_k(tokens, None, 5)
    np.testing.assert_array_equal(np.take_along_axis(full, ids, 1), values)
    np.testing.assert_array_equal(ids[:, 0], full.argmax(axis=1))
