"""Corpus BLEU and chrF with sacrebleu, always with the signature that says how they were computed."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from sacrebleu.metrics import BLEU, CHRF


def score(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """Cased, detokenized text in; sacrebleu's default 13a tokenization inside."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(list(hypotheses), [list(references)])
    c = chrf.corpus_score(list(hypotheses), [list(references)])
    return {
        "bleu": round(b.score, 2),
        "chrf": round(c.score, 2),
        "bleu_detail": str(b),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "sentences": len(hypotheses),
    }


def bleu_only(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    return round(BLEU().corpus_score(list(hypotheses), [list(references)]).score, 2)


BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 12345  # sacrebleu's default seed for its own resampling


def paired_bootstrap(
    system: Sequence[str],
    baseline: Sequence[str],
    references: Sequence[str],
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> dict:
    """BLEU(system) - BLEU(baseline) on the same sentences, with what one test set can say about it:
    paired bootstrap resampling (Koehn, 2004), both systems scored on the same resampled sentences.

    delta: the difference on the whole set; ci95: the 2.5th and 97.5th percentiles of the resampled
    differences; p_value: sacrebleu's paired bootstrap test (`sacrebleu --paired-bs`, after Moses'
    bootstrap-hypothesis-difference-significance.pl) of "no difference", so a reader can tell a
    0.3-BLEU step from noise."""
    if not len(system) == len(baseline) == len(references):
        raise ValueError(f"{len(system)} and {len(baseline)} hypotheses for {len(references)} references")
    stats = [sentence_statistics(h, references) for h in (system, baseline)]
    rng = np.random.default_rng(seed)
    index = rng.choice(len(references), size=(samples, len(references)), replace=True)
    # Per resample, the sentence counts times the per-sentence statistics: one matrix product
    # instead of materialising [samples, sentences, statistics].
    counts = np.zeros((samples, len(references)))
    np.add.at(counts, (np.arange(samples)[:, None], index), 1.0)
    scores = [np.array([bleu_from_statistics(row) for row in counts @ s]) for s in stats]
    diffs = scores[0] - scores[1]
    delta = bleu_from_statistics(stats[0].sum(0)) - bleu_from_statistics(stats[1].sum(0))
    spread = np.abs(diffs)
    p_value = (np.sum(spread - spread.mean() > abs(delta)) + 1) / (samples + 1)
    if list(system) == list(baseline):  # the test's +1 would call identical outputs different
        p_value = 1.0
    low, high = np.percentile(diffs, [2.5, 97.5])
    return {
        "delta": round(float(delta), 2),
        "ci95": [round(float(low), 2), round(float(high), 2)],
        "p_value": round(float(p_value), 4),
        "samples": samples,
        "seed": seed,
        "test": "paired bootstrap resampling (Koehn 2004), sacrebleu's BLEU statistics",
    }


def sentence_statistics(hypotheses: Sequence[str], references: Sequence[str]) -> np.ndarray:
    """[sentences, 10]: per sentence, BLEU's matching and total 1-4-gram counts, then hypothesis
    and reference lengths (sacrebleu's public BLEUScore fields). Summed over any sample of the
    sentences, they give that sample's corpus BLEU (bleu_from_statistics)."""
    metric = BLEU(effective_order=True)  # sentence-level smoothing: only the scores differ, not the counts
    rows = []
    for hyp, ref in zip(hypotheses, references):
        s = metric.sentence_score(hyp, [ref])
        rows.append([*s.counts, *s.totals, s.sys_len, s.ref_len])
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), 10)


def bleu_from_statistics(row) -> float:
    """Corpus BLEU, as BLEU().corpus_score computes it (exp smoothing, order 4), from summed statistics."""
    return BLEU.compute_bleu(
        [int(v) for v in row[:4]], [int(v) for v in row[4:8]], int(row[8]), int(row[9]), smooth_method="exp"
    ).score
