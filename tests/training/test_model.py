"""The Transformer and search: cached decoding is exact, beam 1 is greedy, batching changes nothing."""

from __future__ import annotations

import pytest
import torch
from mt_runtime.search import GenerationConfig, beam_search, greedy_search

from model.torch_decoder import TorchDecoder
from model.transformer import Transformer, TransformerConfig, load_model, save_model, unfactorised
from tests.helpers.models import tiny


def test_incremental_decoding_matches_full_forward():
    for pre_ln in (False, True):
        model = tiny(pre_ln)
        src = torch.randint(4, 60, (3, 7))
        src[1, 5:] = 0
        tgt = torch.randint(4, 60, (3, 9))
        tgt[:, 0] = 1
        with torch.no_grad():
            full = model(src, tgt)
            memory, mask = model.encode(src)
            cross, past, steps = model.cross_kv(memory), None, []
            for t in range(tgt.shape[1]):
                logits, past = model.decode_step(tgt[:, t : t + 1], cross, mask, past)
                steps.append(logits)
        # fp32 round-off only: logits here reach ~60, so 1e-4 is a relative error of ~2e-6.
        assert torch.allclose(full, torch.stack(steps, 1), atol=1e-4, rtol=0)


def test_forward_with_targets_only_scores_real_positions():
    model = tiny()
    src = torch.randint(4, 60, (2, 5))
    tin = torch.tensor([[1, 5, 6, 0], [1, 7, 8, 9]])
    tout = torch.tensor([[5, 6, 2, 0], [7, 8, 9, 2]])
    with torch.no_grad():
        packed = model(src, tin, tout)
        full = model(src, tin)
    assert packed.shape == (7, 60)
    assert torch.allclose(packed, full[tout != 0], atol=1e-6)


SOURCES = [[5, 6, 7, 2], [8, 9, 2], [10, 11, 12, 13, 14, 15, 16, 2], [20, 2]]


def test_beam_one_is_greedy_and_batching_changes_nothing():
    model = tiny()
    dec = TorchDecoder(model)
    greedy = GenerationConfig(beam=1, max_positions=64)
    batch = greedy_search(dec, SOURCES, greedy)
    assert batch == beam_search(dec, SOURCES, greedy)
    assert batch == [greedy_search(dec, [s], greedy)[0] for s in SOURCES]
    # One sentence takes its own path (no batch bookkeeping): the same tokens, also when the
    # length limit ends a sentence.
    short = GenerationConfig(beam=1, max_positions=64, max_len_a=0, max_len_b=3)
    batch = greedy_search(dec, SOURCES, short)
    assert max(len(h) for h in batch) == 2 and batch == [greedy_search(dec, [s], short)[0] for s in SOURCES]
    beam4 = GenerationConfig(beam=4, max_positions=64)
    assert beam_search(dec, SOURCES, beam4) == [beam_search(dec, [s], beam4)[0] for s in SOURCES]


def test_beam_search_finds_at_least_the_greedy_score():
    model = tiny(seed=3)
    dec = TorchDecoder(model)

    def logprob(src, hyp):
        with torch.no_grad():
            s = torch.tensor([src])
            t_in = torch.tensor([[1] + hyp])
            t_out = torch.tensor([hyp + [2]])
            lp = torch.log_softmax(model(s, t_in), -1)[0]
            return lp.gather(1, t_out[0][:, None]).sum().item() / (len(hyp) + 1)

    for src in SOURCES:
        g = greedy_search(dec, [src], GenerationConfig(beam=1, max_positions=64))[0]
        b = beam_search(dec, [src], GenerationConfig(beam=5, max_positions=64, max_len_a=0, max_len_b=30))[0]
        assert logprob(src, b) >= logprob(src, g) - 1e-5


def test_uneven_heads_save_and_load_give_identical_outputs(tmp_path):
    model = tiny()
    save_model(model, tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.cfg == model.cfg and loaded.cfg.enc_heads == [4, 2]
    src = torch.randint(4, 60, (2, 6))
    tgt = torch.randint(4, 60, (2, 5))
    with torch.no_grad():
        assert torch.equal(model(src, tgt), loaded(src, tgt))


def test_a_factorised_token_table_is_smaller_and_unfactorises_to_the_same_model(tmp_path):
    """vocab x E table plus an E -> d projection, tied both ways; unfactorised() is the same
    function with one vocab x d table (what ONNX and CTranslate2 get), and the config saves it."""
    torch.manual_seed(1)
    base = dict(
        vocab_size=60,
        d_model=32,
        head_dim=8,
        enc_heads=[4],
        dec_self_heads=[4],
        dec_cross_heads=[4],
        enc_ffn=[64],
        dec_ffn=[64],
        max_positions=64,
    )
    plain = Transformer(TransformerConfig(**base))
    model = Transformer(TransformerConfig(**base, embed_dim=12)).eval()
    assert plain.num_parameters() - model.num_parameters() == 60 * 32 - (60 * 12 + 12 * 32)
    with torch.no_grad():
        model.embed.weight.mul_(8.0)
    src, tgt = torch.randint(4, 60, (3, 7)), torch.randint(4, 60, (3, 9))
    tgt[:, 0] = 1
    folded = unfactorised(model)
    assert folded.embed_proj is None and folded.embed.weight.shape == (60, 32)
    with torch.no_grad():
        assert torch.allclose(model(src, tgt), folded(src, tgt), atol=1e-4)
    assert greedy_search(TorchDecoder(model), SOURCES, GenerationConfig(beam=1, max_positions=64)) == greedy_search(
        TorchDecoder(folded), SOURCES, GenerationConfig(beam=1, max_positions=64)
    )
    save_model(model, tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    assert loaded.cfg.embed_dim == 12
    with torch.no_grad():
        assert torch.equal(loaded(src, tgt), model(src, tgt))
    with pytest.raises(ValueError, match="embed_dim"):
        TransformerConfig(**base, embed_dim=32)
