"""Two packages of one model (say, exported before and after a change to the graphs) timed on the
same sentences in one process, taking turns; every translation must be the same.

    python scripts/package_ab.py BEFORE AFTER [--beam 1] [--batch 1] [--rounds 7] [--sentences 40]
                                 [--threads 1] [--steps 30]

Sources are random token ids of the packages' vocabulary, 20 tokens; with --steps each hypothesis
runs that many steps when the package never picks its EOS (random-weight packages from
`scripts/shape_bench.py --keep`), otherwise to the search's length limit. --batch 1 goes through
generate.onnx (one sentence a call), more through the search loop. Prints ms a sentence for each
and the median of the paired ratios (above 1: AFTER faster); exits 1 if a translation differs,
unless --different-ok (packages whose numbers were meant to change, say a new int8 rounding: with
--steps every hypothesis still does the same work, and the mean output lengths are printed).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

import numpy as np
from mt_runtime.translator import Translator


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--beam", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--sentences", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=30, help="0: the package's own length limit")
    ap.add_argument("--different-ok", action="store_true", help="time packages that translate differently")
    args = ap.parse_args()
    sides = [Translator(folder, threads=args.threads) for folder in (args.before, args.after)]
    gen = sides[0].generation
    if args.steps:
        gen = dataclasses.replace(gen, max_len_a=0.0, max_len_b=args.steps + 1)
    gen = dataclasses.replace(gen, beam=args.beam)
    rng = np.random.default_rng(0)
    sources = [[int(t) for t in rng.integers(4, sides[0].vocab, 19)] + [gen.eos_id] for _ in range(args.sentences)]
    batches = [sources[i : i + args.batch] for i in range(0, len(sources), args.batch)]

    def run(translator: Translator):
        started = time.perf_counter()
        out = [translator.searcher(batch, gen) for batch in batches]
        return (time.perf_counter() - started) / len(sources), out

    outputs = [[row for out in run(side)[1] for row in out] for side in sides]
    differ = sum(a != b for a, b in zip(*outputs))
    if differ and not args.different_ok:
        sys.exit("the two packages translate differently")
    same = "translations identical"
    if differ:
        lengths = [statistics.mean(len(row) for row in out) for out in outputs]
        same = f"{differ} of {len(sources)} translations differ"
        same += f" (mean length {lengths[0]:.1f} before, {lengths[1]:.1f} after)"
    times = [tuple(run(side)[0] for side in sides) for _ in range(args.rounds)]
    ratios = [a / b for a, b in times]
    print(
        f"beam {args.beam}, batch {args.batch}, {args.threads} thread(s), {len(sources)} sentences: before "
        f"{1e3 * statistics.median(a for a, _ in times):.3f} ms a sentence, after "
        f"{1e3 * statistics.median(b for _, b in times):.3f}; after / before speed {statistics.median(ratios):.3f} "
        f"(rounds {min(ratios):.3f}-{max(ratios):.3f}); {same}"
    )


if __name__ == "__main__":
    main()
