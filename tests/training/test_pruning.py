"""Head / neuron importance and physical pruning (model/pruning.py) on small real Transformers."""

from __future__ import annotations

import pytest
import torch
from mt_runtime.search import GenerationConfig, beam_search, greedy_search

from model import pruning
from model.torch_decoder import TorchDecoder
from model.transformer import Transformer, TransformerConfig, load_model, save_model

VOCAB = 60


def tiny(pre_ln: bool = False, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    cfg = TransformerConfig(
        vocab_size=VOCAB,
        d_model=24,
        head_dim=6,
        enc_heads=[4, 4, 3],
        dec_self_heads=[4, 2],
        dec_cross_heads=[4, 4],
        enc_ffn=[40, 40, 40],
        dec_ffn=[32, 48],
        dropout=0.1,
        pre_ln=pre_ln,
        max_positions=64,
    )
    return Transformer(cfg).eval()


def batch(seed: int = 1, rows: int = 3):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, VOCAB, (rows, 9), generator=g)
    tgt = torch.randint(3, VOCAB, (rows, 8), generator=g)
    src[0, 6:] = 0  # some padding, so masks matter
    src[0, 5] = 2
    tgt_in = torch.cat([torch.ones(rows, 1, dtype=torch.long), tgt[:, :-1]], 1)
    return src, tgt_in, tgt


def some_plans(model):
    heads = {"enc_self": [[0, 3], [], [1]], "dec_self": [[2], [0]], "dec_cross": [[1, 2, 3], [0]]}
    neurons = {"enc_ffn": [list(range(0, 40, 3)), [], [5]], "dec_ffn": [[0, 31], list(range(20))]}
    return heads, neurons


def incremental_logits(model, src, tgt_in):
    """Logits of every position through the cached decode path (what search uses)."""
    memory, mask = model.encode(src)
    cross, past, out = model.cross_kv(memory), None, []
    for t in range(tgt_in.shape[1]):
        logits, past = model.decode_step(tgt_in[:, t : t + 1], cross, mask, past)
        out.append(logits)
    return torch.stack(out, 1)


@pytest.mark.parametrize("pre_ln", [False, True])
def test_pruning_equals_gating_to_zero(pre_ln):
    model = tiny(pre_ln)
    src, tgt_in, _ = batch()
    heads, neurons = some_plans(model)
    with torch.no_grad():
        pruning.gate_off(model, heads, neurons)
        gated = model(src, tgt_in), incremental_logits(model, src, tgt_in)
        pruning.clear_gates(model)
        before = model.num_parameters()
        pruning.prune_heads(model, heads)
        pruning.prune_neurons(model, neurons)
        pruned = model(src, tgt_in), incremental_logits(model, src, tgt_in)
    for a, b in zip(gated, pruned):
        # Same arithmetic on fewer terms: equal up to float summation order.
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert model.cfg.enc_heads == [2, 4, 2] and model.cfg.dec_self_heads == [3, 1]
    assert model.cfg.dec_cross_heads == [1, 3] and model.cfg.enc_ffn == [26, 40, 39] and model.cfg.dec_ffn == [30, 28]
    removed_heads, removed_neurons = 9, 14 + 1 + 2 + 20
    d, hd = 24, 6
    # Per head: Q, K, V rows (weights and biases) and the output's input columns.
    per_head, per_neuron = 3 * hd * d + 3 * hd + hd * d, 2 * d + 1
    assert before - model.num_parameters() == removed_heads * per_head + removed_neurons * per_neuron
    attn = model.decoder[0].cross_attn
    assert (attn.heads, attn.q.out_features, attn.kv.out_features, attn.out.in_features) == (1, 6, 12, 6)


def test_uneven_heads_round_trip_and_decode(tmp_path):
    model = tiny()
    heads, neurons = some_plans(model)
    pruning.prune_heads(model, heads)
    pruning.prune_neurons(model, neurons)
    save_model(model, tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    assert loaded.cfg == model.cfg
    src, tgt_in, _ = batch(seed=3)
    with torch.no_grad():
        assert torch.equal(model(src, tgt_in), loaded(src, tgt_in))
    cfg = model.cfg
    sources = [[5, 9, 17, 2], [7, 7, 30, 12, 44, 2], [3, 2]]
    for beam in (1, 3):
        gen = GenerationConfig(
            beam=beam, bos_id=cfg.bos_id, eos_id=cfg.eos_id, pad_id=cfg.pad_id, max_positions=cfg.max_positions
        )
        search = greedy_search if beam == 1 else beam_search
        a = search(TorchDecoder(model), sources, gen)
        b = search(TorchDecoder(loaded), sources, gen)
        assert a == b and len(a) == 3 and all(isinstance(t, int) for seq in a for t in seq)


def test_importance_shapes_normalisation_and_dead_heads():
    model = tiny()
    # A head whose output is thrown away cannot matter: its gradient is exactly zero.
    with torch.no_grad():
        model.encoder[1].attn.out.weight[:, 2 * 6 : 3 * 6] = 0.0
        model.decoder[0].ffn.fc2.weight[:, 7] = 0.0
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    heads, neurons, used = pruning.importance(model, [batch(1), batch(2)], neurons=True)
    assert used == 2
    assert {k: [len(s) for s in v] for k, v in heads.items()} == pruning.head_counts(model)
    assert {k: [len(s) for s in v] for k, v in neurons.items()} == pruning.ffn_widths(model)
    assert heads["enc_self"][1][2] == 0.0 and neurons["dec_ffn"][0][7] == 0.0
    assert all(bool((s >= 0).all()) for layers in heads.values() for s in layers)
    # Measuring leaves the model as it was: no gates, no weight change, no .grad.
    for mods in pruning.attention_modules(model).values():
        assert all(m.head_gate is None for m in mods)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in weights.items())
    assert all(p.grad is None for p in model.parameters())

    normed = pruning.normalize_per_layer(heads)
    for kind, layers in normed.items():
        for raw, s in zip(heads[kind], layers):
            assert torch.linalg.vector_norm(s).item() == pytest.approx(1.0, abs=1e-6)
            assert torch.equal(torch.argsort(raw), torch.argsort(s))  # same order within the layer
    again = pruning.ranking_scores(heads, "layer")
    assert all(torch.equal(a, b) for kind in normed for a, b in zip(normed[kind], again[kind]))
    assert pruning.ranking_scores(heads, "none") is heads
    for normalize in ("none", "layer"):
        table = pruning.importance_table(heads, normalize)
        assert len(table) == model.cfg.total_heads()
        assert set(table[0]) == {"layer", "kind", "head", "score", "raw", "normalized"}
        assert {r["kind"] for r in table} == set(pruning.HEAD_KINDS)
        for row in table:
            assert row["score"] == row["raw" if normalize == "none" else "normalized"]
            assert row["raw"] == pytest.approx(heads[row["kind"]][row["layer"]][row["head"]].item(), rel=1e-5)
        row = next(r for r in table if (r["kind"], r["layer"], r["head"]) == ("enc_self", 1, 2))
        assert row["score"] == row["raw"] == row["normalized"] == 0.0


def test_importance_is_the_loss_gradient():
    """E|dL/dgate| for one batch is |dL/dgate|: check it against a finite difference on the gate."""
    model = tiny()
    src, tgt_in, tgt_out = batch()
    heads, _, _ = pruning.importance(model, [(src, tgt_in, tgt_out)])

    def loss_with_gate(value):
        pruning.gate_off(model)
        model.decoder[1].cross_attn.head_gate[3] = value
        with torch.no_grad():
            logits = model(src, tgt_in, tgt_out)
        pruning.clear_gates(model)
        return torch.nn.functional.cross_entropy(logits.double(), tgt_out[tgt_out != 0]).item()

    eps = 1e-2
    numeric = abs(loss_with_gate(1 + eps) - loss_with_gate(1 - eps)) / (2 * eps)
    assert heads["dec_cross"][1][3].item() == pytest.approx(numeric, rel=0.05, abs=1e-4)


def scores(**layers):
    return {kind: [torch.tensor(s, dtype=torch.float32) for s in per_layer] for kind, per_layer in layers.items()}


def test_min_heads_per_layer_is_kept():
    s = scores(enc_self=[[0.1, 0.2, 0.3, 0.9], [0.5, 0.6, 0.7, 0.8]], dec_self=[[0.01, 0.02]])
    plan = pruning.select_lowest(s, remove=100, min_per_layer=1)
    assert [len(x) for x in plan["enc_self"]] == [3, 3] and plan["dec_self"] == [[0]]
    plan = pruning.select_lowest(s, remove=100, min_per_layer=2)
    assert plan["enc_self"] == [[0, 1], [0, 1]] and plan["dec_self"] == [[]]
    plan = pruning.select_lowest(s, remove=100, min_per_layer=2, ranking="uniform")
    assert plan["enc_self"] == [[0, 1], [0, 1]] and plan["dec_self"] == [[]]
    model = tiny()
    with pytest.raises(ValueError, match="every head"):
        pruning.prune_heads(model, {"dec_self": [[], [0, 1]]})


def test_global_vs_uniform_ranking():
    # Layer 0 is unimportant, layer 1 important: a global ranking takes everything it may from
    # layer 0 first; uniform leaves every layer with the same count.
    s = scores(enc_self=[[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]], dec_cross=[[0.9, 0.95, 0.35, 0.99]])
    glob = pruning.select_lowest(s, remove=4)
    assert glob == {"enc_self": [[0, 1, 2], []], "dec_cross": [[2]]}
    uni = pruning.select_lowest(s, remove=4, ranking="uniform")
    assert [len(x) for layers in uni.values() for x in layers] == [2, 2, 2]  # 12 - 4 -> 8/3 -> 2 kept
    assert uni == {"enc_self": [[0, 1], [0, 1]], "dec_cross": [[0, 2]]}
    assert pruning.select_lowest(s, remove=0) == {"enc_self": [[], []], "dec_cross": [[]]}

    # On a model: uniform pruning leaves one head count for the whole model.
    model = tiny()
    heads, _, _ = pruning.importance(model, [batch()])
    plan = pruning.select_lowest(heads, remove=10, ranking="uniform")
    pruning.prune_heads(model, plan)
    counts = model.cfg.enc_heads + model.cfg.dec_self_heads + model.cfg.dec_cross_heads
    assert len(set(counts)) == 1 and sum(counts) <= 25 - 10


def test_surviving_tracks_original_indices():
    origins = {"enc_self": [[0, 1, 2, 3]], "dec_cross": [[0, 2, 3]]}
    after = pruning.surviving(origins, {"enc_self": [[1, 3]], "dec_cross": [[0]]})
    assert after == {"enc_self": [[0, 2]], "dec_cross": [[2, 3]]}
