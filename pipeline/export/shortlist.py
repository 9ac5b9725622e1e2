"""The lexical shortlist a package may carry (mt_runtime/shortlist.py): built from the training
pairs, and how it covers the validation references in batches of 32."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
from mt_runtime.shortlist import build_shortlist
from mt_runtime.subword import SubwordTokenizer

from ..corpora.splits import check_aligned, read_split, split_lines


def make_shortlist(cfg, data: Path, tokenizer: SubwordTokenizer, model_cfg, dest: Path) -> dict:
    """Build the shortlist (`cfg`: the export section's shortlist) from the training pairs (the
    first cfg.max_pairs, encoded a block at a time) and say how it covers the validation
    references in batches of 32 (length-sorted)."""
    check_aligned(data / "train.src", data / "train.tgt")

    def pairs():
        lines = itertools.islice(
            zip(split_lines(data, "train", "src"), split_lines(data, "train", "tgt")), cfg.max_pairs
        )
        while block := list(itertools.islice(lines, 10_000)):
            src, tgt = zip(*block)
            yield from zip(tokenizer.encode(list(src)), tokenizer.encode(list(tgt)))

    specials = (model_cfg.pad_id, model_cfg.bos_id, model_cfg.eos_id, tokenizer.unk_id)
    table, made = build_shortlist(pairs(), model_cfg.vocab_size, cfg.frequent, cfg.per_word, always=specials)
    table.save(dest)
    valid_src, valid_tgt = read_split(data, "valid")
    src, tgt = tokenizer.encode(valid_src), tokenizer.encode(valid_tgt)
    order = sorted(range(len(src)), key=lambda i: len(src[i]))
    sizes, covered, total = [], 0, 0
    for start in range(0, len(order), 32):
        rows = order[start : start + 32]
        words = table.for_sources([src[i] for i in rows])
        sizes.append(len(words))
        for i in rows:
            covered += int(np.isin(tgt[i], words).sum())
            total += len(tgt[i])
    return {
        **made,
        "vocab_size": model_cfg.vocab_size,
        "mean_words_batch_32": round(float(np.mean(sizes)), 1),
        "max_words_batch_32": int(max(sizes)),
        "valid_reference_coverage": round(covered / max(total, 1), 4),
    }
