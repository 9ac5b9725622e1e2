"""A batch's word list (mt_runtime/shortlist.py) in the step graphs for many rows: the output projection
as an If over the list's columns or the whole vocabulary, and shortlist.onnx, which makes those
columns once per batch."""

from __future__ import annotations

import copy

import onnx
from mt_runtime.layout import DECODER, LOG_PROBS, SHORTLISTED, WORDS
from onnx import TensorProto, helper

from .edit import compact_names, expect, prune_dead_nodes, replace_node
from .external import share_weights
from .projection import per_word_inputs, per_word_slots, value_type, vocabulary_projection


def shortlist_projection(g: onnx.GraphProto) -> bool:
    """The output projection as If(shortlisted): then the same op over the inputs
    shortlist_weight [d, words] (and its per-word scale, zero point, bias), which shortlist.onnx
    makes once per batch; else the op over the whole vocabulary as before. An If, not the
    shortlist inputs alone, because onnxruntime prepacks a constant weight (the whole vocabulary)
    and not a fed one. Returns False, changing nothing, where the projection is not one of these."""
    node = vocabulary_projection(g)
    if node is None:
        return False
    fed = copy.deepcopy(node)
    for j, name in per_word_slots(node).items():
        fed.input[j] = name
    float_type = value_type(g)
    g.input.extend([helper.make_tensor_value_info(SHORTLISTED, TensorProto.BOOL, [1]), *per_word_inputs(g, node)])
    out = node.output[0]

    def branch(name: str, op: onnx.NodeProto) -> onnx.GraphProto:
        op = copy.deepcopy(op)
        op.name, op.output[0] = f"{name}/projection", f"{name}/logits"
        return helper.make_graph(
            [op], name, [], [helper.make_tensor_value_info(op.output[0], float_type, ["batch", None])]
        )

    replace_node(
        g,
        node,
        [
            helper.make_node(
                "If",
                [SHORTLISTED],
                [out],
                name="shortlist/if",
                then_branch=branch("shortlisted", fed),
                else_branch=branch("vocabulary", node),
            )
        ],
    )
    return True


def shortlist_selector(decoder: onnx.ModelProto, blob: bytes) -> onnx.ModelProto | None:
    """shortlist.onnx: input `words` (int64 [words], target ids) -> the output projection's
    per-word inputs restricted to those words, in the order of `words`, named as
    decoder_batch.onnx and decoder_greedy.onnx take them. Its weights are decoder.onnx's bytes
    through the same conversions as theirs (folded when the session loads): a [d, vocab] weight
    is transposed once at load, so that a batch's words are whole rows to gather."""
    expect(decoder.graph, "shortlist.onnx", outputs=[LOG_PROBS])
    model = copy.deepcopy(decoder)
    share_weights(model.graph, DECODER, blob)
    g = model.graph
    node = vocabulary_projection(g)
    if node is None:
        return None
    make = helper.make_node
    nodes = []
    for j, name in per_word_slots(node).items():
        source = node.input[j]
        if j == 1:
            nodes += [
                make("Transpose", [source], [f"{name}/by_word"], perm=[1, 0], name=f"{name}/by_word"),
                make("Gather", [f"{name}/by_word", WORDS], [f"{name}/rows"], axis=0, name=f"{name}/rows"),
                make("Transpose", [f"{name}/rows"], [name], perm=[1, 0], name=name),
            ]
        else:
            nodes.append(make("Gather", [source, WORDS], [name], axis=0, name=name))
    # The decoder's nodes, of which pruning keeps those that compute the weights from initializers.
    graph = helper.make_graph(
        [*g.node, *nodes],
        "shortlist",
        [helper.make_tensor_value_info(WORDS, TensorProto.INT64, ["words"])],
        per_word_inputs(g, node),
        initializer=list(g.initializer),
    )
    prune_dead_nodes(graph)
    compact_names(graph)
    return helper.make_model(
        graph, opset_imports=list(model.opset_import), ir_version=model.ir_version, producer_name="mt-pipeline"
    )
