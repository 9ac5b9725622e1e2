"""A lexical shortlist: the target words a batch of sources may be translated into.

Decoding over many rows computes the output projection [rows, d] x [d, vocab] at every step; at
the teacher's width (d 256, 8000 words) that is a fifth of a greedy step at 32 rows. Marian and
Firefox Translations restrict it to a shortlist per batch; CTranslate2 does the same with a
vocabulary map (`use_vmap`). Ours: the `frequent` most frequent target words, plus for every
source word of the batch its `per_word` best target words by how much more often they occur
with it than without it (p(t | s) - p(t) over the training pairs). The words outside the list
cannot be produced; log-probabilities are normalised over the list.

NumPy only: part of mt-runtime, the runtime every package names (package.json's `runtime`).
"""

from __future__ import annotations

import itertools
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from .files import reason

MAX_WORDS = 1 << 26  # bounds what a file may claim, before anything is allocated from it
MAX_BYTES = 1 << 28  # all the arrays of a shortlist file together (256 MiB)
# Candidates a source word may have (the default recipe gives 50), so `words` holds at most
# vocab_size x MAX_PER_WORD: a 234 KB file of 60M entries for one word took a server past 2 GB.
MAX_PER_WORD = 256
# Source-word candidates a batch's word lists are gathered from at a time (a request of many long
# sentences would otherwise gather tokens x per_word of them at once).
PICKS = 1 << 20


class ShortlistError(ValueError):
    """A shortlist file that cannot be this vocabulary's."""


@dataclass(frozen=True)
class Shortlist:
    vocab_size: int
    always: np.ndarray  # int64 [F]: sorted, every batch's (the frequent words and the special ids)
    offsets: np.ndarray  # int64 [vocab_size + 1]: source word s's candidates are words[offsets[s]:offsets[s + 1]]
    words: np.ndarray  # int32

    def for_sources(self, src: Iterable[Iterable[int]]) -> np.ndarray:
        """The sorted target ids a batch of sources (token ids) may be translated into."""
        # Sets as masks over the vocabulary: one pass each, where np.unique and np.union1d sort
        # (a quarter of a millisecond a batch, as much as a student's decoder step).
        ids = np.fromiter((t for s in src for t in s), dtype=np.int64)
        present = np.zeros(self.vocab_size, dtype=bool)
        present[ids[(ids >= 0) & (ids < self.vocab_size)]] = True
        ids = np.flatnonzero(present)
        listed = np.zeros((1, self.vocab_size), dtype=bool)
        listed[0, self.always] = True
        self._mark(listed, np.zeros(len(ids), np.int64), ids)
        return np.flatnonzero(listed[0]).astype(np.int64)

    def _mark(self, table: np.ndarray, rows: np.ndarray, ids: np.ndarray) -> None:
        """table[row, w] = True for every candidate w of every (row, source id) pair; a ragged
        gather without a Python loop per word, PICKS candidates at a time (a word has at most
        MAX_PER_WORD), so what one call allocates does not grow with the batch."""
        counts = self.offsets[ids + 1] - self.offsets[ids]
        ends = np.cumsum(counts)
        cells = np.reshape(table, -1, copy=False)  # flat indices: half a 2-D fancy index's time
        start = 0
        while start < len(ids):
            stop = max(start + 1, int(np.searchsorted(ends, ends[start] - counts[start] + PICKS, side="right")))
            n = counts[start:stop]
            picked = np.repeat(self.offsets[ids[start:stop]] - np.cumsum(n) + n, n) + np.arange(n.sum())
            cells[np.repeat(rows[start:stop] * table.shape[1], n) + self.words[picked]] = True
            start = stop

    def sentence_words(self, src: Iterable[int], specials: Iterable[int], width: int) -> np.ndarray:
        """The words a sentence's greedy search chooses from (the package format's rule): the
        special ids, then the frequent words, then the candidates of its source words that are
        neither, each in id order, at most `width` (sentence_width) in all: where a long
        sentence's candidates do not all fit, the lower ids (the more frequent subwords) stay.
        The generate graph's one-sentence search (model/onnx_passes/sentence_words.py) makes the same list."""
        specials = np.asarray(list(specials), dtype=np.int64)
        ids = np.fromiter(src, dtype=np.int64)
        ids = np.unique(ids[(ids >= 0) & (ids < self.vocab_size)])
        frequent = np.zeros(self.vocab_size, dtype=bool)
        frequent[self.always] = True
        marked = np.zeros((1, self.vocab_size), dtype=bool)
        self._mark(marked, np.zeros(len(ids), np.int64), ids)
        candidate = marked[0]
        frequent[specials] = candidate[specials] = False
        candidate &= ~frequent
        rest = np.concatenate([np.flatnonzero(frequent), np.flatnonzero(candidate)])[: width - len(specials)]
        return np.concatenate([specials, rest])

    def batch_words(
        self, sources: list[list[int]], specials: Iterable[int], width: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(the sorted union of the sentences' sentence_words, bool [sentences, union]: the
        words each sentence may choose): a batch's greedy steps project onto the union once and
        mask each row to its own sentence's words, so no sentence's output depends on the others.
        The (sentence, candidate) pairs of the whole batch at once (PICKS at a time): a sentence_words call each
        took a millisecond per batch of 32, 7% of a student's greedy batch."""
        specials = np.asarray(list(specials), dtype=np.int64)
        common = np.zeros(self.vocab_size, dtype=bool)  # every sentence's: specials and frequent words
        common[self.always] = common[specials] = True
        lengths = np.fromiter((len(s) for s in sources), dtype=np.int64, count=len(sources))
        ids = np.fromiter(itertools.chain.from_iterable(sources), dtype=np.int64, count=int(lengths.sum()))
        rows = np.repeat(np.arange(len(sources)), lengths)
        inside = (ids >= 0) & (ids < self.vocab_size)
        # Each (sentence, word) pair once: a word 200 times in a sentence gathers its candidates once.
        pairs = np.sort(rows[inside] * self.vocab_size + ids[inside])
        pairs = pairs[np.diff(pairs, prepend=-1) != 0]  # np.unique's answer, in a fifth of its time
        candidate = np.zeros((len(sources), self.vocab_size), dtype=bool)
        self._mark(candidate, pairs // self.vocab_size, pairs % self.vocab_size)
        candidate[:, common] = False
        frequent = common.copy()
        frequent[specials] = False
        room = width - len(specials) - int(np.count_nonzero(frequent))
        counts = candidate.view(np.uint8).sum(axis=1, dtype=np.int32)  # bool's sum widens each to int64: 3x slower
        for row in np.flatnonzero(counts > room):  # a long sentence: its lowest ids stay
            candidate[row, np.flatnonzero(candidate[row])[room:]] = False
        union = np.flatnonzero(common | candidate.any(axis=0))
        allowed = candidate[:, union]
        allowed[:, common[union]] = True
        return union, allowed

    def save(self, path: Path) -> None:
        with open(path, "wb") as f:
            np.savez(
                f,
                vocab_size=np.array(self.vocab_size, np.int64),
                always=self.always,
                offsets=self.offsets,
                words=self.words,
            )

    @classmethod
    def load(cls, path: Path, vocab_size: int) -> Shortlist:
        """Read and check a shortlist for a model of `vocab_size` words: no pickles, every array's
        size checked from its header against the vocabulary (at most MAX_PER_WORD candidates a
        word) and MAX_BYTES before it is read, every id in range."""
        arrays = _read_arrays(Path(path), vocab_size)
        always, offsets, words = arrays["always"], arrays["offsets"], arrays["words"]
        problem = None
        per_word = np.diff(offsets)
        if offsets[0] != 0 or offsets[-1] != len(words) or np.any(per_word < 0):
            problem = "offsets out of order"
        elif per_word.max(initial=0) > MAX_PER_WORD:
            word = int(per_word.argmax())
            problem = f"source word {word} has {per_word[word]} candidates, more than {MAX_PER_WORD}"
        elif any(len(a) and (a.min() < 0 or a.max() >= vocab_size) for a in (always, words)):
            problem = "word ids outside the vocabulary"
        if problem:
            raise ShortlistError(f"{path}: {problem}")
        return cls(vocab_size, np.unique(always.astype(np.int64)), offsets.astype(np.int64), words.astype(np.int32))


# Room in a sentence's word list for this many source words' candidates beyond the frequent words
# (see sentence_width); a longer sentence keeps each word's best first.
SENTENCE_SOURCE_WORDS = 12


def sentence_width(shortlist: Shortlist) -> int:
    """The size of a sentence's word list (Shortlist.sentence_words): the generate graph's op
    needs its vocabulary size when it loads, so every sentence's list is cut (or filled, with
    words it may not choose) to this many words, a multiple of 64."""
    per_word = int(np.diff(shortlist.offsets).max(initial=0))
    width = len(shortlist.always) + 3 + SENTENCE_SOURCE_WORDS * per_word
    return min(-(-width // 64) * 64, shortlist.vocab_size)


def _read_arrays(path: Path, vocab_size: int) -> dict[str, np.ndarray]:
    """The four arrays of a shortlist file (np.savez's zip of .npy files). Each member's npy header
    is read first: integers only, the shapes the vocabulary allows, the zip entry's size the one
    the header implies, MAX_BYTES in all; only then are the arrays read, each exactly its size
    (a small file that inflates to gigabytes is refused before anything is allocated)."""
    expected = {
        "vocab_size": lambda shape: shape == (),
        "always": lambda shape: len(shape) == 1 and shape[0] <= vocab_size,
        "offsets": lambda shape: shape == (vocab_size + 1,),
        "words": lambda shape: len(shape) == 1 and shape[0] <= min(MAX_WORDS, vocab_size * MAX_PER_WORD),
    }
    try:
        if path.stat().st_size > MAX_BYTES + (1 << 20):
            raise ShortlistError(f"{path}: larger than a shortlist can be ({MAX_BYTES >> 20} MiB of arrays)")
        with zipfile.ZipFile(path) as z:
            members, total = {}, 0
            for name, fits in expected.items():
                info = z.getinfo(f"{name}.npy")
                with z.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    if version not in ((1, 0), (2, 0)):
                        raise ShortlistError(f"{path}: {name}: npy format {version[0]}.{version[1]}")
                    read_header = (
                        np.lib.format.read_array_header_1_0
                        if version == (1, 0)
                        else np.lib.format.read_array_header_2_0
                    )
                    shape, _, dtype = read_header(f)
                    header = f.tell()
                if dtype.kind not in "iu" or dtype.itemsize > 8:
                    raise ShortlistError(f"{path}: {name}: {dtype}, not integers")
                if not fits(shape):
                    raise ShortlistError(
                        f"{path}: {name}: shape {shape} does not fit a vocabulary of {vocab_size} words"
                        + (f" ({MAX_PER_WORD} candidates a word at most)" if name == "words" else "")
                    )
                size = math.prod(shape) * dtype.itemsize
                if info.file_size != header + size:
                    raise ShortlistError(f"{path}: {name}: {info.file_size} bytes in the file for an array of {size}")
                members[name], total = info, total + size
                if name == "vocab_size":  # first, and one number: a shortlist of another model's says so
                    with z.open(info) as f:
                        made_for = int(np.lib.format.read_array(f, allow_pickle=False))
                    if made_for != vocab_size:
                        raise ShortlistError(f"{path}: made for {made_for} words, the model has {vocab_size}")
            if total > MAX_BYTES:
                raise ShortlistError(f"{path}: {total} bytes of arrays, more than a shortlist may hold ({MAX_BYTES})")
            arrays = {}
            for name, info in members.items():
                with z.open(info) as f:
                    arrays[name] = np.lib.format.read_array(f, allow_pickle=False)
            return arrays
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        if isinstance(exc, ShortlistError):
            raise
        raise ShortlistError(f"{path}: not a shortlist ({reason(exc)})") from None


def build_shortlist(
    pairs: Iterable[tuple[list[int], list[int]]],
    vocab_size: int,
    frequent: int,
    per_word: int,
    always: Iterable[int] = (),
    chunk: int = 20_000,
) -> tuple[Shortlist, dict]:
    """A shortlist from training pairs of token ids. Counts are per sentence (a word twice in a
    pair counts once). Returns it and what it was made from."""
    source_count = np.zeros(vocab_size, np.int64)
    target_count = np.zeros(vocab_size, np.int64)
    keys, counts = np.zeros(0, np.int64), np.zeros(0, np.int64)
    pending: list[np.ndarray] = []
    n_pairs = 0

    def merge():
        nonlocal keys, counts, pending
        if pending:
            new_keys, new_counts = np.unique(np.concatenate(pending), return_counts=True)
            all_keys = np.concatenate([keys, new_keys])
            all_counts = np.concatenate([counts, new_counts])
            keys, inverse = np.unique(all_keys, return_inverse=True)
            counts = np.bincount(inverse, weights=all_counts).astype(np.int64)
            pending = []

    for src, tgt in pairs:
        s = np.unique(np.asarray(src, np.int64))
        t = np.unique(np.asarray(tgt, np.int64))
        s, t = s[(s >= 0) & (s < vocab_size)], t[(t >= 0) & (t < vocab_size)]
        source_count[s] += 1
        target_count[t] += 1
        pending.append((s[:, None] * vocab_size + t[None, :]).ravel())
        n_pairs += 1
        if n_pairs % chunk == 0:
            merge()
    merge()
    if n_pairs == 0:
        raise ShortlistError("no training pairs to build a shortlist from")
    src_of, tgt_of = keys // vocab_size, keys % vocab_size
    gain = counts / source_count[src_of] - target_count[tgt_of] / n_pairs
    # Per source word, best gain first: sort by (source, -gain), then keep the first per_word above chance.
    order = np.lexsort((-gain, src_of))
    src_of, tgt_of, gain = src_of[order], tgt_of[order], gain[order]
    first = np.searchsorted(src_of, src_of, side="left")
    rank = np.arange(len(src_of)) - first
    kept = (rank < per_word) & (gain > 0)
    words = tgt_of[kept].astype(np.int32)
    offsets = np.zeros(vocab_size + 1, np.int64)
    np.add.at(offsets, src_of[kept] + 1, 1)
    offsets = np.cumsum(offsets)
    top = np.argsort(-target_count, kind="stable")[:frequent]
    base = np.union1d(top[target_count[top] > 0], np.fromiter(always, np.int64))
    shortlist = Shortlist(vocab_size, base.astype(np.int64), offsets, words)
    return shortlist, {
        "pairs": n_pairs,
        "frequent": len(base),
        "per_word": per_word,
        "entries": int(len(words)),
        "source_words": int(np.count_nonzero(np.diff(offsets))),
    }
