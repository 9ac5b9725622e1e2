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

from model import onnx_quantize
from model.onnx_quantize import (RecordingDecoder, block_for, node_groups, onnx_bytes, quantize_blockwise,
                                 quantize_dynamic, quantize_static, weight_nodes)
from model.onnx_generate import EXTERNAL_MIN_BYTES, write_generate_graph, write_many_rows_decoder
from model.runtime import GraphSearch, OnnxDecoder, Translator
from model.search import GenerationConfig, greedy_search
from model.transformer import Transformer, TransformerConfig
from pipeline.errors import StageFailed
from pipeline.onnx_graphs import float32_graphs, variant_graphs
from pipeline.corpus import read_split
from pipeline.stages.quantize import guarded_search
from pipeline.model_loading import load_translator

NO_PRUNE = "prune=null"



@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return export_tiny(tmp_path_factory.mktemp("q"))


def export_tiny(folder, d_model: int = 32, biases: float = 0.0):
    """A small model with uneven heads, exported and optimised like the export stage does;
    `biases`: the scale of random biases instead of the zeros a new model starts with."""
    torch.manual_seed(5)
    cfg = TransformerConfig(vocab_size=300, d_model=d_model, head_dim=8, enc_heads=[4, 2], dec_self_heads=[1, 3],
                            dec_cross_heads=[2, 4], enc_ffn=[64, 48], dec_ffn=[40, 64], max_positions=64)
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
    return OnnxDecoder(*(ort.InferenceSession(str(paths[g]), options, providers=["CPUExecutionProvider"])
                         for g in ("encoder", "decoder")), pad_id=0)


def _sources(n=6, seed=0):
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(4, 300, rng.integers(3, 12))] + [2] for _ in range(n)]


def assert_same_but_near_ties(decoder, sources, ours, theirs, beam: bool = False, min_agree: float = 0.6,
                              tie: float = 0.05):
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
    assert set(groups) == {"embeddings", "output_projection", "encoder.0.attention", "encoder.0.ffn",
                           "encoder.1.attention", "encoder.1.ffn", "decoder.0.self_attention",
                           "decoder.0.cross_attention", "decoder.0.ffn", "decoder.1.self_attention",
                           "decoder.1.cross_attention", "decoder.1.ffn"}
    # The cross-attention K/V projections run in the encoder graph but belong to their decoder layer.
    assert groups["decoder.1.cross_attention"]["encoder"] == ["/decoder.1/cross_attn/kv/MatMul"]
    assert groups["output_projection"] == {"decoder": ["/logits/MatMul"]}
    total = sum(len(weight_nodes(onnx.load(str(p)))) for p in paths.values())
    assert sum(len(n) for g in groups.values() for n in g.values()) == total


def test_dynamic_int8_is_smaller_close_and_keeps_float_groups(tiny):
    model, paths, folder = tiny
    groups = node_groups(paths)
    dyn = quantize_dynamic(paths, folder / "dyn", groups)
    assert onnx_bytes(dyn) < 0.6 * onnx_bytes(paths)  # tiny graphs: biases and structure weigh more than at real sizes
    kept = quantize_dynamic(paths, folder / "dyn_keep", groups, keep_float=["output_projection", "embeddings"])
    decoder_graph = onnx.load(str(kept["decoder"]))
    float_names = {n.name for n in decoder_graph.graph.node if n.op_type in ("MatMul", "Gather")}
    assert {"/logits/MatMul", "/embed/Gather_tied"} <= float_names
    assert "/decoder.0/ffn/fc1/MatMul" not in float_names  # quantized: replaced by an integer MatMul
    # Real decoding steps: the int8 model mostly picks the fp32 model's next token. (This random
    # model's next-token distributions are flat, so int8 noise flips more than a trained one's.)
    src = _sources()
    fp32, int8 = RecordingDecoder(_decoder(paths)), _decoder(dyn)
    greedy_search(fp32, src, GenerationConfig(beam=1, max_len_b=3, max_positions=64))
    feeds = fp32.feeds["decoder"]
    agree, error, spread = [], [], []
    for feed in feeds:
        a = fp32.inner.decoder.run(["log_probs"], feed)[0]
        b = int8.decoder.run(["log_probs"], feed)[0]
        agree.append((a.argmax(-1) == b.argmax(-1)).mean())
        error.append(np.abs(a - b).mean())
        spread.append(a.std(-1).mean())
    assert len(feeds) > 3 and np.mean(agree) > 0.75 and np.mean(error) < 0.3 * np.mean(spread)


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


@pytest.mark.parametrize("d_model,block_size", [(32, 16), (24, 32)])  # 24: blocks of 16, the lookup unpads
def test_blockwise_int8_runs_matmulnbits_and_shares_the_tied_table(tiny, tmp_path, d_model, block_size):
    model, paths, folder = tiny if d_model == 32 else export_tiny(tmp_path, d_model)
    groups = node_groups(paths)
    out = quantize_blockwise(paths, folder / f"nbits{block_size}", groups, block_size=block_size)
    assert onnx_bytes(out) < 0.6 * onnx_bytes(paths)
    block_size = block_for(d_model, block_size)
    decoder = onnx.load(str(out["decoder"]))
    ops = [n.op_type for n in decoder.graph.node]
    assert "MatMul" not in ops and ops.count("MatMulNBits") == sum(len(g.get("decoder", [])) for g in groups.values())
    assert not _float_tables(out["decoder"], model.cfg)  # the lookup reads the packed projection
    packed = [i for i in decoder.graph.initializer if i.data_type == onnx.TensorProto.UINT8
              and i.dims[0] == model.cfg.vocab_size]
    assert len(packed) == 1
    agree, error, spread = _next_token_agreement(paths, out)
    assert agree > 0.75 and error < 0.3 * spread
    # The lookup alone, against the dequantized packed rows and the fp32 table.
    lookup = [n for n in decoder.graph.node if n.name.startswith("/embed/Gather_tied")]
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in decoder.graph.initializer}
    needed = {i for n in lookup for i in n.input}
    sub = onnx.helper.make_model(
        onnx.helper.make_graph(lookup, "lookup",
                               [onnx.helper.make_tensor_value_info("tokens", onnx.TensorProto.INT64, [None, 1])],
                               [onnx.helper.make_tensor_value_info(lookup[-1].output[0], onnx.TensorProto.FLOAT, None)],
                               [onnx.numpy_helper.from_array(v, k) for k, v in weights.items() if k in needed]),
        opset_imports=decoder.opset_import, ir_version=decoder.ir_version)
    tokens = np.array([[5], [17], [299]], dtype=np.int64)
    got = ort.InferenceSession(sub.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"tokens": tokens})[0].reshape(3, -1)
    q = weights[packed[0].name][tokens[:, 0]].astype(np.float32) - 128  # [3, blocks, block]
    scales = weights[packed[0].name.replace("_int8_blocks", "_block_scales")][tokens[:, 0]]
    want = (q * scales[..., None]).reshape(3, -1)[:, : model.cfg.d_model]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    table = model.embed.weight.detach().numpy()[tokens[:, 0]]
    # Within one step of each block's scale (ORT's scales carry a sign: the largest magnitude
    # maps to -128, so the opposite extreme may clip at 127).
    step = np.repeat(np.abs(scales), block_size, axis=-1)[:, : model.cfg.d_model]
    assert np.all(np.abs(want - table) <= step * 1.001 + 1e-7)
    kept = quantize_blockwise(paths, folder / f"nbits{block_size}_keep", groups, keep_float=["output_projection"],
                              block_size=block_size)
    kept_nodes = {n.name: n.op_type for n in onnx.load(str(kept["decoder"])).graph.node}
    assert kept_nodes["/logits/MatMul"] == "MatMul" and kept_nodes["/embed/Gather_tied"] == "Gather"


def test_int8_decoder_takes_its_biases_inside_matmulnbits(tmp_path, monkeypatch):
    """An Add of a bias after a MatMulNBits becomes the node's bias input, and the many-rows
    search graph hands it on to DynamicQuantizeMatMul: fewer nodes, the same numbers."""
    _, paths, _ = export_tiny(tmp_path, biases=0.5)
    groups = node_groups(paths)
    folded = quantize_blockwise(paths, tmp_path / "folded", groups, block_size=32)
    monkeypatch.setattr(onnx_quantize, "fold_bias_adds", lambda graph: 0)
    unfolded = quantize_blockwise(paths, tmp_path / "unfolded", groups, block_size=32)
    graph, before = (onnx.load(str(p["decoder"])).graph for p in (folded, unfolded))
    with_bias = [n for n in graph.node if n.op_type == "MatMulNBits" and len(n.input) == 6]
    assert with_bias and len(graph.node) == len(before.node) - len(with_bias)
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    assert all(np.abs(weights[n.input[5]]).max() > 0.01 for n in with_bias)  # real biases, not zeros
    matmul_outputs = {n.output[0] for n in graph.node if n.op_type == "MatMulNBits"}
    assert not any(set(a.input) & matmul_outputs and set(a.input) & set(weights)
                   for a in graph.node if a.op_type == "Add")
    reference = RecordingDecoder(_decoder(unfolded))
    greedy_search(reference, _sources(), GenerationConfig(beam=1, max_len_b=3, max_positions=64))
    candidate = _decoder(folded)
    assert len(reference.feeds["decoder"]) > 3
    for feed in reference.feeds["decoder"]:
        np.testing.assert_allclose(candidate.decoder.run(["log_probs"], feed)[0],
                                   reference.inner.decoder.run(["log_probs"], feed)[0], atol=1e-5)
    gen = GenerationConfig(beam=2, max_len_b=3, max_positions=64)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    searches = []
    for folder in (tmp_path / "folded", tmp_path / "unfolded"):
        many_rows = write_generate_graph(folder, dataclasses.asdict(gen))[-1]
        searches.append(GraphSearch(ort.InferenceSession(str(many_rows), options, providers=["CPUExecutionProvider"])))
    search = onnx.load(str(tmp_path / "folded" / "generate_batch.onnx"), load_external_data=False).graph.node[-1]
    [steps] = [a.g for a in search.attribute if a.name == "decoder"]
    assert any(len(n.input) == 5 and n.input[4] for n in steps.node if n.op_type == "DynamicQuantizeMatMul")
    assert_same_but_near_ties(_decoder(unfolded), _sources(), searches[0](_sources(), gen),
                              searches[1](_sources(), gen), beam=True)


def _lookup_alone(proto: onnx.ModelProto, prefix: str, tokens: np.ndarray) -> np.ndarray:
    """Run the nodes named `prefix`* of a graph (a token lookup) on `tokens` [n, 1]."""
    nodes = [n for n in proto.graph.node if n.name.startswith(prefix)]
    needed = {i for n in nodes for i in n.input}
    sub = onnx.helper.make_model(
        onnx.helper.make_graph(nodes, "lookup",
                               [onnx.helper.make_tensor_value_info(nodes[1].input[1], onnx.TensorProto.INT64, [None, 1])],
                               [onnx.helper.make_tensor_value_info(nodes[-1].output[0], onnx.TensorProto.FLOAT, None)],
                               [t for t in proto.graph.initializer if t.name in needed]),
        opset_imports=proto.opset_import, ir_version=proto.ir_version)
    session = ort.InferenceSession(sub.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {nodes[1].input[1]: tokens})[0].reshape(len(tokens), -1)


@pytest.mark.parametrize("d_model", [32, 24])  # 24: padded blocks, the lookups unpad
def test_int8_encoder_reads_the_token_table_from_the_decoders_bytes(tiny, tmp_path, d_model):
    """The tied table is stored once in the int8 package: the encoder's lookup refers to the
    packed blocks inside decoder.onnx and gives exactly the decoder's rows."""
    model, paths, folder = tiny if d_model == 32 else export_tiny(tmp_path, d_model)
    groups = node_groups(paths)
    out = quantize_blockwise(paths, tmp_path / "int8", groups, block_size=32)
    vocab, d = model.cfg.vocab_size, model.cfg.d_model
    encoder = onnx.load(str(out["encoder"]), load_external_data=False)
    big = [t.name for t in encoder.graph.initializer if np.prod(t.dims) >= vocab * d // 2]
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in encoder.graph.initializer if t.name in big)
    assert {e.value for t in encoder.graph.initializer if t.name in big for e in t.external_data
            if e.key == "location"} == {"decoder.onnx"}
    inline = quantize_dynamic(paths, tmp_path / "inline", groups)["encoder"]  # its own int8 table
    assert out["encoder"].stat().st_size < inline.stat().st_size - 0.9 * vocab * d
    tokens = np.array([[5], [17], [299]], dtype=np.int64)
    enc_rows = _lookup_alone(onnx.load(str(out["encoder"])), "/embed/Gather", tokens)
    dec_rows = _lookup_alone(onnx.load(str(out["decoder"])), "/embed/Gather_tied", tokens)
    np.testing.assert_array_equal(enc_rows, dec_rows)
    assert np.abs(enc_rows - model.embed.weight.detach().numpy()[tokens[:, 0]]).max() < 0.05
    # The package runs from its own folder; the next-token choices are the fp32 graphs' choices.
    agree, error, spread = _next_token_agreement(paths, out)
    assert agree > 0.75 and error < 0.3 * spread
    # With the embeddings kept in float (the guard's choice), the encoder keeps its own table.
    kept = quantize_blockwise(paths, tmp_path / "keep", groups, keep_float=["embeddings"], block_size=32)
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL
                   for t in onnx.load(str(kept["encoder"]), load_external_data=False).graph.initializer)


def _float_tables(path, cfg) -> list[str]:
    return [i.name for i in onnx.load(str(path)).graph.initializer
            if i.data_type == onnx.TensorProto.FLOAT and sorted(i.dims) == sorted([cfg.vocab_size, cfg.d_model])]


@pytest.mark.parametrize("form", ["dynamic", "static"])
def test_int8_decoder_looks_tokens_up_in_the_int8_projection(tiny, form):
    """The tied lookup reads the int8 projection weight: no float copy of the table is left, and
    the embedding it computes is exactly that weight's dequantized column."""
    model, paths, folder = tiny
    groups = node_groups(paths)
    if form == "dynamic":
        out = quantize_dynamic(paths, folder / "tie_dyn", groups)
    else:
        recorder = RecordingDecoder(_decoder(paths))
        greedy_search(recorder, _sources(3, seed=4), GenerationConfig(beam=1, max_len_b=3, max_positions=64))
        out = quantize_static(paths, folder / "tie_static", groups, recorder.feeds, "minmax")
    assert _float_tables(paths["decoder"], model.cfg) and not _float_tables(out["decoder"], model.cfg)
    decoder = onnx.load(str(out["decoder"]))
    # ORT fuses DequantizeLinear + MatMul only when the int8 weight has no other reader.
    for dq in (n for n in decoder.graph.node if n.op_type == "DequantizeLinear"):
        assert sum(dq.input[0] in n.input for n in decoder.graph.node) == 1, dq.input[0]
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in decoder.graph.initializer}
    lookup = next(n for n in decoder.graph.node if n.name == "/embed/Gather_tied_T")  # [tokens, 1, d]
    # Run the lookup alone: a graph from tokens to the looked-up (scaled) embedding.
    nodes = [n for n in decoder.graph.node if n.name.startswith("/embed/Gather_tied")]
    needed = {i for n in nodes for i in n.input}
    sub = onnx.helper.make_model(
        onnx.helper.make_graph(nodes, "lookup",
                               [onnx.helper.make_tensor_value_info("tokens", onnx.TensorProto.INT64, [None, 1])],
                               [onnx.helper.make_tensor_value_info(lookup.output[0], onnx.TensorProto.FLOAT, None)],
                               [onnx.numpy_helper.from_array(v, k) for k, v in weights.items() if k in needed]),
        opset_imports=decoder.opset_import, ir_version=decoder.ir_version)
    tokens = np.array([[5], [17], [299]], dtype=np.int64)
    got = ort.InferenceSession(sub.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"tokens": tokens})[0]
    q = next(v for k, v in weights.items() if v.dtype == np.int8 and v.shape == (model.cfg.d_model, model.cfg.vocab_size))
    name = next(k for k, v in weights.items() if v is q)
    scale = weights[name.replace("_quantized", "_scale")]
    zero = weights.get(name.replace("_quantized", "_zero_point"), np.zeros_like(scale)).astype(np.float32)
    want = ((q[:, tokens[:, 0]].astype(np.float32) - zero[tokens[:, 0]]) * scale[tokens[:, 0]]).T
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-6)
    # And it is the fp32 embedding to within int8 rounding.
    table = model.embed.weight.detach().numpy()[tokens[:, 0]]
    assert np.abs(want - table).max() <= scale[tokens[:, 0]].max() * 0.51 + 1e-7


@pytest.mark.parametrize("method", ["minmax", "entropy", "percentile"])
def test_static_qdq_calibrates_on_recorded_decoding(tiny, method):
    model, paths, folder = tiny
    groups = node_groups(paths)
    recorder = RecordingDecoder(_decoder(paths))
    greedy_search(recorder, _sources(4, seed=1), GenerationConfig(beam=1, max_len_b=3, max_positions=64))
    static = quantize_static(paths, folder / f"static_{method}", groups, recorder.feeds, method,
                             cache=folder / f"cache_{method}")
    ops = {n.op_type for n in onnx.load(str(static["decoder"])).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    src = _sources(5, seed=2)
    gen = GenerationConfig(beam=2, max_len_b=3, max_positions=64)
    out = greedy_search(_decoder(static), src, gen)  # runs on the CPU provider
    assert len(out) == 5
    # Re-quantizing with a group kept in float reuses the cached ranges (no reader needed).
    again = quantize_static(paths, folder / f"static_{method}_2", groups, {"encoder": [], "decoder": []}, method,
                            keep_float=["output_projection"], cache=folder / f"cache_{method}")
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


def test_quantize_stage_writes_guarded_packages(quantized):
    _, arts = quantized
    art = arts["quantize"]
    m = art.metrics
    assert set(m["variants"]) == {"int8_dynamic", "int8_static"}
    assert m["calibration"]["method"] == "minmax" and m["calibration"]["decoder_feeds"] > 0
    # The default dynamic form: MatMulNBits in the decoder; the package names the blocks it really uses.
    dynamic = json.loads((art.path / "int8_dynamic" / "package.json").read_text())
    decoder_ops = {n.op_type for n in onnx.load(str(art.path / "int8_dynamic" / "decoder.onnx")).graph.node}
    assert m["dynamic_kernel"] == "matmul_nbits" and "MatMulNBits" in decoder_ops and "MatMul" not in decoder_ops
    assert dynamic["kernel"]["block_sizes"] and all(b in (16, 32, 64, 128) for b in dynamic["kernel"]["block_sizes"])
    assert f"blocks of {' / '.join(map(str, dynamic['kernel']['block_sizes']))}" in dynamic["precision"]
    src, _ = read_split(arts["data"].path, "valid")
    fp32 = Translator(arts["export.student"].path / "fp32", threads=1)
    for variant, report in m["variants"].items():
        assert report["attempts"][0]["float_groups"] == [] and report["bleu"] == report["attempts"][-1]["bleu"]
        package = json.loads((art.path / variant / "package.json").read_text())
        files, fp32_files = package["files"], fp32.package["files"]
        graphs = ["encoder.onnx", "decoder.onnx", "generate.onnx", "decoder_batch.onnx", "decoder_greedy.onnx"] + \
            ["generate_batch.onnx"] * (variant == "int8_dynamic")
        assert report["onnx_bytes"] == package["onnx_bytes"] == sum(files[g]["bytes"] for g in graphs)
        assert set(graphs) == {f for f in files if f.endswith(".onnx")}  # the many-rows graph: int8 MatMulNBits only
        # Smoke-sized, structure weighs a lot (generate.onnx is all structure): the weights' graphs
        steps = sum(files[g]["bytes"] for g in ("encoder.onnx", "decoder.onnx"))
        assert steps < 0.9 * sum(fp32_files[g]["bytes"] for g in ("encoder.onnx", "decoder.onnx"))
        assert report["latency_ratio"] > 0 and report["latency_search"] == "graph"
        assert package["variant"] == variant and package["float_groups"] == report["float_groups"]
        assert "weight groups kept in float" in (art.path / variant / "MODEL_CARD.md").read_text()
        translator = load_translator(art.path, variant)
        assert translator.runtime == "onnxruntime"
        out = translator.translate(src[:8], beam=2)
        assert len(out) == 8 and all(isinstance(s, str) for s in out)
        # Same search code and length limits as fp32: outputs are never longer than fp32 allows.
        assert out != [""] * 8 or fp32.translate(src[:8], beam=2) == [""] * 8


def test_int8_package_gets_a_many_rows_search_graph(tiny, tmp_path):
    """generate_batch.onnx: the output projection as DynamicQuantizeMatMul on MatMulNBits' own
    bytes (no copy), for calls of more than one row; one row keeps MatMulNBits."""
    model, paths, _ = tiny
    out = quantize_blockwise(paths, tmp_path / "int8", node_groups(paths), block_size=32)
    gen = GenerationConfig(beam=1, max_len_b=3, max_positions=64)
    written = write_generate_graph(tmp_path / "int8", dataclasses.asdict(gen))
    assert [p.name for p in written] == ["generate.onnx", "generate_batch.onnx"]
    proto = onnx.load(str(written[1]), load_external_data=False)
    [decoder] = [a.g for a in proto.graph.node[-1].attribute if a.name == "decoder"]
    assert [n.op_type for n in decoder.node if "logits" in n.output] == ["DynamicQuantizeMatMul"]
    weights = {t.name: t for t in decoder.initializer}
    kept = [n for n in decoder.node if n.op_type == "MatMulNBits"]
    assert all(weights[n.input[1]].dims[1] > 1 for n in kept)  # only matrices of several blocks a column stay
    assert sum(n.op_type == "DynamicQuantizeMatMul" for n in decoder.node) > 1
    assert not any(len(t.raw_data) >= EXTERNAL_MIN_BYTES for t in decoder.initializer)  # read from decoder.onnx
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    one, many = (ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"]) for p in written)
    graph = GraphSearch(one, many)
    src = _sources()
    steps = greedy_search(_decoder(out), src, gen)
    # One row: generate.onnx, MatMulNBits as in the step graphs (the same translations but near-ties).
    assert_same_but_near_ties(_decoder(out), src, [graph([s], gen)[0] for s in src], steps)
    decoder = _decoder(out)  # ... and the check fails where an output parts from the other for real
    decoder.encode([src[0]], 1)
    unlikely = [int(np.argmin(decoder.step(np.array([1]), None)[0]))] + steps[0]
    with pytest.raises(AssertionError):
        assert_same_but_near_ties(decoder, src, [unlikely] + steps[1:], steps)
    # Many rows: the same int8 weights, activations quantized per call instead of per row block.
    batched = graph(src, gen)
    assert batched == GraphSearch(many)(src, gen)  # more than one row: the many-rows graph
    agree = np.mean([a[:1] == b[:1] for a, b in zip(batched, steps)])
    assert agree >= 0.5
    # Several blocks per output column (d_model 64, blocks of 32): dequantized and quantized
    # again per column, at load; the distribution stays within the rounding of one more step.
    _, paths64, _ = export_tiny(tmp_path / "d64", d_model=64)
    out64 = quantize_blockwise(paths64, tmp_path / "int8_64", node_groups(paths64), block_size=32)
    written = write_generate_graph(tmp_path / "int8_64", dataclasses.asdict(gen))
    proto = onnx.load(str(written[-1]), load_external_data=False)
    [decoder] = [a.g for a in proto.graph.node[-1].attribute if a.name == "decoder"]
    assert [n.op_type for n in decoder.node if "logits" in n.output] == ["DynamicQuantizeMatMul"]
    assert not any(n.op_type == "MatMulNBits" for n in decoder.node)
    many_rows = write_many_rows_decoder(tmp_path / "int8_64")
    plain = _decoder(out64)
    fast = OnnxDecoder(plain.encoder, plain.decoder, pad_id=0,
                       many_rows=ort.InferenceSession(str(many_rows), options, providers=["CPUExecutionProvider"]))
    for d in (plain, fast):
        d.encode(src, 1)
    tokens = np.full(len(src), 1, dtype=np.int64)
    full = plain.step(tokens, None)
    values, ids = fast.step_top_k(tokens, None, 5)
    assert (np.diff(values, axis=1) <= 0).all()  # best first
    assert np.abs(np.take_along_axis(full, ids, 1) - values).max() < 0.1
    assert np.mean(ids[:, 0] == full.argmax(axis=1)) >= 0.75
    # Without scores (greedy search) the graph skips the softmax: the same words, and the values
    # are logits, so they differ from the log-probabilities by one constant per row.
    fast.encode(src, 1)
    logits, raw_ids = fast.step_top_k(tokens, None, 5, scores=False)
    assert (raw_ids == ids).all()
    shift = logits - values
    assert np.abs(shift - shift[:, :1]).max() < 1e-3 and np.abs(shift).max() > 1e-2
