"""Quantize stage: the fp32 ONNX package -> int8_dynamic/ and int8_static/ packages, each behind
an accuracy guard (pipeline/quantize/guard.py): every candidate is written and opened as it ships
and scored on the validation set against the fp32 package; if the drop exceeds `max_bleu_drop`,
the most sensitive weight groups stay in float, one more at a time. The manifest lists what
stayed in float and every attempt's BLEU; if no attempt meets the tolerance the stage fails with
that table instead of shipping a bad model. The graphs are model/onnx_quantize/'s.
"""

from __future__ import annotations

from typing import Callable

import onnxruntime as ort
from mt_runtime.layout import SHORTLIST_FILE

from model.onnx_quantize import calibration_feeds, node_groups, quantize_rows, quantize_static

from ...corpora.splits import read_split
from ...engine.context import StageContext
from ...export.packages import package_bytes, set_figures, write_package
from ...quantize.card import package_about, package_figures
from ...quantize.guard import GuardScorer, guarded_search
from ...quantize.latency import latency_vs_fp32
from . import QuantizeConfig, QuantizeInputs


def run(ctx: StageContext) -> dict:
    cfg: QuantizeConfig = ctx.settings
    inputs: QuantizeInputs = ctx.inputs
    fp32_dir = inputs.export.path / "fp32"
    paths = {"encoder": fp32_dir / "encoder.onnx", "decoder": fp32_dir / "decoder.onnx"}
    groups = node_groups(paths)
    valid_src, valid_ref = read_split(inputs.data.path, "valid")
    n_guard = cfg.guard_sentences or len(valid_src)
    guard = GuardScorer(fp32_dir, valid_src[:n_guard], valid_ref[:n_guard], ctx.progress)  # verifies the package
    fp32 = guard.translator

    fp32_bleu = guard.bleu(fp32_dir, "fp32")
    ctx.log(
        f"fp32 validation BLEU {fp32_bleu:.2f} on {n_guard} sentences (beam {fp32.generation.beam}); "
        f"{len(groups)} weight groups"
    )
    metrics: dict = {
        "fp32_bleu": fp32_bleu,
        "guard_sentences": n_guard,
        "beam": fp32.generation.beam,
        "max_bleu_drop": cfg.max_bleu_drop,
        "fp32_onnx_bytes": fp32.package["onnx_bytes"],
        "groups": list(groups),
        "onnxruntime": ort.__version__,
        "variants": {},
    }

    makers: dict[str, Callable] = {}
    if cfg.dynamic:
        makers["int8_dynamic"] = lambda keep, out: quantize_rows(paths, out, groups, keep)
    if cfg.static:
        calibration = valid_src[: cfg.calibration_sentences]
        with ctx.progress(
            "calibration inputs", total=sum(bool(s.strip()) for s in calibration), unit="sentences"
        ) as bar:
            feeds = calibration_feeds(fp32, calibration, on_batch=bar.advance)
        metrics["calibration"] = {
            "method": cfg.calibration,
            "sentences": min(cfg.calibration_sentences, len(valid_src)),
            "encoder_feeds": len(feeds["encoder"]),
            "decoder_feeds": len(feeds["decoder"]),
        }
        makers["int8_static"] = lambda keep, out: quantize_static(
            paths, out, groups, feeds, cfg.calibration, keep, cfg.per_channel, cache=ctx.work / "calibration"
        )

    for variant, make in makers.items():
        tries = ctx.work / variant

        def evaluate(keep: tuple[str, ...]) -> float:
            graphs = make(keep, tries / f"try{len(list(tries.glob('try*')))}")
            return guard.bleu(guard.candidate(graphs, variant, keep), f"{variant}, {len(keep)} groups float")

        result = guarded_search(list(groups), evaluate, fp32_bleu, cfg.max_bleu_drop, variant, ctx.log)
        graphs = make(tuple(result["float_groups"]), ctx.work / f"{variant}.final")
        report = {**result}
        folder = ctx.out / variant
        about = package_about(fp32.package, variant, result["float_groups"], metrics.get("calibration"))
        shortlist = fp32_dir / SHORTLIST_FILE
        meta = write_package(
            folder,
            graphs["encoder"],
            graphs["decoder"],
            fp32_dir / "tokenizer.json",
            guard.generation,
            about,
            shortlist=shortlist if shortlist.is_file() else None,
        )
        report["onnx_bytes"] = meta["onnx_bytes"]
        report["bytes_ratio"] = round(meta["onnx_bytes"] / metrics["fp32_onnx_bytes"], 4)
        if cfg.latency_sentences:
            report.update(latency_vs_fp32(fp32_dir, folder, valid_src[: cfg.latency_sentences], variant, ctx.progress))
        set_figures(folder, package_figures(report, fp32_bleu, n_guard))  # bytes and latency need the package first
        report["package_bytes"] = package_bytes(folder)
        metrics["variants"][variant] = report
        ctx.log(
            f"{variant}: BLEU {report['bleu']:.2f} (fp32 {fp32_bleu:.2f}), float groups: "
            f"{', '.join(report['float_groups']) or 'none'}; ONNX bytes {report['bytes_ratio']:.0%} of fp32"
            + (f"; batch-1 latency {report['latency_ratio']:.2f}x fp32" if "latency_ratio" in report else "")
        )

    first = next(iter(metrics["variants"].values()), None)
    if first:  # headline figures (the run summary shows these keys) from the first variant
        metrics.update(bleu=first["bleu"], bytes_ratio=first["bytes_ratio"])
    return metrics
