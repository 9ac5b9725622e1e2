"""Data, tokenizer, the Transformer, training, distillation, pruning, an imported teacher."""
