"""Greedy and beam search, in NumPy, over any incremental decoder.

One implementation serves every runtime: PyTorch (model/torch_decoder.py) and ONNX Runtime
(model/runtime.py) only have to provide `encode` and `step`. This file imports NumPy alone,
so the shipped runtime stays free of torch.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Protocol, Sequence

import numpy as np


class IncrementalDecoder(Protocol):
    def encode(self, src: list[list[int]], beam: int) -> None:
        """Run the encoder on a batch (ids end with EOS) and keep each sentence's state
        repeated `beam` times (row b * beam + k is beam k of sentence b)."""

    def step(self, tokens: np.ndarray, parents: np.ndarray | None) -> np.ndarray:
        """Feed one token per row; first reorder the cache rows by `parents` (if given).
        Returns log-probabilities [rows, vocab] as float32."""

    # Optional, for many rows (see step_top_k and the searches below):
    #   step_top_k(tokens, parents, m, scores) -> (log-probabilities [rows, m], ids [rows, m]),
    #       best first, or None where it cannot (then step() is used); with scores=False the
    #       values need only rank the words (logits will do: no softmax over the vocabulary);
    #   keep(rows): from now on only these rows of the encoder state (the sentences still being
    #       searched); the cache follows `parents` of the next step, which index the old rows.


def step_top_k(decoder: IncrementalDecoder, tokens: np.ndarray, parents: np.ndarray | None,
               m: int, scores: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """One decoder step's m best words per row, best first: (log-probabilities, ids), [rows, m].
    From the decoder itself where it can (onnxruntime's TopK inside the graph, torch.topk),
    else from the whole distribution here. scores=False: the values may be anything in the
    same order (the logits), for a search that keeps only the ids."""
    direct = getattr(decoder, "step_top_k", None)
    got = direct(tokens, parents, m, scores) if direct else None
    if got is not None:
        return got
    return best_of(decoder.step(tokens, parents), m)


def best_of(scores: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The m highest entries of each row of [rows, vocab], best first: (values, ids)."""
    m = min(m, scores.shape[-1])
    if m == 1:  # greedy steps: plain indexing costs a quarter of take_along_axis at 32 rows
        ids = scores.argmax(axis=-1)
        return scores[np.arange(len(ids)), ids][:, None], ids[:, None]
    ids = top_k_indices(scores, m)
    values = np.take_along_axis(scores, ids, 1)
    order = np.argsort(-values, axis=1, kind="stable")
    return np.take_along_axis(values, order, 1), np.take_along_axis(ids, order, 1)


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
    if len(src) == 1:
        return [_greedy_one(decoder, src[0], gen)]
    return _greedy_batch(decoder, src, gen, 0)[0]


def greedy_search_top_k(decoder: IncrementalDecoder, src: list[list[int]], gen: GenerationConfig,
                        k: int) -> tuple[list[list[int]], list[tuple[np.ndarray, np.ndarray]]]:
    """greedy_search, plus the model's k most likely words at every step of each output (its
    EOS step included): ids [steps, k] and their log-probabilities, best first. These are the
    distributions a teacher-forced pass over the output would give, at no extra model cost."""
    return _greedy_batch(decoder, src, gen, k)


def _greedy_batch(decoder: IncrementalDecoder, src: list[list[int]], gen: GenerationConfig, k: int):
    """Greedy search over a batch. A decoder that can `keep` rows stops computing a sentence's
    row once it has ended (CTranslate2 does the same): the rows left are the batch's work.
    Every row ends with EOS (at its length limit at the latest), so a row's length is read from
    `out` at the end instead of being counted each step: a step here is a handful of NumPy calls
    (at batch 32 the student's step graph takes about 0.7 ms, and each call a few us)."""
    decoder.encode(src, 1)
    n = len(src)
    shrink = hasattr(decoder, "keep")
    last_step = np.array([gen.max_len(len(s)) for s in src]) - 1  # per row: the step that must end it
    width = int(last_step.max()) + 1
    out = np.full((n, width), gen.pad_id, dtype=np.int64)
    top_ids = np.zeros((n, width, k), dtype=np.int64)
    top_logp = np.zeros((n, width, k), dtype=np.float32)
    alive = np.arange(n)  # the sentence of each row
    done = np.zeros(n, dtype=bool)  # per row; rows stay only where the decoder cannot drop them
    tokens = np.full(n, gen.bos_id, dtype=np.int64)
    parents = None
    for t in range(width):
        values, ids = step_top_k(decoder, tokens, parents, max(k, 1), scores=k > 0)
        nxt = ids[:, 0].astype(np.int64)
        if k:
            top_ids[alive, t], top_logp[alive, t] = ids[:, :k], values[:, :k]
        nxt[last_step <= t] = gen.eos_id  # out of room: end here
        if not shrink:
            nxt[done] = gen.pad_id
        out[alive, t] = nxt
        ended = nxt == gen.eos_id
        if not shrink:
            done |= ended
            if done.all():
                break
            tokens = np.where(done, gen.eos_id, nxt)
        elif ended.any():
            if ended.all():
                break
            rows = np.flatnonzero(~ended)
            decoder.keep(rows)
            parents, tokens, alive, last_step = rows, nxt[rows], alive[rows], last_step[rows]
        else:
            parents, tokens = None, nxt
    lengths = (out == gen.eos_id).argmax(axis=1) + 1  # up to and including each row's EOS
    results, tops = [], []
    for i, row in enumerate(out[:, : int(lengths.max())].tolist()):
        results.append(row[: lengths[i] - 1])  # without the EOS
        if k:
            tops.append((top_ids[i, : lengths[i]], top_logp[i, : lengths[i]]))
    return results, tops


def _greedy_one(decoder: IncrementalDecoder, src: list[int], gen: GenerationConfig) -> list[int]:
    """greedy_search for one sentence, the latency case: the same tokens, without the batch
    bookkeeping (a dozen NumPy calls a step)."""
    decoder.encode([src], 1)
    limit = gen.max_len(len(src))
    out: list[int] = []
    tokens = np.full(1, gen.bos_id, dtype=np.int64)
    for t in range(limit):
        nxt = int(decoder.step(tokens, None)[0].argmax())
        if nxt == gen.eos_id or t + 1 >= limit:  # ended, or out of room: end here
            break
        out.append(nxt)
        tokens = np.full(1, nxt, dtype=np.int64)
    return out


TOP_K_CHUNK = 64


def top_k_indices(x: np.ndarray, m: int) -> np.ndarray:
    """Column indices of the m largest entries of each row of x [rows, V], in no order.

    np.argpartition over a whole 8000-word row costs about 10 ns an entry (10 ms a step at
    batch 32 x beam 4, a third of a millisecond at beam 4 alone), far more than the decoder
    step. The m largest entries of a row lie in the m chunks with the largest maxima (a chunk
    outside those has m larger entries elsewhere), and chunk maxima are one vectorised pass:
    so only m chunks are partitioned. With ties the indices may differ, the values do not."""
    rows, width = x.shape
    chunks = width // TOP_K_CHUNK
    if chunks <= 4 * m:  # narrow rows: the plain partition is as fast
        return np.argpartition(-x, m - 1, axis=1)[:, :m]
    body = chunks * TOP_K_CHUNK
    maxima = x[:, :body].reshape(rows, chunks, TOP_K_CHUNK).max(axis=2)
    top_chunks = np.argpartition(-maxima, m - 1, axis=1)[:, :m]
    columns = (top_chunks[:, :, None] * TOP_K_CHUNK + np.arange(TOP_K_CHUNK)).reshape(rows, m * TOP_K_CHUNK)
    if body < width:  # the last, partial chunk is always a candidate
        columns = np.concatenate([columns, np.broadcast_to(np.arange(body, width), (rows, width - body))], axis=1)
    pick = np.argpartition(-np.take_along_axis(x, columns, axis=1), m - 1, axis=1)[:, :m]
    return np.take_along_axis(columns, pick, axis=1)


def beam_search(decoder: IncrementalDecoder, src: list[list[int]], gen: GenerationConfig) -> list[list[int]]:
    """The best hypothesis of each sentence (see beam_search_nbest)."""
    if gen.beam == 1:
        return greedy_search(decoder, src, gen)
    return [hyps[0][1] for hyps in beam_search_nbest(decoder, src, gen)]


def beam_search_nbest(decoder: IncrementalDecoder, src: list[list[int]],
                      gen: GenerationConfig) -> list[list[tuple[float, list[int]]]]:
    """Batched beam search returning each sentence's hypotheses as (score, tokens), best first:
    its finished ones (at most `beam`), or its best live one if none finished. A sentence is
    finished once it holds `beam` ended hypotheses (or reaches its length limit); the loop stops
    as soon as every sentence is finished.

    Each step, per sentence: the best 2k (beam, token) candidates in score order; the first k
    that do not end become the next beams; those that end (EOS, or the length limit) before the
    k-th of them join the sentence's finished list while it holds fewer than k. The bookkeeping
    is array arithmetic over all sentences at once (at batch 32 the per-sentence Python loop it
    replaces took 64 of 545 ms; the whole-vocabulary partition, now top_k_indices, took 282)."""
    k = gen.beam
    decoder.encode(src, k)
    n = len(src)
    shrink = hasattr(decoder, "keep")  # finished sentences' rows are dropped, not computed on
    all_limits = np.array([gen.max_len(len(s)) for s in src])
    alive = np.arange(n)  # the sentence of each group of k rows
    scores = np.full((n, k), -np.inf, dtype=np.float64)
    scores[:, 0] = 0.0  # all beams start identical: only the first may expand at step 0
    history = np.zeros((n * k, 0), dtype=np.int64)  # the tokens of hypothesis b * k + j so far
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(n)]
    n_finished = np.zeros(n, dtype=np.int64)  # len(finished[b]), as an array
    fallback: dict[int, tuple[float, list[int]]] = {}  # a sentence dropped with nothing finished
    done = np.zeros(n, dtype=bool)
    tokens = np.full(n * k, gen.bos_id, dtype=np.int64)
    parents = None

    def best_live(b: int) -> tuple[float, list[int]]:
        best = int(np.argmax(scores[b]))
        prefix = history[b * k + best].tolist()
        return float(scores[b, best]) / max(1, len(prefix)) ** gen.length_penalty, prefix

    for t in range(int(all_limits.max())):
        rows = len(alive)
        limits = all_limits[alive]
        # A beam adds the same score to all its tokens, so a sentence's best 2k candidates are
        # among each beam's best 2k tokens: select those before scoring in float64.
        values, best = step_top_k(decoder, tokens, parents, 2 * k)
        m = best.shape[1]
        cand = (scores.reshape(rows * k, 1) + values.astype(np.float64)).reshape(rows, k * m)
        # [rows, 2k], best first, as flat indices into cand (cheaper than take_along_axis here)
        order = np.argsort(-cand, axis=1, kind="stable")[:, : 2 * k] + np.arange(0, rows * k * m, k * m)[:, None]
        score, token = cand.ravel()[order], best.ravel()[order]
        beam = order % (k * m) // m
        live = np.cumprod(np.isfinite(score), axis=1).astype(bool) & ~done[:, None]  # up to the first -inf
        ends = live & ((token == gen.eos_id) | (t + 1 >= limits)[:, None])
        grows = live & ~ends
        rank = np.cumsum(grows, axis=1)  # among growing candidates, 1-based
        taken = grows & (rank <= k)
        looked_at = (rank - grows) < k  # before the k-th growing candidate, or it
        for b, p in zip(*(i.tolist() for i in np.nonzero(ends & looked_at))):  # row-major: in score order
            if n_finished[alive[b]] < k:
                prefix = history[b * k + beam[b, p]].tolist()
                finished[alive[b]].append((score[b, p] / (len(prefix) + 1) ** gen.length_penalty, prefix))
                n_finished[alive[b]] += 1
        flat = np.flatnonzero(taken)  # row-major: b * 2k + p
        b_idx = flat // (2 * k)
        slot = b_idx * k + rank.ravel()[flat] - 1
        new_scores = np.full(rows * k, -np.inf)
        new_scores[slot] = score.ravel()[flat]
        new_scores = new_scores.reshape(rows, k)
        new_parents = np.repeat(np.arange(rows, dtype=np.int64) * k, k)  # unused slots: any valid row
        new_parents[slot] = b_idx * k + beam.ravel()[flat]
        new_tokens = np.full(rows * k, gen.eos_id, dtype=np.int64)
        new_tokens[slot] = token.ravel()[flat]
        done |= (n_finished[alive] >= k) | ~taken.any(axis=1)
        if done.all():
            break
        history = np.concatenate([history[new_parents], new_tokens[:, None]], axis=1)
        scores, parents, tokens = new_scores, new_parents, new_tokens
        if shrink and done.any():
            for b in np.nonzero(done)[0].tolist():
                if not finished[alive[b]]:
                    fallback[int(alive[b])] = best_live(b)
            keep = np.nonzero(~done)[0]
            kept_rows = (keep[:, None] * k + np.arange(k)).reshape(-1)
            decoder.keep(kept_rows)
            scores, parents, tokens, history = scores[keep], parents[kept_rows], tokens[kept_rows], history[kept_rows]
            alive, done = alive[keep], done[keep]
    position = {int(b): i for i, b in enumerate(alive.tolist())}
    results = []
    for b in range(n):
        if finished[b]:  # stable: of equal scores, the one found first stays first
            results.append(sorted(finished[b], key=lambda x: -x[0]))
        else:
            results.append([fallback[b] if b in fallback else best_live(position[b])])
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


def _length_sorted_batches(src: list[list[int]], beam: int, batch_tokens: int, max_batch: int):
    """Index lists into src, shortest first, each within batch_tokens (counting beam rows)."""
    order = sorted(range(len(src)), key=lambda j: len(src[j]))
    start = 0
    while start < len(order):
        end, longest = start, 0
        while end < len(order) and end - start < max_batch:
            longest = max(longest, len(src[order[end]]))
            if (end - start + 1) * longest * beam > batch_tokens and end > start:
                break
            end += 1
        yield order[start:end]
        start = end


def _by_length(tokenizer: Tokenizer, sentences: Sequence[str], gen: GenerationConfig, batch_tokens: int,
               max_batch: int, on_batch, run) -> dict[int, object]:
    """run(list of source ids) on length-sorted batches (less padding) of the non-empty sentences;
    its per-sentence results keyed by the sentence's position in `sentences`."""
    todo = [i for i, s in enumerate(sentences) if s.strip()]
    src = prepare_sources(tokenizer, [sentences[i] for i in todo], gen.max_positions)
    results = {}
    for rows in _length_sorted_batches(src, gen.beam, batch_tokens, max_batch):
        for j, result in zip(rows, run([src[j] for j in rows])):
            results[todo[j]] = result
        if on_batch:
            on_batch(len(rows))
    return results


def translate_sentences(decoder: IncrementalDecoder | None, tokenizer: Tokenizer, sentences: Sequence[str],
                        gen: GenerationConfig, batch_tokens: int = 4000, max_batch: int = 256,
                        on_batch=None, searcher=None) -> list[str]:
    """Translate in length-sorted batches, returning results in input order. Empty inputs give
    empty outputs without touching the model. `searcher(batch, gen)`, if given, replaces
    search(decoder, batch, gen) (a search that runs inside onnxruntime; decoder may then be None)."""
    sentences = list(sentences)
    done = _by_length(tokenizer, sentences, gen, batch_tokens, max_batch, on_batch, lambda batch: tokenizer.decode(
        searcher(batch, gen) if searcher else search(decoder, batch, gen)))
    return [done.get(i, "") for i in range(len(sentences))]


def translate_nbest(decoder: IncrementalDecoder, tokenizer: Tokenizer, sentences: Sequence[str],
                    gen: GenerationConfig, batch_tokens: int = 4000, max_batch: int = 256,
                    on_batch=None) -> list[list[str]]:
    """Like translate_sentences, but each sentence's beam hypotheses, best first (an empty input
    gives [""])."""
    sentences = list(sentences)
    done = _by_length(tokenizer, sentences, gen, batch_tokens, max_batch, on_batch, lambda batch: [
        tokenizer.decode([tokens for _, tokens in hyps]) for hyps in beam_search_nbest(decoder, batch, gen)])
    return [done.get(i, [""]) for i in range(len(sentences))]


def translate_greedy_top_k(decoder: IncrementalDecoder, tokenizer: Tokenizer, sentences: Sequence[str],
                           gen: GenerationConfig, k: int, batch_tokens: int = 4000, max_batch: int = 256,
                           on_batch=None) -> list[tuple[str, list[int], tuple[np.ndarray, np.ndarray] | None]]:
    """Greedy translations in input order, each as (text, output ids, the model's top k per step
    as in greedy_search_top_k); an empty input gives ("", [], None)."""
    sentences = list(sentences)

    def run(batch):
        hyps, tops = greedy_search_top_k(decoder, batch, gen, k)
        return zip(tokenizer.decode(hyps), hyps, tops)

    done = _by_length(tokenizer, sentences, replace(gen, beam=1), batch_tokens, max_batch, on_batch, run)
    return [done.get(i, ("", [], None)) for i in range(len(sentences))]
