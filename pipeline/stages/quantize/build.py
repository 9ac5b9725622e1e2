"""Quantize stage: the fp32 ONNX package -> int8_dynamic/ and int8_static/ (QDQ) packages,
each behind an accuracy guard.

The guard translates the validation set with each variant (the same search and runtime code
the evaluate stage uses) and compares BLEU with the fp32 package. If the drop exceeds
`max_bleu_drop`, it measures each weight group's sensitivity (that group alone in int8) and
keeps the most sensitive groups in float, one more at a time, until the drop is within
tolerance. The manifest lists what stayed in float and every attempt's BLEU; if no attempt
meets the tolerance the stage fails with that table instead of shipping a bad model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import onnxruntime as ort
from mt_runtime.layout import DECODER_BATCH, DECODER_GREEDY, SHORTLIST_FILE
from mt_runtime.search import greedy_search, prepare_sources, translate_sentences
from mt_runtime.translator import GraphSearch, OnnxDecoder, PackageSearch, Translator

from model.onnx_passes import derive_graphs
from model.onnx_quantize import RecordingDecoder, node_groups, quantize_rows, quantize_static

from ...corpora.splits import read_split
from ...engine.context import StageContext
from ...engine.errors import StageFailed
from ...export.packages import package_bytes, set_figures, write_package
from ...measure.scoring import bleu_only
from ...measure.timing import interleaved
from . import QuantizeConfig, QuantizeInputs

CALIBRATION_BATCH = 16
_PRECISION = {
    "int8_dynamic": "int8 weights per output column, activations quantized per row (per token) at run time, "
    "exact int32 products (MatMulIntegerToFloat): a sentence's translation does not depend on "
    "its batch; for CPUs",
    "int8_static": "int8 QDQ (symmetric weights and activations, calibrated); for TensorRT and other int8 runtimes",
}


def run(ctx: StageContext) -> dict:
    cfg: QuantizeConfig = ctx.settings
    inputs: QuantizeInputs = ctx.inputs
    fp32_dir = inputs.export.path / "fp32"
    fp32 = Translator(fp32_dir)  # verifies the package
    paths = {"encoder": fp32_dir / "encoder.onnx", "decoder": fp32_dir / "decoder.onnx"}
    groups = node_groups(paths)
    valid_src, valid_ref = read_split(inputs.data.path, "valid")
    n_guard = cfg.guard_sentences or len(valid_src)
    guard_src, guard_ref = valid_src[:n_guard], valid_ref[:n_guard]

    generation = json.loads((fp32_dir / "generation.json").read_text(encoding="utf-8"))

    def bleu_of(graphs: dict[str, Path], label: str) -> float:
        """Validation BLEU with the search the package will run (generate*.onnx, as Translator
        does on the CPU), so that the guard judges what ships."""
        folder = graphs["decoder"].parent
        if folder == fp32_dir:
            searcher = fp32.searcher
        else:  # a candidate's folder: give it the graphs a package searches with
            derive_graphs(folder, generation)
            many_rows = folder / DECODER_BATCH
            searcher = PackageSearch(
                _decoder(graphs, fp32.generation.pad_id, many_rows), GraphSearch.load(folder, _quiet_options())
            )
        with ctx.progress(f"guard: {label}", total=len(guard_src), unit="sentences") as bar:
            hyps = translate_sentences(
                None, fp32.tokenizer, guard_src, fp32.generation, on_batch=bar.advance, searcher=searcher
            )
        return bleu_only(hyps, guard_ref)

    fp32_bleu = bleu_of(paths, "fp32")
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
        feeds = calibration_feeds(fp32, valid_src[: cfg.calibration_sentences], ctx)
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
            return bleu_of(graphs, f"{variant}, {len(keep)} groups float")

        result = guarded_search(list(groups), evaluate, fp32_bleu, cfg.max_bleu_drop, variant, ctx.log)
        graphs = make(tuple(result["float_groups"]), ctx.work / f"{variant}.final")
        report = {**result}
        folder = ctx.out / variant
        about = _about(
            fp32.package, variant, result["float_groups"], metrics.get("calibration"), cfg, graphs["decoder"]
        )
        shortlist = fp32_dir / SHORTLIST_FILE
        meta = write_package(
            folder,
            graphs["encoder"],
            graphs["decoder"],
            fp32_dir / "tokenizer.json",
            generation,
            about,
            shortlist=shortlist if shortlist.is_file() else None,
        )
        report["onnx_bytes"] = meta["onnx_bytes"]
        report["bytes_ratio"] = round(meta["onnx_bytes"] / metrics["fp32_onnx_bytes"], 4)
        if cfg.latency_sentences:
            report.update(latency_vs_fp32(fp32_dir, folder, valid_src[: cfg.latency_sentences], ctx, variant))
        set_figures(folder, _figures(report, fp32_bleu, n_guard))  # bytes and latency need the package first
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


def _quiet_options() -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.inter_op_num_threads = 1
    return options


def _decoder(graphs: dict[str, Path], pad_id: int, many_rows: Path | None = None) -> OnnxDecoder:
    options = _quiet_options()
    greedy = many_rows.with_name(DECODER_GREEDY) if many_rows is not None else None
    encoder, decoder, many_rows, greedy = (
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        if path is not None and path.is_file()
        else None
        for path in (graphs["encoder"], graphs["decoder"], many_rows, greedy)
    )
    return OnnxDecoder(encoder, decoder, pad_id=pad_id, many_rows=many_rows, greedy=greedy)


# ------------------------------------------------------------------------------ the guard
def guarded_search(
    groups: list[str],
    evaluate: Callable[[tuple[str, ...]], float],
    reference: float,
    max_drop: float,
    variant: str,
    log=print,
) -> dict:
    """Quantize everything; if BLEU drops too much, keep the most sensitive groups in float.

    `evaluate(float_groups)` returns the BLEU with those groups left in float. Sensitivity of a
    group = the BLEU drop when only that group is quantized. Raises StageFailed with the table
    of attempts when even all but one group in float is not within `max_drop`."""
    attempts = []

    def attempt(keep: tuple[str, ...]) -> bool:
        bleu = evaluate(keep)
        attempts.append({"float_groups": list(keep), "bleu": bleu, "drop": round(reference - bleu, 2)})
        return reference - bleu <= max_drop + 1e-9

    if attempt(()):
        return {"bleu": attempts[-1]["bleu"], "float_groups": [], "attempts": attempts, "sensitivity": {}}
    log(f"{variant}: BLEU drop {attempts[-1]['drop']:.2f} > {max_drop:g}; measuring each group's sensitivity")
    sensitivity = {}
    for group in groups:
        sensitivity[group] = round(reference - evaluate(tuple(g for g in groups if g != group)), 2)
    order = sorted(groups, key=lambda g: -sensitivity[g])  # stable: ties keep model order
    for k in range(1, len(groups)):
        if attempt(tuple(order[:k])):
            return {
                "bleu": attempts[-1]["bleu"],
                "float_groups": list(order[:k]),
                "attempts": attempts,
                "sensitivity": sensitivity,
            }
    table = "\n".join(
        f"  {a['bleu']:6.2f} {a['drop']:+6.2f}  float: {', '.join(a['float_groups']) or 'none'}" for a in attempts
    )
    raise StageFailed(
        f"{variant}: no configuration keeps the BLEU drop within {max_drop:g} of fp32 "
        f"({reference:.2f}); attempts (BLEU, drop, groups kept in float):\n{table}\n"
        f"  sensitivity (drop with only that group in int8): {sensitivity}"
    )


# ----------------------------------------------------------------------- calibration, timing
def calibration_feeds(fp32: Translator, sentences: list[str], ctx: StageContext) -> dict[str, list[dict]]:
    """Real encoder and decoder inputs, recorded while the fp32 package decodes (greedy) the
    calibration sentences in batches: every step of the growing cache is represented."""
    recorder = RecordingDecoder(fp32.decoder)
    src = prepare_sources(
        fp32.tokenizer, [s for s in sentences if s.strip()], fp32.generation.max_positions, warn=False
    )
    with ctx.progress("calibration inputs", total=len(src), unit="sentences") as bar:
        for start in range(0, len(src), CALIBRATION_BATCH):
            batch = src[start : start + CALIBRATION_BATCH]
            greedy_search(recorder, batch, fp32.generation)
            bar.advance(len(batch))
    return recorder.feeds


def latency_vs_fp32(fp32_package: Path, package: Path, sentences: list[str], ctx: StageContext, variant: str) -> dict:
    """Batch-1 greedy, text to text, on one thread: the fp32 package and the variant's, each as a
    user runs it (Translator), interleaved sentence by sentence so that machine load hits both."""
    translators = {"fp32": Translator(fp32_package, threads=1), variant: Translator(package, threads=1)}
    sentences = [s for s in sentences if s.strip()]
    contestants = {
        name: (lambda sentence, t=t: t.translate([sentence], beam=1, max_batch=1)) for name, t in translators.items()
    }
    with ctx.progress(f"{variant} batch-1 latency", total=len(sentences), unit="sentences") as bar:
        timed = interleaved(contestants, sentences, on_item=bar.advance)
    return {
        "latency_ms_fp32": timed.median_ms("fp32", 2),
        "latency_ms": timed.median_ms(variant, 2),
        "latency_ratio": timed.ratio(variant, "fp32"),
        "latency_threads": 1,
        "latency_sentences": len(sentences),
        "latency_search": translators[variant].search,
    }


def _about(
    fp32_package: dict,
    variant: str,
    float_groups: list[str],
    calibration: dict | None,
    cfg: QuantizeConfig,
    decoder: Path,
) -> dict:
    keep = ("title", "description", "source_artifact", "src_lang", "tgt_lang", "model", "onnxruntime")
    about = {k: fp32_package[k] for k in keep if k in fp32_package}
    precision = _PRECISION[variant]
    if variant == "int8_dynamic":
        about["kernel"] = {
            "op": "com.microsoft.MatMulIntegerToFloat",
            "weights": "int8 per output column",
            "activations": "int8 per row, scale max|x| / 127, stored + 128",
        }
    about.update(variant=variant, precision=precision, float_groups=float_groups)
    if variant == "int8_static" and calibration:
        about["calibration"] = calibration
    return about


def _figures(report: dict, fp32_bleu: float, n_guard: int) -> dict:
    figures = {
        f"validation BLEU ({n_guard} sentences)": f"{report['bleu']:.2f} (fp32 package: {fp32_bleu:.2f})",
        "weight groups kept in float": ", ".join(report["float_groups"]) or "none",
        "ONNX bytes vs fp32": f"{report['bytes_ratio']:.0%}",
    }
    if "latency_ratio" in report:
        figures["CPU batch-1 greedy latency vs fp32 (1 thread)"] = (
            f"{report['latency_ms']} ms vs {report['latency_ms_fp32']} ms per sentence ({report['latency_ratio']}x)"
        )
    return figures
