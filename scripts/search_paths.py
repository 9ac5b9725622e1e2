"""Where a package's search time goes outside the graphs, two ways (docs/decisions.md, issue 58).

    python scripts/search_paths.py PACKAGE SENTENCES [--beam 1] [--rounds 7] [--count 200]

One sentence: generate.onnx (the whole search in onnxruntime's op, what a Translator runs) against
the step graphs with mt_runtime/search.py's loop as a batch of one, taking turns sentence by
sentence in one process (pipeline.measure.timing.interleaved), the translations compared.
Batches of 32: the wall time against the time inside onnxruntime's session calls, the rest being
the Python between them (the best of --rounds passes).

SENTENCES is a text file (.gz too), one sentence a line, or a shape bench package's job.json
(`scripts/shape_bench.py --keep`): its token ids then, every hypothesis forced to its steps.
One thread, CPU only.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import time
from pathlib import Path

import onnxruntime as ort
from mt_runtime.search import prepare_sources
from mt_runtime.translator import Translator

from pipeline.measure.timing import interleaved


def sources(translator: Translator, path: Path, count: int):
    """Token ids (EOS included) and the generation settings to search them with."""
    gen = translator.generation
    if path.name == "job.json":
        job = json.loads(path.read_text())
        return job["sources"][:count], dataclasses.replace(gen, max_len_a=0.0, max_len_b=job["steps"] + 1)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()][:count]
    return prepare_sources(translator.tokenizer, lines, gen.max_positions), gen


def one_sentence(translator: Translator, src: list[list[int]], gen, rounds: int) -> str:
    steps = Translator(translator.folder, threads=1, search="python")  # a sentence alone: a batch of one
    timed = interleaved(
        {
            "generate.onnx": lambda s: translator.searcher([s], gen)[0],
            "step graphs": lambda s: steps.searcher([s], gen)[0],
        },
        src,
        repeats=rounds,
    )
    same = sum(a == b for a, b in zip(*timed.outputs.values()))
    op, loop = timed.median_ms("generate.onnx"), timed.median_ms("step graphs")
    return (
        f"one sentence, beam {gen.beam}: generate.onnx {op:.3f} ms, step graphs {loop:.3f} ms a sentence "
        f"({loop / op:.2f}x the op's time); the same translation {same}/{len(src)}"
    )


def host_share(translator: Translator, src: list[list[int]], gen, rounds: int, batch: int = 32) -> str:
    inside = {"s": 0.0}
    session = ort.InferenceSession
    plain = {name: getattr(session, name) for name in ("run", "run_with_iobinding")}

    def timed(method):
        def call(self, *args, **kwargs):
            start = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                inside["s"] += time.perf_counter() - start

        return call

    batches = [src[i : i + batch] for i in range(0, len(src), batch)]
    for name, method in plain.items():
        setattr(session, name, timed(method))
    try:
        for b in batches:  # warm-up
            translator.searcher(b, gen)
        best = None
        for _ in range(rounds):
            inside["s"] = 0.0
            start = time.perf_counter()
            for b in batches:
                translator.searcher(b, gen)
            wall = time.perf_counter() - start
            if best is None or wall < best[0]:
                best = (wall, inside["s"])
    finally:
        for name, method in plain.items():
            setattr(session, name, method)
    wall, ort_s = (x / len(batches) * 1000 for x in best)
    return (
        f"batches of {batch}, beam {gen.beam}: {wall:.2f} ms a batch, {ort_s:.2f} inside onnxruntime, "
        f"{wall - ort_s:.2f} between its calls ({(wall - ort_s) / wall:.1%})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("package", type=Path)
    ap.add_argument("sentences", type=Path)
    ap.add_argument("--beam", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--count", type=int, default=200, help="sentences (at most)")
    args = ap.parse_args()
    translator = Translator(args.package, threads=1)
    if translator.search != "graph" or translator.decoder.many_rows is None:
        raise SystemExit(f"{args.package}: needs generate.onnx and decoder_batch.onnx (a CPU package)")
    src, gen = sources(translator, args.sentences, args.count)
    gen = dataclasses.replace(gen, beam=args.beam)
    print(f"{args.package} ({translator.package.get('variant')}), onnxruntime {ort.__version__}, 1 thread")
    print(one_sentence(translator, src, gen, args.rounds))
    print(host_share(translator, src, gen, args.rounds))


if __name__ == "__main__":
    main()
