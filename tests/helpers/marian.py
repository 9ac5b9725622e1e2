"""A tiny Marian checkpoint as the teacher of a small recipe (the `marian` fixture itself is in
tests/training/conftest.py)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

RECIPE = """name: hf_smoke
data: {{source: multi30k, src_lang: en, tgt_lang: fr, max_train: 100, max_valid: 20, max_test: 20}}
tokenizer: {{kind: unigram, vocab_size: 400}}
teacher:
  pretrained: {{path: {path}{decoder}}}
distill:
  corpus: {{beam: 1, batch_tokens: 2000}}
  student:
    model: {{d_model: 16, encoder_layers: 1, decoder_layers: 1, heads: 2, head_dim: 8, ffn_dim: 32, max_positions: 128}}
    train: {{lr: 0.003, warmup_steps: 5, batch_tokens: 1200, max_steps: 6, max_epochs: null,
            valid_bleu_sentences: 10, num_threads: 1}}
  ablation: false
evaluate: {{beam: 1, greedy_too: false}}
benchmark: {{sentences: 4, batch_size: 2, min_repeats: 1, max_repeats: 1, threads: [1], paired_rounds: 0}}
report: {{}}
"""


HUB_OFFLINE = {"HF_HUB_OFFLINE": "1"}


def biased_to(folder, ids):
    """The Marian checkpoint in folder, rewritten with its output layer biased to write `ids`."""
    import torch
    import transformers

    model = transformers.MarianMTModel.from_pretrained(str(folder))
    with torch.no_grad():
        model.final_logits_bias.fill_(-10.0)
        model.final_logits_bias[0, ids] = 5.0
    model.save_pretrained(folder)
    return folder


def _recipe(tmp_path, path, decoder=None):
    recipe = tmp_path / "hf.yaml"
    recipe.write_text(RECIPE.format(path=path, decoder=f", decoder: {decoder}" if decoder else ""), encoding="utf-8")
    return recipe


def make_marian(
    dest: Path,
    data_dir: Path,
    *,
    d_model: int = 32,
    layers: int = 1,
    heads: int = 2,
    ffn_dim: int = 64,
    vocab_size: int = 250,
    sentences: int = 400,
    seed: int = 0,
) -> Path:
    """A randomly initialised Marian checkpoint in `dest`, laid out as OPUS-MT's are: a
    SentencePiece model per language (source.spm, target.spm), trained here on the first
    `sentences` Multi30k sentences of each side, over one joint vocab.json. No network."""
    import sentencepiece as spm
    import transformers

    dest = Path(dest)
    work = dest.parent / f"{dest.name}.spm"
    dest.mkdir(parents=True)
    work.mkdir()
    vocab = {"</s>": 0, "<unk>": 1}
    for side, lang in (("source", "en"), ("target", "fr")):
        with gzip.open(Path(data_dir) / "multi30k" / f"train.{lang}.gz", "rt") as f:
            lines = [s.strip() for _, s in zip(range(sentences), f)]
        (work / f"{side}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        spm.SentencePieceTrainer.train(
            input=str(work / f"{side}.txt"),
            model_prefix=str(work / side),
            vocab_size=vocab_size,
            character_coverage=1.0,
            bos_id=-1,
            eos_id=1,
            pad_id=-1,
            unk_id=0,
            minloglevel=2,
        )
        shutil.copyfile(work / f"{side}.model", dest / f"{side}.spm")
        pieces = spm.SentencePieceProcessor(model_file=str(work / f"{side}.model"))
        for i in range(pieces.get_piece_size()):
            vocab.setdefault(pieces.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)  # Marian's pad is the last id
    (dest / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    tokenizer = transformers.MarianTokenizer(
        vocab=str(dest / "vocab.json"),
        source_spm=str(dest / "source.spm"),
        target_spm=str(dest / "target.spm"),
        source_lang="en",
        target_lang="fr",
    )
    config = transformers.MarianConfig(
        vocab_size=len(vocab),
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=ffn_dim,
        decoder_ffn_dim=ffn_dim,
        max_position_embeddings=128,
        pad_token_id=vocab["<pad>"],
        eos_token_id=0,
        decoder_start_token_id=vocab["<pad>"],
        forced_eos_token_id=0,
    )
    transformers.set_seed(seed)
    transformers.MarianMTModel(config).save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    shutil.rmtree(work)
    return dest
