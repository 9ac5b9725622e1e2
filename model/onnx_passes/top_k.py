"""The top k of each row inside the graph: chunked where a chunk width divides the vocabulary, and
skipped (the logits out) where the caller wants no scores."""

from __future__ import annotations

import copy

import numpy as np
import onnx
from mt_runtime.layout import NORMALIZE, TOP_IDS, TOP_K, TOP_LOG_PROBS
from onnx import TensorProto, helper, numpy_helper

from .projection import VOCABULARY_WORDS


def chunk_width(vocab) -> int | None:
    """The divisor of `vocab` in [32, 128] nearest 64 (None: none, or a vocabulary of unknown size)."""
    if not isinstance(vocab, int) or vocab <= 0:
        return None
    widths = [w for w in range(32, 129) if vocab % w == 0 and vocab // w >= 2]
    return min(widths, key=lambda w: abs(w - 64)) if widths else None


def chunked_top_k(values: str, vocab, p: str) -> list[onnx.NodeProto]:
    """Nodes from `values` [rows, vocab] to {p}/values, {p}/ids: its top_k entries per row, best
    first, as onnxruntime's TopK gives them. The row is cut into chunks of ~64; the k best entries
    lie in the k chunks of highest maximum (a chunk outside those has k larger entries elsewhere),
    so TopK runs over the chunk maxima and then over those k chunks only, as mt_runtime/search.py's
    top_k_indices does. [128, 8000] rows, one thread: 434 against 600 us for TopK over whole rows
    (`/tmp/w/topk_micro.py 128 8000 8 64`). Plain TopK where no chunk width divides the vocabulary;
    with ties, ids may differ, values do not."""
    width = chunk_width(vocab)
    if width is None:
        return [helper.make_node("TopK", [values, TOP_K], [f"{p}/values", f"{p}/ids"], axis=-1, largest=1, sorted=1)]
    chunks = vocab // width

    def const(name: str, array) -> onnx.NodeProto:
        return helper.make_node(
            "Constant", [], [f"{p}/{name}"], value=numpy_helper.from_array(np.asarray(array, np.int64), name)
        )

    make = helper.make_node
    return [
        const("chunked_shape", [0, chunks, width]),
        const("last_axis", [-1]),
        const("chunks", [chunks]),
        const("width", width),
        const("offsets", np.arange(width)),
        const("flat_shape", [0, -1]),
        make("Reshape", [values, f"{p}/chunked_shape"], [f"{p}/chunked"]),
        make("ReduceMax", [f"{p}/chunked"], [f"{p}/maxima"], axes=[-1], keepdims=0),  # opset 17: axes an attribute
        make("Min", [TOP_K, f"{p}/chunks"], [f"{p}/k_chunks"]),  # a k beyond the chunk count: every chunk
        make(
            "TopK",
            [f"{p}/maxima", f"{p}/k_chunks"],
            [f"{p}/chunk_maxima", f"{p}/best_chunks"],
            axis=-1,
            largest=1,
            sorted=0,
        ),
        make("Unsqueeze", [f"{p}/best_chunks", f"{p}/last_axis"], [f"{p}/best_chunks3"]),
        make("Mul", [f"{p}/best_chunks3", f"{p}/width"], [f"{p}/starts"]),
        make("Add", [f"{p}/starts", f"{p}/offsets"], [f"{p}/columns3"]),
        make("Reshape", [f"{p}/columns3", f"{p}/flat_shape"], [f"{p}/columns"]),
        make("GatherElements", [values, f"{p}/columns"], [f"{p}/candidates"], axis=1),
        make("TopK", [f"{p}/candidates", TOP_K], [f"{p}/values", f"{p}/picked"], axis=-1, largest=1, sorted=1),
        make("GatherElements", [f"{p}/columns", f"{p}/picked"], [f"{p}/ids"], axis=1),
    ]


def normalize_or_not(softmax: onnx.NodeProto, value_type: int, vocab=None, restricted=None) -> onnx.NodeProto:
    """If(normalize): the top k of the decoder's LogSoftmax; else the logits themselves, [rows,
    vocab], and no ids ([rows, 0]): the caller takes the best. onnxruntime's TopK(1) over a row of
    8000 took ten times NumPy's argmax ([32, 8000]: 443 vs 41 us, one thread). `restricted`
    (from restricted_projection): the LogSoftmax and top k run over the output vocabulary's
    projection instead, and the logits' producer moves into the else branch (a node outside the
    If runs whichever branch is taken)."""

    def graph(name: str, nodes: list[onnx.NodeProto]) -> onnx.GraphProto:
        return helper.make_graph(
            nodes,
            name,
            [],
            [
                helper.make_tensor_value_info(f"{name}/values", value_type, ["batch", None]),
                helper.make_tensor_value_info(f"{name}/ids", TensorProto.INT64, ["batch", None]),
            ],
        )

    softmax = copy.deepcopy(softmax)
    softmax.output[0] = "log_probabilities/all"
    logits = softmax.input[0]
    normalized, unnormalized = [softmax], []
    if restricted is None:
        normalized += chunked_top_k(softmax.output[0], vocab, "log_probabilities")
    else:
        producer, projection, words = restricted
        softmax.input[0] = projection[0].output[0]
        listed = "log_probabilities/listed"  # top k over the vocabulary: places in it, mapped to word ids
        normalized = [
            *projection,
            softmax,
            *chunked_top_k(softmax.output[0], len(words), listed),
            helper.make_node("Gather", [VOCABULARY_WORDS, f"{listed}/ids"], ["log_probabilities/ids"], axis=0),
            helper.make_node("Identity", [f"{listed}/values"], ["log_probabilities/values"]),
        ]
        unnormalized = [producer]
    no_ids = [
        helper.make_node("Shape", [logits], ["logits/shape"], end=1),
        helper.make_node(
            "Constant", [], ["logits/zero"], value=helper.make_tensor("zero", TensorProto.INT64, [1], [0])
        ),
        helper.make_node("Concat", ["logits/shape", "logits/zero"], ["logits/ids_shape"], axis=0),
        helper.make_node(
            "ConstantOfShape",
            ["logits/ids_shape"],
            ["logits/ids"],
            value=helper.make_tensor("id", TensorProto.INT64, [1], [0]),
        ),
        helper.make_node("Identity", [logits], ["logits/values"]),
    ]
    return helper.make_node(
        "If",
        [NORMALIZE],
        [TOP_LOG_PROBS, TOP_IDS],
        then_branch=graph("log_probabilities", normalized),
        else_branch=graph("logits", [*unnormalized, *no_ids]),
    )
