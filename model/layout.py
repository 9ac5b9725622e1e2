"""A package's layout, in one place: its files, the role of each graph and the names of their inputs
and outputs. The writer (model/onnx_export.py, model/onnx_passes/) names what it makes from here
and the runtime (model/runtime.py) opens and feeds what it finds by these names; the contract
for other clients is docs/package-format.md.

Shipped inside every package (mt_runtime/layout.py), so the standard library only: no onnx, no
torch, no NumPy.
"""

from __future__ import annotations

from dataclasses import dataclass

# ------------------------------------------------------------------------------ the files
ENCODER = "encoder.onnx"
DECODER = "decoder.onnx"
GENERATE = "generate.onnx"
GENERATE_BATCH = "generate_batch.onnx"
DECODER_BATCH = "decoder_batch.onnx"
DECODER_GREEDY = "decoder_greedy.onnx"
SHORTLIST_GRAPH = "shortlist.onnx"
SHORTLIST_FILE = "shortlist.npz"
TOKENIZER = "tokenizer.json"
GENERATION = "generation.json"
PACKAGE_JSON = "package.json"
MODEL_CARD = "MODEL_CARD.md"
RUNTIME_DIR = "mt_runtime"
REQUIRED = (ENCODER, DECODER, TOKENIZER, GENERATION)  # every package has these

# ----------------------------------------------------------------- the step graphs' names
# encoder.onnx: src_ids int64 [batch, src_len] -> cross_k_i, cross_v_i per decoder layer.
# decoder.onnx: tokens, src_mask, cache_index, past_k_i, past_v_i, cross_k_i, cross_v_i ->
# log_probs [rows, vocab], present_k_i, present_v_i.
SRC_IDS = "src_ids"
SRC_MASK = "src_mask"
TOKENS = "tokens"
CACHE_INDEX = "cache_index"
LOG_PROBS = "log_probs"


def _per_layer(prefix: str):
    def name(layer: int) -> str:
        return f"{prefix}_{layer}"

    name.__name__ = prefix
    return name


# A layer's cache and cross-attention values: past_k(0) == "past_k_0".
past_k, past_v, present_k, present_v, cross_k, cross_v = map(
    _per_layer, ("past_k", "past_v", "present_k", "present_v", "cross_k", "cross_v")
)


# ------------------------------------------------------------- the graphs derived from them
# generate.onnx, generate_batch.onnx: the whole search in one call (onnxruntime's BeamSearch op).
INPUT_IDS = "input_ids"  # int32 [batch, src_len]
MAX_LENGTH = "max_length"  # int32 [1]
NUM_BEAMS = "num_beams"  # int32 [1]
LENGTH_PENALTY = "length_penalty"  # float [1]
SEQUENCES = "sequences"  # int32 [batch, 1, length]
SHORTLISTED = "shortlisted"  # bool [1], generate.onnx with a word list (default true); the step graphs' flag
GENERATE_INPUTS = (INPUT_IDS, MAX_LENGTH, NUM_BEAMS, LENGTH_PENALTY)
# decoder_batch.onnx: decoder.onnx for many rows, the top k words per row.
TOP_K = "top_k"  # int64 [1]
NORMALIZE = "normalize"  # bool [1]: false, the logits of every word and no ids
GROUP = "group"  # int64 [1]: consecutive rows of one sentence (its beams)
TOP_LOG_PROBS, TOP_IDS = "top_log_probs", "top_ids"
# decoder_greedy.onnx: greedy steps of many rows, the logits out.
LOGITS = "logits"
# shortlist.onnx: a batch's words -> the output projection over them (the step graphs' inputs).
WORDS = "words"
SHORTLIST_WEIGHT, SHORTLIST_SCALE = "shortlist_weight", "shortlist_scale"


@dataclass(frozen=True)
class Graph:
    """One graph file of a package: what it is for, and which packages have it."""

    file: str
    role: str
    made_for: str


GRAPHS = (
    Graph(ENCODER, "the encoder: a batch's sources to the cross-attention keys and values", "every package"),
    Graph(DECODER, "one step of the decoder: the next word's log-probabilities", "every package"),
    Graph(
        GENERATE,
        "the whole search in one onnxruntime call (one sentence; greedy over its word list)",
        "float32 packages (the CPU)",
    ),
    Graph(
        GENERATE_BATCH,
        "the whole search over the output vocabulary (beam search of one sentence)",
        "int8 packages with a shortlist",
    ),
    Graph(DECODER_BATCH, "a step for many rows: each row's best words", "float32 packages (the CPU)"),
    Graph(DECODER_GREEDY, "a greedy step for many rows: the logits, no cache reorder", "float32 packages (the CPU)"),
    Graph(SHORTLIST_GRAPH, "a batch's words to the output projection over them", "int8 packages with a shortlist"),
)
GRAPH_FILES = tuple(g.file for g in GRAPHS)
ROLES = {g.file: g.role for g in GRAPHS}
