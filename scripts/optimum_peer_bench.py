"""The Optimum rows of docs/results.md: the HF-teacher path (recipes/hf_teacher.yaml) on a local
Marian checkpoint, its benchmark putting side by side, on the same sentences at 1 thread: the
teacher in transformers, through CTranslate2 and through Optimum (float32 and int8 each), and our
packages of the student distilled from it. Then the table, from the run's benchmark.json.

    scripts/optimum_env.sh                                   # Optimum's environment, once
    PIPELINE_DATA=../shared/data .venv/bin/python scripts/optimum_peer_bench.py [--checkpoint DIR] [--out DIR]

No network here, so without --checkpoint it makes a randomly initialised Marian of OPUS-MT's layout
(7.5M parameters: d_model 256, 3+3 layers, SentencePiece vocabularies trained on Multi30k): its
outputs are noise that runs to the length budget, so the figures are costs per sentence of
about 1.5 x its source length + 10 tokens, not quality. The student and its packages are the real
pipeline's, trained for a short budget on that teacher's outputs (their lengths are their own:
the table gives tokens per sentence).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "model" / "runtime")]

# The HF-teacher recipe in minutes: a slice of Multi30k, a short student, no pruning, every row at
# 1 thread on the benchmark's 40 sentences.
SETTINGS = [
    "data.max_train=3000",
    "data.max_test=200",
    "evaluate.test_sets=[test_2016_flickr]",
    "distill.ablation=false",
    "distill.student.train.max_steps=300",
    "distill.student.train.valid_bleu_sentences=100",
    "prune=null",
    "export.parity.decode_sentences=20",
    "quantize.calibration_sentences=50",
    "quantize.latency_sentences=0",
    "benchmark.threads=[1]",
    "benchmark.paired_rounds=0",
    "benchmark.versus.rounds=0",
    "benchmark.versus.separate_rounds=0",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, help="a Marian (or other seq2seq) checkpoint folder")
    ap.add_argument("--out", type=Path, default=Path("optimum-peer"), help="the store and the made checkpoint")
    args = ap.parse_args()
    data = os.environ.get("PIPELINE_DATA")
    if not data:
        sys.exit("set PIPELINE_DATA to the folder holding multi30k/")
    checkpoint = args.checkpoint or args.out / "marian-7m"
    if args.checkpoint is None and not checkpoint.is_dir():
        from tests.helpers.marian import make_marian

        make_marian(
            checkpoint, Path(data), d_model=256, layers=3, heads=4, ffn_dim=1024, vocab_size=4000, sentences=29000
        )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "model" / "runtime")])}
    sets = [f"--set=teacher.pretrained.path={checkpoint.resolve()}", *(f"--set={s}" for s in SETTINGS)]
    store = str((args.out / "store").resolve())
    cmd = [sys.executable, "-m", "pipeline", "run", str(REPO / "recipes" / "hf_teacher.yaml"), "--store", store, *sets]
    subprocess.run(cmd, env=env, cwd=REPO, check=True)
    latest = json.loads(next(Path(store, "latest").glob("hf_teacher@*.json")).read_text(encoding="utf-8"))
    bench = Path(store, "objects", latest["nodes"]["benchmark"]["id"])
    print_table(json.loads((bench / "benchmark.json").read_text(encoding="utf-8")))
    return 0


def print_table(bench: dict) -> None:
    print(f"\n{bench['sentences']} sentences of {bench['test_set']}, 1 thread; ms per sentence (p50)\n")
    print(
        "| row | runtime | type | size MB | greedy ms | beam 4 ms | tokens/sentence (beam 4) | BLEU greedy / beam 4 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in bench["rows"]:
        if r["skipped"]:
            print(f"| {r['name']} | {r['runtime']} | {r['compute_type']} | skipped: {r['skipped']} |||||")
            continue
        lat, tp, scores = r["latency_ms"], r["throughput"], r.get("scores") or {}
        bleu = " / ".join(f"{scores[k]['bleu']:.2f}" if k in scores else "–" for k in ("beam1", "beam4"))
        print(
            f"| {r['name']} | {r['runtime']} | {r['compute_type']} | {r['bytes'] / 1e6:.1f} | "
            f"{lat['greedy_b1']['p50']:.1f} | {lat['beam4_b1']['p50']:.1f} | "
            f"{tp['target_tokens'] / tp['sentences']:.1f} | {bleu} |"
        )


if __name__ == "__main__":
    sys.exit(main())
