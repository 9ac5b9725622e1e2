"""An ONNX package against a CTranslate2 model of the same weights, the two taking turns batch by
batch (sentence by sentence at batch 1), so that a noisy machine slows both alike; with
`--separate`, each also alone in a fresh process of its own.

    python scripts/pair_ctranslate2.py PACKAGE CT2_FOLDER SENTENCES.txt [--threads 1[,2]] [--rounds 5]
        [--points 1x1,1x4,32x1,32x4,64x1,64x4] [--sentences 256] [--compute-type int8]
        [--separate] [--separate-rounds N]

One thread count without --separate: both in this process, one markdown row per point (batch x
beam): sentences/s (ms a sentence at batch 1) and ours / CTranslate2 in brackets, above 1 ours
faster; for greedy batches also the package without its shortlist ("whole"), where it has one;
batch 1 over the first 64 sentences.

Several thread counts (`--threads 1,2`) or --separate: the benchmark stage's `versus`
(pipeline.measure.process), every timing in a fresh process, every point on all the sentences: per
thread count one process holding both, taking turns, and with --separate one process per side
holding it alone (`--separate-rounds`, default --rounds); one row per thread count and point,
then each side at its own best thread count. This script is docs/results.md's independent timing.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from pipeline.measure.jobs import AloneJob, Engine, VersusJob
from pipeline.measure.process import run_process
from pipeline.measure.versus import best_vs_best, separate_points, take_turns
from pipeline.report.rows import best_lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("package", type=Path)
    ap.add_argument("ctranslate2", type=Path)
    ap.add_argument("sentences", type=Path)
    ap.add_argument("--threads", default="1", help="a thread count, or several: 1,2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--points", default="1x1,1x4,32x1,32x4,64x1,64x4")
    ap.add_argument("--sentences", dest="count", type=int, default=256)
    ap.add_argument("--compute-type", default="int8")
    ap.add_argument("--separate", action="store_true", help="also time each side alone in a process of its own")
    ap.add_argument("--separate-rounds", type=int, help="rounds of each side alone (default: --rounds)")
    args = ap.parse_args()

    sample = [s for s in args.sentences.read_text(encoding="utf-8").splitlines() if s.strip()][: args.count]
    threads = [int(n) for n in args.threads.split(",")]
    points = [[int(x) for x in point.split("x")] for point in args.points.split(",")]
    if len(threads) == 1 and not args.separate:
        in_this_process(args, sample, threads[0], points)
    else:
        in_processes(args, sample, threads, points)


def in_this_process(args, sample: list[str], threads: int, points: list[list[int]]) -> None:
    from mt_runtime.translator import Translator

    from model.ctranslate2_export import PeerTranslator

    engines = {
        "ours": Translator(args.package, threads=threads),
        "ctranslate2": PeerTranslator(args.ctranslate2, threads=threads, compute_type=args.compute_type),
    }
    if engines["ours"].describe()["shortlist"]:
        engines["whole"] = Translator(args.package, threads=threads, shortlist=False)
    print(f"| threads | search | batch | {' | '.join(engines)} |")
    print("|---|---|---|" + "---|" * len(engines))
    for batch, beam in points:
        # The shortlist serves greedy batches only: elsewhere "whole" would time the same thing.
        names = [n for n in engines if n != "whole" or (batch > 1 and beam == 1)]
        timed, batches = take_turns(
            {n: engines[n] for n in names},
            sample[:64] if batch == 1 else sample,
            batch,
            beam,
            args.rounds,
            engines["ours"].tokenizer,
        )
        theirs = timed.median_s("ctranslate2")
        per_item = 1 if batch == 1 else len(sample) / batches

        def figure(name: str) -> str:
            seconds = timed.median_s(name)
            value = f"{1000 * seconds:.2f} ms" if batch == 1 else f"{per_item / seconds:.1f}/s"
            return f"{value} ({theirs / seconds:.3f})"

        cells = [figure(n) if n in names else "" for n in engines]
        print(f"| {threads} | {_search(beam)} | {batch} | {' | '.join(cells)} |", flush=True)


def in_processes(args, sample: list[str], threads: list[int], points: list[list[int]]) -> None:
    """Each timing in a fresh process, as the benchmark stage makes them."""
    sides = {"ctranslate2": ("ctranslate2", str(args.ctranslate2)), "ours": ("onnxruntime", str(args.package))}
    tokenizer = str(args.package / "tokenizer.json")

    def engine(side: str, n: int) -> Engine:
        runtime, folder = sides[side]
        return Engine(runtime, "cpu", args.compute_type, folder, n)

    rounds = args.separate_rounds or args.rounds

    def alone_job(side: str, n: int) -> AloneJob:
        return AloneJob(engine(side, n), n, sample, points, rounds, tokenizer)

    together, alone = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in threads:
            job = VersusJob(engine("ours", n), engine("ctranslate2", n), n, sample, points, args.rounds, tokenizer)
            together[str(n)] = run_process(Path(tmp), f"versus-t{n}", job, n)
            if args.separate:
                alone[str(n)] = {
                    side: run_process(Path(tmp), f"alone-{side}-t{n}", alone_job(side, n), n) for side in sides
                }
    print(
        f"{len(sample)} sentences; taking turns in one process, {args.rounds} rounds"
        + (f"; each alone in a process of its own, {rounds} rounds" if args.separate else "")
    )
    print(
        "| threads | search | batch | ours | CTranslate2 | ours / CTranslate2 |"
        + (" alone: ours | alone: CTranslate2 | alone: ours / CTranslate2 |" if args.separate else "")
    )
    print("|---|---|---|---|---|---|" + ("---|---|---|" if args.separate else ""))
    for n in threads:
        result = together[str(n)]
        if result.get("skipped"):
            print(f"| {n} | skipped: {result['skipped']} |")
            continue
        both = alone.get(str(n)) or {}
        skipped = [r["skipped"] for r in both.values() if r.get("skipped")]
        separate = (
            {}
            if skipped or not both
            else {(p["batch"], p["beam"]): p for p in separate_points(both["ours"], both["ctranslate2"])}
        )
        for p in result["points"]:
            cells = [
                _figure(p["batch"], p["ours_sent_per_s"]),
                _figure(p["batch"], p["ctranslate2_sent_per_s"]),
                f"{p['ratio']:.3f}",
            ]
            q = separate.get((p["batch"], p["beam"]))
            if q:
                cells += [
                    _figure(q["batch"], q["ours_sent_per_s"]),
                    _figure(q["batch"], q["ctranslate2_sent_per_s"]),
                    f"{q['ratio']:.3f}",
                ]
            elif args.separate:
                cells += [f"skipped: {'; '.join(skipped)}", "", ""]
            print(f"| {n} | {_search(p['beam'])} | {p['batch']} | {' | '.join(cells)} |")
    versus = {"by_threads": together, "best": best_vs_best(together, alone)}
    print("\n".join(best_lines(versus)))


def _search(beam: int) -> str:
    return "greedy" if beam == 1 else f"beam {beam}"


def _figure(batch: int, sent_per_s: float) -> str:
    return f"{1000 / sent_per_s:.2f} ms" if batch == 1 else f"{sent_per_s:.1f}/s"


if __name__ == "__main__":
    main()
