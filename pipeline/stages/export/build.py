"""Export stage: a trained model -> ONNX packages fp32/ (optimised) and fp16/, with parity checks.

The fp32 package must match PyTorch: log-probabilities within `parity.max_abs_diff` on fresh
random inputs (several batch sizes, source and cache lengths), and token-for-token identical
greedy and beam outputs on the first validation sentences. Otherwise the stage fails. The fp16
package (for GPUs) is checked the same way and its figures recorded; half precision is not
expected to match to 1e-4, so only non-finite outputs fail it. The graphs are
pipeline/export/float_graphs.py's, the checks pipeline/measure/parity.py's, the shortlist
pipeline/export/shortlist.py's; this module wires them.
"""

from __future__ import annotations

import onnxruntime as ort
import torch
from mt_runtime.layout import SHORTLIST_FILE
from mt_runtime.subword import SubwordTokenizer

from model.transformer import load_model

from ...corpora.data_output import DataOutput
from ...corpora.splits import read_split
from ...engine.context import StageContext
from ...export.card import MISSING, package_about, package_figures
from ...export.float_graphs import GraphOptions, float32_graphs, generation_of, variant_graphs
from ...export.packages import package_bytes, set_figures, write_package
from ...export.shortlist import make_shortlist
from ...measure.parity import check_parity, enforce_parity
from . import ExportConfig, ExportInputs


def run(ctx: StageContext) -> dict:
    cfg: ExportConfig = ctx.settings
    parity_cfg = cfg.parity
    inputs: ExportInputs = ctx.inputs
    source = inputs.model
    threads = parity_cfg.threads
    model = load_model(source.path)
    tokenizer = SubwordTokenizer.load(source.file("tokenizer.json"))
    valid_src, _ = read_split(inputs.data.path, "valid")
    sentences = valid_src[: parity_cfg.decode_sentences]

    options = GraphOptions(opset=cfg.opset, fused_attention=cfg.fused_attention, optimize=cfg.optimize)
    graphs, built = float32_graphs(model, ctx.work, options)
    metrics: dict = {
        "opset": cfg.opset,
        "fused_attention": cfg.fused_attention,
        "onnxruntime": ort.__version__,
        "torch": torch.__version__,
        "source_artifact": source.id,
        "threads": threads,
        "packages": {},
        "parity": {},
        **built,
    }
    ctx.log(
        f"exported {source.id} (opset {cfg.opset}); checking parity on random inputs and "
        f"{len(sentences)} validation sentences"
    )

    generation = generation_of(model.cfg, parity_cfg.beam)
    data_output = DataOutput.of(inputs.data.metrics, inputs.data.id)
    shortlist = None
    if cfg.shortlist is not None:
        shortlist = ctx.work / SHORTLIST_FILE
        metrics["shortlist"] = make_shortlist(cfg.shortlist, inputs.data.path, tokenizer, model.cfg, shortlist)
        ctx.log(
            f"shortlist: {metrics['shortlist']['mean_words_batch_32']:.0f} words a batch of 32 validation "
            f"sentences on average, {metrics['shortlist']['valid_reference_coverage']:.1%} of the reference tokens"
        )
    for variant in ["fp32"] + (["fp16"] if cfg.fp16 else []):
        paths, done = variant_graphs(graphs, variant, ctx.work, model.cfg.d_model)
        metrics.update(done)
        folder = ctx.out / variant
        about = package_about(model, source, variant, data_output.src_lang, data_output.tgt_lang)
        write_package(
            folder,
            paths["encoder"],
            paths["decoder"],
            source.file("tokenizer.json"),
            generation,
            about,
            shortlist=shortlist if variant == "fp32" else None,
        )
        report = check_parity(model, folder, tokenizer, sentences, parity_cfg, threads, ctx.progress, variant)
        metrics["parity"][variant] = report
        figures = package_figures(report, variant, threads, source.metrics.get("valid_bleu", MISSING))
        meta = set_figures(folder, figures)
        metrics["packages"][variant] = {"bytes": package_bytes(folder), "onnx_bytes": meta["onnx_bytes"]}
        enforce_parity(variant, report, parity_cfg)

    fp32 = metrics["parity"]["fp32"]
    metrics.update(
        parity_max_abs_diff=fp32["max_abs_diff"],
        greedy_identical=fp32["greedy_identical"],
        beam_identical=fp32["beam_identical"],
        onnx_bytes=metrics["packages"]["fp32"]["onnx_bytes"],
        greedy_speedup=fp32["greedy_speedup"],
    )
    ctx.log(
        f"fp32 parity: max |Δ log p| {fp32['max_abs_diff']:.2e}, greedy {fp32['greedy_identical']}, "
        f"beam {fp32['beam_identical']} identical; batch-1 greedy {fp32['greedy_speedup']}x PyTorch"
    )
    if "graph_search" in fp32:
        graph = fp32["graph_search"]
        ctx.log(
            f"generate.onnx: greedy {graph['greedy_identical']}, beam {graph['beam_identical']} identical to the "
            f"Python search; batch-1 greedy {graph['greedy_speedup_vs_python_search']}x faster"
        )
    return metrics
