"""The ONNX step graphs against the PyTorch model they were exported from: log-probabilities on
fresh random inputs (several batch sizes, source and cache lengths), and greedy and beam outputs on
validation sentences, token for token, with batch-1 greedy timed in both runtimes (and
generate.onnx's search against ours where the package has it). `enforce_parity` says whether a
package passes: the export stage fails it otherwise."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
from mt_runtime.search import prepare_sources, search
from mt_runtime.subword import SubwordTokenizer
from mt_runtime.translator import Translator

from model.onnx_export import DecoderGraph, EncoderGraph, decoder_input_names, example_inputs
from model.torch_decoder import TorchDecoder
from model.transformer import Transformer

from ..engine.errors import StageFailed
from .timing import interleaved


def enforce_parity(variant: str, report: dict, parity_cfg) -> None:
    """Fail a package whose graphs produce non-finite log-probabilities; an fp32 one also past
    `parity_cfg.max_abs_diff` (the export section's parity) or with any output unlike PyTorch's
    (half precision is not expected to match: its figures are recorded only)."""
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


def check_parity(
    model: Transformer,
    folder: Path,
    tokenizer: SubwordTokenizer,
    sentences: list[str],
    parity_cfg,
    threads: int,
    progress,
    variant: str,
) -> dict:
    """random_parity and decode_parity of one package, at `threads` in both runtimes
    (`parity_cfg`: the export section's parity; `progress`: a stage context's)."""
    # The graphs against PyTorch: the whole vocabulary (the shortlist is judged by BLEU, in evaluate).
    translator = Translator(folder, threads=threads, shortlist=False)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        report = random_parity(model, translator, parity_cfg.batch_sizes)
        report.update(decode_parity(model, translator, tokenizer, sentences, parity_cfg.beam, progress, variant))
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
    progress,
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
    with progress(f"{variant} greedy parity", total=len(src), unit="sentences") as bar:
        timed = interleaved(contestants, src, on_item=bar.advance)
    greedy = timed.outputs
    beams: dict = {name: [] for name in searches}
    chunk = 16
    with progress(f"{variant} beam {beam} parity", total=len(src), unit="sentences") as bar:
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
