"""`translate` on one core against N threads and N child processes, one package, real sentences.

    python scripts/translate_cores.py PACKAGE SENTENCES.gz [--cores 2] [--rounds 7] [--beams 1,4]
                                      [--batch 32]

Three Translators of the package in this process: threads=1, threads=N (whole batches at once,
one per thread, mt_runtime/cores.py) and processes=N (child processes of one thread each,
mt_runtime/processes.py). Each round translates every sentence once with each, in an order that
turns round by round, so a busy machine slows each alike; printed are the median sentences a
second over the rounds and the median of each round's ratio to one thread. Every translation must
be the one-thread one (exits 1 otherwise).
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import sys
import time
from pathlib import Path

from mt_runtime.translator import Translator


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("package", type=Path)
    ap.add_argument("sentences", type=Path, help="one sentence a line, plain or .gz")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--beams", default="1,4")
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    opener = gzip.open if args.sentences.suffix == ".gz" else open
    with opener(args.sentences, "rt", encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    sides = {
        "1 thread": Translator(args.package, threads=1),
        f"{args.cores} threads": Translator(args.package, threads=args.cores),
        f"{args.cores} processes": Translator(args.package, threads=1, processes=args.cores),
    }
    try:
        for beam in (int(b) for b in args.beams.split(",")):
            speeds: dict[str, list[float]] = {name: [] for name in sides}
            outputs = {}
            for name, side in sides.items():  # warm-up: first runs allocate
                outputs[name] = side.translate(lines[: 4 * args.batch * args.cores], beam=beam, max_batch=args.batch)
            for r in range(args.rounds):
                names = list(sides)[r % len(sides) :] + list(sides)[: r % len(sides)]
                for name in names:
                    started = time.perf_counter()
                    outputs[name] = sides[name].translate(lines, beam=beam, max_batch=args.batch)
                    speeds[name].append(len(lines) / (time.perf_counter() - started))
            one = list(sides)[0]
            if any(out != outputs[one] for out in outputs.values()):
                sys.exit(f"beam {beam}: the translations differ")
            shown = []
            for name in sides:
                ratio = statistics.median(s / o for s, o in zip(speeds[name], speeds[one]))
                shown.append(f"{name} {statistics.median(speeds[name]):.0f} sent/s ({ratio:.2f}x)")
            print(f"beam {beam}, batches of {args.batch}, {len(lines)} sentences: " + "; ".join(shown))
    finally:
        for side in sides.values():
            side.close()


if __name__ == "__main__":
    main()
