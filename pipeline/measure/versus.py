"""Ours against CTranslate2 on the same weights: both in one process taking turns batch by batch
(a VersusJob: measure_versus), or one side alone in a process of its own (an AloneJob:
measure_alone); each point's verdict (versus_point), and per point each side at its own best
thread count (best_vs_best)."""

from __future__ import annotations

import os
import statistics
import sys

from .jobs import AloneJob, VersusJob
from .speed import translator_for


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


def batching_tokenizer(job: VersusJob | AloneJob, engine=None):
    """What sorts the sentences into batches: the job's tokenizer file (our package's, so that
    both sides, together or each alone, get the same batches), else the engine's own."""
    if job.tokenizer:
        from mt_runtime.subword import SubwordTokenizer

        return SubwordTokenizer.load(job.tokenizer)
    return getattr(engine, "tokenizer", None)


def measure_versus(job: VersusJob) -> dict:
    """Ours against CTranslate2 on the same weights, both in this process at the same thread
    count, taking turns batch by batch at each (batch, beam) point (take_turns); the point's ratio
    is the median of the rounds' own ratios, with their range beside it, and its figures are the
    median round's (median_round)."""
    sample = job.sentences
    engines = {"ours": translator_for(job.ours.as_dict()), "ctranslate2": translator_for(job.theirs.as_dict())}
    tokenizer = batching_tokenizer(job, engines["ours"])
    points = []
    for batch, beam in job.points:
        timed, batches = take_turns(engines, sample, batch, beam, job.rounds, tokenizer)
        rounds, middle = median_round(timed.seconds["ours"], timed.seconds["ctranslate2"])
        ours, theirs = (len(sample) / (batches * timed.seconds[name][middle]) for name in ("ours", "ctranslate2"))
        point = versus_point(batch, beam, ours, theirs, len(sample), rounds)
        # Each one's own median round too: what its best thread count is chosen by (best_vs_best).
        point["median_sent_per_s"] = {
            name: round(statistics.median(sent_per_s(sample, batches, timed.seconds[name])), 2) for name in engines
        }
        points.append(point)
    return {
        "threads": job.threads,
        "sentences": len(sample),
        "rounds": job.rounds,
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


def measure_alone(job: AloneJob) -> dict:
    """One side of the comparison alone in this process, the other not loaded: the same
    sentences, batches (batching_tokenizer), points and rounds as measure_versus, each point's
    figure its median round. The benchmark stage pairs two of these, one per side, made in
    fresh processes one after the other (separate_points); the machine's drift between them
    is not cancelled as it is when the two take turns."""
    sample = job.sentences
    translator = translator_for(job.engine.as_dict())
    tokenizer = batching_tokenizer(job, translator)
    points = []
    for batch, beam in job.points:
        timed, batches = take_turns({"alone": translator}, sample, batch, beam, job.rounds, tokenizer)
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
        "threads": job.threads,
        "runtime": job.engine.runtime,
        "sentences": len(sample),
        "rounds": job.rounds,
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
