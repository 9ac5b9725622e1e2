"""The decoder's self-attention cache: rows that continue their own need no reorder, and a cache
that is not reordered can be written in place."""

from __future__ import annotations

import numpy as np
import onnx
from mt_runtime.layout import CACHE_INDEX, PAST_SEQUENCE_LENGTH
from onnx import TensorProto, helper, numpy_helper

from .edit import rename


def drop_cache_reorder(g: onnx.GraphProto) -> None:
    """Remove the Gathers by cache_index: each row's past_* is then its own row's."""
    for node in [n for n in g.node if n.op_type == "Gather" and len(n.input) > 1 and n.input[1] == CACHE_INDEX]:
        g.node.remove(node)
        rename(g, node.output[0], node.input[0])


def cache_in_place(g: onnx.GraphProto) -> bool:
    """A step graph without a cache reorder (decoder_greedy.onnx) whose self-attention writes the
    step's keys and values into the cache it reads instead of copying it into a new one: each
    past_* becomes a buffer of `capacity` positions whose first `past_sequence_length` are filled,
    and its present_* is that buffer again (the caller binds both to the same memory).
    onnxruntime's MultiHeadAttention does this when given past_sequence_length, with the same
    products and softmax over the same positions: the outputs are bit-identical to the copying
    form (greedy batches of 32 ran 1.03-1.05x at one thread, scripts/inplace_ab.py,
    docs/decisions.md).

    The position of the step's token was read from the cache's length (Shape, then Gather 2);
    it is past_sequence_length now. Returns False, changing nothing, unless every past_* is read
    only by a self-attention MultiHeadAttention whose present_* is a graph output, and by such a
    length: a graph this pass does not know keeps the copying form."""
    if any(i.name == CACHE_INDEX for i in g.input):
        return False
    pasts = {i.name for i in g.input if i.name.startswith("past_")}
    outputs = {o.name for o in g.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in g.node:
        for name in node.input:
            if name in pasts:
                readers.setdefault(name, []).append(node)
    # Small constants only: the weights are external data this pass never reads.
    constants = {i.name: numpy_helper.to_array(i) for i in g.initializer if i.data_location != TensorProto.EXTERNAL}
    attentions, lengths = [], []
    for past in pasts:
        for node in readers.get(past, []):
            if node.op_type == "MultiHeadAttention" and _reads_past_as_cache(node, past, outputs):
                attentions.append(node)
            elif node.op_type == "Shape" and _only_length_read(g, node, constants):
                lengths.append(node)
            else:
                return False
    if not attentions:
        return False
    g.input.append(helper.make_tensor_value_info(PAST_SEQUENCE_LENGTH, TensorProto.INT32, [1]))
    g.initializer.append(numpy_helper.from_array(np.zeros(0, dtype=np.int64), "past_sequence_length/scalar"))
    one, scalar = "past_sequence_length/one", "past_sequence_length/int64"
    g.node.insert(0, helper.make_node("Reshape", [one, "past_sequence_length/scalar"], [scalar]))
    g.node.insert(0, helper.make_node("Cast", [PAST_SEQUENCE_LENGTH], [one], to=TensorProto.INT64))
    for shape_node in lengths:
        for gather in [n for n in g.node if shape_node.output[0] in n.input]:
            g.node.remove(gather)
            rename(g, gather.output[0], scalar)
        g.node.remove(shape_node)
    for node in {id(n): n for n in attentions}.values():
        del node.input[8:]
        node.input.extend([""] * (8 - len(node.input)) + [PAST_SEQUENCE_LENGTH])
    for value in (*g.input, *g.output):
        if value.name in pasts or value.name in outputs and value.name.startswith("present_"):
            dim = value.type.tensor_type.shape.dim[2]
            dim.Clear()
            dim.dim_param = "capacity"
    return True


def _reads_past_as_cache(node: onnx.NodeProto, past: str, outputs: set[str]) -> bool:
    """MultiHeadAttention reading `past` as its past_key (6) or past_value (7), its presents
    graph outputs, with no past_sequence_length yet."""
    inputs = list(node.input)
    return (
        len(inputs) in (8, 9)
        and past in inputs[6:8]
        and inputs.index(past) in (6, 7)
        and (len(inputs) == 8 or not inputs[8])
        and len(node.output) == 3
        and all(o in outputs for o in node.output[1:])
    )


def _only_length_read(g: onnx.GraphProto, shape_node: onnx.NodeProto, constants: dict) -> bool:
    """A Shape whose only readers are Gathers of its dimension 2 (the cache's length) as a scalar."""
    readers = [n for n in g.node if shape_node.output[0] in n.input]
    if not readers or any(o.name == shape_node.output[0] for o in g.output):
        return False
    for node in readers:
        if node.op_type != "Gather" or node.input[0] != shape_node.output[0] or node.input[1] not in constants:
            return False
        index = constants[node.input[1]]
        if index.shape != () or int(index) != 2 or any(a.name == "axis" and a.i != 0 for a in node.attribute):
            return False
    return all(a.name == "start" and a.i == 0 for a in shape_node.attribute)  # the whole shape
