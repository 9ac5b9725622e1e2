"""An ONNX package against a CTranslate2 model of the same weights, in one process, the two taking
turns batch by batch (sentence by sentence at batch 1), so that a noisy machine slows both alike.

    python scripts/pair_ctranslate2.py PACKAGE CT2_FOLDER SENTENCES.txt [--threads 1] [--rounds 5]
        [--points 1x1,1x4,32x1,32x4,64x1,64x4] [--sentences 256] [--compute-type int8]

Prints one markdown row per point (batch x beam): sentences/s (ms a sentence at batch 1) and ours /
CTranslate2 in brackets, above 1 ours faster; for greedy batches also the package without its
shortlist ("whole"), where it has one. The turns are the benchmark stage's `versus`
(pipeline.measurement.take_turns); this script is docs/results.md's independent timing, at batch 1
over the first 64 sentences.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from model.ctranslate2_export import CTranslate2Translator
from model.runtime import Translator
from pipeline.measurement import take_turns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("package", type=Path)
    ap.add_argument("ctranslate2", type=Path)
    ap.add_argument("sentences", type=Path)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--points", default="1x1,1x4,32x1,32x4,64x1,64x4")
    ap.add_argument("--sentences", dest="count", type=int, default=256)
    ap.add_argument("--compute-type", default="int8")
    args = ap.parse_args()

    sample = [s for s in args.sentences.read_text(encoding="utf-8").splitlines() if s.strip()][: args.count]
    engines = {"ours": Translator(args.package, threads=args.threads),
               "ctranslate2": CTranslate2Translator(args.ctranslate2, threads=args.threads,
                                                    compute_type=args.compute_type)}
    if engines["ours"].describe()["shortlist"]:
        engines["whole"] = Translator(args.package, threads=args.threads, shortlist=False)
    print(f"| threads | search | batch | {' | '.join(engines)} |")
    print("|---|---|---|" + "---|" * len(engines))
    for point in args.points.split(","):
        batch, beam = (int(x) for x in point.split("x"))
        # The shortlist serves greedy batches only: elsewhere "whole" would time the same thing.
        names = [n for n in engines if n != "whole" or (batch > 1 and beam == 1)]
        timed, batches = take_turns({n: engines[n] for n in names}, sample[:64] if batch == 1 else sample,
                                    batch, beam, args.rounds, engines["ours"].tokenizer)
        theirs = timed.median_s("ctranslate2")
        per_item = 1 if batch == 1 else len(sample) / batches

        def figure(name: str) -> str:
            seconds = timed.median_s(name)
            value = f"{1000 * seconds:.2f} ms" if batch == 1 else f"{per_item / seconds:.1f}/s"
            return f"{value} ({theirs / seconds:.3f})"

        cells = [figure(n) if n in names else "" for n in engines]
        print(f"| {args.threads} | {'greedy' if beam == 1 else f'beam {beam}'} | {batch} | {' | '.join(cells)} |",
              flush=True)


if __name__ == "__main__":
    main()
