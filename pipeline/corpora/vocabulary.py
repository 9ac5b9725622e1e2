"""The joint subword vocabulary's text and figures: the training sentences it is trained on (both
sides, streamed, or a sample of them), an imported teacher's own vocabulary in our format, and how
a vocabulary splits the validation split."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Iterable

from mt_runtime.subword import SubwordTokenizer

from ..engine.errors import UserInputError
from .splits import read_split, reservoir_sample, split_lines


def training_sentences(data: Path, train_pairs: int, max_sentences: int | None) -> tuple[Iterable[str], int]:
    """Both sides of the training split, streamed from the files (the corpus is never held whole),
    and how many: a sample of `max_sentences` (drawn in one pass, seed 0) where there are more."""
    total = 2 * train_pairs
    sentences = itertools.chain(split_lines(data, "train", "src"), split_lines(data, "train", "tgt"))
    if max_sentences is not None and total > max_sentences:
        return reservoir_sample(sentences, max_sentences, random.Random(0)), max_sentences
    return sentences, total


def teacher_vocabulary(teacher: Path) -> SubwordTokenizer:
    """An imported teacher's vocabulary (its artifact's checkpoint/) in our format (model/hf_tokenizer.py)."""
    from model.hf_tokenizer import UnconvertibleTokenizer, teacher_tokenizers

    try:
        return SubwordTokenizer(*teacher_tokenizers(teacher / "checkpoint"))
    except (UnconvertibleTokenizer, ValueError) as exc:
        raise UserInputError(
            f"tokenizer.kind: teacher: the teacher's tokenizer cannot be the student's: {exc}; "
            "train the student its own (kind: unigram)"
        ) from None


def split_scores(tok: SubwordTokenizer, data: Path) -> dict:
    """How the tokenizer splits the validation split: pieces per sentence, unknown pieces, and
    how many targets decode back to themselves."""
    valid_src, valid_tgt = read_split(data, "valid")
    stats = {}
    for side, ids in (("src", tok.encode(valid_src)), ("tgt", tok.encode_target(valid_tgt))):
        pieces = sum(len(x) for x in ids)
        stats[f"valid_{side}_tokens_per_sentence"] = round(pieces / max(1, len(ids)), 2)
        stats[f"valid_{side}_unk_rate"] = round(sum(x.count(tok.unk_id) for x in ids) / max(1, pieces), 5)
    round_trip = sum(tok.decode(tok.encode_target([s]))[0] == s for s in valid_tgt) / max(1, len(valid_tgt))
    return {"valid_round_trip_exact": round(round_trip, 4), **stats}
