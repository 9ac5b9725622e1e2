"""Sequence-level knowledge distillation corpus (Kim & Rush, 2016): the teacher translates the
training sources with beam search; students then learn from these translations. With
`selection: closest_to_reference` (their Seq-Inter) the target is, of the teacher's beam, the
hypothesis with the highest sentence BLEU against the human reference.

An artifact of its own, so changing only the student re-uses it. Work is done in length-sorted
chunks saved as they finish, so a killed run resumes where it stopped; under torchrun
(`--nproc N`) the chunks are shared out across processes and merged in order.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ..context import StageContext
from ..corpus import read_split
from ..distill_corpus import TOP_K_FILE, load_top_k, write_top_k
from ..distributed import launch, worker_main, world_size
from ..recipe import KDCorpusConfig, dump_config

# Sentences per saved chunk: what a resumed run keeps, and the unit processes share under
# torchrun. Results do not depend on it beyond float noise (it bounds the batches), so it is
# not in the fingerprint; tests set a small one (PIPELINE_KD_CHUNK) to have several to share.
CHUNK = 1024


def run(ctx: StageContext) -> dict:
    cfg: KDCorpusConfig = ctx.settings
    job = {**dump_config(cfg), "role": "kd_corpus", "data": str(ctx.input("data").path),
           "teacher": str(ctx.input("teacher").path), "out": str(ctx.out), "work": str(ctx.work)}
    if ctx.nproc > 1:
        return launch(ctx, "pipeline.stages.kd_corpus", job)
    return translate_job(job, ctx.log, ctx.progress)


def translate_job(job: dict, log, progress, rank: int = 0, device: str | None = None) -> dict:
    import torch

    from model.torch_decoder import TorchTranslator

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    world = world_size()
    if device == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    src, ref = read_split(Path(job["data"]), "train")
    if job.get("max_sentences"):
        src, ref = src[: job["max_sentences"]], ref[: job["max_sentences"]]
    closest = job.get("selection", "top") == "closest_to_reference"
    translator = TorchTranslator.load(Path(job["teacher"]), device=device)
    chunks_dir = Path(job["work"]) / "chunks"
    chunks_dir.mkdir(parents=True, exist_ok=True)
    tokenized = translator.tokenizer.encode(src)
    order = sorted(range(len(src)), key=lambda i: len(tokenized[i]))
    chunk = int(os.environ.get("PIPELINE_KD_CHUNK", CHUNK))
    chunks = [order[i: i + chunk] for i in range(0, len(order), chunk)]
    mine = [c for c in range(len(chunks)) if c % world == rank]
    todo = [c for c in mine if not (chunks_dir / f"{c:05d}.json").is_file()]
    if len(todo) < len(mine):
        log(f"resuming: {len(mine) - len(todo)} of {len(mine)} chunks already translated")
    t0 = time.perf_counter()
    done_sentences = 0
    with progress("teacher translating", total=sum(len(chunks[c]) for c in todo) * world, unit="sentences") as bar:
        for c in todo:
            idx = chunks[c]
            settings = dict(beam=job["beam"], length_penalty=job["length_penalty"], batch_tokens=job["batch_tokens"],
                            on_batch=lambda n: bar.advance(n * world))
            part: dict = {"index": idx}
            if closest:
                nbest = translator.translate_nbest([src[i] for i in idx], **settings)
                part.update(closest_to_reference(nbest, [ref[i] for i in idx]))
            elif job.get("top_k"):
                done = translator.translate_greedy_top_k([src[i] for i in idx], job["top_k"],
                                                         batch_tokens=job["batch_tokens"], on_batch=settings["on_batch"])
                part["hyps"] = [text for text, _, _ in done]
                part["top_k_dropped"] = save_top_k(chunks_dir / f"{c:05d}.npz", done, translator.tokenizer)
            else:
                part["hyps"] = translator.translate([src[i] for i in idx], **settings)
            tmp = chunks_dir / f"{c:05d}.json.tmp"
            tmp.write_text(json.dumps(part), encoding="utf-8")
            os.replace(tmp, chunks_dir / f"{c:05d}.json")
            done_sentences += len(idx)
    seconds = time.perf_counter() - t0
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
    if rank != 0:
        return {}
    translations = [""] * len(src)
    selected = {"not_top": 0, "sentence_bleu_top": 0.0, "sentence_bleu_selected": 0.0}
    metric = None
    top_k_parts, top_k_dropped = [None] * len(src), 0
    for c in range(len(chunks)):
        part = json.loads((chunks_dir / f"{c:05d}.json").read_text(encoding="utf-8"))
        for i, h in zip(part["index"], part["hyps"]):
            translations[i] = h
        if job.get("top_k"):
            top_k_dropped += part["top_k_dropped"]
            for i, arrays in zip(part["index"], load_top_k(chunks_dir / f"{c:05d}.npz")):
                top_k_parts[i] = arrays
        for key in selected if closest else ():
            selected[key] += part[key]
        metric = part.get("metric") or metric
    out = Path(job["out"])
    keep = [i for i, h in enumerate(translations) if h.strip()]
    with open(out / "kd.src", "w", encoding="utf-8") as fs, open(out / "kd.tgt", "w", encoding="utf-8") as ft:
        for i in keep:
            fs.write(src[i] + "\n")
            ft.write(translations[i] + "\n")
    if job.get("top_k"):
        write_top_k(out / TOP_K_FILE, [top_k_parts[i] for i in keep])
    rate = done_sentences * world / seconds if seconds > 0 and done_sentences else None
    log(f"translated {len(src)} sentences" + (f" at {rate:.1f} sentences/s" if rate else ""))
    src_words = sum(len(src[i].split()) for i in keep)
    tgt_words = sum(len(translations[i].split()) for i in keep)
    metrics = {"sentences": len(keep), "empty_translations": len(src) - len(keep), "beam": job["beam"],
               "seconds": round(seconds, 1), "sentences_per_s": round(rate, 2) if rate else None,
               "processes": world, "device": device, "length_ratio": round(tgt_words / max(1, src_words), 3),
               "threads": torch.get_num_threads() if device == "cpu" else None, "precision": "float32"}
    if job.get("top_k"):
        # A translation whose text the tokenizer splits differently from how the teacher wrote it
        # would misalign its distributions with the student's targets: those pairs train on hard labels.
        metrics["top_k"] = {"k": job["top_k"], "file": TOP_K_FILE, "pairs_without": top_k_dropped}
    if closest:
        n = max(1, len(src))
        metrics["selection"] = {
            "kind": "closest_to_reference", "not_top_fraction": round(selected["not_top"] / n, 4),
            "mean_sentence_bleu_top": round(selected["sentence_bleu_top"] / n, 2),
            "mean_sentence_bleu_selected": round(selected["sentence_bleu_selected"] / n, 2),
            "metric": metric}
        log(f"closest to the reference: not the teacher's best for {selected['not_top'] / n:.1%} of sentences; "
            f"mean sentence BLEU {metrics['selection']['mean_sentence_bleu_top']} -> "
            f"{metrics['selection']['mean_sentence_bleu_selected']}")
    return metrics


def save_top_k(path: Path, done: list, tokenizer) -> int:
    """One chunk's teacher distributions, in its sentence order (see write_top_k), none for a
    sentence whose text does not encode back to the ids the teacher wrote. Returns how many have none."""
    import numpy as np

    texts = [text for text, _, _ in done]
    pairs = []
    for (text, written, top), encoded in zip(done, tokenizer.encode(texts) if texts else []):
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


if __name__ == "__main__":
    worker_main(translate_job)
