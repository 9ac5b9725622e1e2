"""What a training is judged by: the validation split's cross-entropy and the greedy BLEU of its
first sentences, the same way for the teacher, the students and pruning's steps."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from model.torch_greedy import greedy_hypotheses
from model.transformer import Transformer

from ..corpora.encoded import Corpus, encode_corpus, make_batches
from ..corpora.splits import read_split
from ..measure.scoring import bleu_only
from .batches import prepare_batch


@dataclass
class ValidationSet:
    corpus: Corpus
    sources: list[list[int]]  # for BLEU: ids + EOS of the first N sentences
    references: list[str]


def validation_set(data: Path, tokenizer, max_positions: int, bleu_sentences: int | None) -> ValidationSet:
    """The data artifact's valid split, every pair kept (none dropped for length), with its first
    `bleu_sentences` sentences (None: all) for BLEU."""
    src, tgt = read_split(data, "valid")
    corpus = encode_corpus(tokenizer, src, tgt, max_positions, drop_long=False)
    n = len(src) if bleu_sentences is None else min(bleu_sentences, len(src))
    return ValidationSet(corpus, corpus.src.rows(n), tgt[:n])


@torch.no_grad()
def valid_loss(model: Transformer, corpus: Corpus, tokenizer, batch_tokens: int, device) -> float:
    """Cross-entropy per target token on `corpus`, added up on the device (float64, in batch
    order) and read once."""
    model.eval()
    tok = tokenizer
    total, count = torch.zeros((), dtype=torch.float64, device=device), 0
    for index in make_batches(corpus, batch_tokens, 0, 0):
        batch = prepare_batch(corpus, index, tok.pad_id, tok.bos_id, tok.eos_id).to(device)
        logits = model(batch.src, batch.tgt_in, keep=batch.keep)
        total += F.cross_entropy(logits.float(), batch.target, reduction="sum").double()
        count += batch.tokens
    return float(total) / max(1, count)


@torch.no_grad()
def valid_bleu(model: Transformer, valid: ValidationSet, tokenizer, device) -> float | None:
    """Corpus BLEU of the greedy translations of the BLEU sentences; None where there are none."""
    if not valid.sources:
        return None
    model.eval()
    hyps = greedy_hypotheses(model, valid.sources, device)
    return bleu_only(tokenizer.decode(hyps), valid.references)
