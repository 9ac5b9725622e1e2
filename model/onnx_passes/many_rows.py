"""decoder_batch.onnx: decoder.onnx for a search loop over many rows (its own nodes, weights read
from its bytes), the rows of one sentence grouped for cross-attention, each row's top k out."""

from __future__ import annotations

import copy

import numpy as np
import onnx
from mt_runtime.layout import CACHE_INDEX, DECODER, GROUP, LOG_PROBS, NORMALIZE, SRC_MASK, TOP_IDS, TOP_K, TOP_LOG_PROBS
from onnx import TensorProto, helper, numpy_helper

from .batch_words import shortlist_projection
from .edit import compact_names, expect, shape
from .external import share_weights
from .output_vocabulary import restricted_projection
from .top_k import normalize_or_not


def many_rows_copy(decoder: onnx.ModelProto, blob: bytes, shortlist: bool = False) -> onnx.ModelProto:
    """decoder.onnx with its weights read from decoder.onnx's bytes (`blob`); with `shortlist`,
    its output projection may be restricted to a batch's words (see shortlist_projection). Its
    nodes are decoder.onnx's, so that a row's numbers are the same in every graph."""
    model = copy.deepcopy(decoder)
    if shortlist:
        shortlist_projection(model.graph)
    share_weights(model.graph, DECODER, blob)
    return model


def group_cross_attention(g: onnx.GraphProto, beams: str | None = None) -> int:
    """Each cross-attention runs with the rows of one sentence (its beams, consecutive) as its
    query positions: one (sentence, head) product of `group` rows instead of `group` products of
    one row. At 32 sentences x beam 4, one thread, a cross-attention took 347 instead of 780 us
    (`/tmp/s34/xgroup.py`), and the encoder's output is no longer repeated per beam.

    Without `beams` (decoder_batch.onnx): the group size is the input `group` (int64 [1]), and
    cross_k_*, cross_v_* and src_mask have one row per sentence. With `beams`, the name of an
    int32 [1] value (the search op's num_beams, read from the outer graph), the keys, values and
    mask come one row per beam, as the op expands them, and each attention takes every group-th
    row: the same products, so a sentence alone in the op gets decoder_batch.onnx's numbers to the
    bit (one row at a time, MLAS summed a cross-attention in another order: 3.6e-7 apart, enough
    to move an int8 activation by a step and, once in 1000 sentences, a beam's choice).
    Returns how many attentions it grouped."""
    inputs = {i.name for i in g.input}
    crosses = [
        n
        for n in g.node
        if n.op_type == "MultiHeadAttention"
        and len(n.input) > 1
        and n.input[1] in inputs
        and n.input[1].startswith("cross_k_")
    ]
    if not crosses:
        return 0
    g.initializer.extend(
        [
            numpy_helper.from_array(np.array([-1], np.int64), "group/minus_one"),
            numpy_helper.from_array(np.array([0], np.int64), "group/same"),
            numpy_helper.from_array(np.array([-1, 1, 0], np.int64), "group/rows"),
        ]
    )
    first = [
        helper.make_node(
            "Concat", ["group/minus_one", GROUP, "group/same"], ["group/queries"], axis=0, name="group/queries"
        )
    ]
    if beams is None:
        g.input.append(helper.make_tensor_value_info(GROUP, TensorProto.INT64, [1]))
        for value in g.input:  # one row per sentence, not per row
            if value.name == SRC_MASK or value.name.startswith(("cross_k_", "cross_v_")):
                value.type.tensor_type.shape.dim[0].dim_param = "sentences"
    else:
        g.initializer.append(numpy_helper.from_array(np.array([2**62], np.int64), "group/end"))
        first.insert(0, helper.make_node("Cast", [beams], [GROUP], to=TensorProto.INT64, name="group/beams"))
        per_sentence = {}
        for node in crosses:  # key, value, key padding mask: the first beam's row of each sentence
            for slot in (1, 2, 4):
                name = node.input[slot] if len(node.input) > slot else ""
                if name and name not in per_sentence:
                    per_sentence[name] = f"{name}/per_sentence"
                    first.append(
                        helper.make_node(
                            "Slice",
                            [name, "group/same", "group/end", "group/same", GROUP],
                            [per_sentence[name]],
                            name=f"group/{name}",
                        )
                    )
                if name:
                    node.input[slot] = per_sentence[name]
    for node in crosses:
        at = list(g.node).index(node)
        query, out = node.input[0], node.output[0]
        # [rows, 1, width] -> [sentences, group, width] (0: keep the width) and back
        g.node.insert(
            at,
            helper.make_node(
                "Reshape", [query, "group/queries"], [f"{query}/grouped"], name=f"{node.name or out}/group"
            ),
        )
        node.input[0] = f"{query}/grouped"
        node.output[0] = f"{out}/grouped"
        g.node.insert(
            at + 2,
            helper.make_node("Reshape", [f"{out}/grouped", "group/rows"], [out], name=f"{node.name or out}/ungroup"),
        )
    for at, node in enumerate(first):
        g.node.insert(at, node)
    return len(crosses)


def top_k_decoder(
    decoder: onnx.ModelProto, blob: bytes, shortlist: bool = False, vocabulary: np.ndarray | None = None
) -> onnx.ModelProto:
    """decoder.onnx for a search loop over many rows: the int8 matrices as in generate_batch.onnx,
    and instead of log_probs [rows, vocab] its `top_k` (an input, int64 [1]) best entries per row,
    best first: top_log_probs float [rows, top_k], top_ids int64 [rows, top_k]. The loop's own
    top-k over the whole distribution (NumPy) was 28% of batch 32 x beam 4 (915 of 3226 ms, one
    thread, 256 sentences); onnxruntime's TopK reads it in place. With `normalize` (bool [1])
    false, top_log_probs holds the raw logits of the whole vocabulary and top_ids no column:
    greedy search without scores needs no softmax over the vocabulary (CTranslate2 skips it
    likewise), and onnxruntime runs every node of a graph whatever outputs are asked for, so the
    choice is an If. Weights are read from decoder.onnx's bytes, as the generate graphs do.
    `vocabulary` (sorted ids; see output_vocabulary): the normalized steps (beam search) project
    onto those words only and are normalized over them, as generate_batch.onnx's are (int8
    projections only); the ids out are word ids."""
    expect(decoder.graph, "decoder_batch.onnx", [CACHE_INDEX], [LOG_PROBS])
    model = many_rows_copy(decoder, blob, shortlist)
    g = model.graph
    group_cross_attention(g)
    [log_probs] = [o for o in g.output if o.name == LOG_PROBS]
    [softmax] = [n for n in g.node if LOG_PROBS in n.output]
    value_type = log_probs.type.tensor_type.elem_type
    g.input.append(helper.make_tensor_value_info(TOP_K, TensorProto.INT64, [1]))
    if softmax.op_type == "LogSoftmax":
        g.node.remove(softmax)
        vocab = shape(log_probs)[-1]
        restricted = restricted_projection(g, softmax.input[0], vocabulary, vocab) if vocabulary is not None else None
        g.node.append(normalize_or_not(softmax, value_type, vocab, restricted))
        g.input.append(helper.make_tensor_value_info(NORMALIZE, TensorProto.BOOL, [1]))
    else:  # a graph whose log-probabilities are not one LogSoftmax's: always normalized
        g.node.append(
            helper.make_node("TopK", [LOG_PROBS, TOP_K], [TOP_LOG_PROBS, TOP_IDS], axis=-1, largest=1, sorted=1)
        )
    index = list(g.output).index(log_probs)
    g.output.remove(log_probs)
    g.output.insert(index, helper.make_tensor_value_info(TOP_IDS, TensorProto.INT64, ["batch", None]))
    g.output.insert(index, helper.make_tensor_value_info(TOP_LOG_PROBS, value_type, ["batch", None]))
    compact_names(g)
    del g.value_info[:]
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model
