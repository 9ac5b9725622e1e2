"""A tiny Marian checkpoint as the teacher of a small recipe (the `marian` fixture itself is in
tests/training/conftest.py)."""

from __future__ import annotations

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
