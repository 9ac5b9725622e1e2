"""Tokenizer stage: a joint subword vocabulary for source and target (embeddings are tied)."""

from __future__ import annotations

import itertools
import random

from mt_runtime.subword import SubwordTokenizer

from model.subword_training import train_subword

from ...corpora.splits import read_split, reservoir_sample, split_lines
from ...engine.context import StageContext
from ...engine.errors import UserInputError
from . import TokenizerConfig, TokenizerInputs


def run(ctx: StageContext) -> dict:
    cfg: TokenizerConfig = ctx.settings
    inputs: TokenizerInputs = ctx.inputs
    data = inputs.data.path
    if cfg.kind == "teacher":
        tok = _teachers(ctx)
        return {
            "vocab_size": tok.vocab_size,
            "kind": cfg.kind,
            "special_ids": tok.special_ids(),
            "target_side": tok.target is not None,
            "teacher": inputs.teacher.id,
            **_scores(tok, data),
        }
    # Both sides, streamed from the files (the corpus is never held whole); a sample of
    # `max_sentences` where the recipe asks for one, drawn in one pass.
    total = 2 * inputs.data.metrics["train_pairs"]
    sentences = itertools.chain(split_lines(data, "train", "src"), split_lines(data, "train", "tgt"))
    if cfg.max_sentences is not None and total > cfg.max_sentences:
        sentences, total = reservoir_sample(sentences, cfg.max_sentences, random.Random(0)), cfg.max_sentences
    ctx.log(f"training a {cfg.kind} tokenizer ({cfg.vocab_size} pieces) on {total} sentences")
    tok = train_subword(sentences, cfg.vocab_size, cfg.kind, count=total)
    tok.save(ctx.out / "tokenizer.json")
    return {"vocab_size": tok.vocab_size, "kind": cfg.kind, "special_ids": tok.special_ids(), **_scores(tok, data)}


def _teachers(ctx: StageContext) -> SubwordTokenizer:
    """The imported teacher's vocabulary in our format (model/hf_tokenizer.py), saved."""
    from model.hf_tokenizer import UnconvertibleTokenizer, teacher_tokenizers

    teacher = ctx.inputs.teacher
    try:
        tok = SubwordTokenizer(*teacher_tokenizers(teacher.path / "checkpoint"))
    except (UnconvertibleTokenizer, ValueError) as exc:
        raise UserInputError(
            f"tokenizer.kind: teacher: the teacher's tokenizer cannot be the student's: {exc}; "
            "train the student its own (kind: unigram)"
        ) from None
    tok.save(ctx.out / "tokenizer.json")
    ctx.log(
        f"the teacher's vocabulary: {tok.vocab_size} pieces"
        + (", a tokenizer per side" if tok.target is not None else "")
    )
    return tok


def _scores(tok: SubwordTokenizer, data) -> dict:
    """How the tokenizer splits the validation split: pieces per sentence, unknown pieces, and
    how many targets decode back to themselves."""
    valid_src, valid_tgt = read_split(data, "valid")
    stats = {}
    for side, ids in (("src", tok.encode(valid_src)), ("tgt", tok.encode_target(valid_tgt))):
        pieces = sum(len(x) for x in ids)
        stats[f"valid_{side}_tokens_per_sentence"] = round(pieces / max(1, len(ids)), 2)
        stats[f"valid_{side}_unk_rate"] = round(sum(x.count(tok.unk_id) for x in ids) / max(1, pieces), 5)
    round_trip = sum(tok.decode(tok.encode_target([s]))[0] == s for s in valid_tgt) / max(1, len(valid_tgt))
    return {"valid_round_trip_exact": round(round_trip, 4), **stats}
