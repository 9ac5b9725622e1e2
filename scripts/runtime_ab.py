"""One package translated by two versions of mt-runtime in one process, taking turns batch by
batch: the runtime at a git revision against the working tree's. Every translation must be the
same (a runtime change that is only faster changes no output).

    python scripts/runtime_ab.py REVISION PACKAGE SENTENCES [--beam 1] [--batch 32] [--rounds 5]
                                 [--count 1000] [--threads 1]

SENTENCES is a text file (.gz too), one sentence a line, sorted by length into batches as a
server's length-sorted batches are, or a shape bench package's job.json (`scripts/shape_bench.py
--keep`: its token ids, every hypothesis forced to its steps). REVISION's model/runtime/mt_runtime
is imported as another package beside the working tree's (its imports are relative), so both
searches run on the same onnxruntime, in the same process, on the same machine state. Prints ms a
batch for each side, each round's, and the speed of the working tree over REVISION (above 1:
faster); exits 1 if any batch translates differently.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import importlib
import io
import json
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
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()
