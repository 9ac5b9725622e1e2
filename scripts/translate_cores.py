"""`translate` on one core against N threads and N child processes, one package, real sentences.

    python scripts/translate_cores.py PACKAGE SENTENCES.gz [--cores 2] [--rounds 7] [--beams 1,4]
                                      [--batch 32]

The benchmark stage's measurement (pipeline/measure/cores.py), in this process: three Translators
of the package, threads=1, threads=N (whole batches at once, one per thread, mt_runtime/cores.py)
and processes=N (child processes of one thread each, mt_runtime/processes.py). Each round
translates every sentence once with each, the order alternating round by round, so a busy machine
slows each alike; printed are the median round's sentences a second and the median of each
round's ratio to one thread. Every translation must be the one-thread one (exits 1 otherwise).
"""

from __future__ import annotations

import argparse
import gzip
import sys
from pathlib import Path

from pipeline.measure.cores import cores_line, measure_cores
from pipeline.measure.jobs import CoresJob


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
        lines = [line.strip() for line in f if line.strip()]
    beams = [int(b) for b in args.beams.split(",")]
    result = measure_cores(CoresJob(str(args.package), args.cores, lines, beams, args.batch, args.rounds))
    print(f"{args.package}, {len(lines)} sentences: {cores_line(result)}")
    if not all(p["same"] for p in result["points"]):
        sys.exit("the translations differ")


if __name__ == "__main__":
    main()
