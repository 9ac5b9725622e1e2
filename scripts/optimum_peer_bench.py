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
    ap.add_argument("--again", action="store_true", help="measure again (the benchmark rebuilt, the rest reused)")
    ap.add_argument("--rounds", type=int, default=0, help="then ROUNDS rounds of the TURNS rows taking turns")
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
    cmd += ["--force", "benchmark"] if args.again else []
    subprocess.run(cmd, env=env, cwd=REPO, check=True)
    latest = json.loads(next(Path(store, "latest").glob("hf_teacher@*.json")).read_text(encoding="utf-8"))
    bench = Path(store, "objects", latest["nodes"]["benchmark"]["id"])
    table = json.loads((bench / "benchmark.json").read_text(encoding="utf-8"))
    print_table(table)
    if args.rounds:
        in_turns(table, bench, Path(store), args.rounds)
    return 0


# The rows measured again taking turns: a loaded machine's speed drifts by tens of percent over the
# minutes between two rows of the benchmark, so ratios are read within a round.
TURNS = (
    "optimum_teacher_float32",
    "optimum_teacher_int8",
    "ctranslate2_teacher_float32",
    "ctranslate2_teacher_int8",
    "teacher",
    "int8_static",
)


def in_turns(table: dict, bench: Path, store: Path, rounds: int) -> None:
    """Each TURNS row's batch-1 latency on the benchmark's sentences, one fresh process a
    measurement (the Optimum rows' in Optimum's environment), the rows in turn, the order rotated
    each round; per row the median over rounds of its p50 and of its ratio to Optimum float32's."""
    import statistics

    from pipeline.measure import optimum_peer
    from pipeline.measure.jobs import Engine, LatencyJob
    from pipeline.measure.process import run_process

    rows = {r["name"]: r for r in table["rows"] if r["name"] in TURNS and not r["skipped"]}
    names = [n for n in TURNS if n in rows]
    sample = (bench / "sample.src").read_text(encoding="utf-8").splitlines()
    p50 = {n: {"greedy_b1": [], "beam4_b1": []} for n in names}
    for k in range(rounds):
        for name in names[k % len(names) :] + names[: k % len(names)]:
            r = rows[name]
            folder = bench / r["files"] if r["files"] else store / "objects" / r["artifact"] / (r["package"] or "")
            job = LatencyJob(Engine(r["runtime"], "cpu", r["compute_type"], str(folder), 1), sample, 1, 1, 1, 1, 1.0)
            python = optimum_peer.python() if r["runtime"] == optimum_peer.RUNTIME else None
            result = run_process(store / "turns", f"{name}-{k}", job, 1, python=python)
            for key in p50[name]:
                p50[name][key].append(result["latency_ms"][key]["p50"])
    base = names[0]
    print(f"\n{rounds} rounds taking turns, 1 thread: median p50 ms (its ratio to {base}, median over rounds)\n")
    print("| row | greedy ms | beam 4 ms | greedy / Optimum fp32 | beam 4 / Optimum fp32 |")
    print("|---|---|---|---|---|")
    for name in names:
        cells = [f"{statistics.median(p50[name][key]):.1f}" for key in ("greedy_b1", "beam4_b1")]
        ratios = [
            f"{statistics.median(a / b for a, b in zip(p50[name][key], p50[base][key])):.2f}"
            for key in ("greedy_b1", "beam4_b1")
        ]
        print(f"| {name} | {' | '.join(cells)} | {' | '.join(ratios)} |")


def print_table(bench: dict) -> None:
    print(f"\n{bench['sentences']} sentences of {bench['test_set']}, 1 thread; ms per sentence (p50)\n")
    print("| row | runtime | type | size MB | greedy ms | beam 4 ms | BLEU greedy / beam 4 |")
    print("|---|---|---|---|---|---|---|")
    for r in bench["rows"]:
        if r["skipped"]:
            print(f"| {r['name']} | {r['runtime']} | {r['compute_type']} | skipped: {r['skipped']} ||||")
            continue
        lat, scores = r["latency_ms"], r.get("scores") or {}
        bleu = " / ".join(f"{scores[k]['bleu']:.2f}" if k in scores else "–" for k in ("beam1", "beam4"))
        print(
            f"| {r['name']} | {r['runtime']} | {r['compute_type']} | {r['bytes'] / 1e6:.1f} | "
            f"{lat['greedy_b1']['p50']:.1f} | {lat['beam4_b1']['p50']:.1f} | {bleu} |"
        )


if __name__ == "__main__":
    sys.exit(main())
