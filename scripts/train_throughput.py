"""Training throughput of our Transformer against torch.nn.Transformer of the same shape.

Both are trained in the same plain loop (Adam, label-smoothed cross-entropy, the same batches of
real Multi30k subword ids, padding included), alternating round by round so that machine load
hits both alike. Target tokens per second (non-padding) are printed for each.

    python scripts/train_throughput.py [--d-model 256 --layers 3 --heads 4 --ffn 1024 --vocab 8000]
"""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from model.subword_training import train_subword
from model.transformer import Transformer, TransformerConfig
from pipeline.corpora.encoded import encode_corpus
from pipeline.training.loop import collate, make_batches


class TorchReference(nn.Module):
    """torch.nn.Transformer with tied embeddings, sinusoidal positions and a tied output layer."""

    def __init__(self, vocab: int, d: int, heads: int, layers: int, ffn: int, dropout: float, pad: int):
        super().__init__()
        self.pad, self.d = pad, d
        self.embed = nn.Embedding(vocab, d, padding_idx=pad)
        self.core = nn.Transformer(d, heads, layers, layers, ffn, dropout, batch_first=True)
        from model.transformer import sinusoidal_positions

        self.register_buffer("pos", sinusoidal_positions(512, d), persistent=False)
        self.drop = nn.Dropout(dropout)

    def forward(self, src, tgt_in, tgt_out):
        emb = lambda x: self.drop(self.embed(x) * self.d**0.5 + self.pos[: x.shape[1]])  # noqa: E731
        causal = self.core.generate_square_subsequent_mask(tgt_in.shape[1])
        h = self.core(
            emb(src),
            emb(tgt_in),
            tgt_mask=causal,
            tgt_is_causal=True,
            src_key_padding_mask=src == self.pad,
            memory_key_padding_mask=src == self.pad,
        )
        return F.linear(h[tgt_out != self.pad], self.embed.weight)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--batch-tokens", type=int, default=2500)
    ap.add_argument("--batches", type=int, default=12, help="timed batches per model per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--data", default=os.environ.get("PIPELINE_DATA", "../shared/data"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    folder = Path(args.data) / "multi30k"
    src = gzip.open(folder / "train.en.gz", "rt", encoding="utf-8").read().split("\n")[:5000]
    tgt = gzip.open(folder / "train.fr.gz", "rt", encoding="utf-8").read().split("\n")[:5000]
    tok = train_subword(src + tgt, args.vocab)
    corpus = encode_corpus(tok, src, tgt, 256)
    batches = make_batches(corpus, args.batch_tokens, seed=0, epoch=0)

    cfg = TransformerConfig(
        vocab_size=tok.vocab_size,
        d_model=args.d_model,
        head_dim=args.d_model // args.heads,
        enc_heads=[args.heads] * args.layers,
        dec_self_heads=[args.heads] * args.layers,
        dec_cross_heads=[args.heads] * args.layers,
        enc_ffn=[args.ffn] * args.layers,
        dec_ffn=[args.ffn] * args.layers,
        pad_id=tok.pad_id,
        bos_id=tok.bos_id,
        eos_id=tok.eos_id,
    )
    models = {
        "ours (model/transformer.py)": Transformer(cfg),
        "torch.nn.Transformer": TorchReference(
            tok.vocab_size, args.d_model, args.heads, args.layers, args.ffn, 0.1, tok.pad_id
        ),
    }
    optims = {k: torch.optim.Adam(m.parameters(), lr=3e-4, betas=(0.9, 0.98), eps=1e-9) for k, m in models.items()}
    rates: dict[str, list[float]] = {k: [] for k in models}

    def train(name: str, index) -> int:
        model, opt = models[name], optims[name]
        s, tin, tout = collate(corpus, index, tok.pad_id, tok.bos_id, tok.eos_id, "cpu")
        target = tout[tout != tok.pad_id]
        loss = F.cross_entropy(model(s, tin, tout), target, label_smoothing=0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return int(target.numel())

    for name, model in models.items():
        model.train()
        for index in batches[:2]:  # warm-up
            train(name, index)
    for r in range(args.rounds):
        chunk = batches[2 + r * args.batches : 2 + (r + 1) * args.batches]
        for name in models:
            t0, tokens = time.perf_counter(), 0
            for index in chunk:
                tokens += train(name, index)
            rates[name].append(tokens / (time.perf_counter() - t0))
    params = {k: sum(p.numel() for p in m.parameters()) for k, m in models.items()}
    print(
        f"d_model {args.d_model}, {args.layers}+{args.layers} layers, {args.heads} heads, FFN {args.ffn}, "
        f"vocab {tok.vocab_size}, ~{args.batch_tokens} tokens/batch, {args.threads} threads, torch {torch.__version__}"
    )
    for name, values in rates.items():
        print(
            f"  {name:<30} {statistics.median(values):8.0f} target tokens/s  (rounds: "
            f"{', '.join(f'{v:.0f}' for v in values)}; {params[name]:,} parameters)"
        )


if __name__ == "__main__":
    main()
