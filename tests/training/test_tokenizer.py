"""The tokenizer stage gives one file for one corpus: the same ids, so the same embeddings and
the same model from the same recipe."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from tests.helpers import REPO, _data_dir

TRAIN = """
import gzip, sys
from mt_runtime.subword import SubwordTokenizer
from model.subword_training import train_subword
lines = []
for lang in ("en", "fr"):
    with gzip.open(sys.argv[1] + f"/train.{lang}.gz", "rt", encoding="utf-8") as f:
        lines += [next(f).strip() for _ in range(3000)]
train_subword(lines, 1000, sys.argv[3]).save(sys.argv[2])
"""


def _train_in_a_fresh_process(out, kind="unigram") -> bytes:
    # A process of its own each time: the trainer's hash maps are seeded per process.
    subprocess.run(
        [sys.executable, "-c", TRAIN, str(_data_dir() / "multi30k"), str(out), kind], cwd=REPO, check=True, timeout=120
    )
    return out.read_bytes()


@pytest.mark.slow
def test_unigram_training_is_reproducible_to_the_byte(tmp_path):
    files = {hashlib.sha256(_train_in_a_fresh_process(tmp_path / f"{i}.json")).hexdigest() for i in range(3)}
    assert len(files) == 1
    vocab = json.loads((tmp_path / "0.json").read_text())["model"]["vocab"]
    assert [p for p, _ in vocab[:4]] == ["<pad>", "<s>", "</s>", "<unk>"]
    scores = [s for _, s in vocab[4:]]
    assert scores == sorted(scores, reverse=True)  # best first, as the trainer gives them
