"""Translate with an exported ONNX package: onnxruntime, tokenizers and NumPy only, never torch.

Part of mt-runtime, the distribution every package names as its runtime (package.json's
`runtime`): it imports its siblings relatively and nothing else from this repository.

A package folder holds encoder.onnx, decoder.onnx (graph I/O: see model/onnx_export.py and the
package's MODEL_CARD.md), tokenizer.json, generation.json and package.json, which lists every
file with its sha256. Translator refuses a package whose files differ from that list, that holds
anything but regular files, or whose graphs read external data outside it or not in the list
(mt_runtime/files.py), before onnxruntime opens a graph; and a graph whose inputs and outputs are
not the format's as it opens it (mt_runtime/graph_checks.py).

Packages for the CPU also hold generate.onnx: the same two graphs inside onnxruntime's BeamSearch
op (model/onnx_passes/), so that a whole batch is translated by one onnxruntime call instead
of one call per token plus a NumPy search loop (int8 packages with a shortlist run a greedy call
of one sentence there over the sentence's word list). On the CPU, Translator uses it when it is
there (search="auto"); search="python" uses the step graphs and mt_runtime/search.py instead.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import warnings
import weakref
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import onnxruntime as ort

from . import graph_checks, package_checks
from .cores import WAVE, FasterOfTwo, ShardPool
from .files import PACKAGE_JSON, PackageError, reason, sha256_file, verify_package  # noqa: F401 (re-exported)
from .inplace import InPlaceCache, row_moves, take_rows
from .layout import (
    CACHE_INDEX,
    DECODER,
    DECODER_BATCH,
    DECODER_GREEDY,
    DECODER_GREEDY_INPLACE,
    ENCODER,
    GENERATE,
    GENERATE_BATCH,
    GENERATION,
    GROUP,
    INPUT_IDS,
    LENGTH_PENALTY,
    LOG_PROBS,
    MAX_LENGTH,
    NORMALIZE,
    NUM_BEAMS,
    SEQUENCES,
    SHORTLIST_FILE,
    SHORTLIST_GRAPH,
    SHORTLISTED,
    SRC_IDS,
    SRC_MASK,
    TOKENIZER,
    TOKENS,
    TOP_K,
    WORDS,
)
from .lazy_session import LazySession
from .processes import ProcessSearch, start_children
from .search import GenerationConfig, best_of, greedy_search_top_k, search, source_width, translate_sentences
from .shortlist import Shortlist, ShortlistError, sentence_width
from .subword import SubwordTokenizer

_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
_ARRAY_TYPES = {**_DTYPES, "tensor(int8)": np.int8, "tensor(bool)": np.bool_}


def session_options(threads: int | None, shared: bool = False) -> ort.SessionOptions:
    """`shared`: the session is run by several threads at once (shards, mt_runtime/cores.py)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.inter_op_num_threads = 1
    options.intra_op_num_threads = threads or 0  # 0: ORT's default, one per physical core
    options.log_severity_level = 3
    if threads != 1:
        # Idle pool threads spin after each run, taking the cores from the search loop's own
        # Python between steps: at 2 threads, batch 32 greedy ran 348 sent/s spinning, 651 not.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if shared:
        # Threads running one session at once queue on its memory arena's lock (py-spy: 2-4% of
        # each shard's time at 2 threads); malloc serves each thread from its own arena. With one
        # thread the session's arena is the faster (test_2016 greedy b32: 2-2.5%), so only here.
        options.enable_cpu_mem_arena = False
    return options


def _kept(array: np.ndarray, rows: np.ndarray, moves: tuple) -> np.ndarray:
    """array[rows], in place where it can (the encoder's keys and values are the search's own
    arrays): only the rows that change place are copied (take_rows; `moves`: row_moves(rows))."""
    if array.flags.writeable and array.flags.c_contiguous and len(rows) <= len(array):
        return take_rows(array, rows, moves=moves)
    return array[rows]


class OnnxDecoder:
    """The two graphs as an IncrementalDecoder (mt_runtime/search.py): encode once, then step.

    On the CPU, arrays go in and out as NumPy. On CUDA, I/O binding keeps the encoder's
    cross-attention keys/values and the growing self-attention cache on the device between
    steps (the beam reordering is a Gather inside the decoder graph); only the token ids go in
    and the log-probabilities come out each step."""

    def __init__(
        self,
        encoder: ort.InferenceSession,
        decoder: ort.InferenceSession,
        pad_id: int,
        device: str = "cpu",
        device_id: int = 0,
        many_rows: ort.InferenceSession | None = None,
        greedy: ort.InferenceSession | None = None,
        shortlist: tuple[Shortlist, ort.InferenceSession] | None = None,
        greedy_inplace: ort.InferenceSession | None = None,
        max_positions: int | None = None,
    ):
        self.encoder, self.decoder, self.pad_id = encoder, decoder, pad_id
        self.max_positions = max_positions  # the graphs' positions: sources are padded within them
        self._sessions = (encoder, decoder, pad_id, device, device_id, many_rows, greedy, shortlist, greedy_inplace)
        self._sessions += (max_positions,)
        # decoder_batch.onnx: the same step with int8 kernels for many rows and the top k words
        # per row instead of the whole distribution (model/onnx_passes/many_rows.py); CPU only.
        self.many_rows = many_rows if device == "cpu" else None
        # decoder_greedy.onnx: decoder_batch.onnx without the cache reorder, logits out: greedy
        # steps where every row continues its own (most of them).
        self.greedy = greedy if self.many_rows is not None else None
        if self.greedy is not None:
            self.greedy_inputs = [i.name for i in greedy.get_inputs()]
            self.greedy_outputs = [o.name for o in greedy.get_outputs()]
            self.greedy_past = [n.replace("present_", "past_") for n in self.greedy_outputs[1:]]
        if self.many_rows is not None:
            self.many_rows_outputs = [o.name for o in self.many_rows.get_outputs()]
            self.vocab = decoder.get_outputs()[0].shape[-1]
            # Packages from before the `normalize` input always return log-probabilities.
            self.can_skip_softmax = any(i.name == NORMALIZE for i in self.many_rows.get_inputs())
            # Packages from before the `group` input take the encoder's output once per beam.
            self.can_group = any(i.name == GROUP for i in self.many_rows.get_inputs())
        self.group = 1  # rows per sentence in the feed's cross_* and src_mask (see encode)
        self._setup_shortlist(shortlist)
        if device == "cpu":  # `keep` (mt_runtime/search.py) only where rows are NumPy arrays to slice
            self.keep = self._keep
        self.device, self.device_id = device, device_id
        self.cross_names = [o.name for o in encoder.get_outputs()]
        self.output_names = [o.name for o in decoder.get_outputs()]
        self.present_names = self.output_names[1:]
        self.past_names = [n.replace("present_", "past_") for n in self.present_names]
        inputs = {i.name: i for i in decoder.get_inputs()}
        # Shapes of an empty cache: [rows, heads, 0, head_dim], in the graph's float type.
        self.past_specs = {
            n: (inputs[n].shape[1], inputs[n].shape[3], _DTYPES[inputs[n].type]) for n in self.past_names
        }
        self.feed: dict = {}
        self.rows = 0
        self.arange = np.zeros(0, dtype=np.int64)
        # decoder_greedy_inplace.onnx (format 2.1): the greedy steps with the cache written in
        # place (mt_runtime/inplace.py); `cache_in_buffers`: the live cache is there, not in feed.
        self.inplace = None
        if self.many_rows is not None and greedy_inplace is not None:
            self.inplace = InPlaceCache(greedy_inplace, self.past_names)
        self.cache_in_buffers = False

    def twin(self) -> OnnxDecoder:
        """A decoder over the same sessions with search state of its own: a shard of a batch runs
        on it in another thread (mt_runtime/cores.py)."""
        twin = OnnxDecoder(*self._sessions)
        twin.use_shortlist = self.use_shortlist
        return twin

    def _empty_past(self, rows: int) -> dict:
        return {n: np.zeros((rows, heads, 0, dim), dtype=dtype) for n, (heads, dim, dtype) in self.past_specs.items()}

    def encode(self, src: list[list[int]], beam: int) -> None:
        width = source_width([len(s) for s in src], self.max_positions)
        ids = np.full((len(src), width), self.pad_id, dtype=np.int64)
        for i, s in enumerate(src):
            ids[i, : len(s)] = s
        self.src_ids = ids
        self.rows = len(src) * beam
        self.arange = np.arange(self.rows, dtype=np.int64)
        if self.device == "cuda":
            return self._encode_cuda(ids, beam)
        cross = self.encoder.run(self.cross_names, {SRC_IDS: ids})
        mask = ids != self.pad_id
        # Beam k of sentence b is row b * beam + k. decoder_batch.onnx with `group` reads the
        # sentence's row of cross_* and src_mask for all its beams; decoder.onnx wants a copy per beam.
        self.group = beam if beam > 1 and self.many_rows is not None and self.can_group else 1
        if beam > 1 and self.group == 1:
            cross = [np.repeat(c, beam, axis=0) for c in cross]
            mask = np.repeat(mask, beam, axis=0)
        self.feed = {SRC_MASK: mask, **dict(zip(self.cross_names, cross)), **self._empty_past(self.rows)}
        self.batch_sources, self.words, self.shortlist_feed, self.masked = src, None, None, None
        self.cache_in_buffers = False

    def _setup_shortlist(self, shortlist) -> None:
        """A package's lexical shortlist (mt_runtime/shortlist.py) and the special ids, used by
        decoder_batch.onnx and decoder_greedy.onnx where both take it, on greedy steps (see
        _projection_feed); `use_shortlist` turns it off (the whole vocabulary)."""
        self.shortlist = self.selector = self.words = self.shortlist_feed = self.masked = None
        self.batch_sources: list[list[int]] = []
        self.use_shortlist = False
        self.shortlist_flag = SHORTLISTED
        names = {i.name: i for i in self.many_rows.get_inputs()} if self.many_rows is not None else {}
        # Without a shortlist the graphs still take its inputs: empty ones, and the flag off.
        # Nothing for a package from before the shortlist, or one whose projection cannot take it.
        self.no_shortlist_feed = {}
        if self.shortlist_flag in names:
            self.no_shortlist_feed[self.shortlist_flag] = np.array([False])
            for name, value in names.items():
                if name.startswith("shortlist_"):
                    shape = [d if isinstance(d, int) else 0 for d in value.shape]
                    self.no_shortlist_feed[name] = np.zeros(shape, _ARRAY_TYPES[value.type])
        if shortlist is not None and self.no_shortlist_feed:
            self.shortlist, self.selector, self.specials = shortlist
            self.sentence_width = sentence_width(self.shortlist)
            self.selector_outputs = [o.name for o in self.selector.get_outputs()]
            self.use_shortlist = True

    def _projection_feed(self, scores: bool) -> tuple[dict, np.ndarray | None]:
        """The step graphs' shortlist inputs for a step, and the words its outputs index (None: the
        vocabulary). Only steps that want the best words without their scores (greedy search) are
        shortlisted: log-probabilities normalised over a shortlist shift the scores beam search
        compares across beams (teacher int8, test_2016, beam 4, batch 32: -0.34 BLEU with 100
        words per source word, where greedy lost nothing). The projection covers the union of the
        batch's sentences' word lists; each row may choose from its own sentence's list only
        (`masked`: -inf elsewhere), the list the one-sentence search in generate.onnx uses, so no
        neighbour changes a sentence's words. Made at the batch's first such step."""
        if scores or self.shortlist is None or not self.use_shortlist:
            return self.no_shortlist_feed, None
        if self.shortlist_feed is None:
            self.words, allowed = self.shortlist.batch_words(self.batch_sources, self.specials, self.sentence_width)
            # C order (allowed, a column gather, is not): keep copies rows of it in place
            self.masked = np.where(np.ascontiguousarray(allowed), np.float32(0), np.float32(-np.inf))
            self.shortlist_feed = {
                self.shortlist_flag: np.array([True]),
                **dict(zip(self.selector_outputs, self.selector.run(self.selector_outputs, {WORDS: self.words}))),
            }
        return self.shortlist_feed, self.words

    def _per_row(self, feed: dict) -> dict:
        """The feed with a row of cross_* and src_mask per decoder row, as decoder.onnx takes it."""
        if self.group == 1:
            return feed
        return {**feed, **{n: np.repeat(feed[n], self.group, axis=0) for n in (SRC_MASK, *self.cross_names)}}

    def step(self, tokens: np.ndarray, parents: np.ndarray | None) -> np.ndarray:
        if self.device == "cuda":
            return self._step_cuda(tokens, parents)
        self._cache_in_feed()
        feed = self.feed
        feed[TOKENS] = tokens.reshape(-1, 1)
        feed[CACHE_INDEX] = self.arange if parents is None else parents
        out = self.decoder.run(self.output_names, self._per_row(feed))
        feed.update(zip(self.past_names, out[1:]))
        return out[0]

    def step_top_k(self, tokens: np.ndarray, parents: np.ndarray | None, m: int, scores: bool = True):
        """The m best words per row, best first, from decoder_batch.onnx (None without it), or
        from decoder_greedy.onnx where no row changes place and no scores are wanted; with
        scores=False their values may be logits instead of log-probabilities (the graphs then
        return all the logits; the best are taken here)."""
        if self.many_rows is None:
            return None
        feed = self.feed
        feed[TOKENS] = tokens.reshape(-1, 1)
        projection, words = self._projection_feed(scores)
        if self.inplace is not None and not scores and self.group == 1:
            if not self.cache_in_buffers:
                self.inplace.load({n: feed.pop(n) for n in self.past_names})
                self.cache_in_buffers = True
            if parents is not None:
                self.inplace.reorder(parents)
            logits = self.inplace.step(tokens, {**feed, **projection})
            return self._best_words(logits, words, m)
        self._cache_in_feed()
        if self.greedy is not None and parents is None and not scores:
            logits, *present = self.greedy.run(
                self.greedy_outputs, {**{n: feed[n] for n in self.greedy_inputs if n in feed}, **projection}
            )
            feed.update(zip(self.greedy_past, present))
            return self._best_words(logits, words, m)
        feed[CACHE_INDEX] = self.arange if parents is None else parents
        top_k = min(m, self.vocab) if isinstance(self.vocab, int) else m
        if words is not None:
            top_k = min(top_k, len(words))
        extra = {TOP_K: np.array([top_k], dtype=np.int64)}
        if self.can_skip_softmax:
            extra[NORMALIZE] = np.array([scores])
        if self.can_group:
            extra[GROUP] = np.array([self.group], dtype=np.int64)
        values, ids, *present = self.many_rows.run(self.many_rows_outputs, {**feed, **extra, **projection})
        feed.update(zip(self.past_names, present))
        if ids.shape[1] == 0:  # normalize false: the logits of the whole vocabulary (or the shortlist)
            return self._best_words(values, words, m)
        return values, ids if words is None else words[ids]

    def _best_words(self, logits: np.ndarray, words: np.ndarray | None, m: int):
        """The m best of a step's logits over `words` (None: the vocabulary) as (values, word ids),
        each row choosing among its own sentence's words only (`masked`). For the one best word
        the mask is added only to the rows whose best word overall is not theirs (few): the same
        choice, since the mask only lowers the others, without reading [rows, words] twice more
        (at a default student's greedy batch of 32 that was a tenth of a step)."""
        if words is None:
            return best_of(logits, m)
        if m != 1:
            values, ids = best_of(np.add(logits, self.masked, out=logits), m)
            return values, words[ids]
        rows = self.arange if len(self.arange) == len(logits) else np.arange(len(logits))  # arange releases the GIL
        ids = logits.argmax(axis=-1)
        outside = np.flatnonzero(self.masked[rows, ids])  # -inf where the word is not the row's
        if len(outside):
            logits[outside] += self.masked[outside]
            ids[outside] = logits[outside].argmax(axis=-1)
        return logits[rows, ids][:, None], words[ids][:, None]

    def _cache_in_feed(self) -> None:
        """The cache as past_* arrays in the feed again (from the in-place buffers, where it is)."""
        if self.cache_in_buffers:
            self.feed.update(self.inplace.arrays())
            self.cache_in_buffers = False

    def _keep(self, rows: np.ndarray) -> None:
        """Only these rows of the encoder state from now on (the searches drop finished sentences);
        the cache rows follow the next step's parents."""
        rows = np.asarray(rows, dtype=np.int64)
        self.rows = len(rows)
        if self.group > 1:  # the searches keep or drop a sentence's beams together
            groups = rows.reshape(-1, self.group) if len(rows) % self.group == 0 else None
            if (
                groups is None
                or np.any(groups != groups[:, :1] + np.arange(self.group))
                or np.any(groups[:, 0] % self.group)
            ):
                raise ValueError(f"keep: rows must be whole groups of {self.group} (a sentence's beams)")
            rows = groups[:, 0] // self.group
        feed, moves = self.feed, row_moves(rows)
        for name in (SRC_MASK, *self.cross_names):
            feed[name] = _kept(feed[name], rows, moves)
        if self.masked is not None:  # greedy: a row per sentence
            self.masked = _kept(self.masked, rows, moves)
        self.arange = np.arange(self.rows, dtype=np.int64)

    # ------------------------------------------------------------------ CUDA, I/O binding
    def _ortvalue(self, array: np.ndarray) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), "cuda", self.device_id)

    def _encode_cuda(self, ids: np.ndarray, beam: int) -> None:
        # The beam copies are made on the host from the ids (the encoder then runs on B * beam
        # rows on the GPU) so that the cross keys/values never cross the bus.
        ids = np.repeat(ids, beam, axis=0) if beam > 1 else ids
        binding = self.encoder.io_binding()
        binding.bind_cpu_input(SRC_IDS, ids)
        for name in self.cross_names:
            binding.bind_output(name, "cuda", self.device_id)
        self.encoder.run_with_iobinding(binding)
        self.cross = dict(zip(self.cross_names, binding.get_outputs()))
        self.mask = self._ortvalue(ids != self.pad_id)
        self.past = {n: self._ortvalue(a) for n, a in self._empty_past(self.rows).items()}

    def _step_cuda(self, tokens: np.ndarray, parents: np.ndarray | None) -> np.ndarray:
        binding = self.decoder.io_binding()
        binding.bind_cpu_input(TOKENS, np.ascontiguousarray(tokens.reshape(-1, 1)))
        binding.bind_cpu_input(CACHE_INDEX, self.arange if parents is None else np.ascontiguousarray(parents))
        binding.bind_ortvalue_input(SRC_MASK, self.mask)
        for name, value in (*self.past.items(), *self.cross.items()):
            binding.bind_ortvalue_input(name, value)
        binding.bind_output(LOG_PROBS, "cpu")
        for name in self.present_names:
            binding.bind_output(name, "cuda", self.device_id)
        self.decoder.run_with_iobinding(binding)
        out = binding.get_outputs()
        self.past = dict(zip(self.past_names, out[1:]))
        return out[0].numpy()


class GraphSearch:
    """Search with generate.onnx: one session.run per batch, the loop inside onnxruntime.
    `batch_session` (generate_batch.onnx, int8 packages) serves calls with batch x beam > 1.
    (OnnxDecoder's `many_rows` is decoder_batch.onnx, a step graph: another file.)"""

    FILES = (GENERATE, GENERATE_BATCH)

    def __init__(
        self, session: ort.InferenceSession, batch_session: ort.InferenceSession | None = None, shortlist: bool = True
    ):
        self.session, self.batch_session = session, batch_session
        # A greedy call of one sentence runs over its word list (the package's shortlist) unless told not to.
        listed = SHORTLISTED in {i.name for i in session.get_overridable_initializers()}
        self.extra = {} if shortlist or not listed else {SHORTLISTED: np.array([False])}

    @classmethod
    def load(
        cls, folder: Path, options: ort.SessionOptions, listed=None, shortlist: bool = True, layers: int | None = None
    ) -> GraphSearch | None:
        """The folder's generate graphs on the CPU, or None where it has none. `listed`: the files
        the package lists (verified); a graph it does not list is never opened. With `layers`, each
        is checked against the format's layout (mt_runtime/graph_checks.py)."""
        sessions = []
        for name in cls.FILES:
            if (folder / name).is_file() and (listed is None or name in listed):
                session = ort.InferenceSession(str(folder / name), options, providers=["CPUExecutionProvider"])
                if layers is not None:
                    graph_checks.check_graph(folder / name, session.get_inputs(), session.get_outputs(), layers)
                sessions.append(session)
        return cls(*sessions, shortlist=shortlist) if sessions else None

    def __call__(self, src: list[list[int]], gen: GenerationConfig) -> list[list[int]]:
        width = source_width([len(s) for s in src], gen.max_positions)
        ids = np.full((len(src), width), gen.pad_id, dtype=np.int32)
        for i, s in enumerate(src):
            ids[i, : len(s)] = s
        # Tokens including the start token, so max_len(...) - 1 generated tokens at most, as in
        # mt_runtime/search.py. The op takes one limit for the whole batch (the longest sentence's);
        # each output is cut to its own limit below (for greedy that is exactly mt_runtime/search.py).
        limit = max(gen.max_len(len(s)) for s in src)
        one = self.batch_session is None or len(src) * gen.beam == 1
        sequences = (self.session if one else self.batch_session).run(
            [SEQUENCES],
            {
                INPUT_IDS: ids,
                MAX_LENGTH: np.array([limit], dtype=np.int32),
                NUM_BEAMS: np.array([gen.beam], dtype=np.int32),
                LENGTH_PENALTY: np.array([gen.length_penalty], dtype=np.float32),
                **(self.extra if one else {}),
            },
        )[0]
        out = []
        for s, row in zip(src, sequences[:, 0, 1:].tolist()):  # drop the start token
            end = next((j for j, t in enumerate(row) if t == gen.eos_id or t == gen.pad_id), len(row))
            out.append(row[: min(end, gen.max_len(len(s)) - 1)])
        return out


class PackageSearch:
    """What translates a batch of a package on the CPU: generate.onnx (one onnxruntime call) for
    one sentence; for several, where the package has decoder_batch.onnx, mt_runtime/search.py's loop
    over it, which reads each step's top k words instead of the whole distribution, runs int8
    matrices with the kernel for many rows and drops finished sentences: at batch 32 it was the
    faster (docs/decisions.md, issue 31). mode "graph" sends every batch to generate.onnx.

    With `shards` above 1 a batch is split among that many threads, each with a decoder of its own
    over one-thread sessions, and a single sentence runs on `one_thread_graph` (generate.onnx at one
    intra-op thread) or `graph` (at the Translator's), whichever the first calls measured faster
    (mt_runtime/cores.py)."""

    def __init__(
        self,
        decoder: OnnxDecoder,
        graph: GraphSearch | None,
        mode: str = "auto",
        shards: int = 1,
        one_thread_graph: Callable[[], GraphSearch] | None = None,
    ):
        self.decoder, self.graph = decoder, graph
        self.one = "graph" if graph is not None else "python"
        self.many = "python" if mode != "graph" and decoder.many_rows is not None else self.one
        self.shards = ShardPool([decoder, *(decoder.twin() for _ in range(shards - 1))])
        self.one_thread_graph = one_thread_graph if shards > 1 else None
        self.single = None
        if graph is not None and self.one_thread_graph is not None:
            self.single = FasterOfTwo(lambda *a: self.one_thread_graph()(*a), graph)

    def which(self, batch: list[list[int]]) -> str:
        return self.one if len(batch) == 1 else self.many

    def __call__(self, batch: list[list[int]], gen: GenerationConfig) -> list[list[int]]:
        if len(batch) == 1 and self.one == "graph":
            if self.single is None:
                return self.graph(batch, gen)
            return self.single("beam" if gen.beam > 1 else "greedy", lambda out: len(out[0]) + 1, batch, gen)
        return self.shards(batch, lambda decoder, part: self._part(decoder, part, gen))

    @property
    def at_once(self) -> int:
        """Batches a translate call keeps handed over (`stream`): WAVE per shard. Each shard takes
        the next as it finishes one, so a long batch leaves the other shards idle only at a call's
        end (test_2016 in batches of 32 at 2 threads: greedy 1.52 -> 1.59x one thread, beam 4 1.71
        -> 1.77x against one batch a shard at a time)."""
        return WAVE * len(self.shards.states) if len(self.shards.states) > 1 else 1

    def each(self, batches: list[list[list[int]]], gen: GenerationConfig) -> list[list[list[int]]]:
        """Several batches: each whole on a shard's decoder, as many at once as there are shards
        (ShardPool.each); a call of one batch as `__call__` runs it (split among the shards)."""
        if len(batches) < 2:
            return [self(batch, gen) for batch in batches]
        return self.shards.each(batches, lambda decoder, batch: self._part(decoder, batch, gen))

    def stream(self, batches: Iterable[list[list[int]]], gen: GenerationConfig) -> Iterator[list[list[int]]]:
        """each(), lazily, for a translate call: results in order as they are ready (ShardPool.stream)."""
        return self.shards.stream(batches, lambda decoder, batch: self._part(decoder, batch, gen), self.at_once)

    def _part(self, decoder: OnnxDecoder, part: list[list[int]], gen: GenerationConfig) -> list[list[int]]:
        if self.which(part) == "graph":  # shards share the one-thread session; alone, the Translator's
            return (self.one_thread_graph() if self.shards.pool is not None else self.graph)(part, gen)
        decoder.use_shortlist = self.decoder.use_shortlist  # a caller may have turned it off
        if gen.beam == 1 and len(part) == 1 and decoder.many_rows is not None:
            # As a batch of one, over the graphs and the shortlist its batches use: search.py's
            # one-row loop runs decoder.onnx over the whole vocabulary.
            return greedy_search_top_k(decoder, part, gen, 0)[0]
        return search(decoder, part, gen)

    def describe(self) -> dict:
        return {
            "shards": len(self.shards.states),
            "one_sentence_threads": self.single.describe() if self.single is not None else None,
        }


class Translator:
    """Text in, text out, with an ONNX package. Same interface as the PyTorch translator.

    A package is checked before use: its files against package.json (mt_runtime/files.py), then what
    they hold against the graphs (mt_runtime/package_checks.py, _check_content), each failure one
    PackageError line naming the file and the field."""

    runtime = "onnxruntime"

    def __init__(
        self,
        folder: str | Path,
        device: str = "cpu",
        threads: int | None = None,
        device_id: int = 0,
        search: str = "auto",
        shortlist: bool = True,
        processes: int | None = None,
    ):
        self.folder = Path(folder)
        self.package = verify_package(self.folder)

        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        if processes is not None and processes < 0:
            raise ValueError(f"processes must be 0 or more, got {processes}")
        if processes and device != "cpu":
            raise ValueError("processes: batches run in child processes on the CPU only")
        self.threads = threads
        self._one_call = threading.Lock()  # translate: its decoders hold one search each
        # threads=N on the CPU: batches split into N shards on one-thread sessions (mt_runtime/cores.py).
        # With child processes this process searches one sentence alone, while they idle: it may
        # use all their threads (1 or that many, whichever its first calls measure faster).
        own = threads * processes if processes and threads else threads
        shards = own if device == "cpu" and own and own > 1 else 1
        options = session_options(own)
        step_options = options if shards == 1 else session_options(1, shared=True)
        providers = ["CPUExecutionProvider"]
        if device == "cuda":
            providers = [("CUDAExecutionProvider", {"device_id": device_id}), "CPUExecutionProvider"]
        encoder = self._open(ENCODER, step_options, providers)
        decoder = self._open(DECODER, step_options, providers)
        # What really loaded: a CUDA provider that is listed but cannot start falls back to the CPU.
        self.providers = decoder.get_providers()
        self.device = "cuda" if self.providers[0] == "CUDAExecutionProvider" else "cpu"
        if device == "cuda" and self.device != "cuda":
            warnings.warn(f"{self.folder}: CUDA execution provider unavailable; running on the CPU", stacklevel=2)
        self.tokenizer, self.generation = self._check_content(decoder)
        listed = self.package["files"]
        # decoder_greedy.onnx serves greedy batches only where the package has no in-place twin.
        greedy_copying = DECODER_GREEDY if DECODER_GREEDY_INPLACE not in listed else None
        wanted = (DECODER_BATCH, greedy_copying, DECODER_GREEDY_INPLACE)
        many_rows, greedy, greedy_inplace = (
            self._open(name, step_options) if self.device == "cpu" and name in listed else None for name in wanted
        )
        # What this process will seldom or never search with waits on disk (lazy_session.py): decoder.onnx
        # where the step graphs serve every search; and the step graphs of a parent whose child
        # processes search its batches while generate.onnx searches its single sentences.
        seldom = {DECODER} if many_rows is not None else set()
        if processes and search != "python" and GENERATE in listed:
            seldom |= {ENCODER, DECODER_BATCH, DECODER_GREEDY_INPLACE}
        encoder, decoder, many_rows, greedy_inplace = (
            self._seldom(session, name, step_options, providers) if session is not None and name in seldom else session
            for session, name in (
                (encoder, ENCODER),
                (decoder, DECODER),
                (many_rows, DECODER_BATCH),
                (greedy_inplace, DECODER_GREEDY_INPLACE),
            )
        )
        lexical = None
        if shortlist and many_rows is not None and SHORTLIST_FILE in listed and SHORTLIST_GRAPH in listed:
            try:
                table = Shortlist.load(self.folder / SHORTLIST_FILE, self.vocab)
            except ShortlistError as exc:
                raise PackageError(str(exc)) from None
            lexical = (
                table,
                self._open(SHORTLIST_GRAPH, step_options),
                (self.generation.pad_id, self.generation.bos_id, self.generation.eos_id),
            )
        self.decoder = OnnxDecoder(
            encoder,
            decoder,
            self.generation.pad_id,
            self.device,
            device_id,
            many_rows,
            greedy,
            lexical,
            greedy_inplace,
            max_positions=self.generation.max_positions,
        )
        if search not in ("auto", "graph", "python"):
            raise ValueError(f"search must be 'auto', 'graph' or 'python', got {search!r}")
        # On CUDA the step graphs with I/O binding stay the path (the op's CUDA kernel is untested here).
        has_graph = GraphSearch.FILES[0] in listed and self.device == "cpu"
        if search == "graph" and not has_graph:
            raise PackageError(
                f"{self.folder}: no generate.onnx usable on {self.device} (float32 CPU packages have one)"
            )
        self.graph_search = None
        if has_graph and search != "python":
            try:
                self.graph_search = GraphSearch.load(self.folder, options, listed, shortlist, self.layers)
            except PackageError:  # a graph that is not the format's: the package is wrong, not this onnxruntime
                raise
            except Exception as exc:  # e.g. a minimal onnxruntime build without the contrib ops
                if search == "graph":
                    raise PackageError(f"{self.folder}: generate.onnx does not load: {exc}") from exc
                warnings.warn(
                    f"{self.folder}: generate.onnx does not load with onnxruntime {ort.__version__} "
                    f"({exc}); searching over the step graphs instead",
                    stacklevel=2,
                )
        self.searcher = PackageSearch(
            self.decoder,
            self.graph_search,
            search,
            shards if self.device == "cpu" else 1,
            # A sentence alone, mostly one at a time: the arena's one-thread speed (session_options).
            functools.cache(lambda: GraphSearch.load(self.folder, session_options(1), listed, shortlist, self.layers)),
        )
        if processes:
            # Batches of several sentences in child processes of `threads` threads each, one
            # sentence here (mt_runtime/processes.py); closed by close() or when collected.
            # A child searches batches over the step graphs; generate.onnx would only hold memory
            # there (its weights, a copy per session), unless every batch is to run in it.
            child_search = "graph" if search == "graph" else "python"
            children = start_children(
                processes, self.folder, {"threads": threads, "search": child_search, "shortlist": shortlist}
            )
            self.searcher = ProcessSearch(self.searcher, self.decoder, children)
            self._finalizer = weakref.finalize(self, self.searcher.close)
        self.processes = processes or 0
        self.search, self.batch_search = self.searcher.one, self.searcher.many  # one sentence, several

    def close(self) -> None:
        """Stop the child processes (Translator(processes=N)); nothing to do without them."""
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()

    def _open(self, name: str, options: ort.SessionOptions, providers=("CPUExecutionProvider",)):
        """A session on the package's graph `name`, its inputs and outputs checked against the
        format's layout (mt_runtime/graph_checks.py; the encoder first: it tells the layer count)."""
        path = self.folder / name
        try:
            session = ort.InferenceSession(str(path), options, providers=list(providers))
        except Exception as exc:  # onnxruntime's errors: a file it cannot read as a graph
            raise PackageError(f"{path}: onnxruntime cannot load it ({reason(exc)})") from None
        if name == ENCODER:
            self.layers = graph_checks.decoder_layers(session.get_outputs(), path)
        graph_checks.check_graph(path, session.get_inputs(), session.get_outputs(), self.layers)
        return session

    def _seldom(self, session: ort.InferenceSession, name: str, options: ort.SessionOptions, providers) -> LazySession:
        """`session`, checked, let go: opened again the first time something runs it (as it was
        opened; the reopening holds no reference to this Translator)."""
        path, providers = str(self.folder / name), list(providers)
        return LazySession(session, lambda: ort.InferenceSession(path, options, providers=providers))

    def _check_content(self, decoder: ort.InferenceSession) -> tuple[SubwordTokenizer, GenerationConfig]:
        """The tokenizer and generation.json, checked against the graphs (mt_runtime/package_checks.py)
        before anything runs with them."""
        self.vocab = package_checks.vocabulary(decoder.get_outputs(), self.folder / DECODER)
        positions = package_checks.position_rows([self.folder / ENCODER, self.folder / DECODER])
        tokenizer = package_checks.load_tokenizer(self.folder / TOKENIZER, self.vocab)
        return tokenizer, package_checks.load_generation(self.folder / GENERATION, tokenizer, self.vocab, positions)

    # The IncrementalDecoder protocol, so search code can drive a Translator directly.
    def encode(self, src: list[list[int]], beam: int) -> None:
        package_checks.check_ids(src, self.vocab)
        self.decoder.encode(src, beam)

    def step(self, tokens: np.ndarray, parents: np.ndarray | None) -> np.ndarray:
        package_checks.check_ids(tokens, self.vocab)
        return self.decoder.step(tokens, parents)

    def translate(
        self,
        sentences: Sequence[str],
        beam: int = 4,
        length_penalty: float = 1.0,
        batch_tokens: int = 4000,
        max_batch: int = 256,
        on_batch=None,
    ) -> list[str]:
        gen = dataclasses.replace(self.generation, beam=beam, length_penalty=length_penalty)
        # Calls from several threads take turns: each decoder (a shard's, a child's pipe) holds
        # one search at a time. A server runs a Translator a worker thread (mt_runtime/serve_workers.py).
        with self._one_call:
            return translate_sentences(
                self.decoder,
                self.tokenizer,
                sentences,
                gen,
                batch_tokens=batch_tokens,
                max_batch=max_batch,
                on_batch=on_batch,
                searcher=self.searcher,
            )

    @property
    def at_once(self) -> int:
        """Batches a translate call keeps at work at a time (1 without threads or processes)."""
        return self.searcher.at_once

    def describe(self) -> dict:
        return {
            "runtime": self.runtime,
            "device": self.device,
            "providers": self.providers,
            "threads": self.threads,
            "processes": self.processes,
            "variant": self.package.get("variant"),
            "search": self.search,
            "batch_search": self.batch_search,
            "shortlist": self.decoder.use_shortlist,
            **self.searcher.describe(),
            "onnxruntime": ort.__version__,
        }
