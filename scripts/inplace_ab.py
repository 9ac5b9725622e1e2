"""Greedy batches with the cache written in place (decoder_greedy_inplace.onnx) against the copying
graphs of the same package, in one process, taking turns batch set by batch set.

    python scripts/inplace_ab.py PACKAGE [--threads 1] [--rounds 6] [--lengths 5-40] [--batch 32]

Sources are random token ids of the package's vocabulary with lengths drawn from --lengths,
sorted by length and batched as `translate` batches them; each sentence decodes to its length
limit (a random-weight package from `scripts/shape_bench.py --keep` never picks its EOS), so rows
leave the batch as their sentences reach it, as they do in real text. The copying side is the
same Translator with the in-place graph set aside (what a package of format 2.0 runs). Prints ms
a sentence for each and the median of the paired ratios (above 1: in place faster); fails if a
single translation differs.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import numpy as np
from mt_runtime.translator import Translator


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("package")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--lengths", default="5-40", help="source lengths, min-max tokens")
    ap.add_argument("--sentences", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    translator = Translator(args.package, threads=args.threads)
    decoders = translator.searcher.shards.states
    if decoders[0].inplace is None:
        raise SystemExit(f"{args.package}: no decoder_greedy_inplace.onnx (a package of format 2.0)")
    low, high = (int(x) for x in args.lengths.split("-"))
    rng = np.random.default_rng(1)
    gen = translator.generation
    vocab = translator.vocab
    sources = [
        [int(t) for t in rng.integers(4, vocab, int(rng.integers(low, high + 1)))] + [gen.eos_id]
        for _ in range(args.sentences)
    ]
    sources.sort(key=len)
    batches = [sources[i : i + args.batch] for i in range(0, len(sources), args.batch)]
    greedy = dataclasses.replace(gen, beam=1)
    kept = [d.inplace for d in decoders]

    def run(in_place: bool):
        for decoder, cache in zip(decoders, kept):
            decoder.inplace = cache if in_place else None
        started = time.perf_counter()
        out = [translator.searcher(batch, greedy) for batch in batches]
        return (time.perf_counter() - started) / len(sources), out

    _, copying = run(False)
    _, in_place = run(True)
    if copying != in_place:
        raise SystemExit("the two give different translations")
    times = [(run(False)[0], run(True)[0]) for _ in range(args.rounds)]
    ratios = [a / b for a, b in times]
    length = sum(len(s) for batch in in_place for s in batch) / len(sources)
    print(
        f"{args.package}, {args.threads} thread(s), {len(sources)} sentences of {args.lengths} tokens in batches of "
        f"{args.batch} (mean output {length:.1f} tokens): copying {1e3 * statistics.median(a for a, _ in times):.3f} "
        f"ms a sentence, in place {1e3 * statistics.median(b for _, b in times):.3f}; in place / copying speed "
        f"{statistics.median(ratios):.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f}); translations identical"
    )


if __name__ == "__main__":
    main()
