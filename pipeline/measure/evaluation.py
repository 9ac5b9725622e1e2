"""Scoring a translator on test sets: each translated with beam search (and greedily), BLEU and
chrF (scoring.py), and for an ONNX package each sentence again alone, counting the ones that come
out otherwise than in their batch (a package promises the same translation in any batch, so the
BLEU scored on batches is also the BLEU of single requests). What the evaluate stage returns is
EvaluateOutput; the report reads it.

It takes "a translator", not a torch module, so the same code scores every variant: PyTorch
models and ONNX packages (fp32, fp16, int8) alike. Hypotheses are written one a line,
line-aligned with the test set's sources and references (mt_runtime/lines.py). `cfg` is an
evaluate node's settings (pipeline/stages/evaluate: EvaluateNode); `progress` and `log` a stage
context's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from mt_runtime.lines import one_line

from ..corpora.splits import read_split
from ..engine.errors import StageFailed
from ..engine.stage import Output
from .scoring import score


@dataclass(frozen=True)
class EvaluateOutput(Output):
    variant: str
    runtime: str
    device: str
    # mt_runtime/search.py's loop, or "graph": onnxruntime's BeamSearch op (generate.onnx)
    search: str
    model_artifact: str
    bleu: float  # the first test set's, at `beam`
    chrf: float
    test_set: str
    beam: int
    bleu_signature: str
    chrf_signature: str
    results: dict  # test set -> beam<k> -> bleu, chrf, seconds, sentences_per_s, bleu_detail
    bleu_greedy: float | None = None  # greedy_too, beam > 1
    chrf_greedy: float | None = None
    alone_identical: dict | None = None  # ONNX packages with alone_too: "<test>.beam<k>" -> counts
    batch_invariant: bool | None = None  # every sentence came out the same alone


def score_test_sets(translator, data: Path, test_sets: list[str], cfg, out: Path, progress, log) -> dict:
    """{test set: {"beam<k>": scores}} at cfg.beam (and greedy where cfg.greedy_too), each
    translation written to out/<test>.beam<k>.hyp."""
    beams = [cfg.beam] + ([1] if cfg.greedy_too and cfg.beam != 1 else [])
    results: dict = {}
    for test in test_sets:
        src, refs = read_split(data, f"test.{test}")
        results[test] = {}
        for beam in beams:
            with progress(f"{test} beam {beam}", total=len(src), unit="sentences") as bar:
                t0 = time.perf_counter()
                hyps = translator.translate(
                    src,
                    beam=beam,
                    length_penalty=cfg.length_penalty,
                    batch_tokens=cfg.batch_tokens,
                    on_batch=bar.advance,
                )
                seconds = time.perf_counter() - t0
            hyps = [one_line(h) for h in hyps]
            if len(hyps) != len(src):
                raise StageFailed(
                    f"{translator.runtime} returned {len(hyps)} translations for the {len(src)} lines "
                    f"of {data / f'test.{test}.src'}"
                )
            scores = score(hyps, refs)
            scores.update(seconds=round(seconds, 2), sentences_per_s=round(len(src) / seconds, 1))
            if cfg.alone_too and translator.runtime == "onnxruntime":
                scores["alone_identical"] = alone_identical(translator, src, hyps, beam, cfg, test, progress, log)
            (out / f"{test}.beam{beam}.hyp").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
            results[test][f"beam{beam}"] = scores
            log(f"{test} beam {beam}: BLEU {scores['bleu']:.2f}, chrF {scores['chrf']:.2f} ({seconds:.0f} s)")
    return results


def evaluation_metrics(results: dict, test_sets: list[str], cfg, translator, model_id: str) -> dict:
    """What the stage returns (EvaluateOutput's keys, in the manifest's order): the first test
    set's scores at cfg.beam in front, every score under `results`."""
    first = results[test_sets[0]]
    head = first[f"beam{cfg.beam}"]
    metrics = {
        "variant": cfg.variant,
        "runtime": translator.runtime,
        "device": cfg.device,
        # only packages name their search (PyTorch always runs the loop; CTranslate2 and
        # transformers, which search on their own, have been recorded "python" and still are)
        "search": translator.describe().get("search", "python"),
        "model_artifact": model_id,
        "bleu": head["bleu"],
        "chrf": head["chrf"],
        "test_set": test_sets[0],
        "beam": cfg.beam,
        "bleu_signature": head["bleu_signature"],
        "chrf_signature": head["chrf_signature"],
        "results": {
            t: {
                k: {m: v[m] for m in ("bleu", "chrf", "seconds", "sentences_per_s", "bleu_detail")}
                for k, v in r.items()
            }
            for t, r in results.items()
        },
    }
    if "beam1" in first and cfg.beam != 1:
        metrics["bleu_greedy"] = first["beam1"]["bleu"]
        metrics["chrf_greedy"] = first["beam1"]["chrf"]
    alone = {
        f"{t}.{k}": v["alone_identical"] for t, r in results.items() for k, v in r.items() if "alone_identical" in v
    }
    if alone:  # the BLEU above holds for every path where every sentence came out the same alone
        metrics["alone_identical"] = alone
        metrics["batch_invariant"] = all(v["identical"] == v["sentences"] for v in alone.values())
    return metrics


def alone_identical(translator, src: list[str], batched: list[str], beam: int, cfg, test: str, progress, log) -> dict:
    """Every sentence translated again alone (a batch of one, the path a single request takes:
    onnxruntime's search op) against its translation in the batches above: a package promises the
    same output either way (docs of the package format), so one BLEU holds for every path."""
    with progress(f"{test} beam {beam}, one sentence at a time", total=len(src), unit="sentences") as bar:
        alone = [
            one_line(h)
            for h in translator.translate(
                src,
                beam=beam,
                length_penalty=cfg.length_penalty,
                batch_tokens=cfg.batch_tokens,
                max_batch=1,
                on_batch=bar.advance,
            )
        ]
    differ = [i for i, (a, b) in enumerate(zip(alone, batched)) if a != b]
    if differ:
        log(
            f"{test} beam {beam}: {len(differ)} of {len(src)} sentences translate differently alone "
            f"(lines {', '.join(str(i + 1) for i in differ[:5])}{', ...' if len(differ) > 5 else ''})"
        )
    return {"identical": len(src) - len(differ), "sentences": len(src), "differ": differ[:20]}
