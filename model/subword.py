"""The joint subword tokenizer (HF `tokenizers`). Torch-free: the shipped runtime uses it too.

One vocabulary for both sides (the embeddings are tied). Its tokenizer.json encodes sources and
decodes any id; a vocabulary taken from an imported teacher whose sides split text differently
(Marian's two SentencePiece models) has a tokenizer.target.json beside it, which encodes the
training targets as the teacher wrote them (model/hf_tokenizer.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Iterable, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from .lines import one_line

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = [PAD, BOS, EOS, UNK]  # ids 0..3, in this order, in the vocabularies trained here
TARGET_FILE = "tokenizer.target.json"
# A generous alphabet of Latin letters so rare accented letters are not <unk> at test time.
_EXTRA_ALPHABET = list("àâäáãåæçéèêëíìîïñóòôöõøœúùûüýÿßÀÂÄÁÃÅÆÇÉÈÊËÍÌÎÏÑÓÒÔÖÕØŒÚÙÛÜÝŸ«»“”‘’–—…€")


class SubwordTokenizer:
    def __init__(self, tokenizer: Tokenizer, target: Tokenizer | None = None):
        self.tok, self.target = tokenizer, target
        ids = [tokenizer.token_to_id(t) for t in SPECIALS]
        if None in ids:
            raise ValueError(f"tokenizer lacks special tokens {SPECIALS}")
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = ids
        self.vocab_size = tokenizer.get_vocab_size()
        if target is not None and (
            target.get_vocab_size() != self.vocab_size or [target.token_to_id(t) for t in SPECIALS] != ids
        ):
            raise ValueError("the target-side tokenizer's vocabulary is not the source side's")
        self._dropped = {self.pad_id, self.bos_id, self.eos_id}

    @classmethod
    def load(cls, path: str | Path) -> "SubwordTokenizer":
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        target = path.with_name(TARGET_FILE)
        return cls(Tokenizer.from_file(str(path)), Tokenizer.from_file(str(target)) if target.is_file() else None)

    @classmethod
    def train(
        cls, sentences: Iterable[str], vocab_size: int, kind: str = "unigram", count: int | None = None
    ) -> "SubwordTokenizer":
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
        return cls(_canonical_unigram(tok) if kind == "unigram" else tok)

    def save(self, path: str | Path) -> None:
        """tokenizer.json at `path`, and the target side's file beside it where there is one."""
        self.tok.save(str(path))
        if self.target is not None:
            self.target.save(str(Path(path).with_name(TARGET_FILE)))

    def encode(self, sentences: Sequence[str]) -> list[list[int]]:
        """Subword ids of sources without specials (the model adds EOS / BOS)."""
        return [e.ids for e in self.tok.encode_batch(list(sentences), add_special_tokens=False)]

    def encode_target(self, sentences: Sequence[str]) -> list[list[int]]:
        """Subword ids of target-language sentences (training targets, outputs counted)."""
        if self.target is None:
            return self.encode(sentences)
        return [e.ids for e in self.target.encode_batch(list(sentences), add_special_tokens=False)]

    def decode(self, batch: Sequence[Sequence[int]]) -> list[str]:
        """One text per sequence, on one line (a piece holding a line break gives a space: model/lines.py)."""
        cleaned = [[i for i in ids if i not in self._dropped] for ids in batch]
        return [one_line(text) for text in self.tok.decode_batch(cleaned, skip_special_tokens=False)]

    def special_ids(self) -> dict:
        return {"pad": self.pad_id, "bos": self.bos_id, "eos": self.eos_id, "unk": self.unk_id}

    def describe(self) -> str:
        return json.dumps({"vocab_size": self.vocab_size, **self.special_ids()})


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
