"""The sequence-level knowledge distillation corpus (Kim & Rush, 2016): the teacher translates the
training sources with beam search; students then learn from these translations. With
`selection: closest_to_reference` (their Seq-Inter) the target is, of the teacher's beam, the
hypothesis with the highest sentence BLEU against the human reference.

An artifact of its own, so changing only the student re-uses it. Work is done in length-sorted
chunks saved as they finish, so a killed run resumes where it stopped; under torchrun
(`--nproc N`) the chunks are shared out across processes and merged in order. Nothing is held
whole: sources are read by line offset, and the merge writes as it reads. Every translation is
written on one line whatever the teacher's pieces hold (mt_runtime/lines.py), and the two files are
counted once written: kd.src and kd.tgt are line-aligned or the stage fails.

The chunks and their merge are pipeline/corpora/kd_chunks.py's. Run as `python -m
pipeline.training.kd_corpus JOB.json` this module is one torchrun worker (engine/workers.py).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path

from ..corpora.distilled import TOP_K_FILE, chunk_problem
from ..corpora.encoded import ENCODE_BLOCK
from ..corpora.kd_chunks import closest_to_reference, merge_chunks, save_top_k
from ..corpora.splits import LineIndex, check_aligned, split_lines
from ..engine.errors import UserInputError
from ..engine.store import file_record
from ..engine.workers import worker_main, world_size
from ..measure.translators import is_imported_teacher

# Sentences per saved chunk: what a resumed run keeps, and the unit processes share under
# torchrun. Results do not depend on it beyond float noise (it bounds the batches), so it is
# not in the fingerprint; tests set a small one (PIPELINE_KD_CHUNK) to have several to share.
CHUNK = 1024


def translate_job(job: dict, log, progress, rank: int = 0, device: str | None = None) -> dict:
    import numpy as np
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    world = world_size()
    if device == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    data, work = Path(job["data"]), Path(job["work"])
    closest = job.get("selection", "top") == "closest_to_reference"
    translator = teacher_translator(job, device, work, log)
    # What the student will encode the translations with: a stored distribution is kept only
    # where that gives back the ids the teacher wrote.
    student_side = translator.tokenizer
    if job.get("top_k") and is_imported_teacher(Path(job["teacher"])):
        from mt_runtime.subword import SubwordTokenizer

        from model.hf_tokenizer import teacher_tokenizers

        student_side = SubwordTokenizer(*teacher_tokenizers(Path(job["teacher"]) / "checkpoint"))
    chunks_dir = work / "chunks"
    chunks_dir.mkdir(parents=True, exist_ok=True)
    if closest:
        check_aligned(data / "train.src", data / "train.tgt")
    sources = LineIndex(data / "train.src", job.get("max_sentences"))
    references = LineIndex(data / "train.tgt", job.get("max_sentences")) if closest else None
    order = np.argsort(
        _source_lengths(translator.tokenizer, data, len(sources), work, rank, world, progress), kind="stable"
    )  # stable: sentences of one length keep their order
    chunk = int(os.environ.get("PIPELINE_KD_CHUNK", CHUNK))
    chunks = [order[i : i + chunk].tolist() for i in range(0, len(order), chunk)]
    mine = [c for c in range(len(chunks)) if c % world == rank]
    todo = []
    for c in mine:  # a chunk an earlier run saved is kept where it is whole, translated again where not
        problem = chunk_problem(chunks_dir, c, chunks[c], bool(job.get("top_k")))
        if problem and (chunks_dir / f"{c:05d}.json").exists():
            log(f"{chunks_dir}: {problem}; translating that chunk again")
        todo += [c] if problem else []
    if len(todo) < len(mine):
        log(f"resuming: {len(mine) - len(todo)} of {len(mine)} chunks already translated")
    t0 = time.perf_counter()
    done_sentences = 0
    with progress("teacher translating", total=sum(len(chunks[c]) for c in todo) * world, unit="sentences") as bar:
        for c in todo:
            idx = chunks[c]
            texts = [sources[i] for i in idx]
            settings = dict(
                beam=job["beam"],
                length_penalty=job["length_penalty"],
                batch_tokens=job["batch_tokens"],
                on_batch=lambda n: bar.advance(n * world),
            )
            part: dict = {"index": idx}
            if closest:
                nbest = translator.translate_nbest(texts, **settings)
                part.update(closest_to_reference(nbest, [references[i] for i in idx]))
            elif job.get("top_k"):
                done = translator.translate_greedy_top_k(
                    texts, job["top_k"], batch_tokens=job["batch_tokens"], on_batch=settings["on_batch"]
                )
                part["hyps"] = [text for text, _, _ in done]
                part["top_k_dropped"] = save_top_k(chunks_dir / f"{c:05d}.npz", done, student_side)
                part["top_k_file"] = file_record(chunks_dir / f"{c:05d}.npz")
            else:
                part["hyps"] = translator.translate(texts, **settings)
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
    merged = merge_chunks(job, chunks, sources, chunks_dir, Path(job["out"]), work)
    rate = done_sentences * world / seconds if seconds > 0 and done_sentences else None
    log(
        f"translated {len(sources)} sentences"
        + (f" at {rate:.1f} sentences/s" if rate else "")
        + f" ({getattr(translator, 'runtime', 'torch')})"
    )
    metrics = {
        "sentences": merged["kept"],
        "empty_translations": len(sources) - merged["kept"],
        "beam": job["beam"],
        "seconds": round(seconds, 1),
        "sentences_per_s": round(rate, 2) if rate else None,
        "processes": world,
        "device": device,
        "length_ratio": round(merged["tgt_words"] / max(1, merged["src_words"]), 3),
        "threads": torch.get_num_threads() if device == "cpu" else None,
        "precision": "float32",
    }
    if is_imported_teacher(Path(job["teacher"])):
        metrics["decoder"] = translator.runtime
        metrics["decoders"] = compare_decoders(job, translator, sources, device, work, log)
    if job.get("top_k"):
        # A translation whose text the tokenizer splits differently from how the teacher wrote it
        # would misalign its distributions with the student's targets: those pairs train on hard labels.
        metrics["top_k"] = {"k": job["top_k"], "file": TOP_K_FILE, "pairs_without": merged["top_k_dropped"]}
    if closest:
        selected, n = merged["selected"], max(1, len(sources))
        metrics["selection"] = {
            "kind": "closest_to_reference",
            "not_top_fraction": round(selected["not_top"] / n, 4),
            "mean_sentence_bleu_top": round(selected["sentence_bleu_top"] / n, 2),
            "mean_sentence_bleu_selected": round(selected["sentence_bleu_selected"] / n, 2),
            "metric": merged["metric"],
        }
        log(
            f"closest to the reference: not the teacher's best for {selected['not_top'] / n:.1%} of sentences; "
            f"mean sentence BLEU {metrics['selection']['mean_sentence_bleu_top']} -> "
            f"{metrics['selection']['mean_sentence_bleu_selected']}"
        )
    return metrics


def teacher_translator(job: dict, device: str, work: Path, log):
    """Our teacher in PyTorch; an imported one through CTranslate2 where the recipe allows and its
    converter takes the model, else transformers' generate."""
    teacher = Path(job["teacher"])
    if not is_imported_teacher(teacher):
        from model.torch_decoder import TorchTranslator

        return TorchTranslator.load(teacher, device=device)
    choice = job.get("decoder", "auto")
    if choice != "transformers":
        try:
            return _imported_decoder("ctranslate2", teacher, work, device)
        except Exception as exc:  # the converter's refusals are of many kinds (unsupported model, options)
            if choice == "ctranslate2":
                raise UserInputError(
                    f"teacher.pretrained.decoder: ctranslate2 cannot take this model: "
                    f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                ) from None
            log(
                f"CTranslate2 cannot take this model ({type(exc).__name__}: {str(exc).splitlines()[0][:160]}); "
                "translating with transformers"
            )
    return _imported_decoder("transformers", teacher, work, device)


def _imported_decoder(runtime: str, teacher: Path, work: Path, device: str):
    """An imported teacher's translator: "ctranslate2" (converted once into the work folder) or
    "transformers", at this process's thread count."""
    import torch

    from model.hf_translator import HFTranslator, ImportedCT2Translator, convert_to_ctranslate2

    threads = torch.get_num_threads() if device == "cpu" else None
    if runtime == "ctranslate2":
        converted = convert_to_ctranslate2(teacher / "checkpoint", work / "ctranslate2")
        return ImportedCT2Translator(teacher / "checkpoint", converted, device=device, threads=threads)
    return HFTranslator(teacher / "checkpoint", device=device, threads=threads)


def compare_decoders(job: dict, used, sources, device: str, work: Path, log, sentences: int = 200) -> dict:
    """Both decoders of an imported teacher on the same first sentences, one after the other,
    each warmed up first: sentences/s of each and how many outputs they share (the corpus came
    from `used`)."""
    sample = [sources[i] for i in range(min(sentences, len(sources)))]
    out, outputs = {}, {}
    for name in ("ctranslate2", "transformers"):
        try:
            translator = used if used.runtime == name else _imported_decoder(name, Path(job["teacher"]), work, device)
        except Exception as exc:
            out[name] = {"skipped": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
            continue
        settings = dict(beam=job["beam"], length_penalty=job["length_penalty"], batch_tokens=job["batch_tokens"])
        translator.translate(sample[:8], **settings)  # warm-up, untimed: a thread pool's first start can take seconds
        t0 = time.perf_counter()
        outputs[name] = translator.translate(sample, **settings)
        seconds = time.perf_counter() - t0
        out[name] = {
            "sentences": len(sample),
            "seconds": round(seconds, 2),
            "sentences_per_s": round(len(sample) / seconds, 1) if seconds > 0 else None,
        }
    if len(outputs) == 2:
        out["identical_outputs"] = sum(a == b for a, b in zip(outputs["ctranslate2"], outputs["transformers"]))
    log(
        "decoders on the first {} sources: ".format(len(sample))
        + ", ".join(
            f"{k} {v['sentences_per_s']} sentences/s"
            for k, v in out.items()
            if isinstance(v, dict) and "sentences_per_s" in v
        )
        + (f"; {out['identical_outputs']}/{len(sample)} outputs identical" if "identical_outputs" in out else "")
    )
    return out


def _source_lengths(tokenizer, data: Path, count: int, work: Path, rank: int, world: int, progress):
    """Each training source's length in subwords (what the chunks are sorted by), computed once
    in blocks by rank 0 and kept in the work folder for the other ranks and a resumed run."""
    import numpy as np

    path = work / "source_lengths.npy"
    if rank == 0 and not path.is_file():
        lengths = np.zeros(count, dtype=np.int32)
        done = 0
        lines = itertools.islice(split_lines(data, "train", "src"), count)
        with progress("sorting sources by length", total=count, unit="sentences") as bar:
            while block := list(itertools.islice(lines, ENCODE_BLOCK)):
                lengths[done : done + len(block)] = [len(ids) for ids in tokenizer.encode(block)]
                done += len(block)
                bar.advance(len(block))
        tmp = work / "source_lengths.tmp.npy"
        np.save(tmp, lengths)
        os.replace(tmp, path)
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
    return np.load(path)


if __name__ == "__main__":
    worker_main(translate_job)
