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
    EOS, the frequent words, the sentence's candidates; runtime.py masks a batch's rows to the
    same lists), filled up to sentence_width with other words that the projection's mask
    (-inf) keeps from being chosen: the op needs a fixed vocabulary size when it loads.

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
    # A word's class: base + 1 if a candidate of the sources. The frequent words 2 or 3 (first),
    # candidates 1, the others 0 (filling); the special ids far below: they are put first apart.
    base = np.zeros(vocab, np.float32)
    base[shortlist.always] = 2.0
    base[specials] = -10.0
    p, make = "shortlist", helper.make_node
    classes = ((1.5, 9.0), (0.5, 1.5), (-0.5, 0.5))  # rank bounds: frequent, candidate, other
    const = {
        "table": table,
        "base": base,
        "nowhere": np.zeros(vocab, np.float32),
        **{
            f"{side}{cls}": np.array(bound, np.float32)
            for cls, bounds in enumerate(classes)
            for side, bound in zip(("low", "high"), bounds)
        },
        "specials": np.array(specials, np.int64),
        "others": np.array([width - 3], np.int64),
        "flat": np.array([-1], np.int64),
        "one": np.array(1.0, np.float32),
        "start": np.array([0], np.int64),
        "places": np.arange(width, dtype=np.int64),
        "listed_base": np.array(3, np.int64),
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
        make("Add", [f"{p}/is_candidate", f"{p}/base"], [f"{p}/rank"], name=f"{p}/rank"),
    ]
    # The ids class by class (frequent, candidate, other), each in id order: a stable partition
    # with NonZero, at a third of the cost of TopK over the vocabulary; where a long sentence's
    # candidates do not all fit, the lower ids (the more frequent subwords) stay.
    for cls in range(len(classes)):
        before += [
            make("Greater", [f"{p}/rank", f"{p}/low{cls}"], [f"{p}/above{cls}"]),
            make("Less", [f"{p}/rank", f"{p}/high{cls}"], [f"{p}/below{cls}"]),
            make("And", [f"{p}/above{cls}", f"{p}/below{cls}"], [f"{p}/in{cls}"]),
            make("NonZero", [f"{p}/in{cls}"], [f"{p}/class{cls}"]),
        ]
    before += [
        make(
            "Concat",
            [f"{p}/class{cls}" for cls in range(len(classes))],
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
        make("Shape", [f"{p}/class0"], [f"{p}/frequent_shape"], start=1, name=f"{p}/frequent_shape"),
        make("Shape", [f"{p}/class1"], [f"{p}/candidate_shape"], start=1, name=f"{p}/candidate_shape"),
        make("Add", [f"{p}/frequent_shape", f"{p}/candidate_shape"], [f"{p}/listed_words"], name=f"{p}/listed_words"),
        make("Add", [f"{p}/listed_words", f"{p}/listed_base"], [f"{p}/listed"], name=f"{p}/listed"),
        make("Less", [f"{p}/places", f"{p}/listed"], [f"{p}/real"], name=f"{p}/real"),
        make("Where", [f"{p}/real", f"{p}/zero", f"{p}/never"], [f"{p}/mask"], name=f"{p}/mask"),
        # The list's columns of the int8 projection and their scales, once per call.
        *columns.node,
        make("Gather", [weight, f"{p}/words"], [f"{p}/weight"], axis=1, name=f"{p}/weight"),
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
