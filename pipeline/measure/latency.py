"""One model's batch-1 latency (greedy and beam 4), throughput, memory and where its time goes, in
this process (a LatencyJob; pipeline/measure/process.py runs it in a fresh one).

What is timed is what a user waits for: text in, text out (tokenization and detokenization
included), through the translator's `translate`. Warm-up runs are not timed. GPU timings are
synchronised before the clock stops.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from .jobs import LatencyJob, ScoreSpec
from .speed import gpu_used_mb, peak_rss_mb, runtime_versions, synchronizer, translator_for
from .timing import percentiles, until_stable

WARMUP_SENTENCES = 3
BEAM = 4  # the "beam4_b1" latency of the report


def measure(job: LatencyJob) -> dict:
    """The job's model measured: the result the benchmark row takes its figures from."""
    sample, engine = job.sentences, job.engine
    gpu_base = gpu_used_mb() if engine.device == "cuda" else None
    gpu_samples: list[float] = []

    def note_gpu():
        if gpu_base is not None:
            used = gpu_used_mb()
            if used is not None:
                gpu_samples.append(used - gpu_base)

    t0 = time.perf_counter()
    translator = translator_for(engine.as_dict())
    load_s = time.perf_counter() - t0
    sync = synchronizer(engine.runtime, engine.device)
    note_gpu()
    repeats = (job.min_repeats, job.max_repeats, job.stable_within)

    def timed(sentences, **kw) -> tuple[float, list[str]]:
        sync()
        start = time.perf_counter()
        out = translator.translate(sentences, **kw)
        sync()
        return time.perf_counter() - start, out

    result: dict = {
        "threads": engine.threads,
        "load_s": round(load_s, 3),
        "latency_ms": {},
        "repeats": {},
        "pass_p50_ms": {},
    }
    for key, beam in (("greedy_b1", 1), ("beam4_b1", BEAM)):
        for sentence in sample[:WARMUP_SENTENCES]:
            timed([sentence], beam=beam, max_batch=1)

        def one_pass(beam=beam):
            return [timed([s], beam=beam, max_batch=1)[0] for s in sample]

        pooled, medians = until_stable(one_pass, *repeats)
        result["latency_ms"][key] = percentiles(pooled)
        result["repeats"][key] = len(medians)
        result["pass_p50_ms"][key] = [round(m * 1000, 3) for m in medians]
        note_gpu()

    if job.latency_only:  # a paired round (pipeline/measure/peers.py): batch-1 latency alone
        return result

    # Throughput: the whole sample in batches of `batch_size` sentences (no token cap); target
    # tokens are the subword tokens of the outputs (EOS not counted), the same count for every runtime.
    batch, beam = job.batch_size, job.throughput_beam
    kw = dict(beam=beam, max_batch=batch, batch_tokens=10**9)
    outputs = translator.translate(sample, **kw)  # warm-up (untimed), and the outputs to count
    target_tokens = sum(len(ids) for ids in translator.tokenizer.encode_target(outputs))
    seconds, medians = until_stable(lambda: [timed(sample, **kw)[0]], *repeats)
    typical = statistics.median(seconds)
    result["throughput"] = {
        "sent_per_s": round(len(sample) / typical, 2),
        "tok_per_s": round(target_tokens / typical, 1),
        "batch": batch,
        "beam": beam,
        "sentences": len(sample),
        "target_tokens": target_tokens,
    }
    result["repeats"]["throughput"] = len(medians)
    note_gpu()

    result["breakdown"] = time_breakdown(translator, sample, sync)
    result["peak_rss_mb"] = peak_rss_mb()
    result["gpu_mem_mb"] = round(max(gpu_samples), 1) if gpu_samples else None
    result["versions"] = runtime_versions(engine.runtime)
    if job.score:
        result["scores"] = score_test_set(translator, job.score, job.batch_size)
    return result


def time_breakdown(translator, sample: list[str], sync) -> dict | None:
    """Where batch-1 greedy time goes, per sentence: the encoder, the decoder steps, and the rest
    (tokenization, search in NumPy, detokenization). Needs a translator that drives an
    IncrementalDecoder (`.decoder` with encode/step: ours); CTranslate2 is one opaque call."""
    decoder = getattr(translator, "decoder", None)
    if decoder is None or not hasattr(decoder, "step") or not hasattr(decoder, "encode"):
        return None
    graph_search = getattr(translator, "graph_search", None)
    if graph_search:
        from mt_runtime.translator import PackageSearch

        # generate.onnx is one opaque call too: its total, then the same sentences through the
        # step graphs and the Python loop, whose parts can be timed.
        start = time.perf_counter()
        for sentence in sample:
            translator.translate([sentence], beam=1, max_batch=1)
        graph_ms = round((time.perf_counter() - start) / len(sample) * 1000, 3)
        searcher = translator.searcher
        translator.graph_search, translator.searcher = None, PackageSearch(translator.decoder, None)
        try:
            steps = time_breakdown(translator, sample, sync)
        finally:
            translator.graph_search, translator.searcher = graph_search, searcher
        return {"search": "graph", "graph_total_ms": graph_ms, **(steps or {})}
    spent = {"encode": 0.0, "step": 0.0, "steps": 0}
    # A step is decoder.onnx's (`step`) or the step graphs' for rows (`step_top_k`, where the
    # decoder has them: it answers None otherwise, and `step` then runs and is counted).
    shadowed = [name for name in ("encode", "step", "step_top_k") if hasattr(decoder, name)]

    def timed_method(name):
        method = getattr(decoder, name)
        part = "encode" if name == "encode" else "step"

        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            out = method(*args, **kwargs)
            sync()
            if name != "step_top_k" or out is not None:
                spent[part] += time.perf_counter() - start
                spent["steps"] += part == "step"
            return out

        return wrapper

    for name in shadowed:  # shadow the methods
        setattr(decoder, name, timed_method(name))
    try:
        start = time.perf_counter()
        for sentence in sample:
            translator.translate([sentence], beam=1, max_batch=1)
        total = time.perf_counter() - start
    finally:
        for name in shadowed:
            delattr(decoder, name)
    n = len(sample)
    return {
        "total_ms": round(total / n * 1000, 3),
        "encode_ms": round(spent["encode"] / n * 1000, 3),
        "decode_steps_ms": round(spent["step"] / n * 1000, 3),
        "other_ms": round((total - spent["encode"] - spent["step"]) / n * 1000, 3),
        "steps_per_sentence": round(spent["steps"] / n, 2),
        "ms_per_step": round(spent["step"] / max(spent["steps"], 1) * 1000, 4),
    }


def score_test_set(translator, spec: ScoreSpec, batch: int) -> dict:
    """BLEU / chrF of this translator on a whole test set (for runtimes no evaluate stage covers)."""
    from mt_runtime.lines import one_line

    from ..corpora.splits import misaligned
    from .scoring import score

    src = Path(spec.src).read_text(encoding="utf-8").split("\n")[:-1]
    refs = Path(spec.refs).read_text(encoding="utf-8").split("\n")[:-1]
    if len(src) != len(refs):
        raise misaligned(Path(spec.src), len(src), Path(spec.refs), len(refs))
    out = {}
    for beam in spec.beams:
        hyps = translator.translate(src, beam=beam, length_penalty=1.0, batch_tokens=4000, max_batch=max(batch, 64))
        hyps = [one_line(h) for h in hyps]  # one a line in the kept file, whatever the decoder wrote
        s = score(hyps, refs)
        out[f"beam{beam}"] = {k: s[k] for k in ("bleu", "chrf", "sentences", "bleu_signature", "chrf_signature")}
        if spec.hypotheses:  # kept, as the evaluate stage keeps its own (the report compares them)
            path = Path(spec.hypotheses) / f"{spec.test_set}.beam{beam}.hyp"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
            out[f"beam{beam}"]["hypotheses"] = path.name
    return out
