"""Corpus BLEU and chrF with sacrebleu, always with the signature that says how they were computed."""

from __future__ import annotations

from typing import Sequence

from sacrebleu.metrics import BLEU, CHRF


def score(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """Cased, detokenized text in; sacrebleu's default 13a tokenization inside."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(list(hypotheses), [list(references)])
    c = chrf.corpus_score(list(hypotheses), [list(references)])
    return {"bleu": round(b.score, 2), "chrf": round(c.score, 2), "bleu_detail": str(b),
            "bleu_signature": str(bleu.get_signature()), "chrf_signature": str(chrf.get_signature()),
            "sentences": len(hypotheses)}


def bleu_only(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    return round(BLEU().corpus_score(list(hypotheses), [list(references)]).score, 2)
