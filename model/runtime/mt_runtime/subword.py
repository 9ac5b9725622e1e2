"""The joint subword tokenizer (HF `tokenizers`). Torch-free: the shipped runtime uses it too.

One vocabulary for both sides (the embeddings are tied). Its tokenizer.json encodes sources and
decodes any id; a vocabulary taken from an imported teacher whose sides split text differently
(Marian's two SentencePiece models) has a tokenizer.target.json beside it, which encodes the
training targets as the teacher wrote them (model/hf_tokenizer.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from tokenizers import Tokenizer

from .lines import one_line

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = [PAD, BOS, EOS, UNK]  # ids 0..3, in this order, in the vocabularies trained here
TARGET_FILE = "tokenizer.target.json"


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
        """One text per sequence, on one line (a piece holding a line break gives a space: mt_runtime/lines.py)."""
        cleaned = [[i for i in ids if i not in self._dropped] for ids in batch]
        return [one_line(text) for text in self.tok.decode_batch(cleaned, skip_special_tokens=False)]

    def special_ids(self) -> dict:
        return {"pad": self.pad_id, "bos": self.bos_id, "eos": self.eos_id, "unk": self.unk_id}

    def describe(self) -> str:
        return json.dumps({"vocab_size": self.vocab_size, **self.special_ids()})
