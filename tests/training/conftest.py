"""The training tests' fixtures: a tiny Marian checkpoint (an imported teacher)."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest


@pytest.fixture(scope="module")
def marian(tmp_path_factory, data_dir):
    """A Marian checkpoint folder as OPUS-MT's are laid out: a SentencePiece model per language
    (source.spm, target.spm) over one joint vocab.json."""
    transformers = pytest.importorskip("transformers")
    spm = pytest.importorskip("sentencepiece")
    folder = tmp_path_factory.mktemp("marian")
    ckpt = folder / "opus-mt-tiny"
    ckpt.mkdir()
    vocab = {"</s>": 0, "<unk>": 1}
    for side, lang in (("source", "en"), ("target", "fr")):
        with gzip.open(data_dir / "multi30k" / f"train.{lang}.gz", "rt") as f:
            lines = [s.strip() for _, s in zip(range(400), f)]
        (folder / f"{side}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        spm.SentencePieceTrainer.train(
            input=str(folder / f"{side}.txt"),
            model_prefix=str(folder / side),
            vocab_size=250,
            character_coverage=1.0,
            bos_id=-1,
            eos_id=1,
            pad_id=-1,
            unk_id=0,
            minloglevel=2,
        )
        shutil.copyfile(folder / f"{side}.model", ckpt / f"{side}.spm")
        pieces = spm.SentencePieceProcessor(model_file=str(folder / f"{side}.model"))
        for i in range(pieces.get_piece_size()):
            vocab.setdefault(pieces.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)  # Marian's pad is the last id
    (ckpt / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    tokenizer = transformers.MarianTokenizer(
        vocab=str(ckpt / "vocab.json"),
        source_spm=str(ckpt / "source.spm"),
        target_spm=str(ckpt / "target.spm"),
        source_lang="en",
        target_lang="fr",
    )
    config = transformers.MarianConfig(
        vocab_size=len(vocab),
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=128,
        pad_token_id=vocab["<pad>"],
        eos_token_id=0,
        decoder_start_token_id=vocab["<pad>"],
        forced_eos_token_id=0,
    )
    transformers.set_seed(0)
    transformers.MarianMTModel(config).save_pretrained(ckpt)
    tokenizer.save_pretrained(ckpt)
    return ckpt
