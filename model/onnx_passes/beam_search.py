"""generate.onnx and generate_batch.onnx: our step graphs as the two subgraphs of onnxruntime's
contrib op com.microsoft.BeamSearch, in its encoder-decoder ("T5", model_type 1) convention."""

from __future__ import annotations

import copy

import numpy as np
import onnx
from mt_runtime.layout import (
    CACHE_INDEX,
    INPUT_IDS,
    LENGTH_PENALTY,
    LOG_PROBS,
    MAX_LENGTH,
    NUM_BEAMS,
    SEQUENCES,
    SHORTLISTED,
    SRC_IDS,
    SRC_MASK,
    TOKENS,
    cross_k,
    cross_v,
    past_k,
    past_v,
    present_k,
    present_v,
)
from onnx import TensorProto, helper, numpy_helper

from .cache import drop_cache_reorder
from .edit import expect, prune_dead_nodes, rename, shape
from .many_rows import group_cross_attention
from .projection import VOCABULARY_WORDS
from .sentence_words import LISTED_SEQUENCES

# Ops that only reshape or retype the source mask on its way to an attention's key_padding_mask.
_MASK_PLUMBING = {"Cast", "Unsqueeze", "Flatten", "Reshape", "Squeeze"}
KEY_PADDING_SLOT = 4


def _last_position_gather(graph: onnx.GraphProto, logits: str, producer: dict) -> onnx.NodeProto | None:
    """The Gather(axis 1, index -1) upstream of `logits` that takes the decoder's last position."""
    constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer if not t.dims}
    todo, seen = [logits], set()
    while todo:
        name = todo.pop()
        node = producer.get(name)
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if (
            node.op_type == "Gather"
            and axis == 1
            and constants.get(node.input[1]) is not None
            and int(constants[node.input[1]]) == -1
        ):
            return node
        todo.append(node.input[0])  # the data path: activations are every op's first input here
    return None


def encoder_subgraph(encoder: onnx.ModelProto, layers: int) -> onnx.GraphProto:
    expect(
        encoder.graph, "the search op's encoder", [SRC_IDS], [f(i) for i in range(layers) for f in (cross_k, cross_v)]
    )
    g = copy.deepcopy(encoder.graph)
    g.name = "encoder"
    outputs = {o.name: o for o in g.output}
    g.node.insert(
        0, helper.make_node("Cast", ["encoder_input_ids"], ["src_ids"], to=TensorProto.INT64, name="generate/src_ids")
    )
    new_outputs = []
    for i in range(layers):
        for ours, theirs in ((cross_k(i), f"present_key_cross_{i}"), (cross_v(i), f"present_value_cross_{i}")):
            rename(g, ours, theirs)
            value = outputs[ours]
            new_outputs.append(
                helper.make_tensor_value_info(
                    theirs, value.type.tensor_type.elem_type, ["B", *shape(value)[1:2], "S", *shape(value)[3:]]
                )
            )
    del g.input[:]
    # The mask is required by the op's convention; our encoder derives it from the ids.
    g.input.extend(
        [
            helper.make_tensor_value_info("encoder_input_ids", TensorProto.INT32, ["B", "S"]),
            helper.make_tensor_value_info("encoder_attention_mask", TensorProto.INT32, ["B", "S"]),
        ]
    )
    del g.output[:]
    g.output.extend(new_outputs)
    del g.value_info[:]
    return g


def decoder_subgraph(
    decoder: onnx.ModelProto, layers: int, first_cache_heads: int, beams: bool = True
) -> onnx.GraphProto:
    """The op's decoder. `beams` false: for an op that only ever runs one row (generate.onnx's
    one-sentence branch), whose cross-attentions need no grouping: each group Slice would copy the
    keys whole every step (2.5% of a greedy sentence on the default run's int8_static, the same bits)."""
    expect(
        decoder.graph,
        "the search op's decoder",
        [TOKENS, SRC_MASK, CACHE_INDEX, *(f(i) for i in range(layers) for f in (past_k, past_v, cross_k, cross_v))],
        [LOG_PROBS],
    )
    g = copy.deepcopy(decoder.graph)
    g.name = "decoder"
    inputs = {i.name: i for i in g.input}
    producer = {o: n for n in g.node for o in n.output}
    float_type = inputs[past_k(0)].type.tensor_type.elem_type
    head_dim = shape(inputs[past_k(0)])[3]

    drop_cache_reorder(g)  # the op reorders the cache rows itself
    # Attention masks straight from the op's int32 mask instead of bool -> unsqueezes -> int32.
    for node in g.node:
        if (
            node.op_type != "MultiHeadAttention"
            or len(node.input) <= KEY_PADDING_SLOT
            or not node.input[KEY_PADDING_SLOT]
        ):
            continue
        name = node.input[KEY_PADDING_SLOT]
        while name in producer and producer[name].op_type in _MASK_PLUMBING:
            name = producer[name].input[0]
        if name == SRC_MASK:
            node.input[KEY_PADDING_SLOT] = "encoder_attention_mask"
    if beams:
        group_cross_attention(g, beams=NUM_BEAMS)
    # The op takes logits and applies its own log-softmax: ours would be done twice.
    logits = LOG_PROBS
    if logits in producer and producer[logits].op_type == "LogSoftmax":
        logits = producer[logits].input[0]
    # The op wants logits [B, 1, vocab]; our graph takes the last position ([B, 1, d] -> [B, d])
    # before the output projection. With one position that Gather selects everything: drop it
    # and the projection's output has the op's shape already.
    last = _last_position_gather(g, logits, producer)
    if last is not None:
        g.node.remove(last)
        rename(g, last.output[0], last.input[0])
        rename(g, logits, "logits")
    else:
        g.node.append(helper.make_node("Unsqueeze", [logits, "generate/axis_1"], ["logits"], name="generate/logits"))
        g.initializer.append(numpy_helper.from_array(np.array([1], dtype=np.int64), "generate/axis_1"))
    # Token ids: the lookups take int32 indices as they are; anything else gets an int64 copy.
    if all(
        n.op_type in ("Gather", "GatherBlockQuantized") and list(n.input).index(TOKENS) == 1
        for n in g.node
        if TOKENS in n.input
    ):
        rename(g, TOKENS, INPUT_IDS)
    else:
        g.node.insert(0, helper.make_node("Cast", [INPUT_IDS], [TOKENS], to=TensorProto.INT64, name="generate/tokens"))
    g.node.insert(
        0,
        helper.make_node("Cast", ["encoder_attention_mask"], [SRC_MASK], to=TensorProto.BOOL, name="generate/src_mask"),
    )

    new_inputs = [
        helper.make_tensor_value_info(INPUT_IDS, TensorProto.INT32, ["B", 1]),
        helper.make_tensor_value_info("encoder_attention_mask", TensorProto.INT32, ["B", "S"]),
    ]
    new_outputs = [helper.make_tensor_value_info("logits", float_type, ["B", 1, shape(g.output[0])[1]])]
    for i in range(layers):
        heads = shape(inputs[past_k(i)])[1]
        for ours, theirs in ((past_k(i), f"past_key_self_{i}"), (past_v(i), f"past_value_self_{i}")):
            if heads != first_cache_heads:
                # The op makes the first, empty, self-attention cache with the head count of the
                # encoder's first output; a pruned layer with other heads reshapes it to its own.
                cache_shape = f"generate/cache_shape_{i}"
                g.node.insert(0, helper.make_node("Reshape", [theirs, cache_shape], [ours], name=f"generate/{theirs}"))
                if not any(t.name == cache_shape for t in g.initializer):
                    g.initializer.append(
                        numpy_helper.from_array(np.array([0, heads, -1, head_dim], np.int64), cache_shape)
                    )
                new_inputs.append(helper.make_tensor_value_info(theirs, float_type, ["B", f"heads_{i}", "P", head_dim]))
            else:
                rename(g, ours, theirs)
                new_inputs.append(helper.make_tensor_value_info(theirs, float_type, ["B", heads, "P", head_dim]))
        for ours, theirs in ((present_k(i), f"present_key_self_{i}"), (present_v(i), f"present_value_self_{i}")):
            rename(g, ours, theirs)
            new_outputs.append(helper.make_tensor_value_info(theirs, float_type, ["B", heads, "P1", head_dim]))
    for i in range(layers):
        for ours, theirs in ((cross_k(i), f"past_key_cross_{i}"), (cross_v(i), f"past_value_cross_{i}")):
            rename(g, ours, theirs)
            new_inputs.append(
                helper.make_tensor_value_info(theirs, float_type, ["B", *shape(inputs[ours])[1:2], "S", head_dim])
            )
    # In the op's order: ids, mask, the self-attention caches (k, v per layer), then the cross ones.
    del g.input[:]
    g.input.extend(new_inputs)
    del g.output[:]
    g.output.extend(new_outputs)
    del g.value_info[:]
    prune_dead_nodes(g)
    return g


def search_model(
    enc: onnx.GraphProto,
    dec: onnx.GraphProto,
    encoder: onnx.ModelProto,
    decoder: onnx.ModelProto,
    generation: dict,
    greedy_one=None,
    vocabulary: np.ndarray | None = None,
) -> onnx.ModelProto:
    """The BeamSearch op over `enc` and `dec`. `greedy_one`: (a decoder restricted to a per-call
    word list, and sentence_word_list's nodes before and after the op and its initializers):
    calls of one row (one sentence, num_beams 1) then go to an op over that decoder instead, by
    an If (the list's scores are normalized over the list only: fine for greedy search, not for
    beams, whose scores are compared across rows), unless the optional input `shortlisted` (bool
    [1], default true) is false. `vocabulary`: the word ids of `dec`'s tokens, by place
    (search_vocabulary): the op's sequences are mapped back to word ids."""
    make = helper.make_node
    constants = [
        numpy_helper.from_array(np.array([1], np.int32), "min_length"),
        numpy_helper.from_array(np.array([1], np.int32), "num_return_sequences"),
        numpy_helper.from_array(np.array([1.0], np.float32), "repetition_penalty"),
    ]
    # The op's own mask, when none is given, masks left padding only (Hugging Face's T5
    # convention); ours is right padding, so the mask is made here: input_ids != PAD.
    pad = numpy_helper.from_array(np.array(generation["pad_id"], np.int32), "pad_id")
    nodes = [
        make("Equal", [INPUT_IDS, "pad_id"], ["is_pad"], name="mask/equal"),
        make("Not", ["is_pad"], ["is_token"], name="mask/not"),
        make("Cast", ["is_token"], ["attention_mask"], to=TensorProto.INT32, name="mask/cast"),
    ]

    def search(name: str, output: str, decoder_graph: onnx.GraphProto, special: dict) -> onnx.NodeProto:
        return make(
            "BeamSearch",
            [
                INPUT_IDS,
                MAX_LENGTH,
                "min_length",
                NUM_BEAMS,
                "num_return_sequences",
                LENGTH_PENALTY,
                "repetition_penalty",
                "",
                "",
                "attention_mask",
            ],
            [output],
            domain="com.microsoft",
            name=name,
            model_type=1,
            early_stopping=1,
            eos_token_id=special["eos"],
            pad_token_id=special["pad"],
            decoder_start_token_id=special["bos"],
            encoder=copy.deepcopy(enc),
            decoder=decoder_graph,
        )

    ids = {key: generation[f"{key}_id"] for key in ("pad", "bos", "eos")}
    if vocabulary is not None:
        ids = {key: int(np.searchsorted(vocabulary, i)) for key, i in ids.items()}
        constants.append(numpy_helper.from_array(vocabulary.astype(np.int32), VOCABULARY_WORDS))
    if greedy_one is not None and vocabulary is not None:
        raise ValueError("an output vocabulary serves the graph without a one-row word list only")
    if greedy_one is None and vocabulary is not None:
        nodes += [
            search("search", "vocabulary/sequences", dec, ids),
            make(
                "Gather", [VOCABULARY_WORDS, "vocabulary/sequences"], [SEQUENCES], axis=0, name="vocabulary/sequences"
            ),
        ]
    elif greedy_one is None:
        nodes.append(search("search", SEQUENCES, dec, ids))
    else:
        one_dec, before, after, extra = greedy_one
        constants += extra

        def branch(name: str, body: list[onnx.NodeProto]) -> onnx.GraphProto:
            return helper.make_graph(
                body,
                name,
                [],
                [helper.make_tensor_value_info(body[-1].output[0], TensorProto.INT32, ["batch", 1, "length"])],
            )

        # The list's ids put PAD, BOS, EOS first (sentence_word_list).
        listed = search("search/one_row", LISTED_SEQUENCES, one_dec, {"pad": 0, "bos": 1, "eos": 2})
        constants += [
            numpy_helper.from_array(np.array([1], np.int64), "one_row/one"),
            numpy_helper.from_array(np.array([True]), SHORTLISTED),
        ]  # an input's default
        nodes += [
            make("Shape", [INPUT_IDS], ["one_row/shape"], end=1, name="one_row/shape"),
            make("Cast", [NUM_BEAMS], ["one_row/beams"], to=TensorProto.INT64, name="one_row/beams"),
            make("Mul", ["one_row/shape", "one_row/beams"], ["one_row/rows"], name="one_row/rows"),
            make("Equal", ["one_row/rows", "one_row/one"], ["one_row/is_one"], name="one_row/is_one"),
            make("And", ["one_row/is_one", SHORTLISTED], ["one_row/listed"], name="one_row/listed"),
            make(
                "If",
                ["one_row/listed"],
                [SEQUENCES],
                name="one_row",
                then_branch=branch("one_row", [*before, listed, *after]),
                else_branch=branch("rows", [search("search", "rows/sequences", dec, ids)]),
            ),
        ]
    inputs = [
        helper.make_tensor_value_info(INPUT_IDS, TensorProto.INT32, ["batch", "src_len"]),
        helper.make_tensor_value_info(MAX_LENGTH, TensorProto.INT32, [1]),
        helper.make_tensor_value_info(NUM_BEAMS, TensorProto.INT32, [1]),
        helper.make_tensor_value_info(LENGTH_PENALTY, TensorProto.FLOAT, [1]),
    ]
    if greedy_one is not None:  # optional (its initializer is the default): false, the whole vocabulary
        inputs.append(helper.make_tensor_value_info(SHORTLISTED, TensorProto.BOOL, [1]))
    graph = helper.make_graph(
        nodes,
        "generate",
        inputs,
        [helper.make_tensor_value_info(SEQUENCES, TensorProto.INT32, ["batch", 1, "length"])],
        initializer=[*constants, pad],
    )
    opsets = {
        o.domain: o.version
        for o in [*encoder.opset_import, *decoder.opset_import]
        if o.domain in ("", "ai.onnx", "com.microsoft")
    }
    opsets.setdefault("com.microsoft", 1)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
        ir_version=decoder.ir_version,
        producer_name="mt-pipeline",
    )
    return model
