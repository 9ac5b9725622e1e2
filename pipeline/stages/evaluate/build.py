"""Evaluate stage: translate each test set with a translator, score BLEU and chrF (sacrebleu).

It takes "a translator", not a torch module, so the same code scores every variant: PyTorch
models and ONNX packages (fp32, fp16, int8) alike. Hypotheses are kept in the artifact, one a
line, line-aligned with the test set's sources and references (mt_runtime/lines.py). An ONNX package
also translates every sentence alone, and the stage records how many come out as in the batches
(`alone_identical`): a package promises the same translation for a sentence in any batch, so the
BLEU scored on batches is also the BLEU of single requests.
"""

from __future__ import annotations

import json
import time

from mt_runtime.lines import one_line

from ...corpora.splits import read_split
from ...engine.context import StageContext
from ...engine.errors import StageFailed, UserInputError
from ...measure.scoring import score
from ...measure.translators import open_model
from . import EvaluateInputs, EvaluateNode


def run(ctx: StageContext) -> dict:
    cfg: EvaluateNode = ctx.settings
    inputs: EvaluateInputs = ctx.inputs
    data, model = inputs.data, inputs.model
    available = data.metrics.get("test_sets", [])
    test_sets = cfg.test_sets or available
    unknown = [t for t in test_sets if t not in available]
    if unknown:
        raise UserInputError(f"evaluate.test_sets: {unknown} not produced by the data stage (it has {available})")
    translator = open_model(model.path / cfg.package if cfg.package else model.path, device=cfg.device)
    beams = [cfg.beam] + ([1] if cfg.greedy_too and cfg.beam != 1 else [])
    results: dict = {}
    for test in test_sets:
        src, refs = read_split(data.path, f"test.{test}")
        results[test] = {}
        for beam in beams:
            with ctx.progress(f"{test} beam {beam}", total=len(src), unit="sentences") as bar:
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
                    f"of {data.path / f'test.{test}.src'}"
                )
            scores = score(hyps, refs)
            scores.update(seconds=round(seconds, 2), sentences_per_s=round(len(src) / seconds, 1))
            if cfg.alone_too and translator.runtime == "onnxruntime":
                scores["alone_identical"] = _alone_identical(ctx, translator, src, hyps, beam, cfg, test)
            (ctx.out / f"{test}.beam{beam}.hyp").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
            results[test][f"beam{beam}"] = scores
            ctx.log(f"{test} beam {beam}: BLEU {scores['bleu']:.2f}, chrF {scores['chrf']:.2f} ({seconds:.0f} s)")
    first = results[test_sets[0]]
    head = first[f"beam{cfg.beam}"]
    metrics = {
        "variant": cfg.variant,
        "runtime": translator.runtime,
        "device": cfg.device,
        # mt_runtime/search.py's loop, or "graph": onnxruntime's BeamSearch op (generate.onnx); only
        # packages name their search (PyTorch always runs the loop; CTranslate2 and transformers,
        # which search on their own, have been recorded "python" and still are)
        "search": translator.describe().get("search", "python"),
        "model_artifact": model.id,
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
    (ctx.out / "scores.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return metrics


def _alone_identical(
    ctx: StageContext, translator, src: list[str], batched: list[str], beam: int, cfg: EvaluateNode, test: str
) -> dict:
    """Every sentence translated again alone (a batch of one, the path a single request takes:
    onnxruntime's search op) against its translation in the batches above: a package promises the
    same output either way (docs of the package format), so one BLEU holds for every path."""
    with ctx.progress(f"{test} beam {beam}, one sentence at a time", total=len(src), unit="sentences") as bar:
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
        ctx.log(
            f"{test} beam {beam}: {len(differ)} of {len(src)} sentences translate differently alone "
            f"(lines {', '.join(str(i + 1) for i in differ[:5])}{', ...' if len(differ) > 5 else ''})"
        )
    return {"identical": len(src) - len(differ), "sentences": len(src), "differ": differ[:20]}
