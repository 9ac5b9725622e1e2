"""ONNX graph passes: each module edits a graph for one job and checks what it expects of its input
(edit.expect). `derive_graphs` makes a package's derived graphs from its two step graphs the way
CTranslate2's converters make a model: load, validate, then for each graph of the table below
compose its passes, and save; it returns the layout record (file -> role, mt_runtime/layout.py).

    generate.onnx         beam_search (+ sentence_words, output_vocabulary's check,   float32
                          few_rows)
    generate_batch.onnx   beam_search + output_vocabulary + few_rows       int8 with a shortlist
    decoder_batch.onnx    many_rows (+ batch_words, output_vocabulary, top_k)          float32
    decoder_greedy.onnx   greedy (many_rows' copy, cache)                              float32
    decoder_greedy_inplace.onnx  decoder_greedy.onnx + cache.cache_in_place               float32
    shortlist.onnx        batch_words                                    with a shortlist

Every derived graph runs decoder.onnx's own nodes and reads its weights from the step graphs'
bytes (external), so a sentence's numbers are the same in each, alone or in a batch. float16
packages get none of them: the search op's CPU kernel is float32 only, and on a GPU the runtime
drives the step graphs.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from mt_runtime.layout import (
    CACHE_INDEX,
    DECODER,
    DECODER_BATCH,
    DECODER_GREEDY,
    DECODER_GREEDY_INPLACE,
    ENCODER,
    GENERATE,
    GENERATE_BATCH,
    LOG_PROBS,
    ROLES,
    SHORTLIST_FILE,
    SHORTLIST_GRAPH,
    SRC_IDS,
    SRC_MASK,
    TOKENS,
    cross_k,
    cross_v,
    past_k,
    past_v,
)
from mt_runtime.shortlist import Shortlist
from onnx import TensorProto

from .batch_words import shortlist_selector
from .beam_search import decoder_subgraph, encoder_subgraph, search_model
from .edit import compact_names, expect, shape
from .external import share_weights
from .few_rows import logits_product, wide_products_as_integer
from .greedy import greedy_decoder, greedy_inplace_decoder
from .many_rows import top_k_decoder
from .output_vocabulary import output_vocabulary, search_vocabulary
from .sentence_words import sentence_word_list, special_ids


class Source:
    """A package folder's step graphs (loaded once; every pass works on a copy) and what decides
    which derived graphs it gets."""

    def __init__(self, folder: Path, generation: dict, shortlist: bool):
        self.folder, self.generation = folder, generation
        self.blobs = {name: (folder / name).read_bytes() for name in (ENCODER, DECODER)}
        self.encoder, self.decoder = (onnx.load_from_string(self.blobs[name]) for name in (ENCODER, DECODER))
        self.layers = len(self.encoder.graph.output) // 2
        cache = next(i for i in self.decoder.graph.input if i.name == past_k(0))
        self.float32 = cache.type.tensor_type.elem_type == TensorProto.FLOAT
        self.shortlist = shortlist and (folder / SHORTLIST_FILE).is_file()

    def validate(self) -> None:
        """What every pass starts from: the step graphs' I/O (mt_runtime/layout.py)."""
        per_layer = [f(i) for i in range(self.layers) for f in (cross_k, cross_v)]
        expect(self.encoder.graph, ENCODER, [SRC_IDS], per_layer)
        expect(
            self.decoder.graph,
            DECODER,
            [TOKENS, SRC_MASK, CACHE_INDEX, *per_layer, *(f(i) for i in range(self.layers) for f in (past_k, past_v))],
            [LOG_PROBS],
        )

    def shortlist_table(self, vocab) -> Shortlist | None:
        if not self.shortlist or not isinstance(vocab, int):
            return None
        return Shortlist.load(self.folder / SHORTLIST_FILE, vocab)

    @cached_property
    def greedy(self) -> onnx.ModelProto | None:
        return greedy_decoder(self.decoder, self.blobs[DECODER], self.shortlist)

    @cached_property
    def search(self) -> SearchGraphs:
        """The search op's subgraphs, shared by generate.onnx and generate_batch.onnx."""
        enc = encoder_subgraph(self.encoder, self.layers)
        first_cache_heads = shape(self.encoder.graph.output[0])[1]
        dec = decoder_subgraph(self.decoder, self.layers, first_cache_heads)
        share_weights(enc, ENCODER, self.blobs[ENCODER])
        share_weights(dec, DECODER, self.blobs[DECODER])
        many_rows = one_row = listed = words = None
        shortlist = self.shortlist_table(shape(dec.output[0])[-1])
        if shortlist is not None:
            # greedy: each sentence's list, whether or not beams have a vocabulary; the branch that
            # runs it takes one row only (beam_search.py's If), so nothing to group
            one_row = decoder_subgraph(self.decoder, self.layers, first_cache_heads, beams=False)
            share_weights(one_row, DECODER, self.blobs[DECODER])
            listed = sentence_word_list(one_row, shortlist, self.generation)
            many_rows = copy.deepcopy(dec)
            words = search_vocabulary(many_rows, output_vocabulary(shortlist, special_ids(self.generation)))
            if words is None:  # not an int8 projection of constants, or a list without the special ids
                many_rows = None
        # The op decodes one row or a beam's few: wide int8 products as MatMulInteger (few_rows.py);
        # a sentence's list is narrow, so its projection keeps the fused op.
        for graph, whole_vocabulary in ((dec, True), (many_rows, True), (one_row, False)):
            if graph is not None:
                wide_products_as_integer(graph, logits_product(graph) if whole_vocabulary else set())
        for graph in (enc, dec, many_rows, one_row):
            if graph is not None:
                compact_names(graph)
        return SearchGraphs(enc, dec, many_rows, words, (one_row, *listed) if listed else None)


@dataclass
class SearchGraphs:
    enc: onnx.GraphProto
    dec: onnx.GraphProto
    over_vocabulary: onnx.GraphProto | None  # the op's decoder over the output vocabulary
    words: np.ndarray | None  # that vocabulary's word ids, by place
    greedy_one: tuple | None  # the one-sentence decoder over its word list, and the nodes around the op


def _generate(src: Source) -> onnx.ModelProto:
    s = src.search
    return search_model(s.enc, s.dec, src.encoder, src.decoder, src.generation, s.greedy_one)


def _generate_batch(src: Source) -> onnx.ModelProto | None:
    s = src.search
    if s.over_vocabulary is None:
        return None
    return search_model(s.enc, s.over_vocabulary, src.encoder, src.decoder, src.generation, vocabulary=s.words)


def _decoder_batch(src: Source) -> onnx.ModelProto:
    log_probs = next(o for o in src.decoder.graph.output if o.name == LOG_PROBS)
    shortlist = src.shortlist_table(shape(log_probs)[-1])
    vocabulary = output_vocabulary(shortlist, special_ids(src.generation)) if shortlist is not None else None
    return top_k_decoder(src.decoder, src.blobs[DECODER], src.shortlist, vocabulary)


def _decoder_greedy(src: Source) -> onnx.ModelProto | None:
    return src.greedy


def _decoder_greedy_inplace(src: Source) -> onnx.ModelProto | None:
    return greedy_inplace_decoder(src.greedy) if src.greedy is not None else None


def _shortlist_graph(src: Source) -> onnx.ModelProto | None:
    return shortlist_selector(src.decoder, src.blobs[DECODER]) if src.shortlist else None


# Each derived graph: its file, and how it is made (None: not for this package). In this order.
DERIVED: tuple[tuple[str, Callable[[Source], onnx.ModelProto | None]], ...] = (
    (GENERATE, _generate),
    (GENERATE_BATCH, _generate_batch),
    (DECODER_BATCH, _decoder_batch),
    (DECODER_GREEDY, _decoder_greedy),
    (DECODER_GREEDY_INPLACE, _decoder_greedy_inplace),
    (SHORTLIST_GRAPH, _shortlist_graph),
)


def derive_graphs(folder: Path, generation: dict, shortlist: bool = False) -> dict[str, str]:
    """Write the derived graphs of the package folder holding encoder.onnx and decoder.onnx (and
    with `shortlist`, its shortlist.npz, mt_runtime/shortlist.py); `generation`: its generation.json.
    Returns {file: role} of the graphs written: none for float16 graphs."""
    source = Source(Path(folder), generation, shortlist)
    source.validate()
    written: dict[str, str] = {}
    if not source.float32:
        return written
    for name, make in DERIVED:
        model = make(source)
        if model is not None:
            onnx.save(model, str(source.folder / name))
            written[name] = ROLES[name]
    return written
