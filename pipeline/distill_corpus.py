"""What a model learns from: the training split's references, or the teacher's translations
(the kd_corpus artifact: kd.src/kd.tgt, and with word-level distillation the teacher's top-k
distributions in TOP_K_FILE), mixed with a share of the references. The kd_corpus stage writes
these files; training and pruning's fine-tune read them."""

from __future__ import annotations

import os
import random
from pathlib import Path

from .corpus import read_split

TOP_K_FILE = "kd.topk.npz"


def write_top_k(path: Path, pairs: list) -> None:
    """Per sentence, the teacher's k most likely words at each target position (EOS included) and
    their probabilities renormalised over the k, or None (hard labels only): one file of three
    arrays, lengths [sentences], ids [positions, k] (int16 when the vocabulary allows), probs (float16)."""
    import numpy as np

    present = [p for p in pairs if p is not None]
    k = present[0][0].shape[1] if present else 0
    ids = np.concatenate([p[0] for p in present]) if present else np.zeros((0, k), np.int32)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, lengths=np.array([0 if p is None else len(p[0]) for p in pairs], dtype=np.int64),
             ids=ids.astype(np.int16 if ids.size == 0 or ids.max() <= np.iinfo(np.int16).max else np.int32),
             probs=np.concatenate([p[1] for p in present]) if present else np.zeros((0, k), np.float16))
    os.replace(tmp, path)


def load_top_k(path: Path) -> list:
    """write_top_k's file as per-sentence (ids, probs) pairs, None where a sentence has none."""
    import numpy as np

    with np.load(path) as f:
        lengths, ids, probs = f["lengths"], f["ids"], f["probs"]
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return [(ids[a:b], probs[a:b]) if b > a else None for a, b in zip(bounds[:-1], bounds[1:])]


def training_pairs(job: dict, log) -> tuple[list[str], list[str], list | None, dict]:
    """The (source, target) text the model learns from: references, or the teacher's
    translations (sequence-level KD) optionally mixed with a share of the references; with
    word-level distillation from the KD corpus, per pair the teacher's stored distributions
    (None for the references)."""
    data = Path(job["data"])
    src, tgt = read_split(data, "train")
    if job["kd_corpus"] is None:
        return src, tgt, None, {"train_pairs": len(src), "source": "references"}
    kd = Path(job["kd_corpus"])
    kd_src, kd_tgt = read_split(kd, "kd")
    mix = float(job.get("reference_mix") or 0.0)
    extra = int(round(mix * len(kd_src)))
    picked = random.Random(job["train"]["seed"]).sample(range(len(src)), min(extra, len(src))) if extra else []
    info = {"train_pairs": len(kd_src) + len(picked), "source": "kd_corpus", "kd_pairs": len(kd_src),
            "reference_pairs_mixed": len(picked)}
    log(f"training on {len(kd_src)} teacher translations" + (f" + {len(picked)} references" if picked else ""))
    soft = load_top_k(kd / TOP_K_FILE) + [None] * len(picked) if stored_word_level(job) else None
    return kd_src + [src[i] for i in picked], kd_tgt + [tgt[i] for i in picked], soft, info


def stored_word_level(config: dict) -> dict | None:
    """The word-level distillation settings of a train job or model config if it learns from the
    KD corpus's stored distributions (pruning's fine-tune then does too), else None."""
    word_level = config.get("word_level") or {}
    return word_level if word_level.get("enabled") and word_level.get("from_kd_corpus") else None
