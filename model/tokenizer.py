"""The joint subword tokenizer (HF `tokenizers`). Torch-free: the shipped runtime uses it too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = [PAD, BOS, EOS, UNK]  # ids 0..3, in this order
# A generous alphabet of Latin letters so rare accented letters are not <unk> at test time.
_EXTRA_ALPHABET = list("àâäáãåæçéèêëíìîïñóòôöõøœúùûüýÿßÀÂÄÁÃÅÆÇÉÈÊËÍÌÎÏÑÓÒÔÖÕØŒÚÙÛÜÝŸ«»“”‘’–—…€")


class SubwordTokenizer:
    def __init__(self, tokenizer: Tokenizer):
        self.tok = tokenizer
        ids = [tokenizer.token_to_id(t) for t in SPECIALS]
        if None in ids:
            raise ValueError(f"tokenizer lacks special tokens {SPECIALS}")
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = ids
        self.vocab_size = tokenizer.get_vocab_size()

    @classmethod
    def load(cls, path: str | Path) -> "SubwordTokenizer":
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        return cls(Tokenizer.from_file(str(path)))

    @classmethod
    def train(cls, sentences: Iterable[str], vocab_size: int, kind: str = "unigram",
              count: int | None = None) -> "SubwordTokenizer":
        meta = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
        if kind == "unigram":
            tok = Tokenizer(models.Unigram())
            trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, unk_token=UNK,
                                              initial_alphabet=_EXTRA_ALPHABET, max_piece_length=16,
                                              show_progress=False)
        elif kind == "bpe":
            tok = Tokenizer(models.BPE(unk_token=UNK))
            trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, min_frequency=2,
                                          initial_alphabet=_EXTRA_ALPHABET, show_progress=False)
        else:
            raise ValueError(f"unknown tokenizer kind {kind!r}")
        tok.pre_tokenizer = meta
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
        tok.train_from_iterator(sentences, trainer, length=count)
        return cls(tok)

    def save(self, path: str | Path) -> None:
        self.tok.save(str(path))

    def encode(self, sentences: Sequence[str]) -> list[list[int]]:
        """Subword ids without specials (the model adds EOS / BOS)."""
        return [e.ids for e in self.tok.encode_batch(list(sentences), add_special_tokens=False)]

    def decode(self, batch: Sequence[Sequence[int]]) -> list[str]:
        cleaned = [[i for i in ids if i >= self.unk_id] for ids in batch]  # drop pad, bos, eos
        return self.tok.decode_batch(cleaned, skip_special_tokens=False)

    def special_ids(self) -> dict:
        return {"pad": self.pad_id, "bos": self.bos_id, "eos": self.eos_id, "unk": self.unk_id}

    def describe(self) -> str:
        return json.dumps({"vocab_size": self.vocab_size, **self.special_ids()})
