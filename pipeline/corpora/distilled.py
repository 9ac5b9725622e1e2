"""What a model learns from: the training split's references, or the teacher's translations
(the kd_corpus artifact: kd.src/kd.tgt, and with word-level distillation the teacher's top-k
distributions in TOP_K_FILE), mixed with a share of the references. The kd_corpus stage writes
these files; training and pruning's fine-tune read them, as streams: the text is encoded on
the way (pipeline/corpora/encoded.py) and the distributions are memory-mapped."""

from __future__ import annotations

import itertools
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from mt_runtime.files import reason

from ..engine.errors import IntegrityError, StageFailed
from .splits import LineIndex, check_aligned, split_lines

# The kd_corpus artifact's stored distributions: TOP_K_FILE + ".lengths.npy" / ".ids.npy" / ".probs.npy".
TOP_K_FILE = "kd.topk"


def write_top_k(path: Path, pairs: list) -> None:
    """One chunk of the teacher's distributions, per sentence its k most likely words at each
    target position (EOS included) and their probabilities renormalised over the k, or None
    (hard labels only): one file of three arrays, lengths [sentences], ids [positions, k]
    (int16 when the vocabulary allows), probs (float16)."""
    import numpy as np

    present = [p for p in pairs if p is not None]
    k = present[0][0].shape[1] if present else 0
    ids = np.concatenate([p[0] for p in present]) if present else np.zeros((0, k), np.int32)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(
        tmp,
        lengths=np.array([0 if p is None else len(p[0]) for p in pairs], dtype=np.int64),
        ids=ids.astype(np.int16 if ids.size == 0 or ids.max() <= np.iinfo(np.int16).max else np.int32),
        probs=np.concatenate([p[1] for p in present]) if present else np.zeros((0, k), np.float16),
    )
    os.replace(tmp, path)


def chunk_problem(chunks_dir: Path, chunk: int, index: list[int], top_k: bool) -> str | None:
    """None when a KD corpus chunk saved by an earlier run is whole: its record (NNNNN.json, written
    last) reads, covers these sentences with one translation each, and with `top_k` lists the
    size and sha256 of its distributions (NNNNN.npz), which match; else what is wrong."""
    from ..engine.store import listed_file_problems

    record = chunks_dir / f"{chunk:05d}.json"
    try:
        part = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"{record.name} is unreadable ({reason(exc)})"
    hyps = part.get("hyps") if isinstance(part, dict) else None
    if (
        part.get("index") != index
        or not isinstance(hyps, list)
        or len(hyps) != len(index)
        or not all(isinstance(h, str) for h in hyps)
    ):
        return f"{record.name} does not hold one translation for each of its {len(index)} sentences"
    if top_k:
        listed = part.get("top_k_file")
        if not isinstance(listed, dict):
            return f"{record.name} lists no distributions file"
        problems = listed_file_problems(chunks_dir, {f"{chunk:05d}.npz": listed}, record=record.name, folder="folder")
        if problems:
            return problems[0].replace(f"{chunks_dir}/", "")
    return None


def load_top_k(path: Path) -> list:
    """write_top_k's file as per-sentence (ids, probs) pairs, None where a sentence has none."""
    import numpy as np

    with np.load(path) as f:
        lengths, ids, probs = f["lengths"], f["ids"], f["probs"]
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return [(ids[a:b], probs[a:b]) if b > a else None for a, b in zip(bounds[:-1], bounds[1:])]


class TopKStore:
    """The kd_corpus artifact's distributions for all its pairs, memory-mapped: row r is pair r's
    (ids [positions, k], probs [positions, k]), or None where it has none (length 0)."""

    def __init__(self, folder: Path):
        import numpy as np

        try:
            self.lengths, self.ids, self.probs = (
                np.load(folder / f"{TOP_K_FILE}.{part}.npy", mmap_mode="r", allow_pickle=False)
                for part in ("lengths", "ids", "probs")
            )
        except (OSError, ValueError) as exc:
            raise IntegrityError(f"{folder}: {TOP_K_FILE}: unreadable ({reason(exc)})") from None
        # The three arrays must hang together before a row is cut from them (sizes only: their
        # content is the artifact's, checked against its manifest before use).
        lengths, ids = self.lengths, self.ids
        if (
            lengths.ndim != 1
            or lengths.dtype.kind not in "iu"
            or ids.ndim != 2
            or ids.dtype.kind not in "iu"
            or self.probs.shape != ids.shape
            or (len(lengths) and int(lengths.min()) < 0)
            or int(lengths.sum()) != ids.shape[0]
        ):
            raise IntegrityError(
                f"{folder}: {TOP_K_FILE}: lengths {lengths.shape}, ids {ids.shape} and probs "
                f"{self.probs.shape} do not fit together"
            )
        self.offsets = np.zeros(len(self.lengths) + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=self.offsets[1:])
        self.k = int(self.ids.shape[1])

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, row: int):
        if not 0 <= row < len(self):
            raise IndexError(row)
        a, b = self.offsets[row], self.offsets[row + 1]
        return (self.ids[a:b], self.probs[a:b]) if b > a else None


class TopKWriter:
    """Writes a TopKStore whose rows arrive in any order: the row lengths are known first (from
    the chunks' length arrays), so each row is written in place, and nothing is held but them."""

    def __init__(self, folder: Path, lengths, k: int, ids_dtype):
        import numpy as np

        self.k = k
        lengths = np.asarray(lengths, dtype=np.int64)
        self.offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.offsets[1:])
        positions = int(self.offsets[-1])
        np.save(folder / f"{TOP_K_FILE}.lengths.npy", lengths)
        self.files = {}
        for part, dtype in (("ids", np.dtype(ids_dtype)), ("probs", np.dtype(np.float16))):
            f = open(folder / f"{TOP_K_FILE}.{part}.npy", "wb")
            np.lib.format.write_array_header_1_0(
                f, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (positions, k)}
            )
            header = f.tell()
            f.truncate(header + positions * k * dtype.itemsize)
            self.files[part] = (f, header, dtype)

    def put(self, row: int, ids, probs) -> None:
        for part, values in (("ids", ids), ("probs", probs)):
            f, header, dtype = self.files[part]
            os.pwrite(
                f.fileno(),
                values.astype(dtype, copy=False).tobytes(),
                header + int(self.offsets[row]) * self.k * dtype.itemsize,
            )

    def close(self) -> None:
        for f, _, _ in self.files.values():
            f.close()


@dataclass
class TrainingText:
    """What a model learns from, as a stream: `pairs()` yields (source, target, row of the
    teacher's stored distributions in `top_k`, or -1) and may be called again for another pass."""

    pairs: Callable[[], Iterator[tuple[str, str, int]]]
    top_k: TopKStore | None
    info: dict


def training_pairs(
    data: Path, kd: Path | None, reference_mix: float, seed: int, stored_distributions: bool, log
) -> TrainingText:
    """The (source, target) text the model learns from: the data's references, or the teacher's
    translations (sequence-level KD, the kd_corpus artifact `kd`) mixed with `reference_mix` of as
    many references (drawn with `seed`); with `stored_distributions` (word-level distillation from
    the KD corpus), the teacher's stored distributions for the translations (none for the
    references). Nothing is read whole."""
    if kd is None:
        count = check_aligned(data / "train.src", data / "train.tgt")
        return TrainingText(
            lambda: _with_row(_pairs_of(data, "train"), -1), None, {"train_pairs": count, "source": "references"}
        )
    kd_count, ref_count = (
        check_aligned(kd / "kd.src", kd / "kd.tgt"),
        check_aligned(data / "train.src", data / "train.tgt"),
    )
    extra = int(round(float(reference_mix or 0.0) * kd_count))
    picked = random.Random(seed).sample(range(ref_count), min(extra, ref_count)) if extra else []
    info = {
        "train_pairs": kd_count + len(picked),
        "source": "kd_corpus",
        "kd_pairs": kd_count,
        "reference_pairs_mixed": len(picked),
    }
    log(f"training on {kd_count} teacher translations" + (f" + {len(picked)} references" if picked else ""))
    top_k = TopKStore(kd) if stored_distributions else None
    if top_k is not None and len(top_k) != kd_count:
        raise StageFailed(
            f"{kd / TOP_K_FILE}.lengths.npy has {len(top_k)} rows but {kd / 'kd.src'} has {kd_count} "
            "lines: the teacher's distributions must be line-aligned with its translations"
        )

    def pairs() -> Iterator[tuple[str, str, int]]:
        rows = itertools.count() if top_k is not None else itertools.repeat(-1)
        for (s, t), row in zip(_pairs_of(kd, "kd"), rows):
            yield s, t, row
        if picked:
            with LineIndex(data / "train.src") as src, LineIndex(data / "train.tgt") as tgt:
                for i in picked:
                    yield src[i], tgt[i], -1

    return TrainingText(pairs, top_k, info)


def encoded_training_set(text: TrainingText, tokenizer, max_positions: int, work: Path, log, progress, rank: int = 0):
    """The training pairs encoded into work/encoded (once: a resumed run opens them after checking
    them, and encodes them again where they fail), memory-mapped; rank 0 encodes while the others
    wait. Returns the corpus and `text.info` with the encoding's record."""
    from ..engine.workers import world_size
    from .encoded import encode_to_disk

    folder = work / "encoded"
    if rank == 0:
        with progress("encoding the training pairs", total=text.info["train_pairs"], unit="pairs") as bar:
            corpus, record = encode_to_disk(
                tokenizer, text.pairs(), folder, max_positions, text.top_k, bar.advance, log=log
            )
    if world_size() > 1:
        import torch.distributed as dist

        dist.barrier()
    if rank != 0:
        corpus, record = encode_to_disk(tokenizer, None, folder, max_positions, text.top_k)
    dropped = record["dropped_too_long"]
    log(
        f"encoded {record['pairs']} training pairs in {record['seconds']:.1f} s"
        + (f" ({dropped} longer than the model's {max_positions} positions dropped)" if dropped else "")
    )
    return corpus, {**text.info, "encode_seconds": record["seconds"], "pairs_too_long": dropped}


def _pairs_of(folder: Path, name: str) -> Iterator[tuple[str, str]]:
    return zip(split_lines(folder, name, "src"), split_lines(folder, name, "tgt"))


def _with_row(pairs: Iterable[tuple[str, str]], row: int) -> Iterator[tuple[str, str, int]]:
    return ((s, t, row) for s, t in pairs)


def stored_word_level(config: dict) -> dict | None:
    """The word-level distillation settings of a train job or model config if it learns from the
    KD corpus's stored distributions (pruning's fine-tune then does too), else None."""
    word_level = config.get("word_level") or {}
    return word_level if word_level.get("enabled") and word_level.get("from_kd_corpus") else None
