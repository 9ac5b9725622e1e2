"""Beam search: the array implementation gives exactly what the per-sentence loop it replaced
gave (kept here as the reference), over models, beam sizes, length penalties and limits."""

from __future__ import annotations

import numpy as np
import pytest
from mt_runtime.search import (
    GenerationConfig,
    IncrementalDecoder,
    beam_search,
    beam_search_nbest,
    fill_from_the_end,
    greedy_search,
    source_width,
    top_k_indices,
)

from model.torch_decoder import TorchDecoder
from tests.helpers.models import tiny


# onnxruntime's BeamSearch op (contrib_ops/cpu/transformers: BeamSearchScorer, BeamHypotheses)
# transcribed one sentence at a time, as the reference mt_runtime/search.py must equal: the op
# searches a package's single sentences, mt_runtime/search.py its batches.
def reference_beam_search(decoder: IncrementalDecoder, src: list[list[int]], gen: GenerationConfig) -> list[list[int]]:
    k = gen.beam
    out = []
    for sentence in src:
        decoder.encode([sentence], k)
        max_length = gen.max_len(len(sentence))  # tokens, the start token included
        beam_scores = np.array([0.0] + [-1e9] * (k - 1), dtype=np.float32)
        sequences = [[gen.bos_id] for _ in range(k)]
        hyps: list[tuple[float, list[int]]] = []  # best first; equal scores: the earlier first

        def add(hypothesis: list[int], sum_logprobs) -> None:
            score = float(np.float32(sum_logprobs) / np.float32(len(hypothesis)) ** np.float32(gen.length_penalty))
            if len(hyps) == k:
                if score <= hyps[-1][0]:
                    return
                hyps.pop()
            at = len(hyps)
            while at > 0 and score > hyps[at - 1][0]:
                at -= 1
            hyps.insert(at, (score, hypothesis))

        tokens, parents, done = np.full(k, gen.bos_id, dtype=np.int64), None, False
        current_length = 1
        while current_length < max_length:
            logp = decoder.step(tokens, parents).astype(np.float32)
            vocab = logp.shape[-1]
            cand = (beam_scores[:, None] + logp).reshape(-1)
            order = sorted(range(len(cand)), key=lambda i: (-cand[i], i))[: 2 * k]  # TopK: ties, lower index
            next_scores, next_tokens, next_beams = [], [], []
            for j, flat in enumerate(order):
                beam, token = divmod(flat, vocab)
                if token == gen.eos_id:
                    if j >= k:
                        continue
                    add(sequences[beam][1:], cand[flat])
                else:
                    next_scores.append(cand[flat])
                    next_tokens.append(token)
                    next_beams.append(beam)
                if len(next_tokens) == k:
                    break
            if len(hyps) == k:  # early stopping
                done = True
                break
            sequences = [sequences[b] + [t] for b, t in zip(next_beams, next_tokens)]
            beam_scores = np.array(next_scores, dtype=np.float32)
            tokens, parents = np.array(next_tokens, dtype=np.int64), np.array(next_beams, dtype=np.int64)
            current_length += 1
        if not done:  # the length limit: the live beams join the hypotheses
            for j in range(k):
                add(sequences[j][1:], beam_scores[j])
        out.append(hyps[0][1])
    return out


@pytest.mark.parametrize("pre_ln,seed", [(False, 0), (True, 1), (False, 2)])
def test_beam_search_equals_the_per_sentence_reference(pre_ln, seed):
    decoder = TorchDecoder(tiny(pre_ln=pre_ln, seed=seed))
    rng = np.random.default_rng(seed)
    sources = [[int(t) for t in rng.integers(4, 60, rng.integers(1, 14))] + [2] for _ in range(9)]
    compared = 0
    for beam in (2, 4, 5):
        for penalty in (0.6, 1.0, 1.5):
            for a, b in ((1.5, 10), (0.0, 3), (0.0, 1)):
                gen = GenerationConfig(beam=beam, length_penalty=penalty, max_len_a=a, max_len_b=b, max_positions=64)
                assert beam_search(decoder, sources, gen) == reference_beam_search(decoder, sources, gen), (
                    beam,
                    penalty,
                    a,
                    b,
                )
                assert beam_search(decoder, sources[:1], gen) == reference_beam_search(decoder, sources[:1], gen)
                compared += 1
    assert compared == 27


@pytest.mark.parametrize("rows,width,m", [(3, 8000, 8), (128, 8000, 10), (2, 8001, 5), (4, 300, 8), (1, 61, 2)])
def test_top_k_indices_finds_the_largest_entries(rows, width, m):
    rng = np.random.default_rng(width + m)
    x = rng.standard_normal((rows, width)).astype(np.float32)
    x[0, -1] = 100.0  # the largest entry in the last (partial) chunk
    got = top_k_indices(x, m)
    assert got.shape == (rows, m) and all(len(set(r)) == m for r in got.tolist())
    want = np.sort(np.partition(x, width - m, axis=1)[:, -m:], axis=1)
    np.testing.assert_array_equal(np.sort(np.take_along_axis(x, got, axis=1), axis=1), want)
    assert width - 1 in got[0]


class _EndsSooner:
    """The sharpened random model never ends a sentence: flatten its distribution and raise
    EOS (renormalised), so that beams end at different lengths."""

    def __init__(self, decoder: IncrementalDecoder, eos_id: int, temperature: float, boost: float):
        self.decoder, self.eos_id, self.temperature, self.boost = decoder, eos_id, temperature, boost

    def encode(self, src, beam):
        self.decoder.encode(src, beam)

    def step(self, tokens, parents):
        logits = self.decoder.step(tokens, parents).astype(np.float64) / self.temperature
        logits[:, self.eos_id] += self.boost
        top = logits.max(axis=1, keepdims=True)
        return (logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))).astype(np.float32)


def _length_normalised_log_prob(
    decoder: IncrementalDecoder, src: list[int], hyp: list[int], gen: GenerationConfig
) -> float:
    """Teacher-forced score of hyp + EOS, as beam search defines it."""
    decoder.encode([src], 1)
    tokens, total = [gen.bos_id] + hyp, 0.0
    for t, nxt in enumerate(hyp + [gen.eos_id]):
        total += float(decoder.step(np.array([tokens[t]]), None)[0, nxt])
    return total / (len(hyp) + 1) ** gen.length_penalty


def test_nbest_holds_the_beam_best_first_with_the_scores_the_model_gives():
    decoder = _EndsSooner(TorchDecoder(tiny(seed=3)), eos_id=2, temperature=10.0, boost=2.5)
    rng = np.random.default_rng(3)
    sources = [[int(t) for t in rng.integers(4, 60, rng.integers(1, 14))] + [2] for _ in range(6)]
    gen = GenerationConfig(beam=4, length_penalty=0.8, max_positions=64)
    nbest = beam_search_nbest(decoder, sources, gen)
    assert [hyps[0][1] for hyps in nbest] == beam_search(decoder, sources, gen)
    assert sum(len(h) for h in nbest) > len(sources)  # more than one hypothesis somewhere
    checked = 0
    for src, hyps in zip(sources, nbest):
        scores = [score for score, _ in hyps]
        assert 1 <= len(hyps) <= 4 and scores == sorted(scores, reverse=True)
        ended = [(score, tokens) for score, tokens in hyps if len(tokens) + 1 < gen.max_len(len(src))]
        assert len({tuple(tokens) for _, tokens in ended}) == len(ended)  # (cut at the limit: may repeat)
        for score, tokens in ended:
            assert score == pytest.approx(_length_normalised_log_prob(decoder, src, tokens, gen), abs=1e-4)
        checked += len(ended)
    assert checked >= 6


class _DropsFinished(_EndsSooner):
    """_EndsSooner that lets the searches drop finished sentences' rows (TorchDecoder.keep)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kept: list[int] = []

    def keep(self, rows):
        self.kept.append(len(rows))
        self.decoder.keep(rows)


def test_dropping_finished_sentences_changes_no_output():
    """The searches stop computing a sentence once it is finished (fewer rows each step, as
    CTranslate2 does): every hypothesis and score is what the search over all rows gives."""
    rng = np.random.default_rng(5)
    sources = [[int(t) for t in rng.integers(4, 60, rng.integers(1, 14))] + [2] for _ in range(11)]
    for beam, boost in ((1, 3.0), (3, 2.5), (4, 2.0)):
        gen = GenerationConfig(beam=beam, length_penalty=0.8, max_positions=64)
        every_row = _EndsSooner(TorchDecoder(tiny(seed=4)), eos_id=2, temperature=10.0, boost=boost)
        dropping = _DropsFinished(TorchDecoder(tiny(seed=4)), eos_id=2, temperature=10.0, boost=boost)
        if beam == 1:
            assert greedy_search(dropping, sources, gen) == greedy_search(every_row, sources, gen)
        else:
            got, want = beam_search_nbest(dropping, sources, gen), beam_search_nbest(every_row, sources, gen)
            # PyTorch's products round differently with fewer rows: the same hypotheses, scores within it
            assert [[tokens for _, tokens in h] for h in got] == [[tokens for _, tokens in h] for h in want]
            assert [s for h in got for s, _ in h] == pytest.approx([s for h in want for s, _ in h], rel=1e-6)
        assert dropping.kept and min(dropping.kept) < len(sources) * beam  # rows were dropped


def test_ended_rows_places_are_filled_from_the_end():
    ended = np.array([False, True, False, False, True, False, False])
    order = fill_from_the_end(ended)
    assert order.tolist() == [0, 5, 2, 3, 6]  # the places of rows 1 and 4 to the rows past the new end
    rng = np.random.default_rng(2)
    for _ in range(200):
        ended = rng.random(int(rng.integers(1, 20))) < 0.4
        order = fill_from_the_end(ended)
        assert sorted(order.tolist()) == np.flatnonzero(~ended).tolist()
        assert np.count_nonzero(order != np.arange(len(order))) == np.count_nonzero(ended[: len(order)])


def test_sources_are_padded_to_a_multiple_of_four_within_the_positions():
    assert [source_width([n], 256) for n in (1, 4, 5, 7, 8)] == [4, 4, 8, 8, 8]
    assert source_width([3, 9, 2], 256) == 12  # the longest source's
    assert source_width([255], 256) == 256 and source_width([257], 258) == 258  # never past the positions
    assert source_width([300], 256) == 300  # never shorter than a source (the graphs then refuse it)
    assert source_width([7], None) == 7  # a caller that does not know the positions
