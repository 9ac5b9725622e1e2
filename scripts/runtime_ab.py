"""One package translated by two versions of mt-runtime in one process, taking turns batch by
batch: the runtime at a git revision against the working tree's. Every translation must be the
same (a runtime change that is only faster changes no output).

    python scripts/runtime_ab.py REVISION PACKAGE SENTENCES [--beam 1] [--batch 32] [--rounds 5]
                                 [--count 1000] [--threads 1] [--calls [--processes N]]

SENTENCES is a text file (.gz too), one sentence a line, sorted by length into batches as a
server's length-sorted batches are, or a shape bench package's job.json (`scripts/shape_bench.py
--keep`: its token ids, every hypothesis forced to its steps). REVISION's model/runtime/mt_runtime
is imported as another package beside the working tree's (its imports are relative), so both
searches run on the same onnxruntime, in the same process, on the same machine state. Prints ms a
batch for each side, each round's, and the speed of the working tree over REVISION (above 1:
faster); exits 1 if any batch translates differently.

`--calls` times whole `translate` calls of the sentences instead (a text file): how a call hands
its batches to `--threads` threads (or `--processes` child processes), each side also at one
thread; prints sentences a second, each side's speed-up over its own one thread (the median of
the rounds' ratios) and the working tree's over REVISION at N.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import importlib
import io
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import mt_runtime.translator as working
from mt_runtime.search import prepare_sources

from pipeline.measure.timing import interleaved

RUNTIME = "model/runtime/mt_runtime"


def runtime_at(revision: str, into: Path):
    """mt_runtime as it was at `revision`, imported as the package `mt_runtime_at_revision`."""
    repo = Path(__file__).resolve().parent.parent
    archive = subprocess.run(["git", "archive", revision, RUNTIME], cwd=repo, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    (into / RUNTIME).rename(into / "mt_runtime_at_revision")
    sys.path.insert(0, str(into))
    return importlib.import_module("mt_runtime_at_revision.translator")


def batches(translator, path: Path, count: int, size: int):
    """Token ids in batches of `size` (by length), and the generation settings to search them with."""
    gen = translator.generation
    if path.name == "job.json":
        job = json.loads(path.read_text())
        src, gen = job["sources"][:count], dataclasses.replace(gen, max_len_a=0.0, max_len_b=job["steps"] + 1)
    else:
        with (gzip.open if path.suffix == ".gz" else open)(path, "rt", encoding="utf-8") as f:
            lines = [line.strip() for line in f if line.strip()][:count]
        src = prepare_sources(translator.tokenizer, lines, gen.max_positions)
    src = sorted(src, key=len)
    return [src[i : i + size] for i in range(0, len(src), size)], gen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("revision")
    ap.add_argument("package", type=Path)
    ap.add_argument("sentences", type=Path)
    ap.add_argument("--beam", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--count", type=int, default=1000, help="sentences (at most)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--calls", action="store_true", help="time whole translate calls, at N and at one thread")
    ap.add_argument("--processes", type=int, default=0, help="with --calls: N child processes instead of threads")
    args = ap.parse_args()
    if args.calls:
        return compare_calls(args)
    with tempfile.TemporaryDirectory() as tmp:
        before = runtime_at(args.revision, Path(tmp)).Translator(args.package, threads=args.threads)
        after = working.Translator(args.package, threads=args.threads)
        work, gen = batches(after, args.sentences, args.count, args.batch)
        gen = dataclasses.replace(gen, beam=args.beam)
        timed = interleaved(
            {args.revision: lambda b: before.searcher(b, gen), "working tree": lambda b: after.searcher(b, gen)},
            work,
            repeats=args.rounds,
        )
    same = sum(x == y for x, y in zip(*timed.outputs.values()))
    rounds = {name: " ".join(f"{s * 1e3:.2f}" for s in seconds) for name, seconds in timed.seconds.items()}
    print(
        f"{args.package}: beam {args.beam}, batches of {args.batch} ({len(work)}), {args.threads} thread(s)\n"
        f"  {args.revision}: {timed.median_ms(args.revision):.3f} ms a batch (rounds {rounds[args.revision]})\n"
        f"  working tree: {timed.median_ms('working tree'):.3f} ms a batch (rounds {rounds['working tree']})\n"
        f"  speed of the working tree: {timed.ratio(args.revision, 'working tree'):.3f}x; "
        f"the same translations in {same}/{len(work)} batches"
    )
    if same != len(work):
        raise SystemExit(1)


def compare_calls(args) -> None:
    """Whole translate calls, each runtime at one thread and at N threads or processes, taking turns."""
    with (gzip.open if args.sentences.suffix == ".gz" else open)(args.sentences, "rt", encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()][: args.count]
    n = args.processes or args.threads
    many = dict(threads=1, processes=n) if args.processes else dict(threads=n)
    how = f"{n} processes" if args.processes else f"{n} threads"
    with tempfile.TemporaryDirectory() as tmp:
        before = runtime_at(args.revision, Path(tmp))
        sides = {}
        for name, runtime in ((args.revision, before), ("working tree", working)):
            sides[f"{name} 1"] = runtime.Translator(args.package, threads=1)
            sides[f"{name} N"] = runtime.Translator(args.package, **many)
        kw = dict(beam=args.beam, max_batch=args.batch, batch_tokens=10**9)
        timed = interleaved(
            {name: (lambda s, t=t: t.translate(s, **kw)) for name, t in sides.items()},
            [lines],
            repeats=args.rounds,
            warmup=1,
        )
        for translator in sides.values():
            getattr(translator, "close", lambda: None)()
    seconds = timed.seconds

    def speedup(slow: str, fast: str) -> float:
        return statistics.median(s / f for s, f in zip(seconds[slow], seconds[fast]))

    same = all(timed.outputs[name] == timed.outputs[f"{args.revision} 1"] for name in sides)
    print(f"{args.package}: {len(lines)} sentences, beam {args.beam}, batches of {args.batch}, {how}")
    for name in (args.revision, "working tree"):
        one, at_n = (len(lines) / statistics.median(seconds[f"{name} {k}"]) for k in "1N")
        print(f"  {name}: one thread {one:.0f} sent/s, {how} {at_n:.0f} ({speedup(f'{name} 1', f'{name} N'):.3f}x)")
    rounds = " ".join(f"{b / a:.3f}" for a, b in zip(seconds["working tree N"], seconds[f"{args.revision} N"]))
    print(
        f"  {how}, working tree over {args.revision}: {speedup(f'{args.revision} N', 'working tree N'):.3f}x "
        f"(rounds {rounds}); the same translations: {same}"
    )
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
