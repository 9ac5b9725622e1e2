"""Cleaning the training corpora: each pair normalized, the ones not worth training on dropped
(empty, too long, too uneven, seen before), counted by reason, and each kept pair written as many
times as its corpus's weight says. Streamed: the de-duplication keeps 8 bytes per kept pair.
`cfg` is the data section's `clean` (pipeline/stages/data: CleanConfig)."""

from __future__ import annotations

import hashlib
import itertools
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from mt_runtime.lines import normalize


class _Counted:
    """An iterator that counts what it hands out."""

    def __init__(self, items: Iterable):
        self._items, self.count = iter(items), 0

    def __iter__(self):
        for item in self._items:
            self.count += 1
            yield item


# ------------------------------------------------------------------- training corpora, weights
@dataclass
class TrainingCorpus:
    """One training corpus as the stage reads it, and what became of its pairs."""

    name: str
    weight: float
    pairs: Iterator[tuple[str, str]]
    origin: str  # what to call it in messages
    raw: int = 0  # pairs read (within max_train)
    kept: int = 0  # clean, and not seen before in this corpus or an earlier one
    written: int = 0  # lines written to train.src/.tgt: kept pairs times their copies
    dropped: Counter = field(default_factory=Counter)

    def metrics(self) -> dict:
        return {
            "name": self.name,
            "weight": self.weight,
            "raw_pairs": self.raw,
            "kept_pairs": self.kept,
            "written_pairs": self.written,
            "dropped": dict(self.dropped),
        }


def train_pairs(corpora: list[TrainingCorpus], cfg, limit: int | None = None) -> Iterator[tuple[str, str]]:
    """The training split's lines: each corpus in order, cleaned and de-duplicated against every
    pair kept so far (one digest set for all), each kept pair written as many times as
    `copies` says for its corpus's weight, the copies adjacent. `limit`: the first N raw pairs
    over all the corpora. Fills in each corpus's counts as it goes."""
    seen: set[int] = set()
    for corpus in corpora:
        budget = None if limit is None else limit - sum(c.raw for c in corpora)
        raw = _Counted(itertools.islice(corpus.pairs, budget) if budget is not None else corpus.pairs)
        for s, t in clean_pairs(raw, cfg, corpus.dropped, seen):
            corpus.kept += 1
            n = copies(s, t, corpus.weight)
            corpus.written += n
            for _ in range(n):
                yield s, t
        corpus.raw = raw.count


# blake2b's salt (at most 16 bytes): a pair's fraction is independent of its de-duplication digest.
_WEIGHT_SALT = b"corpus-weight"


def copies(src: str, tgt: str, weight: float) -> int:
    """How many times a kept pair of a corpus of this weight is written: floor(weight), and once
    more if the pair's fraction, a blake2b digest of its text mapped to [0, 1), is below the
    rest. The same pair always gets the same count: a weight of 0.5 keeps the same half each run."""
    whole = math.floor(weight)
    rest = weight - whole
    if not rest:
        return whole
    digest = hashlib.blake2b(f"{src}\t{tgt}".encode("utf-8"), digest_size=8, salt=_WEIGHT_SALT).digest()
    return whole + (int.from_bytes(digest, "little") / 2**64 < rest)


def clean_pairs(
    pairs: Iterable[tuple[str, str]], cfg, dropped: Counter, seen: set[int] | None = None
) -> Iterator[tuple[str, str]]:
    """The pairs worth training on, normalized, in their order; `dropped` counts the others by
    reason. Duplicates are found by a 64-bit digest of the pair (8 bytes a pair, not the text:
    at 10 million pairs a collision is a few-in-a-million event, and costs one pair); `seen`,
    where given, holds the digests of pairs kept before (an earlier corpus), and gets these."""
    seen = set() if seen is None else seen
    for s, t in pairs:
        s, t = normalize(s, cfg.normalize_nfc), normalize(t, cfg.normalize_nfc)
        if not s or not t:
            dropped["empty"] += 1
            continue
        ns, nt = len(s.split()), len(t.split())
        if ns > cfg.max_words or nt > cfg.max_words:
            dropped["too_long"] += 1
            continue
        if max(ns, nt) > cfg.max_ratio * min(ns, nt) and max(ns, nt) > 3:
            dropped["length_ratio"] += 1
            continue
        if cfg.dedup:
            digest = int.from_bytes(hashlib.blake2b(f"{s}\t{t}".encode("utf-8"), digest_size=8).digest(), "little")
            if digest in seen:
                dropped["duplicate"] += 1
                continue
            seen.add(digest)
        yield s, t
