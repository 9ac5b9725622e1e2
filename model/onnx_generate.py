"""generate.onnx: the whole search (greedy or beam) as one onnxruntime call.

Our step graphs (encoder.onnx, decoder.onnx) are wrapped as the two subgraphs of onnxruntime's
contrib op com.microsoft.BeamSearch, in its encoder-decoder ("T5", model_type 1) convention:

    encoder subgraph  encoder_input_ids, encoder_attention_mask int32 [B, S]
                      -> present_key_cross_i, present_value_cross_i
    decoder subgraph  input_ids int32 [B, 1], encoder_attention_mask,
                      past_key_self_i, past_value_self_i, past_key_cross_i, past_value_cross_i
                      -> logits [B, 1, vocab], present_key_self_i, present_value_self_i

Why: with a Python loop, every generated token costs a session.run (binding its inputs and
outputs) plus NumPy bookkeeping; for beam search that bookkeeping costs as much as the model.
Inside the op, the loop, the top-k and the cache reordering are C++. (Its GreedySearch sibling
only takes decoder-only models, so greedy is BeamSearch with num_beams = 1.)

generate.onnx holds no copy of the weights: every initializer of at least EXTERNAL_MIN_BYTES is
stored as "external data" pointing at the bytes of the same tensor inside encoder.onnx or
decoder.onnx (a protobuf keeps a raw tensor's bytes verbatim), so a package grows by the graph
structure only (tens of KB), not by a second copy of the model.

Semantics, as onnxruntime implements them (HF-style beam search, early stopping): hypothesis
score = sum log p / (tokens incl. EOS) ** length_penalty, as in model/search.py; one length
limit per call (the longest sentence's in a batch, where model/search.py has one per sentence);
an EOS candidate counts only among the best `beam` candidates of a step. Greedy outputs are
token-for-token those of model/search.py; beam outputs almost always are (the export stage
records the agreement).

int8 packages with a shortlist also get generate_batch.onnx, the op over the package's output
vocabulary for beam search; generate.onnx then runs a greedy call of one sentence over its word
list. Every graph here runs decoder.onnx's own nodes (int8 products per row: model/onnx_quantize.py),
so one sentence's numbers are the same in the op and in the step graphs for many rows.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .onnx_graph import refer_to_bytes_in, replace_node
from .shortlist import SHORTLIST_FILE, Shortlist, sentence_width

EXTERNAL_MIN_BYTES = 128  # below this a tensor's bytes cost less than a reference to them
# Ops that only reshape or retype the source mask on its way to an attention's key_padding_mask.
_MASK_PLUMBING = {"Cast", "Unsqueeze", "Flatten", "Reshape", "Squeeze"}
KEY_PADDING_SLOT = 4


def _rename(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        for field in (node.input, node.output):
            for i, name in enumerate(field):
                if name == old:
                    field[i] = new


def _shape(value: onnx.ValueInfoProto) -> list:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value.type.tensor_type.shape.dim]


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """A node's graph attributes: an If's branches."""
    return [g for attr in node.attribute for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs)]


def graph_nodes(graph: onnx.GraphProto):
    """A graph's nodes and those of its subgraphs (If branches, the BeamSearch op's graphs)."""
    for node in graph.node:
        yield node
        for sub in _subgraphs(node):
            yield from graph_nodes(sub)


def _subgraph_inputs(node: onnx.NodeProto) -> set[str]:
    """The names a node's subgraphs read, outer-scope values among them."""
    names: set[str] = set()
    for graph in _subgraphs(node):
        for inner in graph.node:
            names.update(inner.input)
            names |= _subgraph_inputs(inner)
    return names


def _prune_dead_nodes(graph: onnx.GraphProto) -> None:
    needed = {o.name for o in graph.output}
    keep = []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(node.input)
            needed |= _subgraph_inputs(node)
    del graph.node[:]
    graph.node.extend(reversed(keep))
    inits = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(inits)


def _outer_names(graph: onnx.GraphProto) -> set[str]:
    """The names `graph`'s nodes (and their branches) read that it neither takes nor makes: values
    of the graph around it."""
    made = {v.name for v in graph.input} | {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output}
    read = set().union(*(set(n.input) | _subgraph_inputs(n) for n in graph.node)) if graph.node else set()
    return read - made - {""}


def _short_names(graph: onnx.GraphProto) -> None:
    """Internal value and node names -> short ones (the op's contract fixes only the graph's
    inputs and outputs, and values it reads from the graph around it): the generate files are
    all structure, and names were half of it."""
    keep = {v.name for v in (*graph.input, *graph.output)} | {""} | _outer_names(graph)
    mapping: dict[str, str] = {}

    def short(name: str) -> str:
        if name in keep:
            return name
        if name not in mapping:
            mapping[name] = np.base_repr(len(mapping), 36).lower()
        return mapping[name]

    def rename(g: onnx.GraphProto) -> None:
        for node in g.node:
            node.name = ""
            node.doc_string = ""
            for field in (node.input, node.output):
                for i, name in enumerate(field):
                    field[i] = short(name)
            for sub in _subgraphs(node):  # a branch reads outer values by name: rename it alike
                rename(sub)
                for value in sub.output:
                    value.name = short(value.name)

    for tensor in graph.initializer:
        tensor.name = short(tensor.name)
    rename(graph)


def _external(graph: onnx.GraphProto, source: str, blob: bytes) -> int:
    """Point the graph's larger initializers at the same bytes inside the file `source` (whose
    content is `blob`); returns how many. Tensors already stored elsewhere keep their reference."""
    return sum(refer_to_bytes_in(tensor, source, blob) for tensor in graph.initializer
               if len(tensor.raw_data) >= EXTERNAL_MIN_BYTES)


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
        if node.op_type == "Gather" and axis == 1 and constants.get(node.input[1]) is not None \
                and int(constants[node.input[1]]) == -1:
            return node
        todo.append(node.input[0])  # the data path: activations are every op's first input here
    return None


def _drop_cache_reorder(g: onnx.GraphProto) -> None:
    """Remove the Gathers by cache_index: each row's past_* is then its own row's."""
    for node in [n for n in g.node if n.op_type == "Gather" and len(n.input) > 1 and n.input[1] == "cache_index"]:
        g.node.remove(node)
        _rename(g, node.output[0], node.input[0])


def _encoder_subgraph(encoder: onnx.ModelProto, layers: int) -> onnx.GraphProto:
    g = copy.deepcopy(encoder.graph)
    g.name = "encoder"
    outputs = {o.name: o for o in g.output}
    g.node.insert(0, helper.make_node("Cast", ["encoder_input_ids"], ["src_ids"], to=TensorProto.INT64,
                                      name="generate/src_ids"))
    new_outputs = []
    for i in range(layers):
        for ours, theirs in ((f"cross_k_{i}", f"present_key_cross_{i}"), (f"cross_v_{i}", f"present_value_cross_{i}")):
            _rename(g, ours, theirs)
            value = outputs[ours]
            new_outputs.append(helper.make_tensor_value_info(theirs, value.type.tensor_type.elem_type,
                                                             ["B", *_shape(value)[1:2], "S", *_shape(value)[3:]]))
    del g.input[:]
    # The mask is required by the op's convention; our encoder derives it from the ids.
    g.input.extend([helper.make_tensor_value_info("encoder_input_ids", TensorProto.INT32, ["B", "S"]),
                    helper.make_tensor_value_info("encoder_attention_mask", TensorProto.INT32, ["B", "S"])])
    del g.output[:]
    g.output.extend(new_outputs)
    del g.value_info[:]
    return g


def _decoder_subgraph(decoder: onnx.ModelProto, layers: int, first_cache_heads: int) -> onnx.GraphProto:
    g = copy.deepcopy(decoder.graph)
    g.name = "decoder"
    inputs = {i.name: i for i in g.input}
    producer = {o: n for n in g.node for o in n.output}
    float_type = inputs["past_k_0"].type.tensor_type.elem_type
    head_dim = _shape(inputs["past_k_0"])[3]

    _drop_cache_reorder(g)  # the op reorders the cache rows itself
    # Attention masks straight from the op's int32 mask instead of bool -> unsqueezes -> int32.
    for node in g.node:
        if node.op_type != "MultiHeadAttention" or len(node.input) <= KEY_PADDING_SLOT or not node.input[KEY_PADDING_SLOT]:
            continue
        name = node.input[KEY_PADDING_SLOT]
        while name in producer and producer[name].op_type in _MASK_PLUMBING:
            name = producer[name].input[0]
        if name == "src_mask":
            node.input[KEY_PADDING_SLOT] = "encoder_attention_mask"
    # The op takes logits and applies its own log-softmax: ours would be done twice.
    logits = "log_probs"
    if logits in producer and producer[logits].op_type == "LogSoftmax":
        logits = producer[logits].input[0]
    # The op wants logits [B, 1, vocab]; our graph takes the last position ([B, 1, d] -> [B, d])
    # before the output projection. With one position that Gather selects everything: drop it
    # and the projection's output has the op's shape already.
    last = _last_position_gather(g, logits, producer)
    if last is not None:
        g.node.remove(last)
        _rename(g, last.output[0], last.input[0])
        _rename(g, logits, "logits")
    else:
        g.node.append(helper.make_node("Unsqueeze", [logits, "generate/axis_1"], ["logits"], name="generate/logits"))
        g.initializer.append(numpy_helper.from_array(np.array([1], dtype=np.int64), "generate/axis_1"))
    # Token ids: the lookups take int32 indices as they are; anything else gets an int64 copy.
    if all(n.op_type in ("Gather", "GatherBlockQuantized") and list(n.input).index("tokens") == 1
           for n in g.node if "tokens" in n.input):
        _rename(g, "tokens", "input_ids")
    else:
        g.node.insert(0, helper.make_node("Cast", ["input_ids"], ["tokens"], to=TensorProto.INT64,
                                          name="generate/tokens"))
    g.node.insert(0, helper.make_node("Cast", ["encoder_attention_mask"], ["src_mask"], to=TensorProto.BOOL,
                                      name="generate/src_mask"))

    new_inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT32, ["B", 1]),
                  helper.make_tensor_value_info("encoder_attention_mask", TensorProto.INT32, ["B", "S"])]
    new_outputs = [helper.make_tensor_value_info("logits", float_type, ["B", 1, _shape(g.output[0])[1]])]
    for i in range(layers):
        heads = _shape(inputs[f"past_k_{i}"])[1]
        for ours, theirs in ((f"past_k_{i}", f"past_key_self_{i}"), (f"past_v_{i}", f"past_value_self_{i}")):
            if heads != first_cache_heads:
                # The op makes the first, empty, self-attention cache with the head count of the
                # encoder's first output; a pruned layer with other heads reshapes it to its own.
                shape = f"generate/cache_shape_{i}"
                g.node.insert(0, helper.make_node("Reshape", [theirs, shape], [ours], name=f"generate/{theirs}"))
                if not any(t.name == shape for t in g.initializer):
                    g.initializer.append(numpy_helper.from_array(np.array([0, heads, -1, head_dim], np.int64), shape))
                new_inputs.append(helper.make_tensor_value_info(theirs, float_type, ["B", f"heads_{i}", "P", head_dim]))
            else:
                _rename(g, ours, theirs)
                new_inputs.append(helper.make_tensor_value_info(theirs, float_type, ["B", heads, "P", head_dim]))
        for ours, theirs in ((f"present_k_{i}", f"present_key_self_{i}"), (f"present_v_{i}", f"present_value_self_{i}")):
            _rename(g, ours, theirs)
            new_outputs.append(helper.make_tensor_value_info(theirs, float_type, ["B", heads, "P1", head_dim]))
    for i in range(layers):
        for ours, theirs in ((f"cross_k_{i}", f"past_key_cross_{i}"), (f"cross_v_{i}", f"past_value_cross_{i}")):
            _rename(g, ours, theirs)
            new_inputs.append(helper.make_tensor_value_info(theirs, float_type, ["B", *_shape(inputs[ours])[1:2], "S",
                                                                                 head_dim]))
    # In the op's order: ids, mask, the self-attention caches (k, v per layer), then the cross ones.
    del g.input[:]
    g.input.extend(new_inputs)
    del g.output[:]
    g.output.extend(new_outputs)
    del g.value_info[:]
    _prune_dead_nodes(g)
    return g


GENERATE_INPUTS = ("input_ids", "max_length", "num_beams", "length_penalty")


GENERATE = "generate.onnx"
GENERATE_MANY_ROWS = "generate_batch.onnx"
DECODER_MANY_ROWS = "decoder_batch.onnx"
DECODER_GREEDY = "decoder_greedy.onnx"
GREEDY_OUTPUT = "logits"
TOP_K_INPUT, TOP_K_OUTPUTS = "top_k", ("top_log_probs", "top_ids")
NORMALIZE_INPUT = "normalize"
GROUP_INPUT = "group"
SHORTLIST_GRAPH = "shortlist.onnx"
SHORTLIST_FLAG, SHORTLIST_WORDS = "shortlisted", "words"
# The output projection's inputs that have one entry per word, by op and input slot, under the
# names the step graphs take them by when a batch's words are shortlisted (model/shortlist.py).
_PER_WORD_SLOTS = {"MatMulIntegerToFloat": {1: "shortlist_weight", 3: "shortlist_scale"}}


def _top_k_decoder(decoder: onnx.ModelProto, blob: bytes, shortlist: bool = False,
                   vocabulary: np.ndarray | None = None) -> onnx.ModelProto:
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
    model = _many_rows_copy(decoder, blob, shortlist)
    g = model.graph
    _group_cross_attention(g)
    [log_probs] = [o for o in g.output if o.name == "log_probs"]
    [softmax] = [n for n in g.node if "log_probs" in n.output]
    value_type = log_probs.type.tensor_type.elem_type
    g.input.append(helper.make_tensor_value_info(TOP_K_INPUT, TensorProto.INT64, [1]))
    if softmax.op_type == "LogSoftmax":
        g.node.remove(softmax)
        vocab = _shape(log_probs)[-1]
        restricted = _restricted_projection(g, softmax.input[0], vocabulary, vocab) if vocabulary is not None else None
        g.node.append(_normalize_or_not(softmax, value_type, vocab, restricted))
        g.input.append(helper.make_tensor_value_info(NORMALIZE_INPUT, TensorProto.BOOL, [1]))
    else:  # a graph whose log-probabilities are not one LogSoftmax's: always normalized
        g.node.append(helper.make_node("TopK", ["log_probs", TOP_K_INPUT], list(TOP_K_OUTPUTS), axis=-1,
                                       largest=1, sorted=1))
    index = list(g.output).index(log_probs)
    g.output.remove(log_probs)
    g.output.insert(index, helper.make_tensor_value_info(TOP_K_OUTPUTS[1], TensorProto.INT64, ["batch", None]))
    g.output.insert(index, helper.make_tensor_value_info(TOP_K_OUTPUTS[0], value_type, ["batch", None]))
    _short_names(g)
    del g.value_info[:]
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


def _group_cross_attention(g: onnx.GraphProto) -> int:
    """Input `group` (int64 [1]): the rows come in groups of that many consecutive rows of one
    sentence (its beams), and cross_k_*, cross_v_* and src_mask have one row per group. Each
    cross-attention then runs with the group's rows as its query positions: one (sentence, head)
    product of `group` rows instead of `group` products of one row. At 32 sentences x beam 4,
    one thread, a cross-attention took 347 instead of 780 us (`/tmp/s34/xgroup.py`), and the
    encoder's output is no longer repeated per beam. Returns how many attentions it grouped."""
    inputs = {i.name for i in g.input}
    crosses = [n for n in g.node if n.op_type == "MultiHeadAttention" and len(n.input) > 1
               and n.input[1] in inputs and n.input[1].startswith("cross_k_")]
    if not crosses:
        return 0
    g.initializer.extend([numpy_helper.from_array(np.array([-1], np.int64), "group/minus_one"),
                          numpy_helper.from_array(np.array([0], np.int64), "group/same"),
                          numpy_helper.from_array(np.array([-1, 1, 0], np.int64), "group/rows")])
    g.node.insert(0, helper.make_node("Concat", ["group/minus_one", GROUP_INPUT, "group/same"], ["group/queries"],
                                      axis=0, name="group/queries"))
    g.input.append(helper.make_tensor_value_info(GROUP_INPUT, TensorProto.INT64, [1]))
    for value in g.input:  # one row per sentence, not per row
        if value.name == "src_mask" or value.name.startswith(("cross_k_", "cross_v_")):
            value.type.tensor_type.shape.dim[0].dim_param = "sentences"
    for node in crosses:
        at = list(g.node).index(node)
        query, out = node.input[0], node.output[0]
        # [rows, 1, width] -> [sentences, group, width] (0: keep the width) and back
        g.node.insert(at, helper.make_node("Reshape", [query, "group/queries"], [f"{query}/grouped"],
                                           name=f"{node.name or out}/group"))
        node.input[0] = f"{query}/grouped"
        node.output[0] = f"{out}/grouped"
        g.node.insert(at + 2, helper.make_node("Reshape", [f"{out}/grouped", "group/rows"], [out],
                                               name=f"{node.name or out}/ungroup"))
    return len(crosses)


def _many_rows_copy(decoder: onnx.ModelProto, blob: bytes, shortlist: bool = False) -> onnx.ModelProto:
    """decoder.onnx with its weights read from decoder.onnx's bytes (`blob`); with `shortlist`,
    its output projection may be restricted to a batch's words (see _shortlist_projection). Its
    nodes are decoder.onnx's, so that a row's numbers are the same in every graph."""
    model = copy.deepcopy(decoder)
    if shortlist:
        _shortlist_projection(model.graph)
    _external(model.graph, "decoder.onnx", blob)
    return model


def _per_word_slots(node: onnx.NodeProto) -> dict[int, str]:
    """Input slot -> shortlist input name, for the per-word inputs `node` has."""
    return {j: name for j, name in _PER_WORD_SLOTS[node.op_type].items() if len(node.input) > j and node.input[j]}


def _value_type(g: onnx.GraphProto) -> int:
    """The decoder's float type (its cache's)."""
    return next((i.type.tensor_type.elem_type for i in g.input if i.name.startswith("past_")), TensorProto.FLOAT)


def _vocabulary_projection(g: onnx.GraphProto) -> onnx.NodeProto | None:
    """The node whose output the decoder's LogSoftmax normalises (the logits [rows, vocab]), where
    it is one whose per-word inputs (_PER_WORD_SLOTS) are computed from initializers alone."""
    producer = {o: n for n in g.node for o in n.output}
    softmax = producer.get("log_probs")
    if softmax is None or softmax.op_type != "LogSoftmax":
        return None
    node = producer.get(softmax.input[0])
    if node is None or node.op_type not in _PER_WORD_SLOTS:
        return None
    return node if _constants(g, [node.input[j] for j in _per_word_slots(node)]) else None


def _constants(g: onnx.GraphProto, names: list[str]) -> bool:
    """Whether every one of `names` is computed from g's initializers alone."""
    producer = {o: n for n in g.node for o in n.output}
    initializers = {t.name for t in g.initializer}
    known: dict[str, bool] = {}

    def constant(name: str) -> bool:
        if name in initializers or name == "":
            return True
        if name not in known:
            source = producer.get(name)  # None: a graph input; an If: something chosen per call
            known[name] = source is not None and source.op_type != "If" and all(constant(i) for i in source.input)
        return known[name]

    return all(constant(name) for name in names)


def _per_word_inputs(g: onnx.GraphProto, node: onnx.NodeProto) -> list[onnx.ValueInfoProto]:
    """The projection's per-word inputs present on `node`, as the shortlisted step graphs take
    them (and shortlist.onnx gives them): the int8 weight [d, words] and its scales [words]."""
    return [helper.make_tensor_value_info(name, TensorProto.INT8 if j == 1 else _value_type(g),
                                          [None, "words"] if j == 1 else ["words"])
            for j, name in _per_word_slots(node).items()]


def _shortlist_projection(g: onnx.GraphProto) -> bool:
    """The output projection as If(shortlisted): then the same op over the inputs
    shortlist_weight [d, words] (and its per-word scale, zero point, bias), which shortlist.onnx
    makes once per batch; else the op over the whole vocabulary as before. An If, not the
    shortlist inputs alone, because onnxruntime prepacks a constant weight (the whole vocabulary)
    and not a fed one. Returns False, changing nothing, where the projection is not one of these."""
    node = _vocabulary_projection(g)
    if node is None:
        return False
    fed = copy.deepcopy(node)
    for j, name in _per_word_slots(node).items():
        fed.input[j] = name
    value_type = _value_type(g)
    g.input.extend([helper.make_tensor_value_info(SHORTLIST_FLAG, TensorProto.BOOL, [1]), *_per_word_inputs(g, node)])
    out = node.output[0]

    def branch(name: str, op: onnx.NodeProto) -> onnx.GraphProto:
        op = copy.deepcopy(op)
        op.name, op.output[0] = f"{name}/projection", f"{name}/logits"
        return helper.make_graph([op], name, [], [helper.make_tensor_value_info(op.output[0], value_type,
                                                                                ["batch", None])])

    replace_node(g, node, [helper.make_node("If", [SHORTLIST_FLAG], [out], name="shortlist/if",
                                            then_branch=branch("shortlisted", fed),
                                            else_branch=branch("vocabulary", node))])
    return True


def _shortlist_selector(decoder: onnx.ModelProto, blob: bytes) -> onnx.ModelProto | None:
    """shortlist.onnx: input `words` (int64 [words], target ids) -> the output projection's
    per-word inputs restricted to those words, in the order of `words`, named as
    decoder_batch.onnx and decoder_greedy.onnx take them. Its weights are decoder.onnx's bytes
    through the same conversions as theirs (folded when the session loads): a [d, vocab] weight
    is transposed once at load, so that a batch's words are whole rows to gather."""
    model = _many_rows_copy(decoder, blob, shortlist=False)
    g = model.graph
    node = _vocabulary_projection(g)
    if node is None:
        return None
    make = helper.make_node
    nodes = []
    for j, name in _per_word_slots(node).items():
        source = node.input[j]
        if j == 1:
            nodes += [make("Transpose", [source], [f"{name}/by_word"], perm=[1, 0], name=f"{name}/by_word"),
                      make("Gather", [f"{name}/by_word", SHORTLIST_WORDS], [f"{name}/rows"], axis=0, name=f"{name}/rows"),
                      make("Transpose", [f"{name}/rows"], [name], perm=[1, 0], name=name)]
        else:
            nodes.append(make("Gather", [source, SHORTLIST_WORDS], [name], axis=0, name=name))
    # The decoder's nodes, of which pruning keeps those that compute the weights from initializers.
    graph = helper.make_graph([*g.node, *nodes], "shortlist",
                              [helper.make_tensor_value_info(SHORTLIST_WORDS, TensorProto.INT64, ["words"])],
                              _per_word_inputs(g, node), initializer=list(g.initializer))
    _prune_dead_nodes(graph)
    _short_names(graph)
    return helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version,
                             producer_name="mt-pipeline")


def _greedy_decoder(decoder: onnx.ModelProto, blob: bytes, shortlist: bool = False) -> onnx.ModelProto | None:
    """decoder_batch.onnx for the greedy steps where every row continues its own: no cache_index
    input and no reorder (the cache Gathers copied every past_* each step), and the logits
    [rows, vocab] out instead of log_probs (no softmax; the loop takes the argmax). At 64 rows,
    one thread, a step took 0.81-0.89 of decoder_batch.onnx's (student, teacher int8)."""
    model = _many_rows_copy(decoder, blob, shortlist)
    g = model.graph
    _drop_cache_reorder(g)
    producer = {o: n for n in g.node for o in n.output}
    softmax = producer.get("log_probs")
    if softmax is None or softmax.op_type != "LogSoftmax":
        return None  # log-probabilities that are not one LogSoftmax's: decoder_batch.onnx serves
    g.node.remove(softmax)
    [output] = [o for o in g.output if o.name == "log_probs"]
    _rename(g, softmax.input[0], GREEDY_OUTPUT)
    output.name = GREEDY_OUTPUT
    if shortlist:  # a shortlisted step has a column per word of the batch's list, not the vocabulary's
        output.type.tensor_type.shape.dim[-1].dim_param = "words"
    g.input.remove(next(i for i in g.input if i.name == "cache_index"))
    _prune_dead_nodes(g)
    _short_names(g)
    del g.value_info[:]
    return model


def _chunk_width(vocab) -> int | None:
    """The divisor of `vocab` in [32, 128] nearest 64 (None: none, or a vocabulary of unknown size)."""
    if not isinstance(vocab, int) or vocab <= 0:
        return None
    widths = [w for w in range(32, 129) if vocab % w == 0 and vocab // w >= 2]
    return min(widths, key=lambda w: abs(w - 64)) if widths else None


def _chunked_top_k(values: str, vocab, p: str) -> list[onnx.NodeProto]:
    """Nodes from `values` [rows, vocab] to {p}/values, {p}/ids: its top_k entries per row, best
    first, as onnxruntime's TopK gives them. The row is cut into chunks of ~64; the k best entries
    lie in the k chunks of highest maximum (a chunk outside those has k larger entries elsewhere),
    so TopK runs over the chunk maxima and then over those k chunks only, as model/search.py's
    top_k_indices does. [128, 8000] rows, one thread: 434 against 600 us for TopK over whole rows
    (`/tmp/w/topk_micro.py 128 8000 8 64`). Plain TopK where no chunk width divides the vocabulary;
    with ties, ids may differ, values do not."""
    width = _chunk_width(vocab)
    if width is None:
        return [helper.make_node("TopK", [values, TOP_K_INPUT], [f"{p}/values", f"{p}/ids"], axis=-1, largest=1, sorted=1)]
    chunks = vocab // width

    def const(name: str, array) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [f"{p}/{name}"], value=numpy_helper.from_array(np.asarray(array, np.int64), name))

    make = helper.make_node
    return [
        const("chunked_shape", [0, chunks, width]), const("last_axis", [-1]), const("chunks", [chunks]),
        const("width", width), const("offsets", np.arange(width)), const("flat_shape", [0, -1]),
        make("Reshape", [values, f"{p}/chunked_shape"], [f"{p}/chunked"]),
        make("ReduceMax", [f"{p}/chunked"], [f"{p}/maxima"], axes=[-1], keepdims=0),  # opset 17: axes an attribute
        make("Min", [TOP_K_INPUT, f"{p}/chunks"], [f"{p}/k_chunks"]),  # a k beyond the chunk count: every chunk
        make("TopK", [f"{p}/maxima", f"{p}/k_chunks"], [f"{p}/chunk_maxima", f"{p}/best_chunks"], axis=-1, largest=1, sorted=0),
        make("Unsqueeze", [f"{p}/best_chunks", f"{p}/last_axis"], [f"{p}/best_chunks3"]),
        make("Mul", [f"{p}/best_chunks3", f"{p}/width"], [f"{p}/starts"]),
        make("Add", [f"{p}/starts", f"{p}/offsets"], [f"{p}/columns3"]),
        make("Reshape", [f"{p}/columns3", f"{p}/flat_shape"], [f"{p}/columns"]),
        make("GatherElements", [values, f"{p}/columns"], [f"{p}/candidates"], axis=1),
        make("TopK", [f"{p}/candidates", TOP_K_INPUT], [f"{p}/values", f"{p}/picked"], axis=-1, largest=1, sorted=1),
        make("GatherElements", [f"{p}/columns", f"{p}/picked"], [f"{p}/ids"], axis=1)]


def _normalize_or_not(softmax: onnx.NodeProto, value_type: int, vocab=None, restricted=None) -> onnx.NodeProto:
    """If(normalize): the top k of the decoder's LogSoftmax; else the logits themselves, [rows,
    vocab], and no ids ([rows, 0]): the caller takes the best. onnxruntime's TopK(1) over a row of
    8000 took ten times NumPy's argmax ([32, 8000]: 443 vs 41 us, one thread). `restricted`
    (from _restricted_projection): the LogSoftmax and top k run over the output vocabulary's
    projection instead, and the logits' producer moves into the else branch (a node outside the
    If runs whichever branch is taken)."""
    def graph(name: str, nodes: list[onnx.NodeProto]) -> onnx.GraphProto:
        return helper.make_graph(nodes, name, [], [
            helper.make_tensor_value_info(f"{name}/values", value_type, ["batch", None]),
            helper.make_tensor_value_info(f"{name}/ids", TensorProto.INT64, ["batch", None])])

    softmax = copy.deepcopy(softmax)
    softmax.output[0] = "log_probabilities/all"
    logits = softmax.input[0]
    normalized, unnormalized = [softmax], []
    if restricted is None:
        normalized += _chunked_top_k(softmax.output[0], vocab, "log_probabilities")
    else:
        producer, projection, words = restricted
        softmax.input[0] = projection[0].output[0]
        listed = "log_probabilities/listed"  # top k over the vocabulary: places in it, mapped to word ids
        normalized = [*projection, softmax, *_chunked_top_k(softmax.output[0], len(words), listed),
                      helper.make_node("Gather", [VOCABULARY_WORDS, f"{listed}/ids"], ["log_probabilities/ids"], axis=0),
                      helper.make_node("Identity", [f"{listed}/values"], ["log_probabilities/values"])]
        unnormalized = [producer]
    no_ids = [helper.make_node("Shape", [logits], ["logits/shape"], end=1),
              helper.make_node("Constant", [], ["logits/zero"], value=helper.make_tensor("zero", TensorProto.INT64, [1], [0])),
              helper.make_node("Concat", ["logits/shape", "logits/zero"], ["logits/ids_shape"], axis=0),
              helper.make_node("ConstantOfShape", ["logits/ids_shape"], ["logits/ids"],
                               value=helper.make_tensor("id", TensorProto.INT64, [1], [0])),
              helper.make_node("Identity", [logits], ["logits/values"])]
    return helper.make_node("If", [NORMALIZE_INPUT], list(TOP_K_OUTPUTS),
                            then_branch=graph("log_probabilities", normalized),
                            else_branch=graph("logits", [*unnormalized, *no_ids]))


VOCABULARY_WORDS = "vocabulary/words"  # the output vocabulary's word ids, by place


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


def _restricted_projection(g: onnx.GraphProto, logits: str, words: np.ndarray, vocab: int):
    """For _normalize_or_not: (the node making `logits`, nodes projecting onto `words` only, words)
    where the vocabulary projection (_vocabulary_projection; under the shortlist's If, its else
    branch) is int8 with constant weights, else None. Its per-word inputs are Gathers of
    constants in the main graph, which onnxruntime folds into initializers when it loads, so the
    file holds the word list only and the weight is prepacked like any other."""
    producer = {o: n for n in g.node for o in n.output}
    node = producer.get(logits)
    if node is None:
        return None
    projection = node
    if node.op_type == "If":  # _shortlist_projection's: the whole vocabulary is its else branch
        [projection] = [b.g.node[0] for b in node.attribute if b.name == "else_branch"] or [None]
    if projection is None or not _int8_of_constants(g, projection):
        return None
    g.initializer.append(numpy_helper.from_array(words.astype(np.int64), VOCABULARY_WORDS))  # as the ids out
    restricted = copy.deepcopy(projection)
    restricted.output[0] = "vocabulary/logits"
    _onto_words(g, restricted, before=node)
    g.node.remove(node)
    return node, [restricted], words


def _int8_of_constants(g: onnx.GraphProto, projection: onnx.NodeProto) -> bool:
    """Whether `projection` is an int8 product (quantize_rows') whose per-word inputs are constants of g."""
    return projection.op_type in _PER_WORD_SLOTS and _constants(
        g, [projection.input[j] for j in _per_word_slots(projection)])


def _onto_words(g: onnx.GraphProto, projection: onnx.NodeProto, before: onnx.NodeProto,
                words: str = VOCABULARY_WORDS) -> None:
    """Point `projection`'s per-word inputs at Gathers of them by the ids `words`, inserted into g
    before `before` (constants: folded at load)."""
    at = list(g.node).index(before)
    for j in _per_word_slots(projection):
        name = f"{words}/input{j}"
        g.node.insert(at, helper.make_node("Gather", [projection.input[j], words], [name],
                                           axis=1 if j == 1 else 0))  # the weight is [d, words]
        projection.input[j] = name


LISTED_SEQUENCES = "shortlist/sequences"  # the op's output over the list: places in it, not ids


def _shortlisted_search(dec: onnx.GraphProto, shortlist: Shortlist, generation: dict):
    """Restrict the op's vocabulary to a per-call word list (model/shortlist.py): the main graph
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
    producer = {o: n for n in dec.node for o in n.output}
    proj = producer.get("logits")
    specials = _specials(generation)
    vocab = shortlist.vocab_size
    if proj is None or len(set(specials)) < 3 or _shape(dec.output[0])[-1] != vocab or not _int8_of_constants(dec, proj):
        return None
    weight_slot, scale_slot = sorted(_per_word_slots(proj))
    width = sentence_width(shortlist)
    # Each source word's candidates as a row of `per_word`, padded with PAD (listed anyway).
    counts = np.diff(shortlist.offsets)
    per_word = max(int(counts.max(initial=0)), 1)
    table = np.full((vocab, per_word), specials[0], np.int16 if vocab < 2 ** 15 else np.int32)
    for s in np.nonzero(counts)[0]:
        table[s, : counts[s]] = shortlist.words[shortlist.offsets[s]: shortlist.offsets[s + 1]]
    # A word's class: base + 1 if a candidate of the sources. The frequent words 2 or 3 (first),
    # candidates 1, the others 0 (filling); the special ids far below: they are put first apart.
    base = np.zeros(vocab, np.float32)
    base[shortlist.always] = 2.0
    base[specials] = -10.0
    p, make = "shortlist", helper.make_node
    classes = ((1.5, 9.0), (0.5, 1.5), (-0.5, 0.5))  # rank bounds: frequent, candidate, other
    const = {"table": table, "base": base, "nowhere": np.zeros(vocab, np.float32),
             **{f"{side}{cls}": np.array(bound, np.float32) for cls, bounds in enumerate(classes)
                for side, bound in zip(("low", "high"), bounds)},
             "specials": np.array(specials, np.int64), "others": np.array([width - 3], np.int64),
             "flat": np.array([-1], np.int64), "one": np.array(1.0, np.float32), "start": np.array([0], np.int64),
             "places": np.arange(width, dtype=np.int64), "listed_base": np.array(3, np.int64),
             "zero": np.array(0.0, np.float32), "never": np.array(-np.inf, np.float32)}
    # The projection's weight and scales as the main graph makes them: the decoder's nodes of
    # constants that compute them (folded at load), renamed, over copies of their initializers
    # (the same bytes, by reference).
    columns, made = _constant_nodes(dec, [proj.input[weight_slot], proj.input[scale_slot]], f"{p}/all")
    weight, scales = made
    inits = [*columns.initializer, *(numpy_helper.from_array(v, f"{p}/{k}") for k, v in const.items())]
    before = [
        make("Gather", [f"{p}/table", "input_ids"], [f"{p}/candidates"], axis=0, name=f"{p}/candidates"),
        make("Reshape", [f"{p}/candidates", f"{p}/flat"], [f"{p}/flat_candidates"], name=f"{p}/flat_candidates"),
        make("Cast", [f"{p}/flat_candidates"], [f"{p}/ids"], to=TensorProto.INT64, name=f"{p}/ids"),
        make("Shape", [f"{p}/ids"], [f"{p}/ids_shape"], name=f"{p}/ids_shape"),
        make("Expand", [f"{p}/one", f"{p}/ids_shape"], [f"{p}/ones"], name=f"{p}/ones"),
        # Every index writes the same 1: repeated words leave no order to depend on.
        make("ScatterElements", [f"{p}/nowhere", f"{p}/ids", f"{p}/ones"], [f"{p}/is_candidate"], axis=0,
             name=f"{p}/is_candidate"),
        make("Add", [f"{p}/is_candidate", f"{p}/base"], [f"{p}/rank"], name=f"{p}/rank"),
    ]
    # The ids class by class (frequent, candidate, other), each in id order: a stable partition
    # with NonZero, at a third of the cost of TopK over the vocabulary; where a long sentence's
    # candidates do not all fit, the lower ids (the more frequent subwords) stay.
    for cls in range(len(classes)):
        before += [make("Greater", [f"{p}/rank", f"{p}/low{cls}"], [f"{p}/above{cls}"]),
                   make("Less", [f"{p}/rank", f"{p}/high{cls}"], [f"{p}/below{cls}"]),
                   make("And", [f"{p}/above{cls}", f"{p}/below{cls}"], [f"{p}/in{cls}"]),
                   make("NonZero", [f"{p}/in{cls}"], [f"{p}/class{cls}"])]
    before += [
        make("Concat", [f"{p}/class{cls}" for cls in range(len(classes))], [f"{p}/ranked_ids"], axis=1,
             name=f"{p}/ranked_ids"),
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
        make("Gather", [scales, f"{p}/words"], [f"{p}/scales"], axis=0, name=f"{p}/scales")]
    after = [make("Gather", [f"{p}/words32", LISTED_SEQUENCES], [f"{p}/translation"], axis=0, name=f"{p}/translation")]
    # The decoder: the op's tokens are positions in the list.
    for node in dec.node:
        for i, name in enumerate(node.input):
            if name == "input_ids":
                node.input[i] = f"{p}/token_words"
    dec.node.insert(0, make("Gather", [f"{p}/words32", "input_ids"], [f"{p}/token_words"], axis=0,
                            name=f"{p}/token_words"))
    listed = copy.deepcopy(proj)
    listed.input[weight_slot], listed.input[scale_slot] = f"{p}/weight", f"{p}/scales"
    listed.output[0], listed.name = f"{p}/listed_logits", f"{p}/listed_logits"
    replace_node(dec, proj, [listed, make("Add", [listed.output[0], f"{p}/mask"], ["logits"], name=f"{p}/logits")])
    dec.output[0].type.tensor_type.shape.dim[-1].dim_value = width
    _prune_dead_nodes(dec)  # the whole vocabulary's weight is not made here
    return before, after, inits


def _constant_nodes(g: onnx.GraphProto, values: list[str], prefix: str) -> tuple[onnx.GraphProto, list[str]]:
    """The nodes of g that compute `values` from its initializers, and those initializers, renamed
    under `prefix` (a graph holding both), with the new names of `values`."""
    producer = {o: n for n in g.node for o in n.output}
    initializers = {t.name: t for t in g.initializer}
    nodes, inits, seen = [], [], set()

    def visit(name: str) -> None:
        if name in seen or name == "":
            return
        seen.add(name)
        if name in initializers:
            inits.append(copy.deepcopy(initializers[name]))
            return
        node = producer[name]
        for i in node.input:
            visit(i)
        nodes.append(copy.deepcopy(node))

    for value in values:
        visit(value)
    part = helper.make_graph(nodes, "constants", [], [], initializer=inits)
    names = {name: f"{prefix}/{name}" for name in seen if name}
    for tensor in part.initializer:
        tensor.name = names[tensor.name]
    for node in part.node:
        node.name = ""
        for field in (node.input, node.output):
            for i, name in enumerate(field):
                field[i] = names.get(name, name)
    return part, [names[v] for v in values]


def write_generate_graph(folder: Path, generation: dict) -> list[Path]:
    """Write folder/generate.onnx next to folder/encoder.onnx and folder/decoder.onnx, and, for an
    int8 package with a shortlist (model/shortlist.py), folder/generate_batch.onnx: the op over
    the package's output vocabulary (output_vocabulary), which serves beam search, while
    generate.onnx runs a greedy call of one sentence over that sentence's word list
    (_shortlisted_search) and any other call over the whole vocabulary. Both graphs run
    decoder.onnx's own nodes: a sentence's numbers are those of the step graphs for many rows.
    Nothing (an empty list) for float16 graphs: the op's CPU kernel is float32 only, and on GPUs
    the runtime drives the step graphs.

    Inputs: input_ids int32 [batch, src_len] (ids + EOS, right-padded with PAD), max_length int32
    [1] (tokens incl. the start token), num_beams int32 [1], length_penalty float [1].
    Output: sequences int32 [batch, 1, len]: the start token, the translation, then EOS/PAD."""
    blobs = {name: (folder / name).read_bytes() for name in ("encoder.onnx", "decoder.onnx")}
    encoder, decoder = (onnx.load_from_string(blobs[name]) for name in ("encoder.onnx", "decoder.onnx"))
    cache_type = next(i for i in decoder.graph.input if i.name == "past_k_0").type.tensor_type.elem_type
    if cache_type != TensorProto.FLOAT:
        return []
    layers = len(encoder.graph.output) // 2
    first_cache_heads = _shape(encoder.graph.output[0])[1]
    enc = _encoder_subgraph(encoder, layers)
    dec = _decoder_subgraph(decoder, layers, first_cache_heads)
    _external(enc, "encoder.onnx", blobs["encoder.onnx"])
    _external(dec, "decoder.onnx", blobs["decoder.onnx"])
    many_rows = one_row = listed = words = None
    vocab = _shape(dec.output[0])[-1]
    if isinstance(vocab, int) and (folder / SHORTLIST_FILE).is_file():
        shortlist = Shortlist.load(folder / SHORTLIST_FILE, vocab)
        one_row = copy.deepcopy(dec)  # greedy: each sentence's list, whether or not beams have a vocabulary
        listed = _shortlisted_search(one_row, shortlist, generation)
        many_rows = copy.deepcopy(dec)
        words = _search_vocabulary(many_rows, output_vocabulary(shortlist, _specials(generation)))
        if words is None:  # not an int8 projection of constants, or a list without the special ids
            many_rows = None
    for graph in (enc, dec, many_rows, one_row):
        if graph is not None:
            _short_names(graph)
    greedy_one = (one_row, *listed) if listed else None
    paths = [_write_search_model(folder / GENERATE, enc, dec, encoder, decoder, generation, greedy_one)]
    if many_rows is not None:
        paths.append(_write_search_model(folder / GENERATE_MANY_ROWS, enc, many_rows, encoder, decoder, generation,
                                         vocabulary=words))
    return paths


def _specials(generation: dict) -> list[int]:
    return [generation["pad_id"], generation["bos_id"], generation["eos_id"]]


def _search_vocabulary(dec: onnx.GraphProto, words: np.ndarray | None) -> np.ndarray | None:
    """The op's decoder `dec` over the output vocabulary `words` (output_vocabulary): its tokens
    are places in it (mapped to word ids before the embedding) and its logits are the words'
    only, through Gathers of the projection's constant inputs that onnxruntime folds at load.
    Returns `words`, or None (nothing changed) where the projection is not an int8
    DynamicQuantizeMatMul of constants."""
    producer = {o: n for n in dec.node for o in n.output}
    proj = producer.get("logits")
    if words is None or proj is None or not _int8_of_constants(dec, proj):
        return None
    make = helper.make_node
    dec.initializer.append(numpy_helper.from_array(words.astype(np.int32), VOCABULARY_WORDS))
    _onto_words(dec, proj, before=proj)
    for node in dec.node:
        for i, name in enumerate(node.input):
            if name == "input_ids":
                node.input[i] = "vocabulary/token_words"
    dec.node.insert(0, make("Gather", [VOCABULARY_WORDS, "input_ids"], ["vocabulary/token_words"], axis=0))
    dec.output[0].type.tensor_type.shape.dim[-1].dim_value = len(words)
    return words


def write_many_rows_decoder(folder: Path, shortlist: bool = False, generation: dict | None = None) -> Path | None:
    """Write folder/decoder_batch.onnx (see _top_k_decoder) and folder/decoder_greedy.onnx (see
    _greedy_decoder) beside folder/decoder.onnx; returns the first. With `shortlist`, both take a
    batch's shortlisted output projection where theirs allows, and folder/shortlist.onnx makes it
    (see _shortlist_projection); given `generation` too (its special ids), decoder_batch.onnx's
    normalized steps run over the shortlist's output vocabulary (output_vocabulary). None, and
    nothing written, for float16 graphs (GPUs, where the runtime drives decoder.onnx itself)."""
    blob = (folder / "decoder.onnx").read_bytes()
    decoder = onnx.load_from_string(blob)
    cache_type = next(i for i in decoder.graph.input if i.name == "past_k_0").type.tensor_type.elem_type
    if cache_type != TensorProto.FLOAT:
        return None
    vocabulary = None
    vocab = _shape(next(o for o in decoder.graph.output if o.name == "log_probs"))[-1]
    if shortlist and generation is not None and isinstance(vocab, int) and (folder / SHORTLIST_FILE).is_file():
        vocabulary = output_vocabulary(Shortlist.load(folder / SHORTLIST_FILE, vocab), _specials(generation))
    onnx.save(_top_k_decoder(decoder, blob, shortlist, vocabulary), str(folder / DECODER_MANY_ROWS))
    greedy = _greedy_decoder(decoder, blob, shortlist)
    if greedy is not None:
        onnx.save(greedy, str(folder / DECODER_GREEDY))
    selector = _shortlist_selector(decoder, blob) if shortlist else None
    if selector is not None:
        onnx.save(selector, str(folder / SHORTLIST_GRAPH))
    return folder / DECODER_MANY_ROWS


SHORTLISTED_INPUT = "shortlisted"  # generate.onnx with a word list: bool [1], default true


def _write_search_model(path: Path, enc: onnx.GraphProto, dec: onnx.GraphProto, encoder: onnx.ModelProto,
                        decoder: onnx.ModelProto, generation: dict, greedy_one=None,
                        vocabulary: np.ndarray | None = None) -> Path:
    """The BeamSearch op over `enc` and `dec`. `greedy_one`: (a decoder restricted to a per-call
    word list, and _shortlisted_search's nodes before and after the op and its initializers):
    calls of one row (one sentence, num_beams 1) then go to an op over that decoder instead, by
    an If (the list's scores are normalized over the list only: fine for greedy search, not for
    beams, whose scores are compared across rows), unless the optional input `shortlisted` (bool
    [1], default true) is false. `vocabulary`: the word ids of `dec`'s tokens, by place
    (_search_vocabulary): the op's sequences are mapped back to word ids."""
    make = helper.make_node
    constants = [numpy_helper.from_array(np.array([1], np.int32), "min_length"),
                 numpy_helper.from_array(np.array([1], np.int32), "num_return_sequences"),
                 numpy_helper.from_array(np.array([1.0], np.float32), "repetition_penalty")]
    # The op's own mask, when none is given, masks left padding only (Hugging Face's T5
    # convention); ours is right padding, so the mask is made here: input_ids != PAD.
    pad = numpy_helper.from_array(np.array(generation["pad_id"], np.int32), "pad_id")
    nodes = [make("Equal", ["input_ids", "pad_id"], ["is_pad"], name="mask/equal"),
             make("Not", ["is_pad"], ["is_token"], name="mask/not"),
             make("Cast", ["is_token"], ["attention_mask"], to=TensorProto.INT32, name="mask/cast")]

    def search(name: str, output: str, decoder_graph: onnx.GraphProto, special: dict) -> onnx.NodeProto:
        return make("BeamSearch", ["input_ids", "max_length", "min_length", "num_beams", "num_return_sequences",
                                   "length_penalty", "repetition_penalty", "", "", "attention_mask"], [output],
                    domain="com.microsoft", name=name, model_type=1, early_stopping=1,
                    eos_token_id=special["eos"], pad_token_id=special["pad"], decoder_start_token_id=special["bos"],
                    encoder=copy.deepcopy(enc), decoder=decoder_graph)

    ids = {key: generation[f"{key}_id"] for key in ("pad", "bos", "eos")}
    if vocabulary is not None:
        ids = {key: int(np.searchsorted(vocabulary, i)) for key, i in ids.items()}
        constants.append(numpy_helper.from_array(vocabulary.astype(np.int32), VOCABULARY_WORDS))
    if greedy_one is not None and vocabulary is not None:
        raise ValueError("an output vocabulary serves the graph without a one-row word list only")
    if greedy_one is None and vocabulary is not None:
        nodes += [search("search", "vocabulary/sequences", dec, ids),
                  make("Gather", [VOCABULARY_WORDS, "vocabulary/sequences"], ["sequences"], axis=0,
                       name="vocabulary/sequences")]
    elif greedy_one is None:
        nodes.append(search("search", "sequences", dec, ids))
    else:
        one_dec, before, after, extra = greedy_one
        constants += extra

        def branch(name: str, body: list[onnx.NodeProto]) -> onnx.GraphProto:
            return helper.make_graph(body, name, [], [helper.make_tensor_value_info(
                body[-1].output[0], TensorProto.INT32, ["batch", 1, "length"])])

        # The list's ids put PAD, BOS, EOS first (_shortlisted_search).
        listed = search("search/one_row", LISTED_SEQUENCES, one_dec, {"pad": 0, "bos": 1, "eos": 2})
        constants += [numpy_helper.from_array(np.array([1], np.int64), "one_row/one"),
                      numpy_helper.from_array(np.array([True]), SHORTLISTED_INPUT)]  # an input's default
        nodes += [make("Shape", ["input_ids"], ["one_row/shape"], end=1, name="one_row/shape"),
                  make("Cast", ["num_beams"], ["one_row/beams"], to=TensorProto.INT64, name="one_row/beams"),
                  make("Mul", ["one_row/shape", "one_row/beams"], ["one_row/rows"], name="one_row/rows"),
                  make("Equal", ["one_row/rows", "one_row/one"], ["one_row/is_one"], name="one_row/is_one"),
                  make("And", ["one_row/is_one", SHORTLISTED_INPUT], ["one_row/listed"], name="one_row/listed"),
                  make("If", ["one_row/listed"], ["sequences"], name="one_row",
                       then_branch=branch("one_row", [*before, listed, *after]),
                       else_branch=branch("rows", [search("search", "rows/sequences", dec, ids)]))]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT32, ["batch", "src_len"]),
              helper.make_tensor_value_info("max_length", TensorProto.INT32, [1]),
              helper.make_tensor_value_info("num_beams", TensorProto.INT32, [1]),
              helper.make_tensor_value_info("length_penalty", TensorProto.FLOAT, [1])]
    if greedy_one is not None:  # optional (its initializer is the default): false, the whole vocabulary
        inputs.append(helper.make_tensor_value_info(SHORTLISTED_INPUT, TensorProto.BOOL, [1]))
    graph = helper.make_graph(
        nodes, "generate", inputs,
        [helper.make_tensor_value_info("sequences", TensorProto.INT32, ["batch", 1, "length"])],
        initializer=[*constants, pad])
    opsets = {o.domain: o.version for o in [*encoder.opset_import, *decoder.opset_import]
              if o.domain in ("", "ai.onnx", "com.microsoft")}
    opsets.setdefault("com.microsoft", 1)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
                              ir_version=decoder.ir_version, producer_name="mt-pipeline")
    onnx.save(model, str(path))
    return path
