"""Tokenizer stage: a joint subword vocabulary for source and target (embeddings are tied)."""

from __future__ import annotations

import itertools
import random

from model.subword import SubwordTokenizer

from ..context import StageContext
from ..corpus import read_split, reservoir_sample, split_lines
from ..recipe import TokenizerConfig


def run(ctx: StageContext) -> dict:
    cfg: TokenizerConfig = ctx.settings
    data = ctx.input("data").path
    # Both sides, streamed from the files (the corpus is never held whole); a sample of
    # `max_sentences` where the recipe asks for one, drawn in one pass.
    total = 2 * ctx.input("data").metrics["train_pairs"]
    sentences = itertools.chain(split_lines(data, "train", "src"), split_lines(data, "train", "tgt"))
    if cfg.max_sentences is not None and total > cfg.max_sentences:
        sentences, total = reservoir_sample(sentences, cfg.max_sentences, random.Random(0)), cfg.max_sentences
    ctx.log(f"training a {cfg.kind} tokenizer ({cfg.vocab_size} pieces) on {total} sentences")
    tok = SubwordTokenizer.train(sentences, cfg.vocab_size, cfg.kind, count=total)
    tok.save(ctx.out / "tokenizer.json")

    valid_src, valid_tgt = read_split(data, "valid")
    stats = {}
    for side, lines in (("src", valid_src), ("tgt", valid_tgt)):
        ids = tok.encode(lines)
        pieces = sum(len(x) for x in ids)
        stats[f"valid_{side}_tokens_per_sentence"] = round(pieces / max(1, len(ids)), 2)
        stats[f"valid_{side}_unk_rate"] = round(sum(x.count(tok.unk_id) for x in ids) / max(1, pieces), 5)
    round_trip = sum(tok.decode(tok.encode([s]))[0] == s for s in valid_tgt) / max(1, len(valid_tgt))
    return {"vocab_size": tok.vocab_size, "kind": cfg.kind, "special_ids": tok.special_ids(),
            "valid_round_trip_exact": round(round_trip, 4), **stats}
