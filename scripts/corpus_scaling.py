"""How the stages scale with the size of a user's corpus: wall time and peak memory per stage.

    python scripts/corpus_scaling.py --pairs 30000,1000000,4000000 [--work DIR] [--steps 50]
                                     [--until teacher] [--keep]

For each N, a synthetic corpus of N training pairs (Multi30k's, repeated, each pair tagged with
its number so that de-duplication keeps it) is written as one TSV, and a recipe on it
(`data.source: files`) is run stage by stage with `pipeline run --until STAGE`, each stage in a
fresh process. Printed per stage: wall seconds and the process tree's peak resident memory,
read by the parent from the kernel's accounting (wait4), not by the process itself; for the
teacher also, from its record, the seconds spent encoding the corpus and per training step
(the training time less its validations, over the steps). Needs
$PIPELINE_DATA (or ../shared/data) for the Multi30k files; writes under --work (the corpora are
about 150 bytes a pair).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("data", "tokenizer", "teacher")

RECIPE = """name: scaling_{n}
data:
  source: files
  files:
    train: {{tsv: {train}}}
    valid: {{tsv: {valid}}}
    test: {{test: {{tsv: {valid}}}}}
tokenizer: {{vocab_size: 8000, max_sentences: {sample}}}
teacher:
  model: {{d_model: 64, encoder_layers: 2, decoder_layers: 2, heads: 4, head_dim: 16, ffn_dim: 128}}
  train: {{max_steps: {steps}, warmup_steps: 10, batch_tokens: 2000, valid_bleu_sentences: 20, num_threads: 1}}
"""


def multi30k_pairs(data: Path) -> list[tuple[str, str]]:
    def lines(name):
        with gzip.open(data / "multi30k" / name, "rt", encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f]

    return list(zip(lines("train.en.gz"), lines("train.fr.gz")))


def write_corpus(path: Path, pairs: list[tuple[str, str]], n: int) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for i in range(n):
            s, t = pairs[i % len(pairs)]
            f.write(f"{s} #{i}\t{t} #{i}\n" if i >= len(pairs) else f"{s}\t{t}\n")


def measured(cmd: list[str], env: dict) -> tuple[float, float, int]:
    """(wall seconds, peak RSS in MB of the process and its waited-for children, exit status)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        sys.stderr.write(proc.stderr.read().decode(errors="replace")[-2000:])
    return wall, usage.ru_maxrss / 1024, proc.returncode


def teacher_record(store: Path) -> dict:
    """Encoding and step seconds from the teacher artifact's manifest and training history."""
    folder = next((store / "objects").glob("teacher-*"))
    metrics = json.loads((folder / "manifest.json").read_text())["metrics"]
    history = json.loads((folder / "training.json").read_text())["history"]
    validation = sum(entry.get("validation_s", 0.0) for entry in history)
    step_s = (metrics["train_minutes"] * 60 - validation) / max(1, metrics["steps"])
    return {"encode_s": metrics["encode_seconds"], "step_ms": round(step_s * 1000, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", default="30000,1000000")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=50, help="teacher training steps")
    parser.add_argument("--sample", type=int, default=200_000, help="tokenizer.max_sentences")
    parser.add_argument("--until", default="teacher", choices=STAGES)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()

    data = Path(os.environ.get("PIPELINE_DATA") or ROOT.parent / "shared" / "data")
    work = args.work or Path(tempfile.mkdtemp(prefix="scaling-"))
    work.mkdir(parents=True, exist_ok=True)
    pairs = multi30k_pairs(data)
    valid = work / "valid.tsv"
    with (
        gzip.open(data / "multi30k" / "val.en.gz", "rt", encoding="utf-8") as en,
        gzip.open(data / "multi30k" / "val.fr.gz", "rt", encoding="utf-8") as fr,
        open(valid, "w", encoding="utf-8") as out,
    ):
        for s, t in zip(en, fr):
            out.write(f"{s.rstrip()}\t{t.rstrip()}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PIPELINE_DATA": str(data)}
    stages = STAGES[: STAGES.index(args.until) + 1]
    results = []
    print(f"{'pairs':>10} {'TSV MB':>7}" + "".join(f" {s + ' s':>13} {s + ' MB':>13}" for s in stages), flush=True)
    for n in (int(x) for x in args.pairs.split(",")):
        corpus = work / f"train_{n}.tsv"
        if not corpus.is_file():
            write_corpus(corpus, pairs, n)
        recipe = work / f"scaling_{n}.yaml"
        recipe.write_text(RECIPE.format(n=n, train=corpus, valid=valid, sample=args.sample, steps=args.steps))
        row = {"pairs": n, "tsv_mb": round(corpus.stat().st_size / 2**20, 1)}
        shutil.rmtree(work / f"store_{n}", ignore_errors=True)  # every stage built, none reused
        for stage in stages:
            wall, rss, code = measured(
                [
                    sys.executable,
                    "-m",
                    "pipeline.commands.cli",
                    "run",
                    str(recipe),
                    "--until",
                    stage,
                    "--store",
                    str(work / f"store_{n}"),
                ],
                env,
            )
            if code:
                raise SystemExit(f"{stage} failed at {n} pairs (exit {code})")
            row[f"{stage}_s"], row[f"{stage}_peak_rss_mb"] = round(wall, 1), round(rss)
        if "teacher" in stages:
            row.update(teacher_record(work / f"store_{n}"))
        results.append(row)
        print(
            f"{n:>10} {row['tsv_mb']:>7}"
            + "".join(f" {row[s + '_s']:>13} {row[s + '_peak_rss_mb']:>13}" for s in stages)
            + (f"  (teacher: encoding {row['encode_s']} s, {row['step_ms']} ms a step)" if "teacher" in stages else ""),
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
