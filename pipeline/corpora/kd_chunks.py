"""The KD corpus's chunks and how they become its files: each chunk of teacher translations (the
hypothesis closest to the reference where the recipe selects so, the teacher's distributions where
it keeps them), and the merge of all of them into kd.src/kd.tgt (and the distributions) in the
training split's order, written as read and checked line-aligned (pipeline/training/kd_corpus.py
translates; distilled.py reads what this writes)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from mt_runtime.lines import one_line

from ..engine.errors import StageFailed
from .distilled import TopKWriter, load_top_k, write_top_k
from .splits import check_aligned


def merge_chunks(job: dict, chunks: list[list[int]], sources, chunks_dir: Path, out: Path, work: Path) -> dict:
    """kd.src/kd.tgt (and the distributions) in the training split's order, from the chunks in
    length order, holding per sentence only where its translation is: the translations are
    appended to one file as the chunks come, then read back in order; distributions are written
    in place (TopKWriter)."""
    import numpy as np

    count = len(sources)
    starts, sizes = np.zeros(count, dtype=np.int64), np.zeros(count, dtype=np.int64)
    nonempty = np.zeros(count, dtype=bool)
    top_k_lengths = np.zeros(count, dtype=np.int64) if job.get("top_k") else None
    merged = {
        "top_k_dropped": 0,
        "selected": {"not_top": 0, "sentence_bleu_top": 0.0, "sentence_bleu_selected": 0.0},
        "metric": None,
        "kept": 0,
        "src_words": 0,
        "tgt_words": 0,
    }
    closest = job.get("selection", "top") == "closest_to_reference"
    ids_dtype = np.int16
    with open(work / "translations.txt", "wb") as f:
        for c, index in enumerate(chunks):
            part = json.loads((chunks_dir / f"{c:05d}.json").read_text(encoding="utf-8"))
            for i, h in zip(index, part["hyps"]):
                h = one_line(h)  # a piece holding a line break must not add a line to kd.tgt
                encoded = h.encode("utf-8")
                starts[i], sizes[i], nonempty[i] = f.tell(), len(encoded), bool(h.strip())
                f.write(encoded)
            if top_k_lengths is not None:
                merged["top_k_dropped"] += part["top_k_dropped"]
                with np.load(chunks_dir / f"{c:05d}.npz") as arrays:
                    top_k_lengths[index] = arrays["lengths"]
                    ids_dtype = np.promote_types(ids_dtype, arrays["ids"].dtype)
            for key in merged["selected"] if closest else ():
                merged["selected"][key] += part[key]
            merged["metric"] = part.get("metric") or merged["metric"]
    keep = np.flatnonzero(nonempty)
    merged["kept"] = len(keep)
    fd = os.open(work / "translations.txt", os.O_RDONLY)
    try:
        with open(out / "kd.src", "w", encoding="utf-8") as fs, open(out / "kd.tgt", "w", encoding="utf-8") as ft:
            for i in keep.tolist():
                source, translation = one_line(sources[i]), os.pread(fd, int(sizes[i]), int(starts[i])).decode("utf-8")
                fs.write(source + "\n")
                ft.write(translation + "\n")
                merged["src_words"] += len(source.split())
                merged["tgt_words"] += len(translation.split())
    finally:
        os.close(fd)
    written = check_aligned(out / "kd.src", out / "kd.tgt")
    if written != len(keep):
        raise StageFailed(f"{out / 'kd.src'} and {out / 'kd.tgt'} have {written} lines for {len(keep)} translations")
    if top_k_lengths is not None:
        row_of = np.full(count, -1, dtype=np.int64)
        row_of[keep] = np.arange(len(keep))
        writer = TopKWriter(out, top_k_lengths[keep], job["top_k"], ids_dtype)
        try:
            for c, index in enumerate(chunks):
                for i, arrays in zip(index, load_top_k(chunks_dir / f"{c:05d}.npz")):
                    if arrays is not None and row_of[i] >= 0:
                        writer.put(int(row_of[i]), *arrays)
        finally:
            writer.close()
    return merged


def save_top_k(path: Path, done: list, tokenizer) -> int:
    """One chunk's teacher distributions, in its sentence order (see write_top_k), none for a
    sentence whose text does not encode back to the ids the teacher wrote. Returns how many have none."""
    import numpy as np

    texts = [text for text, _, _ in done]
    pairs = []
    for (text, written, top), encoded in zip(done, tokenizer.encode_target(texts) if texts else []):
        if top is None or not text.strip() or encoded != written:
            pairs.append(None)
            continue
        top_ids, top_logp = top
        p = np.exp(top_logp - top_logp.max(1, keepdims=True))
        pairs.append((top_ids, (p / p.sum(1, keepdims=True)).astype(np.float16)))
    write_top_k(path, pairs)
    return sum(p is None for p in pairs)


def closest_to_reference(nbest: list[list[str]], references: list[str]) -> dict:
    """Of each sentence's hypotheses (best first), the one with the highest sentence BLEU against
    its reference (the earlier on ties), with sums for the manifest."""
    from sacrebleu.metrics import BLEU

    bleu = BLEU(effective_order=True)  # exp smoothing; n-gram orders a short sentence lacks are skipped
    part = {"hyps": [], "not_top": 0, "sentence_bleu_top": 0.0, "sentence_bleu_selected": 0.0}
    for hyps, reference in zip(nbest, references):
        scores = [bleu.sentence_score(h, [reference]).score for h in hyps]
        best = max(range(len(hyps)), key=lambda j: (scores[j], -j))
        part["hyps"].append(hyps[best])
        part["not_top"] += best != 0
        part["sentence_bleu_top"] += scores[0]
        part["sentence_bleu_selected"] += scores[best]
    part["metric"] = f"sentence {bleu.get_signature()}" if nbest else None  # known once something is scored
    return part
