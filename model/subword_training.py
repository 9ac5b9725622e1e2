"""Training the joint subword tokenizer (HF `tokenizers`): the pipeline's tokenizer stage and the
tests. Not part of mt-runtime, which only loads, encodes and decodes (mt_runtime/subword.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Iterable

from mt_runtime.subword import SPECIALS, TARGET_FILE, UNK, SubwordTokenizer
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

# A generous alphabet of Latin letters so rare accented letters are not <unk> at test time.
_EXTRA_ALPHABET = list("àâäáãåæçéèêëíìîïñóòôöõøœúùûüýÿßÀÂÄÁÃÅÆÇÉÈÊËÍÌÎÏÑÓÒÔÖÕØŒÚÙÛÜÝŸ«»“”‘’–—…€")


def train_subword(
    sentences: Iterable[str], vocab_size: int, kind: str = "unigram", count: int | None = None
) -> SubwordTokenizer:
    meta = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    if kind == "unigram":
        tok = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(
            vocab_size=vocab_size,
            special_tokens=SPECIALS,
            unk_token=UNK,
            initial_alphabet=_EXTRA_ALPHABET,
            max_piece_length=16,
            show_progress=False,
        )
    elif kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token=UNK))
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=SPECIALS,
            min_frequency=2,
            initial_alphabet=_EXTRA_ALPHABET,
            show_progress=False,
        )
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r}")
    tok.pre_tokenizer = meta
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.train_from_iterator(sentences, trainer, length=count)
    return SubwordTokenizer(_canonical_unigram(tok) if kind == "unigram" else tok)


def copy_tokenizer(path: str | Path, folder: str | Path) -> None:
    """tokenizer.json at `path` into `folder`, with the target side's file where there is one."""
    path, folder = Path(path), Path(folder)
    if path.is_dir():
        path = path / "tokenizer.json"
    shutil.copyfile(path, folder / "tokenizer.json")
    if path.with_name(TARGET_FILE).is_file():
        shutil.copyfile(path.with_name(TARGET_FILE), folder / TARGET_FILE)


# Decimals a unigram piece's log-probability keeps. The trainer sums in an order that changes from
# process to process (hash maps), so the same corpus gives scores that differ in the 15th digit and
# pieces with tied scores in another order: other ids, so other embeddings and another model from
# the same recipe (measured: 450 of 8000 pieces moved between two trainings, and the teacher's
# BLEU 0.66 apart). Rounded, and ties ordered by the piece itself, the vocabulary is one file.
UNIGRAM_SCORE_DECIMALS = 6
# The characters the trainer must cover but did not keep get the lowest piece's score plus 0, 1,
# 2, ... of this step, in a hash set's order (tokenizers' UnigramTrainer::finalize). Within the
# first _REQUIRED_CHAR_STEPS steps, single characters on that grid share its scores out in the
# characters' order instead.
_REQUIRED_CHAR_STEP = 1e-4
_REQUIRED_CHAR_STEPS = 1000


def _canonical_unigram(tok: Tokenizer) -> Tokenizer:
    """The trained tokenizer with its pieces in a reproducible order: the specials first as they
    are, then by rounded score, best first, ties by the piece's text."""
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    head, rest = vocab[: len(SPECIALS)], vocab[len(SPECIALS) :]
    if [piece for piece, _ in head] != SPECIALS:
        raise ValueError(f"unigram vocabulary does not start with {SPECIALS}")
    rest = [[piece, round(score, UNIGRAM_SCORE_DECIMALS)] for piece, score in rest]
    lowest = min((score for _, score in rest), default=0.0)
    tolerance = 2 * 10**-UNIGRAM_SCORE_DECIMALS

    def on_grid(score: float) -> bool:
        steps = (score - lowest) / _REQUIRED_CHAR_STEP
        return round(steps) <= _REQUIRED_CHAR_STEPS and abs(steps - round(steps)) * _REQUIRED_CHAR_STEP <= tolerance

    appended = [i for i, (piece, score) in enumerate(rest) if len(piece) == 1 and on_grid(score)]
    scores = sorted((rest[i][1] for i in appended), reverse=True)
    for i, piece, score in zip(appended, sorted(rest[i][0] for i in appended), scores):
        rest[i] = [piece, score]
    rest.sort(key=lambda entry: (-entry[1], entry[0]))
    data["model"]["vocab"] = head + rest
    return Tokenizer.from_str(json.dumps(data, ensure_ascii=False))
