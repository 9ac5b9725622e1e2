"""Greedy and beam search, in NumPy, over any incremental decoder.

One implementation serves every runtime: PyTorch (model/torch_decoder.py) and ONNX Runtime
(model/runtime.py) only have to provide `encode` and `step`. This file imports NumPy alone,
so the shipped runtime stays free of torch.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np


class IncrementalDecoder(Protocol):
    def encode(self, src: list[list[int]], beam: int) -> None:
        """Run the encoder on a batch (ids end with EOS) and keep each sentence's state
        repeated `beam` times (row b * beam + k is beam k of sentence b)."""

    def step(self, tokens: np.ndarray, parents: np.ndarray | None) -> np.ndarray:
        """Feed one token per row; first reorder the cache rows by `parents` (if given).
        Returns log-probabilities [rows, vocab] as float32."""


@dataclass(frozen=True)
class GenerationConfig:
    beam: int = 4
    length_penalty: float = 1.0  # hypothesis score = sum log p / length ** length_penalty
    max_len_a: float = 1.5  # max target length = a * source length + b (capped by the model)
    max_len_b: int = 10
    bos_id: int = 1
    eos_id: int = 2
    pad_id: int = 0
    max_positions: int = 256

    def max_len(self, src_len: int) -> int:
        return max(1, min(int(self.max_len_a * src_len + self.max_len_b), self.max_positions - 1))


def greedy_search(decoder: IncrementalDecoder, src: list[list[int]], gen: GenerationConfig) -> list[list[int]]:
    decoder.encode(src, 1)
    n = len(src)
    limits = np.array([gen.max_len(len(s)) for s in src])
    out = np.full((n, int(limits.max())), gen.pad_id, dtype=np.int64)
    lengths = np.zeros(n, dtype=np.int64)
    done = np.zeros(n, dtype=bool)
    tokens = np.full(n, gen.bos_id, dtype=np.int64)
    for t in range(int(limits.max())):
        logp = decoder.step(tokens, None)
        nxt = logp.argmax(axis=-1).astype(np.int64)
        nxt[t + 1 >= limits] = gen.eos_id  # out of room: end here
        nxt[done] = gen.pad_id
        out[:, t] = nxt
        lengths[~done] += 1
        done |= nxt == gen.eos_id
        if done.all():
            break
        tokens = np.where(done, gen.eos_id, nxt)
    results = []
    for i, row in enumerate(out[:, : int(lengths.max())].tolist()):
        row = row[: lengths[i]]
        results.append(row[:-1] if row and row[-1] == gen.eos_id else row)
    return results


def beam_search(decoder: IncrementalDecoder, src: list[list[int]], gen: GenerationConfig) -> list[list[int]]:
    """Batched beam search. A sentence is finished once it holds `beam` ended hypotheses (or
    reaches its length limit); the loop stops as soon as every sentence is finished."""
    k = gen.beam
    if k == 1:
        return greedy_search(decoder, src, gen)
    decoder.encode(src, k)
    n = len(src)
    limits = [gen.max_len(len(s)) for s in src]
    scores = np.full((n, k), -np.inf, dtype=np.float64)
    scores[:, 0] = 0.0  # all beams start identical: only the first may expand at step 0
    seqs: list[list[list[int]]] = [[[] for _ in range(k)] for _ in range(n)]
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(n)]
    done = np.zeros(n, dtype=bool)
    tokens = np.full(n * k, gen.bos_id, dtype=np.int64)
    parents = None
    for t in range(max(limits)):
        logp = decoder.step(tokens, parents).astype(np.float64)
        vocab = logp.shape[-1]
        cand = (scores[:, :, None] + logp.reshape(n, k, vocab)).reshape(n, k * vocab)
        top = np.argpartition(-cand, 2 * k, axis=1)[:, : 2 * k]
        new_parents = np.zeros(n * k, dtype=np.int64)
        new_tokens = np.full(n * k, gen.eos_id, dtype=np.int64)
        new_scores = np.full((n, k), -np.inf)
        new_seqs: list[list[list[int]]] = [[[] for _ in range(k)] for _ in range(n)]
        for b in range(n):
            if done[b]:
                new_parents[b * k: (b + 1) * k] = b * k
                continue
            order = top[b][np.argsort(-cand[b, top[b]], kind="stable")]
            last_step = t + 1 >= limits[b]
            slot = 0
            for flat in order:
                score = cand[b, flat]
                if not np.isfinite(score):
                    break
                beam_i, token = divmod(int(flat), vocab)
                prefix = seqs[b][beam_i]
                if token == gen.eos_id or last_step:
                    if len(finished[b]) < k:
                        length = len(prefix) + 1
                        finished[b].append((score / length ** gen.length_penalty, prefix))
                    continue
                new_seqs[b][slot] = prefix + [token]
                new_scores[b, slot] = score
                new_parents[b * k + slot] = b * k + beam_i
                new_tokens[b * k + slot] = token
                slot += 1
                if slot == k:
                    break
            for empty in range(slot, k):  # keep cache rows valid for unused slots
                new_parents[b * k + empty] = b * k
            if len(finished[b]) >= k or slot == 0:
                done[b] = True
        if done.all():
            break
        scores, seqs, parents, tokens = new_scores, new_seqs, new_parents, new_tokens
    results = []
    for b in range(n):
        if finished[b]:
            results.append(max(finished[b], key=lambda x: x[0])[1])
        else:
            best = int(np.argmax(scores[b]))
            results.append(seqs[b][best])
    return results


def search(decoder: IncrementalDecoder, src: list[list[int]], gen: GenerationConfig) -> list[list[int]]:
    return greedy_search(decoder, src, gen) if gen.beam == 1 else beam_search(decoder, src, gen)


# ----------------------------------------------------------------------- text to text
class Tokenizer(Protocol):
    eos_id: int

    def encode(self, sentences: Sequence[str]) -> list[list[int]]: ...

    def decode(self, batch: Sequence[Sequence[int]]) -> list[str]: ...


def prepare_sources(tokenizer: Tokenizer, sentences: Sequence[str], max_positions: int,
                    warn: bool = True) -> list[list[int]]:
    """Subword ids + EOS, truncated to what the model's positions allow (with a warning)."""
    ids = tokenizer.encode(list(sentences))
    limit = max_positions - 1
    out, cut = [], 0
    for seq in ids:
        if len(seq) > limit:
            seq, cut = seq[:limit], cut + 1
        out.append(seq + [tokenizer.eos_id])
    if cut and warn:
        warnings.warn(f"{cut} input sentence(s) longer than the model's {limit} tokens were truncated",
                      stacklevel=2)
    return out


def translate_sentences(decoder: IncrementalDecoder, tokenizer: Tokenizer, sentences: Sequence[str],
                        gen: GenerationConfig, batch_tokens: int = 4000, max_batch: int = 256,
                        on_batch=None) -> list[str]:
    """Translate in length-sorted batches (less padding), returning results in input order.
    Empty inputs give empty outputs without touching the model."""
    sentences = list(sentences)
    results = [""] * len(sentences)
    todo = [i for i, s in enumerate(sentences) if s.strip()]
    src = prepare_sources(tokenizer, [sentences[i] for i in todo], gen.max_positions)
    order = sorted(range(len(todo)), key=lambda j: len(src[j]))
    start = 0
    while start < len(order):
        end, longest = start, 0
        while end < len(order) and end - start < max_batch:
            longest = max(longest, len(src[order[end]]))
            if (end - start + 1) * longest * gen.beam > batch_tokens and end > start:
                break
            end += 1
        batch = [src[order[j]] for j in range(start, end)]
        hyps = search(decoder, batch, gen)
        for j, text in zip(range(start, end), tokenizer.decode(hyps)):
            results[todo[order[j]]] = text
        if on_batch:
            on_batch(end - start)
        start = end
    return results
