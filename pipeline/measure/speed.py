"""One benchmark measurement: one model, one runtime, one device, one thread count, in its own process.

The benchmark stage runs `python -m pipeline.measure.speed JOB.json` once per measurement, so
that every measurement starts from a fresh process: the thread count is set before any runtime
starts its thread pool (torch's cannot always be re-sized after first use), and the peak RSS is
that of this model alone. The process writes RESULT.json (the job's "result" path) and exits.

What is timed is what a user waits for: text in, text out (tokenization and detokenization
included), through the translator's `translate`. Warm-up runs are not timed. GPU timings are
synchronised before the clock stops.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from .timing import percentiles, until_stable

WARMUP_SENTENCES = 3
BEAM = 4  # the "beam4_b1" latency of the report
REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 1800  # one measurement slower than this is a result that says so, not a hung run


def peak_rss_mb() -> float:
    """This process's peak resident memory. Linux: VmHWM, which starts afresh at exec (ru_maxrss
    would carry over the parent's peak across fork + exec)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # bytes on macOS
    return round(peak / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)


def gpu_used_mb() -> float | None:
    """Memory in use on GPU 0 (all processes), from nvidia-smi; None without one. The benchmark
    machine runs one measurement at a time, so the growth of this figure is this process's."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return float(out.stdout.strip().splitlines()[0])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


class Skip(Exception):
    """This measurement cannot be made here (e.g. the runtime has no CUDA); the reason is the row's."""


def open_translator(job: dict):
    """The translator of the job's folder (the registry decides by what it holds), on the job's
    device with its thread count; Skip where the job's runtime cannot run on its device here."""
    runtime, device, threads = job["runtime"], job["device"], job["threads"]
    folder = Path(job["folder"]) / job["package"] if job.get("package") else Path(job["folder"])
    options = {}
    if runtime == "ctranslate2":
        import ctranslate2

        if device == "cuda" and ctranslate2.get_cuda_device_count() == 0:
            raise Skip("ctranslate2 sees no CUDA device")
        options["compute_type"] = job["compute_type"]
    if runtime == "torch":
        import torch

        if device == "cuda" and not torch.cuda.is_available():
            raise Skip(f"torch {torch.__version__} has no CUDA here")
    from pipeline.measure.translators import open_model

    translator = open_model(folder, device=device, threads=threads, **options)
    if translator.device != device:
        raise Skip(
            f"{translator.runtime}'s {device} execution provider did not load "
            f"(providers: {translator.describe().get('providers', '?')})"
        )
    return translator


def synchronizer(runtime: str, device: str):
    """A function that waits for the GPU (translate() already returns host data; this makes sure)."""
    if device == "cuda" and runtime == "torch":
        import torch

        return torch.cuda.synchronize
    return lambda: None


def runtime_versions(runtime: str) -> dict:
    info: dict = {}
    if runtime == "torch":
        import torch

        info = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "torch_threads": torch.get_num_threads()}
    elif runtime == "onnxruntime":
        import onnxruntime

        info = {"onnxruntime": onnxruntime.__version__, "providers": onnxruntime.get_available_providers()}
    elif runtime == "ctranslate2":
        import ctranslate2

        info = {"ctranslate2": ctranslate2.__version__, "cuda_devices": ctranslate2.get_cuda_device_count()}
    return info


def measure(job: dict) -> dict:
    sample: list[str] = job["sentences"]
    gpu_base = gpu_used_mb() if job["device"] == "cuda" else None
    gpu_samples: list[float] = []

    def note_gpu():
        if gpu_base is not None:
            used = gpu_used_mb()
            if used is not None:
                gpu_samples.append(used - gpu_base)

    t0 = time.perf_counter()
    translator = open_translator(job)
    load_s = time.perf_counter() - t0
    sync = synchronizer(job["runtime"], job["device"])
    note_gpu()
    repeats = (job["min_repeats"], job["max_repeats"], job["stable_within"])

    def timed(sentences, **kw) -> tuple[float, list[str]]:
        sync()
        start = time.perf_counter()
        out = translator.translate(sentences, **kw)
        sync()
        return time.perf_counter() - start, out

    result: dict = {
        "threads": job["threads"],
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

    if job.get("latency_only"):  # a paired round (pipeline/stages/benchmark/build.py): batch-1 latency alone
        return result

    # Throughput: the whole sample in batches of `batch_size` sentences (no token cap); target
    # tokens are the subword tokens of the outputs (EOS not counted), the same count for every runtime.
    batch, beam = job["batch_size"], job["throughput_beam"]
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
    result["versions"] = runtime_versions(job["runtime"])
    if job.get("score"):
        result["scores"] = score_test_set(translator, job["score"], job["batch_size"])
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

    def timed_method(name):
        method = getattr(decoder, name)

        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            out = method(*args, **kwargs)
            sync()
            spent[name] += time.perf_counter() - start
            spent["steps"] += name == "step"
            return out

        return wrapper

    decoder.encode, decoder.step = timed_method("encode"), timed_method("step")  # shadow the methods
    try:
        start = time.perf_counter()
        for sentence in sample:
            translator.translate([sentence], beam=1, max_batch=1)
        total = time.perf_counter() - start
    finally:
        del decoder.encode, decoder.step
    n = len(sample)
    return {
        "total_ms": round(total / n * 1000, 3),
        "encode_ms": round(spent["encode"] / n * 1000, 3),
        "decode_steps_ms": round(spent["step"] / n * 1000, 3),
        "other_ms": round((total - spent["encode"] - spent["step"]) / n * 1000, 3),
        "steps_per_sentence": round(spent["steps"] / n, 2),
        "ms_per_step": round(spent["step"] / max(spent["steps"], 1) * 1000, 4),
    }


def score_test_set(translator, spec: dict, batch: int) -> dict:
    """BLEU / chrF of this translator on a whole test set (for runtimes no evaluate stage covers)."""
    from mt_runtime.lines import one_line

    from pipeline.corpora.splits import misaligned
    from pipeline.measure.scoring import score

    src = Path(spec["src"]).read_text(encoding="utf-8").split("\n")[:-1]
    refs = Path(spec["refs"]).read_text(encoding="utf-8").split("\n")[:-1]
    if len(src) != len(refs):
        raise misaligned(Path(spec["src"]), len(src), Path(spec["refs"]), len(refs))
    out = {}
    for beam in spec["beams"]:
        hyps = translator.translate(
            src,
            beam=beam,
            length_penalty=spec.get("length_penalty", 1.0),
            batch_tokens=spec.get("batch_tokens", 4000),
            max_batch=max(batch, 64),
        )
        hyps = [one_line(h) for h in hyps]  # one a line in the kept file, whatever the decoder wrote
        s = score(hyps, refs)
        out[f"beam{beam}"] = {k: s[k] for k in ("bleu", "chrf", "sentences", "bleu_signature", "chrf_signature")}
        if spec.get("hypotheses"):  # kept, as the evaluate stage keeps its own (the report compares them)
            path = Path(spec["hypotheses"]) / f"{spec['test_set']}.beam{beam}.hyp"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
            out[f"beam{beam}"]["hypotheses"] = path.name
    return out


def take_turns(engines: dict, sample: list[str], batch: int, beam: int, rounds: int, tokenizer=None):
    """The engines translating `sample` batch by batch (sentence by sentence at batch 1), taking
    turns at every batch and alternating who goes first (pipeline.measure.timing.interleaved), so that the
    machine's drift, which on a shared VM moves speed 10-30% between minutes, slows all alike. A
    round is one pass of each over the sample (with one engine: its passes alone). Batches as
    everywhere: length-sorted (by `tokenizer`'s pieces, else words), `batch` sentences each, no
    token cap. Returns the timing (seconds a batch, per round) and the number of batches a round
    holds."""
    from .timing import interleaved

    items = batches_of(sample, batch, tokenizer)
    kw = dict(beam=beam, max_batch=batch, batch_tokens=10**9)
    timed = interleaved(
        {name: (lambda b, t=t: t.translate(b, **kw)) for name, t in engines.items()}, items, repeats=rounds, warmup=1
    )
    return timed, len(items)


def batches_of(sample: list[str], batch: int, tokenizer=None) -> list[list[str]]:
    """The sample in batches as take_turns times them: one sentence each at batch 1, else sorted
    by length (`tokenizer`'s pieces, else words; ties in sample order) and cut every `batch`."""
    if batch == 1:
        return [[s] for s in sample]
    lengths = [len(ids) for ids in tokenizer.encode(sample)] if tokenizer else [len(s.split()) for s in sample]
    by_length = [s for _, s in sorted(zip(lengths, sample), key=lambda pair: pair[0])]
    return [by_length[i : i + batch] for i in range(0, len(sample), batch)]


def batching_tokenizer(job: dict, engine=None):
    """What sorts the sentences into batches: the job's tokenizer file (our package's, so that
    both sides, together or each alone, get the same batches), else the engine's own."""
    if job.get("tokenizer"):
        from mt_runtime.subword import SubwordTokenizer

        return SubwordTokenizer.load(job["tokenizer"])
    return getattr(engine, "tokenizer", None)


def measure_versus(job: dict) -> dict:
    """Ours against CTranslate2 on the same weights, both in this process at the same thread
    count, taking turns batch by batch at each (batch, beam) point (take_turns); the point's ratio
    is the median of the rounds' own ratios, with their range beside it, and its figures are the
    median round's (median_round)."""
    sample: list[str] = job["sentences"]
    engines = {"ours": open_translator(job["ours"]), "ctranslate2": open_translator(job["theirs"])}
    tokenizer = batching_tokenizer(job, engines["ours"])
    points = []
    for batch, beam in job["points"]:
        timed, batches = take_turns(engines, sample, batch, beam, job["rounds"], tokenizer)
        rounds, middle = median_round(timed.seconds["ours"], timed.seconds["ctranslate2"])
        ours, theirs = (len(sample) / (batches * timed.seconds[name][middle]) for name in ("ours", "ctranslate2"))
        point = versus_point(batch, beam, ours, theirs, len(sample), rounds)
        # Each one's own median round too: what its best thread count is chosen by (best_vs_best).
        point["median_sent_per_s"] = {
            name: round(statistics.median(sent_per_s(sample, batches, timed.seconds[name])), 2) for name in engines
        }
        points.append(point)
    return {
        "threads": job["threads"],
        "sentences": len(sample),
        "rounds": job["rounds"],
        "points": points,
        "search": {
            "one_sentence": getattr(engines["ours"], "search", None),
            "batches": getattr(engines["ours"], "batch_search", None),
        },
        "pid": os.getpid(),
        "runtimes_loaded": runtimes_loaded(),
    }


def sent_per_s(sample: list[str], batches: int, seconds: list[float]) -> list[float]:
    """Sentences per second of each round, from its seconds a batch."""
    return [len(sample) / (batches * s) for s in seconds]


def runtimes_loaded() -> list[str]:
    """The inference runtimes this process has imported."""
    return [name for name in ("onnxruntime", "ctranslate2", "torch") if name in sys.modules]


def measure_alone(job: dict) -> dict:
    """One side of the comparison alone in this process, the other not loaded: the same
    sentences, batches (batching_tokenizer), points and rounds as measure_versus, each point's
    figure its median round. The benchmark stage pairs two of these, one per side, made in
    fresh processes one after the other (separate_points); the machine's drift between them
    is not cancelled as it is when the two take turns."""
    sample: list[str] = job["sentences"]
    translator = open_translator(job["engine"])
    tokenizer = batching_tokenizer(job, translator)
    points = []
    for batch, beam in job["points"]:
        timed, batches = take_turns({"alone": translator}, sample, batch, beam, job["rounds"], tokenizer)
        rounds = sent_per_s(sample, batches, timed.seconds["alone"])
        points.append(
            {
                "batch": batch,
                "beam": beam,
                "sent_per_s": round(statistics.median(rounds), 2),
                "round_sent_per_s": [round(x, 2) for x in rounds],
            }
        )
    return {
        "threads": job["threads"],
        "runtime": job["engine"]["runtime"],
        "sentences": len(sample),
        "rounds": job["rounds"],
        "points": points,
        "pid": os.getpid(),
        "runtimes_loaded": runtimes_loaded(),
    }


def median_round(ours_seconds: list[float], theirs_seconds: list[float]) -> tuple[list[float], int]:
    """The rounds' own ratios (theirs / ours time: ours' relative throughput) and the index of the
    round whose ratio is their median (the lower middle one of an even count). A point shows that
    round's figures, so they say what its ratio says: each contestant's own median round may come
    from different minutes and read the other way (411.8 against 427.6 sentences/s beside a median
    ratio of 1.002, report-2fc0e91b06eb20ee)."""
    ratios = [t / o for o, t in zip(ours_seconds, theirs_seconds)]
    return ratios, ratios.index(statistics.median_low(ratios))


def versus_point(
    batch: int,
    beam: int,
    ours_per_s: float,
    theirs_per_s: float,
    sentences: int,
    round_ratios: list[float] | None = None,
    threads: tuple[int, int] | None = None,
) -> dict:
    """One point of the comparison with its one-line verdict (throughput: ours / theirs, above 1
    is ours faster; at batch 1 the same figure is one over the time per sentence). With the
    rounds' own ratios, the ratio is their median (median_round's: the figures are that round's)
    and their range is reported with it. With `threads` (ours, theirs) the figures name each
    side's thread count (best_vs_best)."""
    if round_ratios:
        ratio = round(statistics.median_low(round_ratios), 3)
    else:
        ratio = round(ours_per_s / theirs_per_s, 3) if theirs_per_s else None
    what = f"{'greedy' if beam == 1 else f'beam {beam}'}, batch {batch}"
    if threads:
        ours_at, theirs_at = (f" at {n} thread{'s' if n > 1 else ''}" for n in threads)
        figures = (
            f"ours {1000 / ours_per_s:.2f} ms a sentence{ours_at}, CTranslate2 {1000 / theirs_per_s:.2f} ms{theirs_at}"
            if batch == 1
            else f"ours {ours_per_s:.1f} sentences/s{ours_at}, CTranslate2 {theirs_per_s:.1f}{theirs_at}"
        )
    elif batch == 1:
        figures = f"ours {1000 / ours_per_s:.2f} ms, CTranslate2 {1000 / theirs_per_s:.2f} ms a sentence"
    else:
        figures = f"ours {ours_per_s:.1f}, CTranslate2 {theirs_per_s:.1f} sentences/s"
    verdict = (
        "no figure"
        if ratio is None
        else (f"ours faster ({ratio:.2f}x its throughput)" if ratio >= 1 else f"CTranslate2 faster (ours {ratio:.2f}x)")
    )
    spread = f" [rounds {min(round_ratios):.2f}-{max(round_ratios):.2f}]" if round_ratios else ""
    point = {
        "batch": batch,
        "beam": beam,
        "ours_sent_per_s": round(ours_per_s, 2),
        "ctranslate2_sent_per_s": round(theirs_per_s, 2),
        "ratio": ratio,
        "met": None if ratio is None else ratio >= 1,
        "verdict": f"{what}: {figures}: {verdict}{spread}",
    }
    if round_ratios:
        point["round_ratios"] = [round(r, 3) for r in round_ratios]
        point["figures"] = "median round"  # benchmarks before median_round showed each one's median
    if threads:
        point["ours_threads"], point["ctranslate2_threads"] = threads
    return point


SIDES = ("ours", "ctranslate2")


def separate_points(ours: dict, theirs: dict) -> list[dict]:
    """The points of two measure_alone results at one thread count, ours against theirs: each
    one's median round, from two processes."""
    by_point = {(p["batch"], p["beam"]): p["sent_per_s"] for p in theirs.get("points", [])}
    return [
        versus_point(p["batch"], p["beam"], p["sent_per_s"], by_point[p["batch"], p["beam"]], ours["sentences"])
        for p in ours.get("points", [])
        if (p["batch"], p["beam"]) in by_point
    ]


def best_vs_best(interleaved: dict, alone: dict | None = None) -> dict:
    """Per point, each side at its own best thread count: the one of those measured at which
    that side, at that point, translated the most sentences a second (ties: the fewer threads).
    "interleaved" reads the one-process results ({threads: measure_versus result}), each side's
    speed its own median round: where both are best at the same count, the point is that
    process's (the median of its rounds' ratios); else the two figures come from two processes.
    "separate" reads the processes of each side alone ({threads: {"ours": measure_alone result,
    "ctranslate2": ...}})."""
    out: dict[str, list[dict]] = {"interleaved": [], "separate": []}
    found: dict[tuple[int, int], dict[int, dict]] = {}
    for n, result in interleaved.items():
        for p in result.get("points", []):
            found.setdefault((p["batch"], p["beam"]), {})[int(n)] = {**p, "sentences": result["sentences"]}
    for (batch, beam), at in found.items():
        speed = {
            side: {n: (p.get("median_sent_per_s") or {}).get(side, p[f"{side}_sent_per_s"]) for n, p in at.items()}
            for side in SIDES
        }
        best = tuple(_fastest(speed[side]) for side in SIDES)
        same = at[best[0]] if best[0] == best[1] else None
        point = (
            versus_point(
                batch,
                beam,
                same["ours_sent_per_s"],
                same["ctranslate2_sent_per_s"],
                same["sentences"],
                same.get("round_ratios"),
                threads=best,
            )
            if same
            else versus_point(
                batch,
                beam,
                speed["ours"][best[0]],
                speed["ctranslate2"][best[1]],
                at[best[0]]["sentences"],
                threads=best,
            )
        )
        out["interleaved"].append({**point, "same_process": same is not None})
    alone_found: dict[tuple[int, int], dict[str, dict[int, float]]] = {}
    sentences = 0
    for n, sides in (alone or {}).items():
        for side in SIDES:
            result = sides.get(side) or {}
            sentences = result.get("sentences", sentences)
            for p in result.get("points", []):
                alone_found.setdefault((p["batch"], p["beam"]), {}).setdefault(side, {})[int(n)] = p["sent_per_s"]
    for (batch, beam), speed in alone_found.items():
        if set(speed) == set(SIDES):
            best = tuple(_fastest(speed[side]) for side in SIDES)
            out["separate"].append(
                versus_point(
                    batch, beam, speed["ours"][best[0]], speed["ctranslate2"][best[1]], sentences, threads=best
                )
            )
    return out


def _fastest(speed: dict[int, float]) -> int:
    """The thread count of the highest sentences/s (ties: the fewer threads)."""
    return max(speed, key=lambda n: (speed[n], -n))


def run_process(jobs: Path, tag: str, job: dict, threads: int, timeout_s: float = TIMEOUT_S) -> dict:
    """`job` measured by this module in a fresh process (`python -m pipeline.measure.speed`, its
    job, result and log files in `jobs`, named by `tag`) with `threads` for the math libraries.
    A process that fails or runs past `timeout_s` gives a result skipped with the reason."""
    jobs.mkdir(parents=True, exist_ok=True)
    result_path, log_path = jobs / f"{tag}.result.json", jobs / f"{tag}.log"
    result_path.unlink(missing_ok=True)
    job = {**job, "result": str(result_path)}
    (jobs / f"{tag}.json").write_text(json.dumps(job), encoding="utf-8")
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
    }
    with open(log_path, "w", encoding="utf-8") as log:
        try:
            rc = subprocess.run(
                [sys.executable, "-m", "pipeline.measure.speed", str(jobs / f"{tag}.json")],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                timeout=timeout_s,
            ).returncode
        except subprocess.TimeoutExpired:
            return {
                "threads": threads,
                "skipped": f"measurement took over {timeout_s:g} s and was stopped "
                "(an oversubscribed machine makes multi-thread runs crawl)",
            }
    if rc == 0 and result_path.is_file():
        return json.loads(result_path.read_text(encoding="utf-8"))
    lines = [ln for ln in log_path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    return {
        "threads": threads,
        "skipped": f"measurement process failed (exit {rc}): {lines[-1][:300] if lines else 'no output'}",
    }


def main() -> None:
    job_path = Path(sys.argv[1])
    job = json.loads(job_path.read_text(encoding="utf-8"))
    try:
        result = {"versus": measure_versus, "alone": measure_alone}.get(job.get("kind"), measure)(job)
    except Skip as exc:
        result = {"threads": job["threads"], "skipped": str(exc)}
    out = Path(job["result"])
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, out)


if __name__ == "__main__":
    main()
