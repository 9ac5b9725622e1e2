"""The training tests' fixtures: a tiny Marian checkpoint (an imported teacher)."""

from __future__ import annotations

import pytest

from tests.helpers.marian import make_marian


@pytest.fixture(scope="module")
def marian(tmp_path_factory, data_dir):
    """A Marian checkpoint folder as OPUS-MT's are laid out: a SentencePiece model per language
    (source.spm, target.spm) over one joint vocab.json."""
    pytest.importorskip("transformers")
    pytest.importorskip("sentencepiece")
    return make_marian(tmp_path_factory.mktemp("marian") / "opus-mt-tiny", data_dir)
