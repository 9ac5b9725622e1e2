"""How big a Transformer a configuration asks for, computed before anything is allocated.

One rule for recipes (pipeline/engine/recipe.py's ModelSpec) and for a model's config.json
(TransformerConfig, which a downloaded model folder brings): every size is a positive integer
within MAX_DIM / MAX_LAYERS, and the parameters the layers and the token table add up to stay
within MAX_PARAMETERS. A config that asks for more is refused with one line, instead of torch
trying to allocate it. Torch-free.
"""

from __future__ import annotations

from typing import Sequence

MAX_DIM = 65536  # d_model, head_dim, an FFN width, an embedding width, max_positions
MAX_LAYERS = 1024  # layers of the encoder or the decoder; heads in one attention layer
MAX_VOCAB = 1 << 20
MAX_PARAMETERS = 2_000_000_000  # 8 GB of float32 weights, far beyond what this pipeline trains


def parameter_count(
    d_model: int,
    head_dim: int,
    enc_heads: Sequence[int],
    dec_self_heads: Sequence[int],
    dec_cross_heads: Sequence[int],
    enc_ffn: Sequence[int],
    dec_ffn: Sequence[int],
    vocab_size: int = 0,
    embed_dim: int | None = None,
) -> int:
    """Parameters of model/transformer.py's Transformer with this shape (biases and norms included)."""
    d = d_model

    def attention(heads: int) -> int:  # q, k, v and out projections with biases
        inner = heads * head_dim
        return 4 * d * inner + 3 * inner + d

    def ffn(hidden: int) -> int:
        return 2 * d * hidden + hidden + d

    total = sum(attention(h) + ffn(f) + 4 * d for h, f in zip(enc_heads, enc_ffn))
    total += sum(
        attention(s) + attention(c) + ffn(f) + 6 * d for s, c, f in zip(dec_self_heads, dec_cross_heads, dec_ffn)
    )
    table = embed_dim or d
    total += vocab_size * table + (table * d if embed_dim else 0) + 4 * d
    return total


def size_problem(
    d_model: int,
    head_dim: int,
    enc_heads: Sequence[int],
    dec_self_heads: Sequence[int],
    dec_cross_heads: Sequence[int],
    enc_ffn: Sequence[int],
    dec_ffn: Sequence[int],
    vocab_size: int = 0,
    embed_dim: int | None = None,
    max_positions: int = 1,
) -> str | None:
    """None when the shape is within the bounds above; else why not (one line)."""
    lists = {
        "encoder heads": enc_heads,
        "decoder self-attention heads": dec_self_heads,
        "decoder cross-attention heads": dec_cross_heads,
        "encoder FFN widths": enc_ffn,
        "decoder FFN widths": dec_ffn,
    }
    for name, values in lists.items():
        if not isinstance(values, (list, tuple)) or len(values) > MAX_LAYERS:
            return f"{name}: must be a list of at most {MAX_LAYERS} layers"
    scalars = {
        "d_model": (d_model, MAX_DIM),
        "head_dim": (head_dim, MAX_DIM),
        "max_positions": (max_positions, MAX_DIM),
    }
    if vocab_size != 0:  # 0: not known yet (a recipe's model, before its tokenizer)
        scalars["vocab_size"] = (vocab_size, MAX_VOCAB)
    if embed_dim is not None:
        scalars["embed_dim"] = (embed_dim, MAX_DIM)
    for name, values in lists.items():
        limit = MAX_LAYERS if "heads" in name else MAX_DIM
        bad = next((v for v in values if not _in_range(v, limit)), None)
        if bad is not None or any(isinstance(v, bool) for v in values):
            return f"{name}: each must be an integer from 1 to {limit}, got {_short(bad)}"
    for name, (value, limit) in scalars.items():
        if not _in_range(value, limit):
            return f"{name}: must be an integer from 1 to {limit}, got {_short(value)}"
    count = parameter_count(
        d_model, head_dim, enc_heads, dec_self_heads, dec_cross_heads, enc_ffn, dec_ffn, vocab_size, embed_dim
    )
    if count > MAX_PARAMETERS:
        return f"about {count:,} parameters, more than the {MAX_PARAMETERS:,} this pipeline builds"
    return None


def _in_range(value: object, limit: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= limit


def _short(value: object) -> str:
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**30 else "a very large integer"
    return text if len(text) <= 40 else text[:37] + "..."
