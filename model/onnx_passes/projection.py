"""The decoder's output projection (the logits its LogSoftmax normalises): finding it, its inputs
with one entry per word, and pointing those at a list of words."""

from __future__ import annotations

import onnx
from mt_runtime.layout import LOG_PROBS, SHORTLIST_SCALE, SHORTLIST_WEIGHT
from onnx import TensorProto, helper

from .edit import computed_from_constants

# The output projection's inputs that have one entry per word, by op and input slot, under the
# names the step graphs take them by when a batch's words are shortlisted (mt_runtime/shortlist.py).
PER_WORD_SLOTS = {"MatMulIntegerToFloat": {1: SHORTLIST_WEIGHT, 3: SHORTLIST_SCALE}}
VOCABULARY_WORDS = "vocabulary/words"  # the output vocabulary's word ids, by place


def per_word_slots(node: onnx.NodeProto) -> dict[int, str]:
    """Input slot -> shortlist input name, for the per-word inputs `node` has."""
    return {j: name for j, name in PER_WORD_SLOTS[node.op_type].items() if len(node.input) > j and node.input[j]}


def value_type(g: onnx.GraphProto) -> int:
    """The decoder's float type (its cache's)."""
    return next((i.type.tensor_type.elem_type for i in g.input if i.name.startswith("past_")), TensorProto.FLOAT)


def vocabulary_projection(g: onnx.GraphProto) -> onnx.NodeProto | None:
    """The node whose output the decoder's LogSoftmax normalises (the logits [rows, vocab]), where
    it is one whose per-word inputs (PER_WORD_SLOTS) are computed from initializers alone."""
    producer = {o: n for n in g.node for o in n.output}
    softmax = producer.get(LOG_PROBS)
    if softmax is None or softmax.op_type != "LogSoftmax":
        return None
    node = producer.get(softmax.input[0])
    if node is None or node.op_type not in PER_WORD_SLOTS:
        return None
    return node if computed_from_constants(g, [node.input[j] for j in per_word_slots(node)]) else None


def per_word_inputs(g: onnx.GraphProto, node: onnx.NodeProto) -> list[onnx.ValueInfoProto]:
    """The projection's per-word inputs present on `node`, as the shortlisted step graphs take
    them (and shortlist.onnx gives them): the int8 weight [d, words] and its scales [words]."""
    return [
        helper.make_tensor_value_info(
            name, TensorProto.INT8 if j == 1 else value_type(g), [None, "words"] if j == 1 else ["words"]
        )
        for j, name in per_word_slots(node).items()
    ]


def int8_of_constants(g: onnx.GraphProto, projection: onnx.NodeProto) -> bool:
    """Whether `projection` is an int8 product (quantize_rows') whose per-word inputs are constants of g."""
    return projection.op_type in PER_WORD_SLOTS and computed_from_constants(
        g, [projection.input[j] for j in per_word_slots(projection)]
    )


def onto_words(
    g: onnx.GraphProto, projection: onnx.NodeProto, before: onnx.NodeProto, words: str = VOCABULARY_WORDS
) -> None:
    """Point `projection`'s per-word inputs at Gathers of them by the ids `words`, inserted into g
    before `before` (constants: folded at load)."""
    at = list(g.node).index(before)
    for j in per_word_slots(projection):
        name = f"{words}/input{j}"
        g.node.insert(
            at, helper.make_node("Gather", [projection.input[j], words], [name], axis=1 if j == 1 else 0)
        )  # the weight is [d, words]
        projection.input[j] = name
