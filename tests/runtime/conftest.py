"""The runtime tests' fixtures: an int8 package with a shortlist, to check and to change."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mt_runtime.shortlist import build_shortlist

from model.subword_training import train_subword
from model.transformer import Transformer
from pipeline.export.package_builder import build_package
from tests.helpers import multi30k_head, one_layer_config
from tests.helpers.packages import POSITIONS


@pytest.fixture(scope="module")
def package(tmp_path_factory, data_dir) -> Path:
    """An int8 package with a shortlist, from a small untrained model (3 s)."""
    folder = tmp_path_factory.mktemp("package")
    en, fr = multi30k_head(data_dir, "en", 200), multi30k_head(data_dir, "fr", 200)
    tokenizer = train_subword(en + fr, vocab_size=200)
    tokenizer.save(folder / "tokenizer.json")
    table, _ = build_shortlist(
        list(zip(tokenizer.encode(en), tokenizer.encode(fr))),
        tokenizer.vocab_size,
        frequent=10,
        per_word=3,
        always=[0, 1, 2, 3],
    )
    table.save(folder / "shortlist.npz")
    torch.manual_seed(0)
    cfg = one_layer_config(tokenizer.vocab_size, head_dim=8, max_positions=POSITIONS, dropout=0.0)
    build_package(
        Transformer(cfg).eval(),
        "int8_dynamic",
        folder / "int8",
        tokenizer=folder / "tokenizer.json",
        work=folder / "work",
        shortlist=folder / "shortlist.npz",
    )
    return folder / "int8"
