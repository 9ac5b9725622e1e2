"""ONNX export, the torch-free runtime and the shipped package (issue 6)."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from mt_runtime.search import GenerationConfig, beam_search, greedy_search
from mt_runtime.translator import GraphSearch, OnnxDecoder, PackageError, Translator

from model.onnx_export import (
    DecoderGraph,
    EncoderGraph,
    decoder_input_names,
    example_inputs,
    export_onnx,
    optimize_onnx,
    positions_as_formula,
    tie_decoder_embedding,
)
from model.onnx_passes import derive_graphs
from model.onnx_passes.external import EXTERNAL_MIN_BYTES
from model.torch_decoder import TorchDecoder, TorchTranslator
from model.transformer import Transformer, TransformerConfig
from pipeline.corpora.splits import read_split
from pipeline.engine.errors import IntegrityError
from pipeline.export.packages import copy_packages
from pipeline.measure.translators import open_model
from tests.helpers import REPO

NO_PRUNE = "prune=null"  # the smoke student is then the final model: node export.student


def tiny_uneven(pre_ln: bool, embed_dim: int | None = None) -> Transformer:
    torch.manual_seed(3)
    cfg = TransformerConfig(
        vocab_size=61,
        d_model=24,
        head_dim=6,
        enc_heads=[4, 1, 3],
        dec_self_heads=[2, 3],
        dec_cross_heads=[1, 4],
        enc_ffn=[16, 40, 8],
        dec_ffn=[32, 12],
        dropout=0.1,
        pre_ln=pre_ln,
        activation="gelu" if pre_ln else "relu",
        max_positions=64,
        embed_dim=embed_dim,
    )
    model = Transformer(cfg).eval()
    with torch.no_grad():  # larger weights than the init gives sharper, more decisive outputs
        for p in model.parameters():
            p.mul_(1.5)
    return model


@pytest.fixture(
    scope="module",
    params=[(False, True, None), (True, True, None), (False, False, None), (False, True, 10)],
    ids=["post_ln", "pre_ln", "post_ln-standard_ops", "factorised_table"],
)
def exported(request, tmp_path_factory):
    pre_ln, fused, embed_dim = request.param
    model = tiny_uneven(pre_ln, embed_dim)
    folder = tmp_path_factory.mktemp("onnx")
    paths = export_onnx(model, folder, fused=fused)
    attention_nodes = {
        name: [n for n in onnx.load(str(path)).graph.node if n.op_type == "MultiHeadAttention"]
        for name, path in paths.items()
    }
    if fused:  # one node per attention: encoder self; decoder self and cross
        assert len(attention_nodes["encoder"]) == model.cfg.encoder_layers
        assert len(attention_nodes["decoder"]) == 2 * model.cfg.decoder_layers
        assert {n.domain for nodes in attention_nodes.values() for n in nodes} == {"com.microsoft"}
    else:  # standard ONNX only, for runtimes without onnxruntime's contrib ops
        assert all(n.domain in ("", "ai.onnx") for p in paths.values() for n in onnx.load(str(p)).graph.node)
    for name, path in paths.items():
        optimize_onnx(path, folder / f"{name}_opt.onnx")
    # As the export stage does: the decoder's token lookup reads the output projection's weight.
    assert tie_decoder_embedding(folder / "decoder_opt.onnx")
    tables = [
        i
        for i in onnx.load(str(folder / "decoder_opt.onnx")).graph.initializer
        if sorted(i.dims) == sorted([model.cfg.vocab_size, model.cfg.embed_dim or model.cfg.d_model])
    ]
    assert len(tables) == 1  # one copy of the tied embedding (a factorised one: vocab x embed_dim), not two
    for name in paths:  # the position table becomes the nodes that compute it: smaller, same values
        before = (folder / f"{name}_opt.onnx").stat().st_size
        assert positions_as_formula(folder / f"{name}_opt.onnx", model.cfg.d_model)
        assert (folder / f"{name}_opt.onnx").stat().st_size < before - 0.5 * 4 * 64 * model.cfg.d_model
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    sessions = {
        name: ort.InferenceSession(str(folder / f"{name}_opt.onnx"), options, providers=["CPUExecutionProvider"])
        for name in paths
    }
    return model, sessions


def test_export_matches_pytorch_on_random_inputs(exported):
    model, sessions = exported
    names = decoder_input_names(model)
    assert not model.training  # exporting must not switch dropout back on
    for batch, src_len, past_len, past_batch in [(1, 3, 0, 1), (3, 9, 5, 4), (8, 17, 1, 8)]:
        ex = example_inputs(model, batch, src_len, past_len, seed=batch, past_batch=past_batch)
        with torch.no_grad():
            ref_cross = EncoderGraph(model)(ex["src_ids"])
            ref = DecoderGraph(model)(*(ex[n] for n in names))
        cross = sessions["encoder"].run(None, {"src_ids": ex["src_ids"].numpy()})
        out = sessions["decoder"].run(None, {n: ex[n].numpy() for n in names})
        for r, o in zip(ref_cross, cross):
            assert r.shape == o.shape and np.allclose(r.numpy(), o, rtol=1e-4, atol=1e-4)
        assert out[0].shape == (batch, model.cfg.vocab_size)
        assert np.abs(ref[0].numpy() - out[0]).max() < 1e-4
        for i, heads in enumerate(model.cfg.dec_self_heads):  # uneven heads per layer, cache grows by one
            assert out[1 + 2 * i].shape == (batch, heads, past_len + 1, model.cfg.head_dim)
            assert np.allclose(ref[1 + 2 * i].numpy(), out[1 + 2 * i], rtol=1e-4, atol=1e-4)


def test_decoder_steps_attend_at_scale_one_and_the_model_is_left_as_it_was(tmp_path):
    """A step's self-attention takes queries already divided by sqrt(head_dim) and runs at scale 1
    (MLAS's one-row product); the cross-attention and the encoder keep the op's own scale. The
    export scales the query weights in place for the trace and puts them back to the bit."""
    model = tiny_uneven(pre_ln=False)
    before = {name: t.clone() for name, t in model.state_dict().items()}
    paths = export_onnx(model, tmp_path)
    assert all(torch.equal(before[name], t) for name, t in model.state_dict().items())
    scales = {}
    for name, path in paths.items():
        for node in onnx.load(str(path)).graph.node:
            if node.op_type == "MultiHeadAttention":
                scale = [onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == "scale"]
                scales[node.name] = scale[0] if scale else None
    layers = range(model.cfg.decoder_layers)
    assert {n: s for n, s in scales.items() if "self_attn" in n} == {
        f"/decoder.{i}/self_attn/CachedSelfAttention": 1.0 for i in layers
    }
    assert all(s is None for n, s in scales.items() if "self_attn" not in n)  # cross and encoder
    assert len(scales) == model.cfg.encoder_layers + 2 * model.cfg.decoder_layers


def test_greedy_and_beam_identical_to_pytorch(exported):
    model, sessions = exported
    onnx_decoder = OnnxDecoder(sessions["encoder"], sessions["decoder"], pad_id=model.cfg.pad_id)
    torch_decoder = TorchDecoder(model)
    rng = np.random.default_rng(0)
    src = [[int(t) for t in rng.integers(4, 61, n)] + [2] for n in (3, 11, 1, 7)]
    gen = GenerationConfig(beam=3, max_len_a=1.0, max_len_b=4, max_positions=64)
    assert beam_search(onnx_decoder, src, gen) == beam_search(torch_decoder, src, gen)
    assert greedy_search(onnx_decoder, src, gen) == greedy_search(torch_decoder, src, gen)
    assert [greedy_search(onnx_decoder, [s], gen)[0] for s in src] == greedy_search(torch_decoder, src, gen)


@pytest.mark.parametrize("fused", [True, False], ids=["fused_attention", "standard_ops"])
def test_generate_graph_search_matches_python_search(tmp_path, fused):
    """generate.onnx (onnxruntime's BeamSearch op around our two graphs) against mt_runtime/search.py
    on a model whose layers all have different head counts (the op's first cache has the heads
    of the first cross-attention layer: 1 here, 2 and 3 in the self-attention layers)."""
    model = tiny_uneven(pre_ln=False)
    export_onnx(model, tmp_path, fused=fused)
    gen = GenerationConfig(beam=3, max_len_a=1.0, max_len_b=4, max_positions=64)
    assert "generate.onnx" in derive_graphs(tmp_path, dataclasses.asdict(gen))  # float, no shortlist: no generate_batch
    assert not (tmp_path / "generate_batch.onnx").exists()
    proto = onnx.load(str(tmp_path / "generate.onnx"), load_external_data=False)
    subgraphs = [a.g for a in proto.graph.node[-1].attribute if a.type == onnx.AttributeProto.GRAPH]
    external = [t for g in subgraphs for t in g.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    embedded = [t for g in subgraphs for t in g.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
    # No second copy of the weights: the big tensors are read from the step graphs' files.
    assert {e.value for t in external for e in t.external_data if e.key == "location"} == {
        "encoder.onnx",
        "decoder.onnx",
    }
    assert max(len(t.raw_data) for t in embedded) < EXTERNAL_MIN_BYTES
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    graph = GraphSearch(
        ort.InferenceSession(str(tmp_path / "generate.onnx"), options, providers=["CPUExecutionProvider"])
    )
    torch_decoder = TorchDecoder(model)
    rng = np.random.default_rng(0)
    src = [[int(t) for t in rng.integers(4, 61, n)] + [2] for n in (3, 11, 1, 7, 5, 9)]
    greedy = dataclasses.replace(gen, beam=1)
    expected = greedy_search(torch_decoder, src, greedy)
    assert graph(src, greedy) == expected  # a padded batch: masks and per-sentence length limits
    assert [graph([s], greedy)[0] for s in src] == expected
    # Beam search one sentence at a time: in a batch the op has one length limit, the longest
    # sentence's, and this untrained model runs every hypothesis to its limit (batched beam search
    # on real sentences: test_onnx_translator_matches_torch_translator).
    assert [graph([s], gen)[0] for s in src] == beam_search(torch_decoder, src, gen)


# ------------------------------------------------------------------- through the smoke recipe
@pytest.fixture(scope="module")
def export_artifact(smoke):
    store, arts = smoke.build("export", NO_PRUNE)
    return store, arts


@pytest.mark.slow
def test_export_stage_parity_and_packages(export_artifact):
    _, arts = export_artifact
    art = arts["export.student"]
    m = art.metrics
    assert m["parity_max_abs_diff"] < 1e-4
    assert m["greedy_identical"] == m["beam_identical"] == "20/20"
    assert m["parity"]["fp16"]["finite"] and m["parity"]["fp16"]["max_abs_diff"] < 0.05
    assert set(m["packages"]) == {"fp32", "fp16"}
    assert m["packages"]["fp16"]["onnx_bytes"] < 0.75 * m["packages"]["fp32"]["onnx_bytes"]
    package = json.loads((art.path / "fp32" / "package.json").read_text())
    assert {
        "encoder.onnx",
        "decoder.onnx",
        "generate.onnx",
        "tokenizer.json",
        "generation.json",
        "MODEL_CARD.md",
    } <= set(package["files"])
    # The runtime is named, not copied (format 2): mt-runtime's minor series.
    assert package["format"] == "mt-onnx-package/2.1" and package["runtime"] == "mt-runtime>=0.4,<0.5"
    assert not any(name.endswith(".py") for name in package["files"])
    # generate.onnx: the search inside onnxruntime, greedy token-for-token ours, no copy of the weights
    graph = m["parity"]["fp32"]["graph_search"]
    assert graph["greedy_identical"] == "20/20" and graph["greedy_sentences_per_s"] > 0
    files = package["files"]
    assert files["generate.onnx"]["bytes"] < 0.5 * (files["encoder.onnx"]["bytes"] + files["decoder.onnx"]["bytes"])
    assert package["onnx_bytes"] == sum(
        files[g]["bytes"]
        for g in (
            "encoder.onnx",
            "decoder.onnx",
            "generate.onnx",
            "decoder_batch.onnx",
            "decoder_greedy.onnx",
            "decoder_greedy_inplace.onnx",
        )
    )
    assert "generate.onnx" not in json.loads((art.path / "fp16" / "package.json").read_text())["files"]
    assert Translator(art.path / "fp32").search == "graph" and Translator(art.path / "fp16").search == "python"
    card = (art.path / "fp32" / "MODEL_CARD.md").read_text()
    for name in ("src_ids", "cache_index", "past_k_0", "present_v_0", "log_probs", "cross_k_0"):
        assert f"`{name}`" in card
    # The card says which onnxruntime-only operators the graphs use.
    assert m["fused_attention"] and "MultiHeadAttention" in card and "fused_attention: false" in card


@pytest.mark.slow
def test_onnx_translator_matches_torch_translator(export_artifact):
    _, arts = export_artifact
    src, _ = read_split(arts["data"].path, "valid")
    onnx = open_model(arts["export.student"].path / "fp32", threads=1)
    torch_t = open_model(arts["student"].path)
    assert onnx.runtime == "onnxruntime" and isinstance(torch_t, TorchTranslator)
    assert onnx.search == "graph"
    steps = Translator(arts["export.student"].path / "fp32", threads=1, search="python")
    for beam in (1, 3):
        assert onnx.translate(src[:8], beam=beam) == torch_t.translate(src[:8], beam=beam)
        assert steps.translate(src[:8], beam=beam) == torch_t.translate(src[:8], beam=beam)
    assert onnx.translate(["", "  "]) == ["", ""]


@pytest.mark.slow
def test_a_generate_graph_that_does_not_load_falls_back_to_the_step_graphs(export_artifact, monkeypatch):
    _, arts = export_artifact
    package = arts["export.student"].path / "fp32"
    src, _ = read_split(arts["data"].path, "valid")
    expected = Translator(package, threads=1).translate(src[:4], beam=2)

    def unknown_op(*args, **kwargs):
        raise RuntimeError("Could not find an implementation for BeamSearch(1) node with name 'search'")

    monkeypatch.setattr(GraphSearch, "load", unknown_op)
    with pytest.warns(UserWarning, match="generate.onnx does not load.*step graphs"):
        t = Translator(package, threads=1)
    assert t.search == "python" and t.translate(src[:4], beam=2) == expected
    with pytest.raises(PackageError, match="BeamSearch"):
        Translator(package, threads=1, search="graph")


@pytest.mark.slow
def test_runtime_runs_without_torch(export_artifact, tmp_path):
    """The copied package and mt-runtime alone (model/runtime/), in a process where importing
    torch, onnx or anything of the pipeline fails."""
    _, arts = export_artifact
    [dest] = copy_packages(arts["export.student"], tmp_path / "shipped", "fp32")
    src, _ = read_split(arts["data"].path, "valid")
    expected = open_model(arts["student"].path).translate(src[:5], beam=2)
    script = (
        "import sys, json\n"
        "for name in ('torch', 'onnx', 'model', 'pipeline'):\n"
        "    sys.modules[name] = None  # any import of it now raises ImportError\n"
        f"sys.path.insert(0, {str(REPO / 'model' / 'runtime')!r})\n"
        "import mt_runtime\n"
        f"assert mt_runtime.__file__.startswith({str(REPO / 'model' / 'runtime')!r}), mt_runtime.__file__\n"
        "from mt_runtime import Translator\n"
        f"t = Translator({str(dest)!r}, threads=1)\n"
        f"print(json.dumps(t.translate(json.loads(sys.argv[1]), beam=2)))\n"
        "assert not any(m == 'torch' or m.startswith('torch.') for m in sys.modules if sys.modules[m])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(src[:5])],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == expected


def test_model_runtime_module_does_not_import_torch():
    done = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['torch'] = None; import mt_runtime.translator"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_package_with_a_flipped_byte_is_refused(export_artifact, tmp_path):
    _, arts = export_artifact
    package = tmp_path / "fp32"
    shutil.copytree(arts["export.student"].path / "fp32", package)
    Translator(package)  # intact: loads
    data = bytearray((package / "decoder.onnx").read_bytes())
    data[len(data) // 2] ^= 0x01
    (package / "decoder.onnx").write_bytes(bytes(data))
    with pytest.raises(PackageError, match="decoder.onnx"):
        Translator(package)
    with pytest.raises(IntegrityError, match="decoder.onnx"):
        open_model(package)


@pytest.mark.slow
def test_cuda_request_falls_back_to_cpu_without_a_gpu(export_artifact):
    _, arts = export_artifact
    if "CUDAExecutionProvider" in ort.get_available_providers() and torch.cuda.is_available():
        pytest.skip("a GPU is present: the fallback path is not taken")
    with pytest.warns(UserWarning, match="CUDA"):
        t = Translator(arts["export.student"].path / "fp32", device="cuda", threads=1)
    assert t.device == "cpu" and t.providers == ["CPUExecutionProvider"]
    assert (
        t.translate(["A dog runs."], beam=2)[0]
        == Translator(arts["export.student"].path / "fp32", threads=1).translate(["A dog runs."], beam=2)[0]
    )


@pytest.mark.slow
def test_export_package_cli(export_artifact, tmp_path):
    from tests.helpers import cli

    store, arts = export_artifact
    done = cli("export-package", arts["export.student"].id, str(tmp_path / "out"), store=store.root)
    assert done.returncode == 0, done.stderr.decode()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["fp16", "fp32"]
    assert Translator(tmp_path / "out" / "fp16", threads=1).translate(["Two dogs play."], beam=1)[0] is not None


def test_failing_parity_fails_the_stage():
    from pipeline.engine.errors import StageFailed
    from pipeline.measure.parity import enforce_parity
    from pipeline.stages.export import ParityConfig

    good = {
        "finite": True,
        "max_abs_diff": 2e-6,
        "worst_case": "batch 8",
        "greedy_identical": "20/20",
        "beam_identical": "20/20",
        "greedy_mismatches": [],
        "beam_mismatches": [],
    }
    limits = ParityConfig(max_abs_diff=1e-4)
    enforce_parity("fp32", good, limits)
    with pytest.raises(StageFailed, match=re.escape("max |log p difference| 0.003 > 0.0001")):
        enforce_parity("fp32", {**good, "max_abs_diff": 3e-3}, limits)
    with pytest.raises(StageFailed, match="beam outputs identical to PyTorch on only 19/20"):
        enforce_parity("fp32", {**good, "beam_identical": "19/20", "beam_mismatches": [7]}, limits)
    enforce_parity(
        "fp16", {**good, "max_abs_diff": 3e-3, "beam_mismatches": [7]}, limits
    )  # half precision: recorded only
    with pytest.raises(StageFailed, match="non-finite"):
        enforce_parity("fp16", {**good, "finite": False}, limits)


@pytest.mark.parametrize("pre_ln", [False, True])
def test_the_float32_encoder_runs_layer_norm_unfused_with_the_same_outputs(tmp_path, pre_ln):
    """fp32 graphs take SkipLayerNormalization apart (the standard ops were 3-4x faster on many
    rows, and the decoder's one-row and many-row graphs must run the same nodes): same outputs as
    the fused graph and as PyTorch; the decoder's residuals as Sum, which onnxruntime keeps apart."""
    from pipeline.export.float_graphs import float32_graphs, variant_graphs

    model = tiny_uneven(pre_ln=pre_ln)
    fused, _ = float32_graphs(model, tmp_path)
    fp32, done = variant_graphs(fused, "fp32", tmp_path, model.cfg.d_model)
    ops = {
        name: [n.op_type for n in onnx.load(str(path)).graph.node]
        for name, path in (("fused", fused["encoder"]), ("fp32", fp32["encoder"]), ("decoder", fp32["decoder"]))
    }
    assert done["layer_norms_unfused"]["encoder"] == ops["fused"].count("SkipLayerNormalization") > 0
    assert "SkipLayerNormalization" not in ops["fp32"] and "LayerNormalization" in ops["fp32"]
    assert "SkipLayerNormalization" not in ops["decoder"] and "Sum" in ops["decoder"]
    assert done["layer_norms_unfused"]["decoder"] == ops["decoder"].count("Sum") > 0
    src = torch.tensor([[5, 9, 14, 22, 2], [7, 11, 2, 0, 0]])
    with torch.no_grad():
        want = [t.numpy() for t in EncoderGraph(model)(src)]
    for path in (fused["encoder"], fp32["encoder"]):
        got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"src_ids": src.numpy()})
        for a, b in zip(got, want):  # values up to ~7: float32 rounding differs by CPU (2.03e-5 on an EPYC)
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-5)
