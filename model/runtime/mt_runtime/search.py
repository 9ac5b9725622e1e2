"""Greedy and beam search, in NumPy, over any incremental decoder.

One implementation serves every runtime: PyTorch (model/torch_decoder.py) and ONNX Runtime
(mt_runtime/translator.py) only have to provide `encode` and `step`. This file imports NumPy alone,
so the shipped runtime stays free of torch.
"""

from __future__ import annotations

import contextlib
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


def step_top_k(
    decoder: IncrementalDecoder, tokens: np.ndarray, parents: np.ndarray | None, m: int, scores: bool = True
) -> tuple[np.ndarray, np.ndarray]:
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


def greedy_search_top_k(
    decoder: IncrementalDecoder, src: list[list[int]], gen: GenerationConfig, k: int
) -> tuple[list[list[int]], list[tuple[np.ndarray, np.ndarray]]]:
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
            rows = fill_from_the_end(ended)
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


def fill_from_the_end(ended: np.ndarray) -> np.ndarray:
    """The rows that go on when those `ended` stop, in the order that moves the fewest: the last
    rows take the ended ones' places and the others stay where they are, so a decoder's `keep`
    copies a row per ended one (the whole tail moved up, at a default student's greedy batch of
    32, cost more than the step's Python). A row's results do not depend on its place."""
    rows = np.flatnonzero(~ended)
    n = len(rows)
    holes = np.flatnonzero(ended[:n])
    order = np.arange(n)
    order[holes] = rows[n - len(holes) :]
    return order


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


def beam_search_nbest(
    decoder: IncrementalDecoder, src: list[list[int]], gen: GenerationConfig
) -> list[list[tuple[float, list[int]]]]:
    """Batched beam search returning each sentence's hypotheses as (score, tokens), best first.

    The rules are those of onnxruntime's BeamSearch op (its BeamSearchScorer, Hugging Face's with
    early stopping), which searches a package's single sentences, so that a sentence gets the
    same translation alone and in any batch (docs/package-format.md): scores in float32, beams
    other than the first starting at -1e9; each step, per sentence, the best 2k candidates
    (score first, then beam, then word id); an EOS candidate ends a hypothesis only among the
    first k of them and before the k-th growing one; the others grow the next beams; a sentence
    is finished once it holds k ended hypotheses (a better one replacing the worst when full);
    at its length limit (tokens including the start token) its live beams join its hypotheses.
    A hypothesis' score is its summed log-probability (EOS included) over its length in tokens
    (start token included, EOS not) ** length_penalty.

    The bookkeeping is array arithmetic over all sentences at once (at batch 32 a per-sentence
    Python loop took 64 of 545 ms); finished sentences' rows are dropped where the decoder can
    `keep` rows."""
    k = gen.beam
    decoder.encode(src, k)
    n = len(src)
    shrink = hasattr(decoder, "keep")
    all_limits = np.array([gen.max_len(len(s)) for s in src])
    penalty = np.float32(gen.length_penalty)
    alive = np.arange(n)  # the sentence of each group of k rows
    scores = np.full((n, k), -1e9, dtype=np.float32)
    scores[:, 0] = 0.0
    history = np.zeros((n * k, 0), dtype=np.int64)  # the tokens of hypothesis b * k + j so far
    finished: list[list[tuple[float, int, list[int]]]] = [[] for _ in range(n)]  # (score, order, tokens)
    tokens = np.full(n * k, gen.bos_id, dtype=np.int64)
    parents = None
    added = 0

    def add(b: int, total: np.float32, length: int, prefix: list[int]) -> None:
        # BeamHypotheses::Add: a full list takes a hypothesis only if strictly better than its worst
        nonlocal added
        score = float(np.float32(total) / np.float32(length) ** penalty)
        hyps = finished[b]
        if len(hyps) == k:
            if score <= hyps[-1][0]:
                return
            hyps.pop()
        hyps.append((score, added, prefix))
        hyps.sort(key=lambda h: (-h[0], h[1]))
        added += 1

    for b in np.flatnonzero(all_limits <= 1).tolist():  # no room for a token: the start token alone
        for j in range(k):
            add(b, scores[b, j], 1, [])
    done = all_limits <= 1
    t = 0
    while not done.all():
        if shrink and done.any():
            keep = fill_from_the_end(done)
            kept_rows = (keep[:, None] * k + np.arange(k)).reshape(-1)
            decoder.keep(kept_rows)
            scores, tokens, history, alive = scores[keep], tokens[kept_rows], history[kept_rows], alive[keep]
            parents = None if parents is None else parents[kept_rows]
            done = done[keep]
        rows = len(alive)
        values, best = step_top_k(decoder, tokens, parents, 2 * k)
        m = best.shape[1]
        cand = (scores.reshape(rows * k, 1) + values.astype(np.float32)).reshape(rows, k * m)
        beam_of = np.repeat(np.arange(k), m)[None, :]
        word = best.reshape(rows, k * m)
        # per sentence: score descending, then beam, then word id (the op's top k over [k, vocab])
        order = np.lexsort((word, np.broadcast_to(beam_of, cand.shape), -cand), axis=1)[:, : 2 * k]
        score = np.take_along_axis(cand, order, 1)
        token = np.take_along_axis(word, order, 1)
        beam = order // m
        ends = token == gen.eos_id
        grows = ~ends & ~done[:, None]
        rank = np.cumsum(grows, axis=1)  # among growing candidates, 1-based
        taken = grows & (rank <= k)
        before_kth = (rank - grows) < k
        for b, p in zip(
            *(i.tolist() for i in np.nonzero(ends & before_kth & ~done[:, None] & (np.arange(2 * k) < k)))
        ):  # score order
            add(int(alive[b]), score[b, p], t + 1, history[b * k + beam[b, p]].tolist())
        flat = np.flatnonzero(taken)  # row-major: b * 2k + p; k per live sentence
        b_idx = flat // (2 * k)
        slot = b_idx * k + rank.ravel()[flat] - 1
        new_scores = np.full(rows * k, -1e9, dtype=np.float32)
        new_scores[slot] = score.ravel()[flat]
        new_parents = np.repeat(np.arange(rows, dtype=np.int64) * k, k)  # done sentences' rows: any valid row
        new_parents[slot] = b_idx * k + beam.ravel()[flat]
        new_tokens = np.full(rows * k, gen.eos_id, dtype=np.int64)
        new_tokens[slot] = token.ravel()[flat]
        done = done | np.array([len(finished[s]) == k for s in alive.tolist()])
        scores, parents, tokens = new_scores.reshape(rows, k), new_parents, new_tokens
        history = np.concatenate([history[parents], tokens[:, None]], axis=1)
        t += 1
        at_limit = ~done & (t + 1 >= all_limits[alive])  # the op's loop ends: its beams are hypotheses
        for b in np.flatnonzero(at_limit).tolist():
            for j in range(k):
                add(int(alive[b]), scores[b, j], t + 1, history[b * k + j].tolist())
        done |= at_limit
    return [[(score, tokens) for score, _, tokens in hyps] for hyps in finished]


def search(decoder: IncrementalDecoder, src: list[list[int]], gen: GenerationConfig) -> list[list[int]]:
    return greedy_search(decoder, src, gen) if gen.beam == 1 else beam_search(decoder, src, gen)


# ----------------------------------------------------------------------- text to text
class Tokenizer(Protocol):
    eos_id: int

    def encode(self, sentences: Sequence[str]) -> list[list[int]]: ...

    def decode(self, batch: Sequence[Sequence[int]]) -> list[str]: ...


SOURCE_ALIGN = 4


def source_width(lengths: Sequence[int], max_positions: int | None) -> int:
    """Columns of a batch's source ids: the longest source's length rounded up to a multiple of
    SOURCE_ALIGN (padding ids), within max_positions. In a decoder step's cross-attention
    onnxruntime's one-row products sum over all of a sentence's key positions, padding included,
    and their sums come out the same for any count of positions that is a multiple of four, not
    otherwise: padded so, a sentence translates the same alone and in any batch
    (docs/decisions.md). None: no rounding (callers that do not know the graphs' positions)."""
    longest = max(lengths)
    if max_positions is None:
        return longest
    return max(longest, min(-(-longest // SOURCE_ALIGN) * SOURCE_ALIGN, max_positions))


def prepare_sources(
    tokenizer: Tokenizer, sentences: Sequence[str], max_positions: int, warn: bool = True
) -> list[list[int]]:
    """Subword ids + EOS, truncated to what the model's positions allow (with a warning)."""
    ids = tokenizer.encode(list(sentences))
    limit = max_positions - 1
    out, cut = [], 0
    for seq in ids:
        if len(seq) > limit:
            seq, cut = seq[:limit], cut + 1
        out.append(seq + [tokenizer.eos_id])
    if cut and warn:
        warnings.warn(f"{cut} input sentence(s) longer than the model's {limit} tokens were truncated", stacklevel=2)
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


def _by_length(
    tokenizer: Tokenizer,
    sentences: Sequence[str],
    gen: GenerationConfig,
    batch_tokens: int,
    max_batch: int,
    on_batch,
    run,
    run_many=None,
) -> dict[int, object]:
    """run(list of source ids) on length-sorted batches (less padding) of the non-empty sentences;
    its per-sentence results keyed by the sentence's position in `sentences`. With `run_many`
    (an iterable of batches -> a generator of their results in order, as they are ready) every
    batch of a call of several goes to it."""
    todo = [i for i, s in enumerate(sentences) if s.strip()]
    src = prepare_sources(tokenizer, [sentences[i] for i in todo], gen.max_positions)
    results = {}
    order = list(_length_sorted_batches(src, gen.beam, batch_tokens, max_batch))
    many = run_many is not None and len(order) > 1  # one batch goes to `run`: a searcher may split it
    if many:
        # Longest first, so the batch that leaves the other threads idle at the call's end is the
        # shortest (longest-processing-time-first scheduling); each batch is the same batch.
        order.reverse()
    batches = ([src[j] for j in rows] for rows in order)
    outs = run_many(batches) if many else (run(batch) for batch in batches)
    try:
        for rows, out in zip(order, outs):
            for j, result in zip(rows, out):
                results[todo[j]] = result
            if on_batch:
                on_batch(len(rows))
    finally:
        outs.close()  # on an error, the batches still running end before the call does
    return results


def translate_sentences(
    decoder: IncrementalDecoder | None,
    tokenizer: Tokenizer,
    sentences: Sequence[str],
    gen: GenerationConfig,
    batch_tokens: int = 4000,
    max_batch: int = 256,
    on_batch=None,
    searcher=None,
) -> list[str]:
    """Translate in length-sorted batches, returning results in input order. Empty inputs give
    empty outputs without touching the model. `searcher(batch, gen)`, if given, replaces
    search(decoder, batch, gen) (a search that runs inside onnxruntime; decoder may then be None);
    a searcher with `at_once` above 1 gets the batches through `searcher.stream`, which runs
    several at a time."""
    sentences = list(sentences)
    many = getattr(searcher, "at_once", 1) > 1

    def decoded(batches):
        with contextlib.closing(searcher.stream(batches, gen)) as outs:
            for out in outs:
                yield tokenizer.decode(out)

    done = _by_length(
        tokenizer,
        sentences,
        gen,
        batch_tokens,
        max_batch,
        on_batch,
        lambda batch: tokenizer.decode(searcher(batch, gen) if searcher else search(decoder, batch, gen)),
        run_many=decoded if many else None,
    )
    return [done.get(i, "") for i in range(len(sentences))]


def translate_nbest(
    decoder: IncrementalDecoder,
    tokenizer: Tokenizer,
    sentences: Sequence[str],
    gen: GenerationConfig,
    batch_tokens: int = 4000,
    max_batch: int = 256,
    on_batch=None,
) -> list[list[str]]:
    """Like translate_sentences, but each sentence's beam hypotheses, best first (an empty input
    gives [""])."""
    sentences = list(sentences)
    done = _by_length(
        tokenizer,
        sentences,
        gen,
        batch_tokens,
        max_batch,
        on_batch,
        lambda batch: [
            tokenizer.decode([tokens for _, tokens in hyps]) for hyps in beam_search_nbest(decoder, batch, gen)
        ],
    )
    return [done.get(i, [""]) for i in range(len(sentences))]


def translate_greedy_top_k(
    decoder: IncrementalDecoder,
    tokenizer: Tokenizer,
    sentences: Sequence[str],
    gen: GenerationConfig,
    k: int,
    batch_tokens: int = 4000,
    max_batch: int = 256,
    on_batch=None,
) -> list[tuple[str, list[int], tuple[np.ndarray, np.ndarray] | None]]:
    """Greedy translations in input order, each as (text, output ids, the model's top k per step
    as in greedy_search_top_k); an empty input gives ("", [], None)."""
    sentences = list(sentences)

    def run(batch):
        hyps, tops = greedy_search_top_k(decoder, batch, gen, k)
        return zip(tokenizer.decode(hyps), hyps, tops)

    done = _by_length(tokenizer, sentences, replace(gen, beam=1), batch_tokens, max_batch, on_batch, run)
    return [done.get(i, ("", [], None)) for i in range(len(sentences))]
