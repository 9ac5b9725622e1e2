"""What the runtime checks in a package's content before it translates with it.

A package's digests (mt_runtime/files.py's verify_package) say that its files are the ones its
package.json lists; they say nothing about whether whoever wrote package.json made sense. So
every value the runtime reads from a package is checked against what the graphs can do, before
the search runs with it, and a value that is wrong is one PackageError line naming the file and
the field:

- generation.json: every field present, of its type (an integer is not a boolean, a float or a
  string; numbers are finite), in range; the special ids are the tokenizer's own; max_positions
  is at least 2 and at most the rows of the graphs' position table (read from their bytes);
- tokenizer.json: what it would cost, before `tokenizers` builds it (a 30 MB file took 975 MB to
  build and refuse): at most TOKENIZER_BASE_BYTES + TOKENIZER_BYTES_PER_WORD bytes a word of the
  graphs' vocabulary (and MAX_TOKENIZER_BYTES), and no more vocabulary pieces, merges or added
  tokens than the graphs have words; no `padding` (the runtime pads itself: a tokenizer's padding
  would pad a source before its EOS, and `Fixed` 300000000 allocated gigabytes a line), and its
  `truncation` ignored (the runtime cuts a source to max_positions - 1 ids itself; a stride would
  multiply a line's encodings). Then it loads, has the special pieces, and every id it can
  produce is inside the graphs' vocabulary (int8 graphs look a token up with
  GatherBlockQuantized, which returns whatever memory an out-of-range id points at).

The shortlist's own checks are in mt_runtime/shortlist.py. Part of mt-runtime, the runtime every
package names (package.json's `runtime`): NumPy, tokenizers and the standard library only.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from .files import PackageError, UnsafeFile, initializers, open_regular, read_bounded, reason
from .search import GenerationConfig
from .subword import SPECIALS, SubwordTokenizer

MAX_GENERATION_BYTES = 1 << 20
MAX_TOKENIZER_BYTES = 64 << 20  # NLLB's 256k pieces are 17 MB
# A tokenizer's bytes for graphs of V words: at most BASE + PER_WORD x V. Ours are 55 bytes a word
# (pretty-printed Unigram), NLLB's BPE 66 with its merges; BASE leaves room for a normalizer's
# character map (SentencePiece's nmt_nfkc is 240 KB in base64).
TOKENIZER_BASE_BYTES = 2 << 20
TOKENIZER_BYTES_PER_WORD = 256
MAX_POSITIONS = 65536  # model/sizes.py's MAX_DIM: where a graph's own table cannot be found
MAX_BEAM = 256
MAX_LENGTH_PENALTY = 100.0
MAX_LEN_A = 1000.0
MAX_LEN_B = 1 << 20
_INTS = ("beam", "max_len_b", "bos_id", "eos_id", "pad_id", "max_positions")
_SPECIAL_FIELDS = {"pad_id": "<pad>", "bos_id": "<s>", "eos_id": "</s>"}
_FLOAT, _FLOAT16 = 1, 10  # onnx.TensorProto.DataType


def load_tokenizer(path: Path, vocab: int) -> SubwordTokenizer:
    """The package's tokenizer.json (and nothing beside it: a tokenizer.target.json is for
    training), checked as the module says, for graphs of `vocab` words."""
    text = _tokenizer_text(path, vocab)
    try:
        tokenizer = Tokenizer.from_str(text)
    except BaseException as exc:  # tokenizers' errors are plain Exceptions, its panics BaseExceptions
        if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
            raise
        raise PackageError(f"{path}: not a tokenizer ({reason(exc)})") from None
    tokenizer.no_truncation()
    ids = [tokenizer.token_to_id(piece) for piece in SPECIALS]
    if None in ids:
        raise PackageError(
            f"{path}: no {SPECIALS[ids.index(None)]!r} piece (a package's tokenizer has {', '.join(SPECIALS)})"
        )
    if len(set(ids)) < len(ids):
        raise PackageError(f"{path}: two of {', '.join(SPECIALS)} are one id ({ids})")
    highest = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)
    if highest >= vocab:
        raise PackageError(f"{path}: holds id {highest}, beyond the graphs' vocabulary of {vocab} words")
    return SubwordTokenizer(tokenizer)


def _tokenizer_text(path: Path, vocab: int) -> str:
    """tokenizer.json's text, once its size and its counts are within what graphs of `vocab` words
    need (the module's first checks): read and parsed by the standard library, which costs a few
    times the bytes, where `tokenizers` cost thirty."""
    limit = min(MAX_TOKENIZER_BYTES, TOKENIZER_BASE_BYTES + TOKENIZER_BYTES_PER_WORD * vocab)
    try:
        text = read_bounded(path, limit, follow_links=False).decode("utf-8")
    except UnsafeFile as exc:
        if not str(exc).endswith(f"larger than {limit} bytes"):
            raise PackageError(f"{path}: unreadable ({exc})") from None
        raise PackageError(
            f"{path}: larger than {limit} bytes, the most for graphs of {vocab} words "
            f"({TOKENIZER_BASE_BYTES >> 20} MiB + {TOKENIZER_BYTES_PER_WORD} bytes a word)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PackageError(f"{path}: unreadable ({exc})") from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise PackageError(f"{path}: not a tokenizer (not JSON: {reason(exc)})") from None
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, dict):
        raise PackageError(f"{path}: not a tokenizer (no `model` object)")
    for field, items in (
        ("model.vocab", model.get("vocab")),
        ("model.merges", model.get("merges")),
        ("added_tokens", data.get("added_tokens")),
    ):
        if isinstance(items, (list, dict)) and len(items) > vocab:
            raise PackageError(
                f"{path}: {field} holds {len(items)} entries, more than the graphs' vocabulary of {vocab} words"
            )
    if data.get("padding") is not None:
        raise PackageError(
            f"{path}: padding: must be null (the runtime pads sources itself), got {_kind(data['padding'])}"
        )
    return text


def load_generation(path: Path, tokenizer: SubwordTokenizer, vocab: int, positions: int) -> GenerationConfig:
    """generation.json as a GenerationConfig, checked for a tokenizer and graphs of `vocab` words
    and `positions` positions. Unknown keys are left alone (a later runtime's)."""
    try:
        raw = read_bounded(path, MAX_GENERATION_BYTES, follow_links=False).decode("utf-8")
        values = json.loads(raw, parse_constant=_no_constant)
    except (UnsafeFile, OSError, ValueError) as exc:  # JSON, UTF-8 and digit-count errors are ValueErrors
        raise PackageError(f"{path}: not JSON ({reason(exc)})") from None
    if not isinstance(values, dict):
        raise PackageError(f"{path}: not a JSON object")
    fields = {f.name: values.get(f.name) for f in dataclasses.fields(GenerationConfig)}
    for name, value in fields.items():
        problem = _type_problem(name, value)
        if problem:
            raise PackageError(f"{path}: {name}: {problem}")
    ranges = {
        "beam": (1, MAX_BEAM),
        "length_penalty": (0, MAX_LENGTH_PENALTY),
        "max_len_a": (0, MAX_LEN_A),
        "max_len_b": (0, MAX_LEN_B),
        "max_positions": (2, positions),
        **{name: (0, vocab - 1) for name in _SPECIAL_FIELDS},
    }
    for name, (low, high) in ranges.items():
        if not low <= fields[name] <= high:
            why = {"max_positions": " (the rows of the graphs' position table)"}.get(
                name, " (the graphs' vocabulary)" if name in _SPECIAL_FIELDS else ""
            )
            raise PackageError(f"{path}: {name}: must be from {low} to {high}{why}, got {fields[name]!r}")
    for name, piece in _SPECIAL_FIELDS.items():
        own = tokenizer.tok.token_to_id(piece)
        if fields[name] != own:
            raise PackageError(f"{path}: {name}: {fields[name]} is not the tokenizer's {piece} ({own})")
    if int(2 * fields["max_len_a"] + fields["max_len_b"]) < 2:
        raise PackageError(
            f"{path}: max_len_a, max_len_b: a one-word sentence would get no word "
            f"(2 * {fields['max_len_a']} + {fields['max_len_b']} < 2)"
        )
    return GenerationConfig(**fields)


def vocabulary(decoder_outputs: list, graph: Path) -> int:
    """The words a decoder graph scores: its first output's last dimension, which must be fixed."""
    shape = decoder_outputs[0].shape if decoder_outputs else None
    size = shape[-1] if shape else None
    if not isinstance(size, int) or size < 4:
        raise PackageError(f"{graph}: its first output has no fixed vocabulary size ({shape})")
    return size


def position_rows(graphs: list[Path]) -> int:
    """The most positions the graphs can place: the fewest rows of a sinusoidal position table
    in any of them (MAX_POSITIONS where none holds one). Float32 graphs compute the table from
    "/positions/index" (model/onnx_export.py's positions_as_formula: rows x 1, 0 .. rows - 1);
    float16 graphs hold it as a constant (rows x d, row 0 = sin 0, cos 0, ... = 0, 1, 0, 1, ...)."""
    found = []
    for graph in graphs:
        with open(open_regular(graph, follow_links=False), "rb") as f:
            data = f.read()
        try:
            found += [rows for tensor in initializers(data) if (rows := _table_rows(tensor))]
        except UnsafeFile as exc:
            raise PackageError(f"{graph}: {exc}") from None
    return min(found, default=MAX_POSITIONS)


def check_ids(ids, vocab: int) -> None:
    """Token ids handed to the graphs directly (Translator.encode's rows, Translator.step's
    tokens): each inside the vocabulary, ValueError otherwise."""
    try:
        flat = (
            np.fromiter(itertools.chain.from_iterable(ids), np.int64)
            if isinstance(ids, list)
            else np.asarray(ids, dtype=np.int64).ravel()
        )
    except (OverflowError, TypeError, ValueError):
        raise ValueError("token ids must be integers inside the package's vocabulary") from None
    outside = flat[(flat < 0) | (flat >= vocab)]
    if outside.size:
        raise ValueError(f"token id {outside[0]} is outside the package's vocabulary (0 to {vocab - 1})")


def _table_rows(tensor) -> int | None:
    dims, raw = tensor.dims, tensor.raw
    if len(dims) != 2 or dims[0] < 2 or tensor.data_type not in (_FLOAT, _FLOAT16):
        return None
    rows, width = dims
    dtype = np.float32 if tensor.data_type == _FLOAT else np.float16
    if width == 1 and tensor.name.endswith("positions/index"):
        if len(raw) == rows * 4 and np.array_equal(np.frombuffer(raw, np.float32), np.arange(rows)):
            return rows
        return None
    itemsize = np.dtype(dtype).itemsize
    if width < 2 or len(raw) != rows * width * itemsize:
        return None
    head = np.frombuffer(raw[: 2 * width * itemsize], dtype).astype(np.float64).reshape(2, width)
    first = np.zeros(width)
    first[1::2] = 1.0
    if np.array_equal(head[0], first) and abs(head[1, 0] - math.sin(1)) < 1e-2 and abs(head[1, 1] - math.cos(1)) < 1e-2:
        return rows
    return None


def _type_problem(name: str, value) -> str | None:
    if value is None:
        return "missing"
    if name in _INTS:
        if type(value) is not int:
            return f"must be an integer, got {_kind(value)}"
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a number, got {_kind(value)}"
    elif not math.isfinite(value):
        return f"must be a finite number, got {value!r}"
    return None


def _kind(value) -> str:
    if isinstance(value, bool):
        return f"a boolean ({json.dumps(value)})"
    text = json.dumps(value)
    text = text if len(text) <= 40 else text[:37] + "..."
    return {str: "a string", list: "a list", dict: "an object", float: "a number"}.get(type(value), "") + f" ({text})"


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")
