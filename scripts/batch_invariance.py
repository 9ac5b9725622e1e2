"""One sentence, one translation, on any test set: each sentence of a file translated alone against
its translation in batches of several compositions, for each package, greedy and beam 4.

    python scripts/batch_invariance.py SENTENCES [PACKAGE ...] [--beams 1,4] [--batches 32s,7,64]

SENTENCES: a text file, one sentence a line (.gz read as gzip), e.g. Multi30k's held-back
test_2017_flickr.en.gz. --batches: sizes; "s" sorted by length (as `translate` forms them),
otherwise a shuffled order (seeded). Prints identical / sentences per package, beam and batching;
exits 1 where any differ (docs/package-format.md promises none on the CPU). Torch-free.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import sys

import numpy as np
from mt_runtime.search import prepare_sources
from mt_runtime.translator import Translator


def batchings(spec: str, lengths: list[int], seed: int) -> list[tuple[str, np.ndarray, int]]:
    rng = np.random.default_rng(seed)
    out = []
    for item in spec.split(","):
        size = int(item.rstrip("s"))
        if item.endswith("s"):
            out.append((f"sorted {size}", np.argsort(lengths, kind="stable"), size))
        else:
            out.append((f"shuffled {size}", rng.permutation(len(lengths)), size))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sentences")
    parser.add_argument("packages", nargs="+")
    parser.add_argument("--beams", default="1,4")
    parser.add_argument("--batches", default="32s,7,64")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    opener = gzip.open if args.sentences.endswith(".gz") else open
    with opener(args.sentences, "rt", encoding="utf-8") as f:
        texts = [line.rstrip("\n") for line in f]
    differing = 0
    for package in args.packages:
        translator = Translator(package, threads=args.threads)
        ids = prepare_sources(translator.tokenizer, texts, translator.generation.max_positions)
        for beam in map(int, args.beams.split(",")):
            gen = dataclasses.replace(translator.generation, beam=beam)
            alone = [translator.searcher([s], gen)[0] for s in ids]
            results = []
            for name, order, size in batchings(args.batches, [len(s) for s in ids], seed=beam):
                got = {}
                for start in range(0, len(order), size):
                    rows = order[start : start + size].tolist()
                    got.update(zip(rows, translator.searcher([ids[i] for i in rows], gen)))
                same = sum(got[i] == a for i, a in enumerate(alone))
                differing += len(ids) - same
                results.append(f"{name}: {same}/{len(ids)}")
            print(f"{package} beam {beam}: " + "  ".join(results), flush=True)
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
