"""One sentence's word list inside generate.onnx: its greedy search chooses from the words
Shortlist.sentence_words lists for it, the list made from its source in the graph."""

from __future__ import annotations

import copy

import numpy as np
import onnx
from mt_runtime.layout import INPUT_IDS
from mt_runtime.shortlist import Shortlist, sentence_width
from onnx import TensorProto, helper, numpy_helper

from .edit import constant_nodes, expect, prune_dead_nodes, replace_node, shape
from .projection import int8_of_constants, per_word_slots

LISTED_SEQUENCES = "shortlist/sequences"  # the op's output over the list: places in it, not ids


def special_ids(generation: dict) -> list[int]:
    return [generation["pad_id"], generation["bos_id"], generation["eos_id"]]


def sentence_word_list(dec: onnx.GraphProto, shortlist: Shortlist, generation: dict):
    """Restrict the op's vocabulary to a per-call word list (mt_runtime/shortlist.py): the main graph
    makes the list from the sources and the output projection's columns for it; the decoder maps
    the op's token (a position in the list) to its word and projects onto the list only; the
    op's sequences are mapped back after it. The list is Shortlist.sentence_words' (PAD, BOS,
    EOS, the frequent words, the sentence's candidates; translator.py masks a batch's rows to the
    same lists), filled up to sentence_width with PAD, which the projection's mask (-inf) keeps
    from being chosen: the op needs a fixed vocabulary size when it loads.

    Why: at one row the output projection over 8000 words was a quarter of a student's greedy
    step, and the op's log-softmax and top k run over whatever vocabulary the decoder gives it.
    Returns (nodes before the op, nodes after it, initializers), or None where the projection is
    not an int8 product of constants (the graph then keeps the whole vocabulary)."""
    expect(dec, "a sentence's word list", [INPUT_IDS], ["logits"])  # the search op's decoder
    producer = {o: n for n in dec.node for o in n.output}
    proj = producer.get("logits")
    specials = special_ids(generation)
    vocab = shortlist.vocab_size
    if proj is None or len(set(specials)) < 3 or shape(dec.output[0])[-1] != vocab or not int8_of_constants(dec, proj):
        return None
    weight_slot, scale_slot = sorted(per_word_slots(proj))
    width = sentence_width(shortlist)
    # Each source word's candidates as a row of `per_word`, padded with PAD (listed anyway).
    counts = np.diff(shortlist.offsets)
    per_word = max(int(counts.max(initial=0)), 1)
    table = np.full((vocab, per_word), specials[0], np.int16 if vocab < 2**15 else np.int32)
    for s in np.nonzero(counts)[0]:
        table[s, : counts[s]] = shortlist.words[shortlist.offsets[s] : shortlist.offsets[s + 1]]
    # A word is a candidate to list where the sources' table rows name it and it is neither special
    # nor frequent (those are listed anyway, first): `eligible` 1, else 0.
    eligible = np.ones(vocab, np.float32)
    eligible[shortlist.always] = 0.0
    eligible[specials] = 0.0
    frequent = np.setdiff1d(np.asarray(shortlist.always, np.int64), specials)  # sorted: id order
    p, make = "shortlist", helper.make_node
    const = {
        "table": table,
        "eligible": eligible,
        "nowhere": np.zeros(vocab, np.float32),
        "frequent": frequent.reshape(1, -1),
        # The list's filling: PAD, masked out of the projection (-inf), so never chosen; which word
        # fills does not change a number (the op's log-softmax adds exp(-inf) = 0).
        "filling": np.full((1, width), specials[0], np.int64),
        "specials": np.array(specials, np.int64),
        "others": np.array([width - 3], np.int64),
        "flat": np.array([-1], np.int64),
        "one": np.array(1.0, np.float32),
        "start": np.array([0], np.int64),
        "places": np.arange(width, dtype=np.int64),
        "listed_base": np.array(3 + len(frequent), np.int64),
        "zero": np.array(0.0, np.float32),
        "never": np.array(-np.inf, np.float32),
    }
    # The projection's weight and scales as the main graph makes them: the decoder's nodes of
    # constants that compute them (folded at load), renamed, over copies of their initializers
    # (the same bytes, by reference).
    columns, made = constant_nodes(dec, [proj.input[weight_slot], proj.input[scale_slot]], f"{p}/all")
    weight, scales = made
    inits = [*columns.initializer, *(numpy_helper.from_array(v, f"{p}/{k}") for k, v in const.items())]
    before = [
        make("Gather", [f"{p}/table", INPUT_IDS], [f"{p}/candidates"], axis=0, name=f"{p}/candidates"),
        make("Reshape", [f"{p}/candidates", f"{p}/flat"], [f"{p}/flat_candidates"], name=f"{p}/flat_candidates"),
        make("Cast", [f"{p}/flat_candidates"], [f"{p}/ids"], to=TensorProto.INT64, name=f"{p}/ids"),
        make("Shape", [f"{p}/ids"], [f"{p}/ids_shape"], name=f"{p}/ids_shape"),
        make("Expand", [f"{p}/one", f"{p}/ids_shape"], [f"{p}/ones"], name=f"{p}/ones"),
        # Every index writes the same 1: repeated words leave no order to depend on.
        make(
            "ScatterElements",
            [f"{p}/nowhere", f"{p}/ids", f"{p}/ones"],
            [f"{p}/is_candidate"],
            axis=0,
            name=f"{p}/is_candidate",
        ),
        make("Mul", [f"{p}/is_candidate", f"{p}/eligible"], [f"{p}/listable"], name=f"{p}/listable"),
        # The candidates in id order (NonZero: a stable partition, at a third of TopK's cost over
        # the vocabulary); where a long sentence's do not all fit, the lower ids (the more frequent
        # subwords) stay.
        make("NonZero", [f"{p}/listable"], [f"{p}/candidate_ids"], name=f"{p}/candidate_ids"),
        make(
            "Concat",
            [f"{p}/frequent", f"{p}/candidate_ids", f"{p}/filling"],
            [f"{p}/ranked_ids"],
            axis=1,
            name=f"{p}/ranked_ids",
        ),
        make("Reshape", [f"{p}/ranked_ids", f"{p}/flat"], [f"{p}/ranked"], name=f"{p}/ranked"),
        make("Slice", [f"{p}/ranked", f"{p}/start", f"{p}/others"], [f"{p}/chosen"], name=f"{p}/chosen"),
        make("Concat", [f"{p}/specials", f"{p}/chosen"], [f"{p}/words"], axis=0, name=f"{p}/words"),
        make("Cast", [f"{p}/words"], [f"{p}/words32"], to=TensorProto.INT32, name=f"{p}/words32"),
        # The list's real words (specials, frequent, candidates) come first; the filling after
        # them is masked out of the projection: -inf, never chosen.
        make("Shape", [f"{p}/candidate_ids"], [f"{p}/candidate_shape"], start=1, name=f"{p}/candidate_shape"),
        make("Add", [f"{p}/candidate_shape", f"{p}/listed_base"], [f"{p}/listed"], name=f"{p}/listed"),
        make("Less", [f"{p}/places", f"{p}/listed"], [f"{p}/real"], name=f"{p}/real"),
        make("Where", [f"{p}/real", f"{p}/zero", f"{p}/never"], [f"{p}/mask"], name=f"{p}/mask"),
        # The list's columns of the int8 projection and their scales, once per call: the [d, vocab]
        # weight transposed once (folded at load) so that the words are whole rows to gather, then
        # back; a Gather on axis 1 copies byte by byte (337 of 1,600 us a sentence, student int8).
        *columns.node,
        make("Transpose", [weight], [f"{p}/by_word"], perm=[1, 0], name=f"{p}/by_word"),
        make("Gather", [f"{p}/by_word", f"{p}/words"], [f"{p}/rows"], axis=0, name=f"{p}/rows"),
        make("Transpose", [f"{p}/rows"], [f"{p}/weight"], perm=[1, 0], name=f"{p}/weight"),
        make("Gather", [scales, f"{p}/words"], [f"{p}/scales"], axis=0, name=f"{p}/scales"),
    ]
    after = [make("Gather", [f"{p}/words32", LISTED_SEQUENCES], [f"{p}/translation"], axis=0, name=f"{p}/translation")]
    # The decoder: the op's tokens are positions in the list.
    for node in dec.node:
        for i, name in enumerate(node.input):
            if name == INPUT_IDS:
                node.input[i] = f"{p}/token_words"
    dec.node.insert(
        0, make("Gather", [f"{p}/words32", INPUT_IDS], [f"{p}/token_words"], axis=0, name=f"{p}/token_words")
    )
    listed = copy.deepcopy(proj)
    listed.input[weight_slot], listed.input[scale_slot] = f"{p}/weight", f"{p}/scales"
    listed.output[0], listed.name = f"{p}/listed_logits", f"{p}/listed_logits"
    replace_node(dec, proj, [listed, make("Add", [listed.output[0], f"{p}/mask"], ["logits"], name=f"{p}/logits")])
    dec.output[0].type.tensor_type.shape.dim[-1].dim_value = width
    prune_dead_nodes(dec)  # the whole vocabulary's weight is not made here
    return before, after, inits
