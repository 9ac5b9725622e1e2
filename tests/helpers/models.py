"""Small real models and training inputs several test files build."""

from __future__ import annotations

import torch
from mt_runtime.subword import SubwordTokenizer

from model.transformer import Transformer, TransformerConfig
from pipeline.corpora.encoded import encode_corpus
from pipeline.corpora.splits import read_split
from pipeline.training.validation import ValidationSet
from tests.helpers import one_layer_config


def tiny(pre_ln=False, seed=0) -> Transformer:
    torch.manual_seed(seed)
    cfg = TransformerConfig(
        vocab_size=60,
        d_model=32,
        head_dim=8,
        enc_heads=[4, 2],
        dec_self_heads=[3, 1],
        dec_cross_heads=[2, 4],
        enc_ffn=[64, 48],
        dec_ffn=[32, 64],
        max_positions=64,
        pre_ln=pre_ln,
        activation="gelu" if pre_ln else "relu",
    )
    model = Transformer(cfg)
    # Random init decodes to one repeated token; sharpen the output layer so search has choices.
    with torch.no_grad():
        model.embed.weight.mul_(8.0)
    return model.eval()


def _setup(smoke):
    store, arts = smoke.build("tokenizer")
    tok = SubwordTokenizer.load(arts["tokenizer"].file("tokenizer.json"))
    src, tgt = read_split(arts["data"].path, "train")
    vsrc, vtgt = read_split(arts["data"].path, "valid")
    train = encode_corpus(tok, src[:200], tgt[:200], 64)
    valid_corpus = encode_corpus(tok, vsrc, vtgt, 64, drop_long=False)
    valid = ValidationSet(valid_corpus, valid_corpus.src.rows(5), vtgt[:5])
    cfg = one_layer_config(tok.vocab_size, max_positions=64)
    return tok, train, valid, cfg
