"""CTranslate2 peer: a converted model computes what ours computes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

ctranslate2 = pytest.importorskip("ctranslate2")


from model.ctranslate2_export import (  # noqa: E402
    NotConvertible,
    PeerTranslator,
    compare_greedy,
    export_ctranslate2,
)
from model.subword_training import train_subword  # noqa: E402
from model.transformer import Transformer, TransformerConfig, save_model  # noqa: E402
from tests.helpers import multi30k_head  # noqa: E402


@pytest.fixture(scope="module")
def corpus(data_dir):
    en, fr = multi30k_head(data_dir, "en"), multi30k_head(data_dir, "fr")
    return en, train_subword(en + fr, vocab_size=200)


def tiny_model(tmp_path, tokenizer, pre_ln=False, activation="relu", heads=(3, 3, 3), seed=0, embed_dim=None):
    """A randomly initialised model (biases and norms jittered so no layer is an identity),
    with heads x head_dim != d_model and uneven FFN widths, which the converter must handle."""
    torch.manual_seed(seed)
    cfg = TransformerConfig(
        vocab_size=tokenizer.vocab_size,
        d_model=32,
        head_dim=8,
        enc_heads=[heads[0]] * 2,
        dec_self_heads=[heads[1]] * 2,
        dec_cross_heads=[heads[2]] * 2,
        enc_ffn=[64, 48],
        dec_ffn=[40, 64],
        activation=activation,
        pre_ln=pre_ln,
        max_positions=64,
        pad_id=tokenizer.pad_id,
        bos_id=tokenizer.bos_id,
        eos_id=tokenizer.eos_id,
        embed_dim=embed_dim,
    )
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    folder = tmp_path / "model"
    save_model(model, folder)
    tokenizer.save(folder / "tokenizer.json")
    return model.eval(), folder


@pytest.mark.parametrize(
    "pre_ln,activation,embed_dim", [(False, "relu", None), (True, "gelu", None), (False, "relu", 12)]
)
def test_float32_conversion_reproduces_our_model(tmp_path, corpus, pre_ln, activation, embed_dim):
    sentences, tokenizer = corpus
    model, folder = tiny_model(tmp_path, tokenizer, pre_ln, activation, embed_dim=embed_dim)
    out = tmp_path / "ct2"
    meta = export_ctranslate2(folder, out, "float32")
    assert meta["heads"] == 18 and (out / "model.bin").stat().st_size == meta["model_bytes"]

    # Same greedy token ids, sentence by sentence (length limits included).
    check = compare_greedy(folder, out, sentences[:8])
    assert check["identical"] == check["sentences"] == 8, check["mismatches"]

    # Same log-probabilities when both score a given target (teacher forcing).
    peer = PeerTranslator(out, threads=1)
    src, tgt = peer.pieces([sentences[10]]), peer.pieces(["Un homme fait du vélo dans la rue."])
    theirs = peer.model.score_batch(src, tgt)[0].log_probs
    src_ids = [peer.vocab[p] for p in src[0]] + [tokenizer.eos_id]
    tgt_ids = [peer.vocab[p] for p in tgt[0]]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([src_ids]), torch.tensor([[tokenizer.bos_id] + tgt_ids])), -1)[0]
    ours = [logp[i, t].item() for i, t in enumerate(tgt_ids + [tokenizer.eos_id])]
    assert np.allclose(ours, theirs, atol=1e-4)

    # Text in, text out, through our batching: same text as one sentence at a time.
    batched = peer.translate(sentences[:6] + [""], beam=1, max_batch=4)
    assert batched[-1] == "" and batched[:6] == [peer.translate([s], beam=1)[0] for s in sentences[:6]]


def test_int8_conversion_is_smaller_and_translates(tmp_path, corpus):
    sentences, tokenizer = corpus
    _, folder = tiny_model(tmp_path, tokenizer)
    fp32 = export_ctranslate2(folder, tmp_path / "fp32", "float32")
    int8 = export_ctranslate2(folder, tmp_path / "int8", "int8")
    assert int8["model_bytes"] < 0.6 * fp32["model_bytes"]
    out = PeerTranslator(tmp_path / "int8", threads=1, compute_type="int8").translate(sentences[:3], beam=2)
    assert len(out) == 3 and all(isinstance(s, str) for s in out)


def test_uneven_heads_are_refused_or_padded_with_zero_heads(tmp_path, corpus):
    sentences, tokenizer = corpus
    _, folder = tiny_model(tmp_path, tokenizer)
    # Uneven heads, as pruning leaves them.
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(enc_heads=[3, 1], dec_self_heads=[2, 3], dec_cross_heads=[3, 1])
    pruned = Transformer(TransformerConfig.from_dict(cfg)).eval()
    with torch.no_grad():
        for p in pruned.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    save_model(pruned, tmp_path / "pruned")
    tokenizer.save(tmp_path / "pruned" / "tokenizer.json")

    with pytest.raises(NotConvertible, match="one head count for every layer"):
        export_ctranslate2(tmp_path / "pruned", tmp_path / "ct2", "float32")
    assert not (tmp_path / "ct2").exists()

    meta = export_ctranslate2(tmp_path / "pruned", tmp_path / "ct2", "float32", pad_heads=True)
    assert meta["heads"] == 13 and meta["heads_computed"] == 3 * 2 + 2 * 3 * 2
    check = compare_greedy(tmp_path / "pruned", tmp_path / "ct2", sentences[:6])
    assert check["identical"] == check["sentences"] == 6, check["mismatches"]


def test_ours_and_ctranslate2_are_timed_in_one_process_point_by_point(tmp_path, corpus):
    """benchmark.versus: our package and the converted model, same weights, same threads, taking
    turns batch by batch at every (batch, beam); one verdict per point, from the rounds' ratios."""
    from pipeline.export.package_builder import build_package
    from pipeline.measure.jobs import Engine, VersusJob
    from pipeline.measure.versus import measure_versus

    sentences, tokenizer = corpus
    model, folder = tiny_model(tmp_path, tokenizer)
    build_package(model, "fp32", tmp_path / "fp32", tokenizer=folder / "tokenizer.json", work=tmp_path / "work")
    export_ctranslate2(folder, tmp_path / "ct2", "float32")
    ours = Engine("onnxruntime", "cpu", "float32", str(tmp_path / "fp32"), 1)
    theirs = Engine("ctranslate2", "cpu", "float32", str(tmp_path / "ct2"), 1)
    job = VersusJob(ours, theirs, 1, sentences[:10], [[1, 1], [4, 2]], 2, None)
    result = measure_versus(job)
    assert result["search"] == {"one_sentence": "graph", "batches": "python"} and result["sentences"] == 10
    greedy, beam = result["points"]
    assert (greedy["batch"], greedy["beam"], beam["batch"], beam["beam"]) == (1, 1, 4, 2)
    for point in (greedy, beam):
        ours, theirs = point["ours_sent_per_s"], point["ctranslate2_sent_per_s"]
        assert ours > 0 and theirs > 0 and len(point["round_ratios"]) == 2  # a ratio per round, in the same round
        assert point["ratio"] == pytest.approx(min(point["round_ratios"]), abs=1e-3)  # their median (the lower of 2)
        # the figures are that round's, to their rounding: the ratio to 3 decimals (2.6e-3 of 0.189), the
        # sentences/s to 2
        assert ours / theirs == pytest.approx(point["ratio"], rel=2e-3, abs=1e-3)
        assert point["met"] == (point["ratio"] >= 1) and "[rounds " in point["verdict"]
        assert ("ours faster" if point["met"] else "CTranslate2 faster") in point["verdict"]
    assert greedy["verdict"].startswith("greedy, batch 1: ours ") and " ms a sentence" in greedy["verdict"]
    assert beam["verdict"].startswith("beam 2, batch 4: ours ") and "sentences/s" in beam["verdict"]


def test_each_side_is_also_timed_alone_in_a_process_of_its_own(tmp_path, corpus):
    """benchmark.versus's separate processes: each side in a fresh process where the other runtime
    is not even imported, on the same sentences, points and rounds; each point's figure is that
    side's median round, the separate ratio ours / theirs, and best against best is read from both."""
    import os
    import statistics

    from pipeline.export.package_builder import build_package
    from pipeline.measure.peers import versus_ctranslate2
    from pipeline.measure.rows import BenchmarkRow
    from tests.helpers import QuietContext

    sentences, tokenizer = corpus
    model, folder = tiny_model(tmp_path, tokenizer)
    build_package(model, "fp32", tmp_path / "fp32", tokenizer=folder / "tokenizer.json", work=tmp_path / "work")
    export_ctranslate2(folder, tmp_path / "ct2", "float32")
    common = {"device": "cpu", "compute_type": "float32", "source": "student", "threads": 1}
    ours = BenchmarkRow("student_onnx", "student", "onnxruntime", folder=str(tmp_path / "fp32"), **common)
    peer = BenchmarkRow("ctranslate2_student_float32", "student", "ctranslate2", folder=str(tmp_path / "ct2"), **common)
    points = [[1, 1], [4, 1]]
    ctx = QuietContext(tmp_path / "jobs")
    by_row = versus_ctranslate2(ctx, [ours, peer], sentences[:10], "student", points, 2, 3, [1])

    versus = by_row["student_onnx"]
    together, alone = versus["by_threads"]["1"], versus["separate"]["by_threads"]["1"]
    assert versus["separate"]["rounds"] == 3 and together["rounds"] == 2
    mine, theirs = alone["ours"], alone["ctranslate2"]
    assert len({os.getpid(), together["pid"], mine["pid"], theirs["pid"]}) == 4  # three fresh processes
    assert together["runtimes_loaded"] == ["onnxruntime", "ctranslate2"]
    assert mine["runtimes_loaded"] == ["onnxruntime"] and theirs["runtimes_loaded"] == ["ctranslate2"]
    assert (mine["runtime"], theirs["runtime"], mine["sentences"], theirs["sentences"]) == (
        "onnxruntime",
        "ctranslate2",
        10,
        10,
    )
    for side in (mine, theirs):
        assert [(p["batch"], p["beam"]) for p in side["points"]] == [(1, 1), (4, 1)]
        for p in side["points"]:
            assert len(p["round_sent_per_s"]) == 3 and p["sent_per_s"] == pytest.approx(
                statistics.median(p["round_sent_per_s"]), abs=0.01
            )
    for p, a, b in zip(alone["points"], mine["points"], theirs["points"]):
        assert p["ratio"] == pytest.approx(a["sent_per_s"] / b["sent_per_s"], abs=1e-3)
        assert p["met"] == (p["ratio"] >= 1)
    # One thread count: best against best is each side at 1 thread, taking turns as the one-process
    # point says, and alone as the separate point says.
    for best, same in zip(versus["best"]["interleaved"], together["points"]):
        assert (best["ours_threads"], best["ctranslate2_threads"], best["same_process"]) == (1, 1, True)
        assert best["ratio"] == same["ratio"] and "at 1 thread, CTranslate2 " in best["verdict"]
        assert set(same["median_sent_per_s"]) == {"ours", "ctranslate2"}
    assert [p["ratio"] for p in versus["best"]["separate"]] == [p["ratio"] for p in alone["points"]]
