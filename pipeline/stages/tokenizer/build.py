"""Tokenizer stage: a joint subword vocabulary for source and target (embeddings are tied),
trained on the corpus (model/subword_training.py) or an imported teacher's own; its text and
figures are pipeline/corpora/vocabulary.py's."""

from __future__ import annotations

from model.subword_training import train_subword

from ...corpora.data_output import DataOutput
from ...corpora.vocabulary import split_scores, teacher_vocabulary, training_sentences
from ...engine.context import StageContext
from . import TokenizerConfig, TokenizerInputs


def run(ctx: StageContext) -> dict:
    cfg: TokenizerConfig = ctx.settings
    inputs: TokenizerInputs = ctx.inputs
    data = inputs.data.path
    if cfg.kind == "teacher":
        tok = teacher_vocabulary(inputs.teacher.path)
        tok.save(ctx.out / "tokenizer.json")
        ctx.log(
            f"the teacher's vocabulary: {tok.vocab_size} pieces"
            + (", a tokenizer per side" if tok.target is not None else "")
        )
        return {
            "vocab_size": tok.vocab_size,
            "kind": cfg.kind,
            "special_ids": tok.special_ids(),
            "target_side": tok.target is not None,
            "teacher": inputs.teacher.id,
            **split_scores(tok, data),
        }
    train_pairs = DataOutput.of(inputs.data.metrics, inputs.data.id).train_pairs
    sentences, total = training_sentences(data, train_pairs, cfg.max_sentences)
    ctx.log(f"training a {cfg.kind} tokenizer ({cfg.vocab_size} pieces) on {total} sentences")
    tok = train_subword(sentences, cfg.vocab_size, cfg.kind, count=total)
    tok.save(ctx.out / "tokenizer.json")
    return {"vocab_size": tok.vocab_size, "kind": cfg.kind, "special_ids": tok.special_ids(), **split_scores(tok, data)}
