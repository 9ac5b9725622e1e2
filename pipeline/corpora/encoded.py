"""A training set as subword ids: what the batcher reads.

On disk (encode_to_disk) a corpus is two ragged arrays, one flat file of ids per side plus the
offsets where each sentence starts (as fairseq's and Marian's binarised data are), written once
in blocks by a single pass over the text and memory-mapped for reading. What a process holds
is the offsets (8 bytes a sentence a side) and the pages the current batches touch, whatever
the corpus size. The validation set, a few thousand sentences, is encoded in memory
(encode_corpus) into the same structure.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
from mt_runtime.files import UnsafeFile, read_bounded, reason

from ..engine.errors import PipelineError
from ..engine.store import file_record, listed_file_problems, write_json_atomic

# Pairs per tokenizer call: `tokenizers` encodes a batch on all cores; blocks keep memory flat.
ENCODE_BLOCK = 10_000
_META = "encoded.json"
_TOP_K_ROWS = "top_k_rows.npy"


class Ragged:
    """Rows of ids of varying length: row i is ids[offsets[i]:offsets[i + 1]]."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray):
        self.ids, self.offsets = ids, offsets

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[int]]) -> "Ragged":
        lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ids = np.fromiter((i for r in rows for i in r), dtype=np.int64, count=int(offsets[-1]))
        return cls(ids, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.ids[self.offsets[i] : self.offsets[i + 1]]

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def rows(self, count: int) -> list[list[int]]:
        """The first `count` rows as lists (what the search functions take)."""
        return [self[i].tolist() for i in range(min(count, len(self)))]


class SoftTargets:
    """Per training pair, the teacher's stored top-k distributions (a TopKStore row), or none:
    `rows[i]` is the store row of pair i, -1 for a pair that learns from its label alone."""

    def __init__(self, store, rows: np.ndarray):
        self.store, self.rows = store, rows

    def __getitem__(self, i: int):
        row = int(self.rows[i])
        return None if row < 0 else self.store[row]

    def __len__(self) -> int:
        return len(self.rows)

    def present(self) -> int:
        return int((self.rows >= 0).sum())

    @property
    def k(self) -> int:
        return self.store.k


@dataclass
class Corpus:
    src: Ragged  # subword ids + EOS
    tgt: Ragged  # subword ids, no BOS/EOS (added when batching)
    # Per pair, a teacher's k most likely words at each target position (EOS included) and their
    # probabilities renormalised over those k: word-level distillation without the teacher in the loop.
    soft: SoftTargets | None = None

    def __post_init__(self):
        if not isinstance(self.src, Ragged):
            self.src = Ragged.from_rows(self.src)
        if not isinstance(self.tgt, Ragged):
            self.tgt = Ragged.from_rows(self.tgt)

    def __len__(self) -> int:
        return len(self.src)


def make_batches(
    corpus: Corpus, batch_tokens: int, seed: int, epoch: int, rank: int = 0, world: int = 1
) -> list[np.ndarray]:
    """Length-bucketed batches of at most `batch_tokens` (padded) tokens, in a shuffled order that
    depends only on (seed, epoch): a resumed run sees exactly the batches it would have seen."""
    rng = np.random.default_rng([seed, epoch])
    src_len, tgt_len = corpus.src.lengths(), corpus.tgt.lengths() + 1
    order = np.lexsort((rng.random(len(corpus)), src_len, tgt_len))
    # Greedy along the sorted order: a batch ends where one more pair would pad it past the
    # budget. Python ints, not numpy scalars (a few million pairs take a second, not ten), made
    # a block at a time (all at once they would be 36 bytes a pair).
    sizes = np.maximum(src_len, tgt_len)[order]
    blocks = (sizes[i : i + 65536].tolist() for i in range(0, len(sizes), 65536))
    starts, start, longest = [0], 0, 0
    for end, size in enumerate(itertools.chain.from_iterable(blocks)):
        candidate = max(longest, size)
        if (end - start + 1) * candidate > batch_tokens and end > start:
            starts.append(end)
            start, candidate = end, size
        longest = candidate
    batches = [order[a:b] for a, b in zip(starts, starts[1:] + [len(order)])] if len(order) else []
    rng.shuffle(batches)
    if world > 1:
        batches = batches[: len(batches) - len(batches) % world][rank::world]
    return batches


def _fitted(s: list[int], t: list[int], limit: int, drop_long: bool, eos: int):
    """A pair cut to the model's positions (None where dropped): source with EOS, target bare."""
    if len(s) >= limit or len(t) >= limit:
        if drop_long:
            return None
        s, t = s[: limit - 1], t[: limit - 1]
    return s + [eos], t


def encode_corpus(
    tokenizer, src_lines: list[str], tgt_lines: list[str], max_positions: int, drop_long: bool = True
) -> Corpus:
    """Subword ids of a small set of pairs, in memory (too long ones dropped or cut)."""
    fitted = [
        _fitted(s, t, max_positions - 1, drop_long, tokenizer.eos_id)
        for s, t in zip(tokenizer.encode(src_lines), tokenizer.encode_target(tgt_lines))
    ]
    kept = [pair for pair in fitted if pair is not None]
    return Corpus([s for s, _ in kept], [t for _, t in kept])


def encode_to_disk(
    tokenizer,
    pairs: Iterable[tuple[str, str, int]] | None,
    folder: Path,
    max_positions: int,
    top_k=None,
    on_pairs: Callable[[int], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[Corpus, dict]:
    """Encode (source, target, top-k row or -1) pairs into `folder`, too long ones dropped, and
    open the result memory-mapped; with `top_k` (a TopKStore) a pair keeps its row where the row
    covers its encoded target plus EOS. A folder encoded before is opened as it is (a resumed
    training does not encode again) once it passes its check (check_encoded: the record written
    last, every file's size and sha256, the offsets); one that fails it is encoded again, with a
    line to `log`, or with `pairs` None (a process that only opens what another encoded) refused
    in one line. Returns the corpus and a record (pairs read and kept, seconds, files)."""
    folder = Path(folder)
    problem = check_encoded(folder, tokenizer.vocab_size, max_positions, top_k) if folder.exists() else "missing"
    if problem is not None:
        if pairs is None:
            raise PipelineError(f"{folder}: {problem}; remove the folder and run again (it is encoded anew)")
        if folder.exists() and log is not None:
            log(f"{folder}: {problem}; encoding the training pairs again")
        _encode(tokenizer, pairs, folder, max_positions, top_k, on_pairs)
    meta = json.loads((folder / _META).read_text(encoding="utf-8"))
    sides = {}
    for side in ("src", "tgt"):
        offsets = np.load(folder / f"{side}.offsets.npy", allow_pickle=False)
        ids = (
            np.memmap(folder / f"{side}.ids", dtype=meta["dtype"], mode="r")
            if offsets[-1] > 0
            else np.zeros(0, dtype=meta["dtype"])
        )  # numpy cannot map an empty file
        sides[side] = Ragged(ids, offsets)
    soft = None
    if top_k is not None:
        soft = SoftTargets(top_k, np.load(folder / _TOP_K_ROWS, allow_pickle=False))
    return Corpus(sides["src"], sides["tgt"], soft), meta


def check_encoded(folder: Path, vocab_size: int, max_positions: int, top_k=None) -> str | None:
    """None when `folder` holds a whole encoding for this vocabulary and these positions (with the
    rows of `top_k` where given); else what is wrong, in a few words. Reads every file once (its
    sha256, ~1.2 GB/s here): 0.36 s for 4M pairs (376 MB), a few ms for Multi30k's 29k."""
    try:
        meta = json.loads(read_bounded(folder / _META, 1 << 20).decode("utf-8"))
    except FileNotFoundError:
        return f"no {_META} (its encoding did not finish)"
    except (OSError, UnsafeFile, ValueError) as exc:
        return f"{_META} is unreadable ({reason(exc)})"
    if not isinstance(meta, dict) or not isinstance(meta.get("files"), dict):
        return f"{_META} lists no files (written by an older version)"
    expected = {"vocab_size": vocab_size, "max_positions": max_positions}
    for key, value in expected.items():
        if meta.get(key) != value:
            return f"encoded for {key} {meta.get(key)!r}, not {value}"
    pairs, dtype = meta.get("pairs"), meta.get("dtype")
    if type(pairs) is not int or pairs < 0 or dtype not in ("uint16", "int32"):
        return f"{_META} holds no pair count or id type"
    names = {f"{side}.{part}" for side in ("src", "tgt") for part in ("ids", "offsets.npy")}
    if top_k is not None:
        names.add(_TOP_K_ROWS)
    if not names <= set(meta["files"]):
        return f"{_META} does not list {', '.join(sorted(names - set(meta['files'])))}"
    problems = listed_file_problems(folder, {n: meta["files"][n] for n in names}, record=_META, folder="folder")
    if problems:
        return problems[0].replace(f"{folder}/", "")
    # The files are the ones written; what they say must still hang together (a record from a
    # build that went wrong is refused too).
    for side in ("src", "tgt"):
        offsets = np.load(folder / f"{side}.offsets.npy", allow_pickle=False)
        ids_bytes = meta["files"][f"{side}.ids"]["bytes"]
        if (
            offsets.dtype != np.int64
            or offsets.shape != (pairs + 1,)
            or offsets[0] != 0
            or np.any(np.diff(offsets) < 0)
            or int(offsets[-1]) * np.dtype(dtype).itemsize != ids_bytes
        ):
            return f"{side}.offsets.npy does not fit {pairs} pairs and {ids_bytes} bytes of ids"
    if top_k is not None:
        rows = np.load(folder / _TOP_K_ROWS, allow_pickle=False)
        if rows.shape != (pairs,) or (len(rows) and (rows.min() < -1 or rows.max() >= len(top_k))):
            return f"{_TOP_K_ROWS} does not fit {pairs} pairs and {len(top_k)} stored distributions"
    return None


def _encode(tokenizer, pairs, folder: Path, max_positions: int, top_k, on_pairs) -> None:
    start = time.perf_counter()
    tmp = folder.with_name(folder.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
    lengths: dict[str, list[np.ndarray]] = {"src": [], "tgt": []}
    digests = {"src": hashlib.sha256(), "tgt": hashlib.sha256()}  # of the ids as they are written
    rows: list[np.ndarray] = []
    read = 0
    with open(tmp / "src.ids", "wb") as src_file, open(tmp / "tgt.ids", "wb") as tgt_file:
        for block in _blocks(pairs, ENCODE_BLOCK):
            read += len(block)
            src_ids = tokenizer.encode([s for s, _, _ in block])
            tgt_ids = tokenizer.encode_target([t for _, t, _ in block])
            kept_src, kept_tgt, kept_rows = [], [], []
            for s, t, (_, _, row) in zip(src_ids, tgt_ids, block):
                pair = _fitted(s, t, max_positions - 1, True, tokenizer.eos_id)
                if pair is not None:
                    kept_src.append(pair[0])
                    kept_tgt.append(pair[1])
                    kept_rows.append(row)
            for side, out, kept in (("src", src_file, kept_src), ("tgt", tgt_file, kept_tgt)):
                lengths[side].append(np.fromiter((len(x) for x in kept), dtype=np.int64, count=len(kept)))
                data = np.fromiter((i for x in kept for i in x), dtype=dtype).tobytes()
                out.write(data)
                digests[side].update(data)
            rows.append(np.asarray(kept_rows, dtype=np.int64))
            if on_pairs:
                on_pairs(len(block))
    files = {
        f"{side}.ids": {"sha256": digests[side].hexdigest(), "bytes": (tmp / f"{side}.ids").stat().st_size}
        for side in ("src", "tgt")
    }
    side_lengths = {side: np.concatenate(parts) if parts else np.zeros(0, np.int64) for side, parts in lengths.items()}
    for side, side_length in side_lengths.items():
        offsets = np.zeros(len(side_length) + 1, dtype=np.int64)
        np.cumsum(side_length, out=offsets[1:])
        np.save(tmp / f"{side}.offsets.npy", offsets)
    kept_count = len(side_lengths["tgt"])
    if top_k is not None:
        store_rows = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        # A stored distribution fits a pair when it has one entry per target word plus EOS.
        fits = (store_rows >= 0) & (top_k.lengths[np.maximum(store_rows, 0)] == side_lengths["tgt"] + 1)
        np.save(tmp / _TOP_K_ROWS, np.where(fits, store_rows, -1))
    for path in tmp.iterdir():
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        if path.name not in files:
            files[path.name] = file_record(path)
    meta = {
        "pairs_read": read,
        "pairs": kept_count,
        "dropped_too_long": read - kept_count,
        "dtype": np.dtype(dtype).name,
        "max_positions": max_positions,
        "vocab_size": tokenizer.vocab_size,
        "seconds": round(time.perf_counter() - start, 2),
        "files": files,
    }
    write_json_atomic(tmp / _META, meta)  # last: a folder without it is not a whole encoding
    if folder.exists():
        shutil.rmtree(folder)
    os.rename(tmp, folder)


def _blocks(items: Iterable, size: int) -> Iterator[list]:
    block = []
    for item in items:
        block.append(item)
        if len(block) == size:
            yield block
            block = []
    if block:
        yield block
