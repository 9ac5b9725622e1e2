"""Export stage: a trained model -> ONNX packages fp32/ (optimised) and fp16/, with parity checks.

The fp32 package must match PyTorch: log-probabilities within `parity.max_abs_diff` on fresh
random inputs (several batch sizes, source and cache lengths), and token-for-token identical
greedy and beam outputs on the first validation sentences. Otherwise the stage fails. The fp16
package (for GPUs) is checked the same way and its figures recorded; half precision is not
expected to match to 1e-4, so only non-finite outputs fail it.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from mt_runtime.layout import SHORTLIST_FILE
from mt_runtime.search import prepare_sources, search
from mt_runtime.shortlist import build_shortlist
from mt_runtime.subword import SubwordTokenizer
from mt_runtime.translator import Translator

from model.onnx_export import DecoderGraph, EncoderGraph, decoder_input_names, example_inputs
from model.torch_decoder import TorchDecoder
from model.transformer import Transformer, load_model

from ...corpora.splits import check_aligned, read_split, split_lines
from ...engine.context import StageContext
from ...engine.errors import StageFailed
from ...export.float_graphs import GraphOptions, float32_graphs, generation_of, variant_graphs
from ...export.packages import package_bytes, set_figures, write_package
from ...measure.timing import interleaved
from . import ExportConfig, ExportInputs, ParityConfig, ShortlistConfig


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
    data_metrics = inputs.data.metrics
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
        about = describe(model, source, variant, data_metrics)
        write_package(
            folder,
            paths["encoder"],
            paths["decoder"],
            source.file("tokenizer.json"),
            generation,
            about,
            shortlist=shortlist if variant == "fp32" else None,
        )
        report = check_parity(model, folder, tokenizer, sentences, parity_cfg, threads, ctx, variant)
        metrics["parity"][variant] = report
        figures = {
            "parity (max abs log-prob diff vs PyTorch, random inputs)": f"{report['max_abs_diff']:.2e}",
            "greedy outputs identical to PyTorch": report["greedy_identical"],
            "beam outputs identical to PyTorch": report["beam_identical"],
        }
        if variant == "fp32":
            graph = report.get("graph_search")
            figures["CPU batch-1 greedy, validation sentences"] = (
                (f"{graph['greedy_sentences_per_s']} sentences/s with generate.onnx, " if graph else "")
                + f"{report['onnx_greedy_sentences_per_s']} sentences/s with the step graphs and a Python loop, "
                f"{report['torch_greedy_sentences_per_s']} with PyTorch ({threads} threads)"
            )
            if graph:
                figures["generate.onnx vs the step graphs (validation sentences)"] = (
                    f"greedy identical {graph['greedy_identical']}, beam identical {graph['beam_identical']}"
                )
        if "valid_bleu" in source.metrics:
            figures["validation BLEU of the PyTorch model (greedy, during training)"] = source.metrics["valid_bleu"]
        meta = set_figures(folder, figures)
        metrics["packages"][variant] = {"bytes": package_bytes(folder), "onnx_bytes": meta["onnx_bytes"]}
        _enforce(variant, report, parity_cfg)

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


def describe(model: Transformer, source, variant: str, data_metrics: dict) -> dict:
    cfg = model.cfg
    return {
        "variant": variant,
        "title": f"{source.metrics.get('role', 'model')} translation model",
        "precision": {
            "fp32": "float32 weights and activations",
            "fp16": "float16 weights, activations and cache; log_probs float32; for GPUs",
        }.get(variant, variant),
        "description": "Encoder-decoder Transformer exported to ONNX with a key/value cache for incremental "
        "decoding, for CPUs (fp32) and GPUs (fp16).",
        "source_artifact": source.id,
        "src_lang": data_metrics.get("src_lang"),
        "tgt_lang": data_metrics.get("tgt_lang"),
        "model": {
            "d_model": cfg.d_model,
            "encoder_layers": cfg.encoder_layers,
            "decoder_layers": cfg.decoder_layers,
            "enc_heads": cfg.enc_heads,
            "dec_self_heads": cfg.dec_self_heads,
            "dec_cross_heads": cfg.dec_cross_heads,
            "head_dim": cfg.head_dim,
            "vocab_size": cfg.vocab_size,
            "params": model.num_parameters(),
        },
        "onnxruntime": ort.__version__,
    }


def _enforce(variant: str, report: dict, parity_cfg: ParityConfig) -> None:
    if not report["finite"]:
        raise StageFailed(f"{variant}: the ONNX graphs produce non-finite log-probabilities")
    if variant != "fp32":
        return
    problems = []
    if report["max_abs_diff"] > parity_cfg.max_abs_diff:
        problems.append(
            f"max |log p difference| {report['max_abs_diff']:.3g} > {parity_cfg.max_abs_diff:g} "
            f"(worst case: {report['worst_case']})"
        )
    graph = report.get("graph_search")
    if graph and graph["greedy_mismatches"]:
        problems.append(
            f"generate.onnx's greedy search differs from ours on the same graphs (validation "
            f"sentences {graph['greedy_mismatches']})"
        )
    for kind in ("greedy", "beam"):
        if report[f"{kind}_mismatches"]:
            first = report[f"{kind}_mismatches"][0]
            problems.append(
                f"{kind} outputs identical to PyTorch on only {report[f'{kind}_identical']} "
                f"sentences (first difference: validation sentence {first})"
            )
    if problems:
        raise StageFailed("fp32 ONNX export fails parity: " + "; ".join(problems))


# ----------------------------------------------------------------------------- parity
def make_shortlist(cfg: ShortlistConfig, data: Path, tokenizer: SubwordTokenizer, model_cfg, dest: Path) -> dict:
    """Build the shortlist from the training pairs (the first cfg.max_pairs, encoded a block at a
    time) and say how it covers the validation references in batches of 32 (length-sorted)."""
    check_aligned(data / "train.src", data / "train.tgt")

    def pairs():
        lines = itertools.islice(
            zip(split_lines(data, "train", "src"), split_lines(data, "train", "tgt")), cfg.max_pairs
        )
        while block := list(itertools.islice(lines, 10_000)):
            src, tgt = zip(*block)
            yield from zip(tokenizer.encode(list(src)), tokenizer.encode(list(tgt)))

    specials = (model_cfg.pad_id, model_cfg.bos_id, model_cfg.eos_id, tokenizer.unk_id)
    table, made = build_shortlist(pairs(), model_cfg.vocab_size, cfg.frequent, cfg.per_word, always=specials)
    table.save(dest)
    valid_src, valid_tgt = read_split(data, "valid")
    src, tgt = tokenizer.encode(valid_src), tokenizer.encode(valid_tgt)
    order = sorted(range(len(src)), key=lambda i: len(src[i]))
    sizes, covered, total = [], 0, 0
    for start in range(0, len(order), 32):
        rows = order[start : start + 32]
        words = table.for_sources([src[i] for i in rows])
        sizes.append(len(words))
        for i in rows:
            covered += int(np.isin(tgt[i], words).sum())
            total += len(tgt[i])
    return {
        **made,
        "vocab_size": model_cfg.vocab_size,
        "mean_words_batch_32": round(float(np.mean(sizes)), 1),
        "max_words_batch_32": int(max(sizes)),
        "valid_reference_coverage": round(covered / max(total, 1), 4),
    }


def check_parity(
    model: Transformer,
    folder: Path,
    tokenizer: SubwordTokenizer,
    sentences: list[str],
    parity_cfg: ParityConfig,
    threads: int,
    ctx: StageContext,
    variant: str,
) -> dict:
    # The graphs against PyTorch: the whole vocabulary (the shortlist is judged by BLEU, in evaluate).
    translator = Translator(folder, threads=threads, shortlist=False)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        report = random_parity(model, translator, parity_cfg.batch_sizes)
        report.update(decode_parity(model, translator, tokenizer, sentences, parity_cfg.beam, ctx, variant))
    finally:
        torch.set_num_threads(before)
    return report


def random_parity(model: Transformer, translator: Translator, batch_sizes: list[int]) -> dict:
    """Max |difference| between PyTorch and ONNX Runtime on fresh random inputs: per batch size a
    first step (empty cache) and a later one (cache of another batch size, reordered)."""
    encoder, decoder = translator.decoder.encoder, translator.decoder.decoder
    dtypes = {i.name: i.type for i in decoder.get_inputs()}
    names = decoder_input_names(model)
    worst = {"log_probs": 0.0, "encoder": 0.0, "cache": 0.0}
    worst_case, finite = "", True
    for b in batch_sizes:
        for seed, (src_len, past_len, past_batch) in enumerate(((3 + b, 0, b), (7 + 2 * b, 4 + b, b + 2))):
            ex = example_inputs(model, b, src_len, past_len, seed=1000 * b + seed, past_batch=past_batch)
            with torch.no_grad():
                ref_cross = EncoderGraph(model)(ex["src_ids"])
                ref = DecoderGraph(model)(*(ex[n] for n in names))
            cross = encoder.run(None, {"src_ids": ex["src_ids"].numpy()})
            feed = {n: _as(ex[n].numpy(), dtypes[n]) for n in names}
            out = decoder.run(None, feed)
            finite &= bool(np.isfinite(out[0]).all())
            diffs = {
                "log_probs": _maxdiff(ref[0], out[0]),
                "encoder": max(_maxdiff(r, o) for r, o in zip(ref_cross, cross)),
                "cache": max(_maxdiff(r, o) for r, o in zip(ref[1:], out[1:])),
            }
            if diffs["log_probs"] >= worst["log_probs"]:
                worst_case = f"batch {b}, src_len {src_len}, past_len {past_len}"
            worst = {k: max(worst[k], diffs[k]) for k in worst}
    return {
        "max_abs_diff": worst["log_probs"],
        "encoder_max_abs_diff": worst["encoder"],
        "cache_max_abs_diff": worst["cache"],
        "worst_case": worst_case,
        "finite": finite,
        "batch_sizes": list(batch_sizes),
    }


def _as(array: np.ndarray, onnx_type: str) -> np.ndarray:
    return array.astype(np.float16) if onnx_type == "tensor(float16)" else array


def _maxdiff(a: torch.Tensor, b: np.ndarray) -> float:
    return float(np.abs(a.float().numpy() - b.astype(np.float32)).max(initial=0.0))


def decode_parity(
    model: Transformer,
    translator: Translator,
    tokenizer: SubwordTokenizer,
    sentences: list[str],
    beam: int,
    ctx: StageContext,
    variant: str,
) -> dict:
    """Greedy (one sentence at a time, timed: the batch-1 latency both runtimes are judged on)
    and batched beam search with both runtimes; the token ids must be identical. Where the
    package has generate.onnx, its search is compared with ours on the same step graphs too."""
    gen = dataclasses.replace(translator.generation, beam=beam)
    greedy_gen = dataclasses.replace(gen, beam=1)
    src = prepare_sources(tokenizer, sentences, gen.max_positions, warn=False)
    torch_decoder, onnx_decoder = TorchDecoder(model), translator.decoder
    searches = {
        "torch": lambda batch, g: search(torch_decoder, batch, g),
        "onnx": lambda batch, g: search(onnx_decoder, batch, g),
    }
    if translator.graph_search:
        searches["graph"] = translator.graph_search
    contestants = {name: (lambda s, run=run: run([s], greedy_gen)[0]) for name, run in searches.items()}
    with ctx.progress(f"{variant} greedy parity", total=len(src), unit="sentences") as bar:
        timed = interleaved(contestants, src, on_item=bar.advance)
    greedy = timed.outputs
    beams: dict = {name: [] for name in searches}
    chunk = 16
    with ctx.progress(f"{variant} beam {beam} parity", total=len(src), unit="sentences") as bar:
        for start in range(0, len(src), chunk):
            batch = src[start : start + chunk]
            for name, run in searches.items():
                beams[name].extend(run(batch, gen))
            bar.advance(len(batch))
    greedy_bad = [i for i, (a, b) in enumerate(zip(greedy["torch"], greedy["onnx"])) if a != b]
    beam_bad = [i for i, (a, b) in enumerate(zip(beams["torch"], beams["onnx"])) if a != b]
    n = len(src)
    torch_rate, onnx_rate = timed.per_second("torch", 6), timed.per_second("onnx", 6)
    graph = {}
    if "graph" in searches:
        graph_greedy_bad = [i for i, (a, b) in enumerate(zip(greedy["onnx"], greedy["graph"])) if a != b]
        graph_beam_same = sum(a == b for a, b in zip(beams["onnx"], beams["graph"]))
        graph_rate = timed.per_second("graph", 6)
        graph = {
            "graph_search": {
                "greedy_identical": f"{n - len(graph_greedy_bad)}/{n}",
                "greedy_mismatches": graph_greedy_bad[:20],
                "beam_identical": f"{graph_beam_same}/{n}",
                "greedy_sentences_per_s": round(graph_rate, 1),
                "greedy_speedup_vs_python_search": round(graph_rate / onnx_rate, 2) if onnx_rate else None,
            }
        }
    return {
        "sentences": n,
        "beam": beam,
        **graph,
        "greedy_identical": f"{n - len(greedy_bad)}/{n}",
        "beam_identical": f"{n - len(beam_bad)}/{n}",
        "greedy_agreement": round((n - len(greedy_bad)) / n, 4) if n else 1.0,
        "beam_agreement": round((n - len(beam_bad)) / n, 4) if n else 1.0,
        "greedy_mismatches": greedy_bad[:20],
        "beam_mismatches": beam_bad[:20],
        "torch_greedy_sentences_per_s": round(torch_rate, 1),
        "onnx_greedy_sentences_per_s": round(onnx_rate, 1),
        "greedy_speedup": round(onnx_rate / torch_rate, 2) if torch_rate else None,
    }
