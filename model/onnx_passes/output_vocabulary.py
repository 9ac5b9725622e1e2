"""The package's output vocabulary: every word its shortlist can list, which beam search searches
(normalized over it alone) instead of the whole vocabulary, in generate_batch.onnx and in
decoder_batch.onnx's normalized steps."""

from __future__ import annotations

import copy

import numpy as np
import onnx
from mt_runtime.layout import INPUT_IDS
from mt_runtime.shortlist import Shortlist
from onnx import helper, numpy_helper

from .edit import expect
from .projection import VOCABULARY_WORDS, int8_of_constants, onto_words


def output_vocabulary(shortlist: Shortlist, specials) -> np.ndarray | None:
    """The words a package with `shortlist` searches over where it searches the whole vocabulary
    with an int8 projection (beam search): every word any of its lists can hold (the frequent
    words, the special ids, each source word's candidates), sorted, filled with the lowest other
    ids to a multiple of 64 (the chunked top k's width). None where that is every word, or the
    shortlist lacks one of `specials`.

    Why: the default recipe's vocabulary is shared by English and French, and a third of it never
    occurs as a French training target (5521 of 8000 listable, covering all but 29 of the 455,894
    target tokens of train.fr): the projection, log-softmax and top k over those words are work
    on words the model was only taught to avoid. Unlike a per-batch list's, the words left out hold
    a small, even mass (label smoothing's floor: 2.4% of a step's probability on average, standard
    deviation 1.7%, student int8 on test_2016), so beam search, which compares scores across rows,
    keeps almost all its choices (docs/decisions.md)."""
    listed = np.zeros(shortlist.vocab_size, bool)
    listed[shortlist.always] = True
    listed[shortlist.words] = True
    if not listed[list(specials)].all():
        return None
    width = -(-int(listed.sum()) // 64) * 64
    if width >= shortlist.vocab_size:
        return None
    listed[np.flatnonzero(~listed)[: width - int(listed.sum())]] = True
    return np.flatnonzero(listed)


def restricted_projection(g: onnx.GraphProto, logits: str, words: np.ndarray, vocab: int):
    """For normalize_or_not: (the node making `logits`, nodes projecting onto `words` only, words)
    where the vocabulary projection (vocabulary_projection; under the shortlist's If, its else
    branch) is int8 with constant weights, else None. Its per-word inputs are Gathers of
    constants in the main graph, which onnxruntime folds into initializers when it loads, so the
    file holds the word list only and the weight is prepacked like any other."""
    producer = {o: n for n in g.node for o in n.output}
    node = producer.get(logits)
    if node is None:
        return None
    projection = node
    if node.op_type == "If":  # shortlist_projection's: the whole vocabulary is its else branch
        [projection] = [b.g.node[0] for b in node.attribute if b.name == "else_branch"] or [None]
    if projection is None or not int8_of_constants(g, projection):
        return None
    g.initializer.append(numpy_helper.from_array(words.astype(np.int64), VOCABULARY_WORDS))  # as the ids out
    restricted = copy.deepcopy(projection)
    restricted.output[0] = "vocabulary/logits"
    onto_words(g, restricted, before=node)
    g.node.remove(node)
    return node, [restricted], words


def search_vocabulary(dec: onnx.GraphProto, words: np.ndarray | None) -> np.ndarray | None:
    """The op's decoder `dec` over the output vocabulary `words` (output_vocabulary): its tokens
    are places in it (mapped to word ids before the embedding) and its logits are the words'
    only, through Gathers of the projection's constant inputs that onnxruntime folds at load.
    Returns `words`, or None (nothing changed) where the projection is not an int8
    DynamicQuantizeMatMul of constants."""
    expect(dec, "the output vocabulary", [INPUT_IDS], ["logits"])  # the search op's decoder
    producer = {o: n for n in dec.node for o in n.output}
    proj = producer.get("logits")
    if words is None or proj is None or not int8_of_constants(dec, proj):
        return None
    make = helper.make_node
    dec.initializer.append(numpy_helper.from_array(words.astype(np.int32), VOCABULARY_WORDS))
    onto_words(dec, proj, before=proj)
    for node in dec.node:
        for i, name in enumerate(node.input):
            if name == INPUT_IDS:
                node.input[i] = "vocabulary/token_words"
    dec.node.insert(0, make("Gather", [VOCABULARY_WORDS, INPUT_IDS], ["vocabulary/token_words"], axis=0))
    dec.output[0].type.tensor_type.shape.dim[-1].dim_value = len(words)
    return words
