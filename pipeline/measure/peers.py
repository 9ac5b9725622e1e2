"""The benchmark's measurements, each in a fresh process (process.run_process), and ours against
CTranslate2 on the same weights: paired latency rounds, and throughput taking turns in one process
and each side alone. Each function returns what it measured; the benchmark stage puts it in its
rows (pipeline/measure/rows.py)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from ..engine.context import StageContext
from . import optimum_peer
from .cores import cores_line
from .jobs import AloneJob, CoresJob, Engine, Job, LatencyJob, ScoreSpec, VersusJob
from .process import run_process
from .rows import BenchmarkRow
from .versus import best_vs_best, separate_points


@dataclass(frozen=True)
class Measuring:
    """How a latency measurement repeats its passes and what its throughput runs (the recipe's
    `benchmark` section)."""

    batch_size: int
    throughput_beam: int
    min_repeats: int
    max_repeats: int
    stable_within: float


def engine(row: BenchmarkRow, threads: int) -> Engine:
    """What a measurement process needs to open a row's translator."""
    return Engine(row.runtime, row.device, row.compute_type, row.folder, threads)


def measure(
    ctx: StageContext,
    row: BenchmarkRow,
    threads: int,
    sample: list[str],
    how: Measuring,
    score: ScoreSpec | None,
    latency_only: bool = False,
    tag: str = "",
) -> dict:
    """One measurement in a fresh process; a process that fails gives a skipped result, not a crash."""
    job = LatencyJob(
        engine(row, threads),
        sample,
        how.batch_size,
        how.throughput_beam,
        how.min_repeats,
        how.max_repeats,
        how.stable_within,
        score,
        latency_only,
    )
    python = optimum_peer.python() if row.runtime == optimum_peer.RUNTIME else None
    return run_job(ctx, f"{row.name}-t{threads}{'-' + tag if tag else ''}", job, threads, python)


def run_job(ctx: StageContext, tag: str, job: Job, threads: int, python: Path | None = None) -> dict:
    """pipeline.measure.process on `job` in a fresh process with `threads` for the math libraries
    (run by `python`, another environment's interpreter, where given)."""
    return run_process(ctx.work / "jobs", tag, job, threads, python=python)


def peer_pairs(rows: list[BenchmarkRow], final_model: str | None) -> list[tuple[BenchmarkRow, BenchmarkRow]]:
    """(our row, the CTranslate2 row of the same compute type): the final model on the CPU. (The
    Optimum rows are a peer too, never ours.)"""
    peers = {
        r.compute_type: r
        for r in rows
        if r.runtime == "ctranslate2" and r.device == "cpu" and not r.skipped and r.source == final_model
    }
    return [
        (r, peers[r.compute_type])
        for r in rows
        if r.runtime not in ("ctranslate2", optimum_peer.RUNTIME)
        and r.device == "cpu"
        and not r.skipped
        and r.source == final_model
        and r.compute_type in peers
    ]


def paired_rounds(
    ctx: StageContext, rows: list[BenchmarkRow], sample: list[str], how: Measuring, final_model: str | None, rounds: int
) -> dict[str, dict]:
    """Ours against CTranslate2, same weights, same compute type, on the CPU: `rounds` rounds of
    one batch-1 latency measurement each, ours and theirs process after process (the order
    alternating), both at the same thread count: the one CTranslate2's row chose (its best
    setting, so the comparison never favours us by the threads). The rows themselves are
    measured minutes apart, and a small VM's speed drifts by tens of percent over minutes: the
    median of the rounds' ratios is the comparison to read. Returned as {our row's name: its
    `paired`}. (Each at its own row's thread count, one run put ours at 2 threads against theirs
    at 1 and read 1.41 / 2.12 where the rows read 1.09 / 1.30: two threads on two busy vCPUs
    wait on each other.)"""
    pairs = peer_pairs(rows, final_model)
    out: dict[str, dict] = {}
    if not rounds or not pairs:
        return out
    once = replace(how, min_repeats=1, max_repeats=1)
    with ctx.progress("paired rounds vs CTranslate2", total=len(pairs) * rounds, unit="rounds") as bar:
        for ours, theirs in pairs:
            done = []
            for k in range(rounds):
                order = (ours, theirs) if k % 2 == 0 else (theirs, ours)
                got = {
                    r.name: measure(ctx, r, theirs.threads, sample, once, None, latency_only=True, tag=f"paired{k}")
                    for r in order
                }
                a, b = got[ours.name], got[theirs.name]
                bar.advance(1)
                if a.get("skipped") or b.get("skipped"):
                    continue
                lat = {
                    key: (a["latency_ms"][key]["p50"], b["latency_ms"][key]["p50"]) for key in ("greedy_b1", "beam4_b1")
                }
                done.append(
                    {
                        "first": order[0].name,
                        **{f"{key}_p50_ms": list(v) for key, v in lat.items()},
                        **{f"{key}_p50_ratio": round(x / y, 3) for key, (x, y) in lat.items()},
                    }
                )
            if done:
                paired = out[ours.name] = {
                    "peer": theirs.name,
                    "threads": [theirs.threads, theirs.threads],
                    "rounds": done,
                    **{
                        f"{key}_p50_ratio": round(statistics.median(r[f"{key}_p50_ratio"] for r in done), 3)
                        for key in ("greedy_b1", "beam4_b1")
                    },
                }
                ctx.log(
                    f"{ours.name} vs {theirs.name}, {len(done)} paired rounds: p50 ratio "
                    f"{paired['greedy_b1_p50_ratio']} greedy, {paired['beam4_b1_p50_ratio']} beam 4"
                )
    return out


def versus_ctranslate2(
    ctx: StageContext,
    rows: list[BenchmarkRow],
    sample: list[str],
    final_model: str | None,
    points: list[list[int]],
    rounds: int,
    separate_rounds: int,
    threads: list[int],
) -> dict[str, dict]:
    """Each of our ONNX packages of the final model against CTranslate2 on the same weights and
    compute type, at every [batch, beam] of `points` and every thread count: one process per
    thread count holding both, taking turns (pipeline.measure.versus.measure_versus); then, with
    `separate_rounds`, each side alone in processes of its own (versus_alone). Returned as {our
    row's name: its `versus`}: per thread count, the one-process points with their one-line
    verdicts (by_threads) and the separate processes' (separate); per point, each side at its own
    best thread count, from each (best: pipeline.measure.versus.best_vs_best)."""
    pairs = [(ours, theirs) for ours, theirs in peer_pairs(rows, final_model) if ours.runtime == "onnxruntime"]
    if not rounds or not pairs or not sample:
        return {}
    out: dict[str, dict] = {}
    with ctx.progress("ours vs CTranslate2, one process", total=len(pairs) * len(threads), unit="processes") as bar:
        for ours, theirs in pairs:
            out[ours.name] = {"peer": theirs.name, "by_threads": {}}
            for n in threads:
                job = VersusJob(engine(ours, n), engine(theirs, n), n, sample, points, rounds, batching_file(ours))
                result = run_job(ctx, f"versus-{ours.name}-t{n}", job, n)
                out[ours.name]["by_threads"][str(n)] = result
                bar.advance(1)
                log_points(ctx, ours, theirs, f"{n} thread{'s' if n > 1 else ''}", result)
    if separate_rounds:
        for name, separate in versus_alone(ctx, pairs, sample, points, separate_rounds, threads).items():
            out[name]["separate"] = separate
    for ours, theirs in pairs:
        versus = out[ours.name]
        alone = (versus.get("separate") or {}).get("by_threads")
        versus["best"] = best_vs_best(versus["by_threads"], alone)
        for how, best in versus["best"].items():
            log_points(ctx, ours, theirs, f"each at its best thread count, {how}", {"points": best})
    return out


def versus_alone(
    ctx: StageContext,
    pairs: list[tuple[BenchmarkRow, BenchmarkRow]],
    sample: list[str],
    points: list[list[int]],
    rounds: int,
    threads: list[int],
) -> dict[str, dict]:
    """Each side of every pair alone in a fresh process, the other runtime not loaded, at every
    thread count (pipeline.measure.versus.measure_alone): the same sentences, batches and points
    as the one-process comparison, `rounds` rounds each. A CTranslate2 row compared with several
    of our packages is timed once, just before them. Returned as {our row's name: {rounds,
    by_threads: {n: {"ours": its result, "ctranslate2": the peer's, "points": ours / theirs}}}}."""
    peers = {theirs.name: theirs for _, theirs in pairs}
    order = [row for name, peer in peers.items() for row in (peer, *(o for o, t in pairs if t.name == name))]
    batching = {theirs.name: batching_file(ours) for ours, theirs in reversed(pairs)}  # the first pair's
    alone: dict[tuple[str, int], dict] = {}
    with ctx.progress("ours and CTranslate2, each alone", total=len(order) * len(threads), unit="processes") as bar:
        for n in threads:
            for row in order:
                tokenizer = batching.get(row.name) or batching_file(row)
                job = AloneJob(engine(row, n), n, sample, points, rounds, tokenizer)
                alone[row.name, n] = run_job(ctx, f"alone-{row.name}-t{n}", job, n)
                bar.advance(1)
    out = {}
    for ours, theirs in pairs:
        by_threads = {}
        for n in threads:
            mine, peer = alone[ours.name, n], alone[theirs.name, n]
            skipped = mine.get("skipped") or peer.get("skipped")
            by_threads[str(n)] = {
                "ours": mine,
                "ctranslate2": peer,
                "rounds": rounds,
                "sentences": len(sample),
                "points": [] if skipped else separate_points(mine, peer),
                **({"skipped": skipped} if skipped else {}),
            }
            log_points(ctx, ours, theirs, f"{n} thread{'s' if n > 1 else ''}, each alone", by_threads[str(n)])
        out[ours.name] = {"rounds": rounds, "by_threads": by_threads}
    return out


def on_every_core(
    ctx: StageContext,
    rows: list[BenchmarkRow],
    sample: list[str],
    final_model: str | None,
    spec,
    batch: int,
    machine: dict,
) -> dict[str, dict]:
    """Each of our ONNX packages of the final model on the CPU at one thread, N threads and N child
    processes (pipeline.measure.cores), in a fresh process each: {row name: its `cores`}. Nothing
    on one core, or with rounds 0. `spec`: the recipe's benchmark.cores (beams, rounds); the cores
    are the machine's usable ones. The sample is repeated where it holds too few batches to keep
    every core busy (enough_for)."""
    cores, beams, rounds = machine["usable_cores"], spec.beams, spec.rounds
    ours = [
        r
        for r in rows
        if r.runtime == "onnxruntime" and r.device == "cpu" and not r.skipped and r.source == final_model
    ]
    if cores < 2 or not rounds or not ours or not sample:
        return {}
    sample = enough_for(sample, batch, cores)
    out = {}
    with ctx.progress("on every core: threads and processes", total=len(ours), unit="packages") as bar:
        for row in ours:
            job = CoresJob(row.folder, cores, sample, beams, batch, rounds)
            out[row.name] = run_job(ctx, f"cores-{row.name}", job, cores)
            ctx.log(f"{row.name} on {cores} cores: {cores_line(out[row.name])}")
            bar.advance(1)
    return out


def enough_for(sample: list[str], batch: int, cores: int) -> list[str]:
    """`sample`, repeated as far as needed for WAVE batches a core (what a translate call hands each
    thread or child at a time): on many cores the test set's 1000 sentences would leave most of
    them idle, and the speed-up measured would be the sample's, not the machine's."""
    from mt_runtime.cores import WAVE

    needed = WAVE * batch * cores
    if len(sample) >= needed:
        return sample
    return (sample * -(-needed // len(sample)))[:needed]


def batching_file(row: BenchmarkRow) -> str | None:
    """The tokenizer file that sorts a comparison's sentences into batches: our package's (the
    CTranslate2 model of the same weights tokenizes with the same file)."""
    path = Path(row.folder) / "tokenizer.json"
    return str(path) if path.is_file() else None


def log_points(ctx: StageContext, ours: BenchmarkRow, theirs: BenchmarkRow, how: str, result: dict) -> None:
    for point in result.get("points", []):
        ctx.log(f"{ours.name} vs {theirs.name}, {how}: {point['verdict']}")
    if result.get("skipped"):
        ctx.log(f"{ours.name} vs {theirs.name}, {how}: skipped: {result['skipped']}")
