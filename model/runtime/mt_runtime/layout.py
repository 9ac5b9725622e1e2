"""A package's layout, in one place: the format's version, its files, and each graph's role, inputs
and outputs with their types and shapes. The writer (model/onnx_export.py, model/onnx_passes/,
pipeline/export/packages.py) names what it makes from here and the runtime (translator.py) opens
and feeds what it finds by these names. docs/package-format.md is the contract for other clients;
its tables are this module's (`python -m mt_runtime.layout` prints them, and a test fails when the
page and this module disagree).

The standard library only: no onnx, no torch, no NumPy.
"""

from __future__ import annotations

from dataclasses import dataclass

# ----------------------------------------------------------------------------- the format
# A reader refuses a major version it does not know; a minor version only adds what a reader of
# the same major may ignore. Version 1: packages written before 2026-12-04 (the same graphs' first
# forms, with a copy of the Python runtime inside); version 2 names the runtime instead; 2.1 adds
# decoder_greedy_inplace.onnx, which a 2.0 reader does without.
FORMAT_NAME = "mt-onnx-package"
FORMAT_MAJOR = 2
FORMAT = f"{FORMAT_NAME}/{FORMAT_MAJOR}"
FORMAT_WRITTEN = f"{FORMAT}.1"  # what package.json says of a package written now
READS = (1, 2)  # the majors this runtime loads


def format_version(text: object) -> tuple[int, int]:
    """(major, minor) of a package.json `format` such as "mt-onnx-package/2" or ".../2.1";
    ValueError for anything else."""
    if isinstance(text, str) and text.startswith(FORMAT_NAME + "/"):
        major, _, minor = text[len(FORMAT_NAME) + 1 :].partition(".")
        if major.isdigit() and major.isascii() and (minor == "" or (minor.isdigit() and minor.isascii())):
            return int(major), int(minor or 0)
    raise ValueError(f"format {text!r} is not {FORMAT_NAME}/<major>[.<minor>]")


# ------------------------------------------------------------------------------ the files
ENCODER = "encoder.onnx"
DECODER = "decoder.onnx"
GENERATE = "generate.onnx"
GENERATE_BATCH = "generate_batch.onnx"
DECODER_BATCH = "decoder_batch.onnx"
DECODER_GREEDY = "decoder_greedy.onnx"
DECODER_GREEDY_INPLACE = "decoder_greedy_inplace.onnx"
SHORTLIST_GRAPH = "shortlist.onnx"
SHORTLIST_FILE = "shortlist.npz"
TOKENIZER = "tokenizer.json"
GENERATION = "generation.json"
PACKAGE_JSON = "package.json"
MODEL_CARD = "MODEL_CARD.md"
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
# decoder_greedy_inplace.onnx: the same with the cache written in place.
PAST_SEQUENCE_LENGTH = "past_sequence_length"  # int32 [1]
# shortlist.onnx: a batch's words -> the output projection over them (the step graphs' inputs).
WORDS = "words"
SHORTLIST_WEIGHT, SHORTLIST_SCALE = "shortlist_weight", "shortlist_scale"


@dataclass(frozen=True)
class Tensor:
    """One input or output of a graph. A name ending in `_i` stands for one per decoder layer
    (`past_k_0`, `past_k_1`, ...). `dtype` is ONNX's name; "float" is float16 in float16 packages.
    `shape` names each dimension (a number is a fixed size); `where` says which packages have it
    when not all do."""

    name: str
    dtype: str
    shape: tuple[str, ...]
    meaning: str
    where: str = ""

    @property
    def per_layer(self) -> bool:
        return self.name.endswith("_i")

    def names(self, layers: int) -> list[str]:
        return [f"{self.name[:-2]}_{i}" for i in range(layers)] if self.per_layer else [self.name]

    def type_and_shape(self) -> str:
        return f"{self.dtype} [{', '.join(self.shape)}]"


@dataclass(frozen=True)
class Graph:
    """One graph file of a package: what it is for, which packages have it, its inputs and outputs."""

    file: str
    role: str
    made_for: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]


_SHORTLISTED = "int8 packages with a shortlist"
_SRC_MASK = "`src_ids != pad_id` of the row's sentence"
_CROSS = "layer i's cross-attention {kv}"
_PAST = (
    "the self-attention {kv}: the previous step's `present_*` (at the first step an empty cache "
    "[rows, self_heads_i, 0, head_size] and `cache_index` 0..rows-1; `self_heads_i` and `head_size` are numbers "
    "in the graph)"
)
_PRESENT = "the self-attention {kv}: the cache with this step's row appended, already reordered by `cache_index`"


def _pair(k: str, v: str, dtype: str, shape: tuple[str, ...], meaning: str) -> tuple[Tensor, Tensor]:
    """Layer i's keys and values: `meaning` says {kv} where they differ."""
    return Tensor(k, dtype, shape, meaning.format(kv="keys")), Tensor(v, dtype, shape, meaning.format(kv="values"))


_TOKENS = Tensor(TOKENS, "int64", ("rows", "1"), "the previous token of each row (`bos_id` at the first step)")
_CACHE_INDEX = Tensor(CACHE_INDEX, "int64", ("rows",), "which row of `past_*` each row continues (its parent beam)")
_PASTS = _pair("past_k_i", "past_v_i", "float", ("past_rows", "self_heads_i", "steps", "head_size"), _PAST)
_PRESENTS = _pair("present_k_i", "present_v_i", "float", ("rows", "self_heads_i", "steps + 1", "head_size"), _PRESENT)
_CROSS_PER_ROW = _pair(
    "cross_k_i",
    "cross_v_i",
    "float",
    ("rows", "heads_i", "src_len", "head_size"),
    "the encoder's {kv}, one copy per row",
)
_GREEDY_LOGITS = Tensor(
    LOGITS, "float", ("rows", "words"), "every word's logit, or the shortlist's `words`' in their order"
)
_SHORTLIST_INPUTS = (
    Tensor(SHORTLISTED, "bool", ("1",), "true: the logits of the shortlist's `words` only", _SHORTLISTED),
    Tensor(
        SHORTLIST_WEIGHT,
        "int8",
        ("table_width", "words"),
        "from shortlist.onnx (empty when not shortlisted)",
        _SHORTLISTED,
    ),
    Tensor(SHORTLIST_SCALE, "float", ("words",), "from shortlist.onnx (empty when not shortlisted)", _SHORTLISTED),
)
_GENERATE_INPUTS = (
    Tensor(INPUT_IDS, "int32", ("batch", "src_len"), "source ids, as `src_ids`"),
    Tensor(MAX_LENGTH, "int32", ("1",), "the length limit L, start token included (one for all sentences)"),
    Tensor(NUM_BEAMS, "int32", ("1",), "the beam size (1: greedy)"),
    Tensor(LENGTH_PENALTY, "float", ("1",), "the length penalty"),
)
_SEQUENCES = Tensor(
    SEQUENCES, "int32", ("batch", "1", "length"), "the start token, the translation, then `eos_id` and `pad_id`"
)

GRAPHS = (
    Graph(
        ENCODER,
        "the encoder: a batch's sources to the cross-attention keys and values",
        "every package",
        (Tensor(SRC_IDS, "int64", ("batch", "src_len"), "source ids, right-padded with `pad_id`"),),
        _pair("cross_k_i", "cross_v_i", "float", ("batch", "heads_i", "src_len", "head_size"), _CROSS),
    ),
    Graph(
        DECODER,
        "one step of the decoder: the next word's log-probabilities",
        "every package",
        (
            _TOKENS,
            Tensor(SRC_MASK, "bool", ("rows", "src_len"), _SRC_MASK),
            _CACHE_INDEX,
            *_PASTS,
            *_CROSS_PER_ROW,
        ),
        (Tensor(LOG_PROBS, "float", ("rows", "vocab"), "the next token's log-softmax"), *_PRESENTS),
    ),
    Graph(
        GENERATE,
        "the whole search in one onnxruntime call (one sentence; greedy over its word list)",
        "float32 and int8 packages (the CPU)",
        (
            *_GENERATE_INPUTS,
            Tensor(SHORTLISTED, "bool", ("1",), "greedy over the sentence's words (default true)", _SHORTLISTED),
        ),
        (_SEQUENCES,),
    ),
    Graph(
        GENERATE_BATCH,
        "the whole search over the output vocabulary (beam search of one sentence)",
        _SHORTLISTED,
        _GENERATE_INPUTS,
        (_SEQUENCES,),
    ),
    Graph(
        DECODER_BATCH,
        "a step for many rows: each row's best words",
        "float32 and int8 packages (the CPU)",
        (
            _TOKENS,
            Tensor(SRC_MASK, "bool", ("sentences", "src_len"), _SRC_MASK + ", one row per sentence"),
            _CACHE_INDEX,
            *_PASTS,
            *_pair(
                "cross_k_i",
                "cross_v_i",
                "float",
                ("sentences", "heads_i", "src_len", "head_size"),
                "the encoder's {kv}, one row per sentence",
            ),
            *_SHORTLIST_INPUTS,
            Tensor(GROUP, "int64", ("1",), "consecutive rows that are one sentence's beams (rows = sentences x group)"),
            Tensor(TOP_K, "int64", ("1",), "how many words per row"),
            Tensor(NORMALIZE, "bool", ("1",), "false: every word's logit, no ids"),
        ),
        (
            Tensor(
                TOP_LOG_PROBS,
                "float",
                ("rows", "k"),
                "best first; k = `top_k`, or every word's logit with `normalize` false",
            ),
            Tensor(TOP_IDS, "int64", ("rows", "k"), "their word ids (k = 0 with `normalize` false)"),
            *_PRESENTS,
        ),
    ),
    Graph(
        DECODER_GREEDY,
        "a greedy step for many rows: the logits, no cache reorder",
        "float32 and int8 packages (the CPU)",
        (
            _TOKENS,
            Tensor(SRC_MASK, "bool", ("rows", "src_len"), _SRC_MASK),
            *_PASTS,
            *_CROSS_PER_ROW,
            *_SHORTLIST_INPUTS,
        ),
        (
            _GREEDY_LOGITS,
            *_PRESENTS,
        ),
    ),
    Graph(
        DECODER_GREEDY_INPLACE,
        "`decoder_greedy.onnx`'s step with the cache written in place (each `present_*` bound to its "
        "`past_*`'s memory)",
        "float32 and int8 packages of format 2.1 (the CPU)",
        (
            _TOKENS,
            Tensor(SRC_MASK, "bool", ("rows", "src_len"), _SRC_MASK),
            Tensor(
                PAST_SEQUENCE_LENGTH, "int32", ("1",), "how many positions of the cache are filled (the step's index)"
            ),
            *_pair(
                "past_k_i",
                "past_v_i",
                "float",
                ("rows", "self_heads_i", "capacity", "head_size"),
                "the self-attention {kv}: a buffer of `capacity` > `past_sequence_length` positions, the first "
                "`past_sequence_length` filled (at the first step 0: zeros will do)",
            ),
            *_CROSS_PER_ROW,
            *_SHORTLIST_INPUTS,
        ),
        (
            _GREEDY_LOGITS,
            *_pair(
                "present_k_i",
                "present_v_i",
                "float",
                ("rows", "self_heads_i", "capacity", "head_size"),
                "the past_* buffer itself, this step's row written at position `past_sequence_length`: bound to "
                "the same memory as past_* (any other buffer is left unfilled)",
            ),
        ),
    ),
    Graph(
        SHORTLIST_GRAPH,
        "a batch's words to the output projection over them",
        _SHORTLISTED,
        (Tensor(WORDS, "int64", ("words",), "the word ids the projection covers"),),
        (
            Tensor(SHORTLIST_WEIGHT, "int8", ("table_width", "words"), "the projection's columns for `words`"),
            Tensor(SHORTLIST_SCALE, "float", ("words",), "their scales"),
        ),
    ),
)
GRAPH_FILES = tuple(g.file for g in GRAPHS)
# Inputs a reader does without where a graph lacks them, beside those only some packages have
# (`where`): decoder_batch.onnx's `group` and `normalize`, which packages written before them lack.
LATER_INPUTS = {DECODER_BATCH: (GROUP, NORMALIZE)}
ROLES = {g.file: g.role for g in GRAPHS}
BY_FILE = {g.file: g for g in GRAPHS}

# ----------------------------------------------------------------------------- generation.json
GENERATION_FIELDS = (
    ("pad_id", "int", "padding"),
    ("bos_id", "int", "the start of a target"),
    ("eos_id", "int", "the end of a sentence"),
    ("max_positions", "int >= 2", "positions the graphs hold; no sequence is longer"),
    ("max_len_a", "float", "the length limit's factor (The search)"),
    ("max_len_b", "int", "the length limit's constant (The search)"),
    ("beam", "int >= 1", "the default beam size (1 = greedy)"),
    ("length_penalty", "float", "the default length penalty"),
)


def generation_table() -> str:
    """generation.json's fields as docs/package-format.md shows them."""
    out = ["| field | type | meaning |", "|---|---|---|"]
    out += [f"| `{name}` | {kind} | {meaning} |" for name, kind, meaning in GENERATION_FIELDS]
    return "\n".join(out) + "\n"


def graph_tables() -> str:
    """Each graph's inputs and outputs as docs/package-format.md shows them."""
    out = []
    for graph in GRAPHS:
        out += [f"### `{graph.file}`", "", f"{graph.role[0].upper()}{graph.role[1:]}; in {graph.made_for}.", ""]
        out += ["| | name | type, shape | meaning |", "|---|---|---|---|"]
        for side, tensors in (("in", graph.inputs), ("out", graph.outputs)):
            for t in tensors:
                where = f" (only {t.where})" if t.where else ""
                out.append(f"| {side} | `{t.name}` | {t.type_and_shape()} | {t.meaning}{where} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":  # the tables of docs/package-format.md
    print(generation_table() + "\n" + graph_tables(), end="")
