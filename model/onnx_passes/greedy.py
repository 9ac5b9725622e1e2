"""decoder_greedy.onnx: the greedy steps where every row continues its own: no cache reorder, the
logits out (no softmax; the loop takes the argmax)."""

from __future__ import annotations

import copy

import onnx
from mt_runtime.layout import CACHE_INDEX, LOG_PROBS, LOGITS

from .cache import cache_in_place, drop_cache_reorder
from .edit import compact_names, expect, prune_dead_nodes, rename
from .many_rows import many_rows_copy


def greedy_decoder(decoder: onnx.ModelProto, blob: bytes, shortlist: bool = False) -> onnx.ModelProto | None:
    """decoder_batch.onnx for the greedy steps where every row continues its own: no cache_index
    input and no reorder (the cache Gathers copied every past_* each step), and the logits
    [rows, vocab] out instead of log_probs (no softmax; the loop takes the argmax). At 64 rows,
    one thread, a step took 0.81-0.89 of decoder_batch.onnx's (student, teacher int8)."""
    expect(decoder.graph, "decoder_greedy.onnx", [CACHE_INDEX], [LOG_PROBS])
    model = many_rows_copy(decoder, blob, shortlist)
    g = model.graph
    drop_cache_reorder(g)
    producer = {o: n for n in g.node for o in n.output}
    softmax = producer.get(LOG_PROBS)
    if softmax is None or softmax.op_type != "LogSoftmax":
        return None  # log-probabilities that are not one LogSoftmax's: decoder_batch.onnx serves
    g.node.remove(softmax)
    [output] = [o for o in g.output if o.name == LOG_PROBS]
    rename(g, softmax.input[0], LOGITS)
    output.name = LOGITS
    if shortlist:  # a shortlisted step has a column per word of the batch's list, not the vocabulary's
        output.type.tensor_type.shape.dim[-1].dim_param = "words"
    g.input.remove(next(i for i in g.input if i.name == CACHE_INDEX))
    prune_dead_nodes(g)
    compact_names(g)
    del g.value_info[:]
    return model


def greedy_inplace_decoder(greedy: onnx.ModelProto) -> onnx.ModelProto | None:
    """decoder_greedy.onnx with the cache written in place (cache.cache_in_place); None where the
    graph's cache is not one that pass knows."""
    model = copy.deepcopy(greedy)
    return model if cache_in_place(model.graph) else None
