"""Latency of an unpruned model against its pruned one: batch-1 greedy on the CPU, one thread, in
PyTorch eager and in onnxruntime with the fp32 step graphs the export stage would make."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from mt_runtime.search import GenerationConfig, greedy_search

from model.torch_decoder import TorchDecoder
from model.transformer import Transformer

from ..engine.context import StageContext
from ..measure.timing import interleaved

DECODER_STEPS = 20  # forced decoder steps per sentence when timing one step


def measure_latency(ctx: StageContext, models: dict[str, Transformer], sources: list[list[int]], cfg) -> dict:
    """Batch-1 greedy latency on the CPU, one thread, of each model on the same sentences, in
    PyTorch eager (keys sentence_ms_<name>, decoder_step_ms_<name>) and in onnxruntime with each
    model's fp32 step graphs as the export stage makes them (the same keys under
    "onnxruntime"): the runtime the pruned model ships in, where a step is not dominated by
    PyTorch's per-operator overhead. `cfg`: the recipe's prune section (latency_sentences,
    latency_repeats).

    Sentence: encode + greedy decode of one sentence (each model's own output length; the mean
    length is reported). Decoder step: DECODER_STEPS forced steps with the cache, so every model
    does the same work. Timed by `timing.interleaved`: each figure is the median over
    `latency_repeats` passes of the mean per sentence (or step)."""
    sources = sources[: cfg.latency_sentences]
    any_cfg = next(iter(models.values())).cfg
    gen = GenerationConfig(
        beam=1, bos_id=any_cfg.bos_id, eos_id=any_cfg.eos_id, pad_id=any_cfg.pad_id, max_positions=any_cfg.max_positions
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        eager = {name: TorchDecoder(m.cpu().eval(), "cpu") for name, m in models.items()}
        out = _timed(ctx, eager, sources, gen, cfg.latency_repeats, "PyTorch")
        out["onnxruntime"] = _timed(
            ctx, onnx_decoders(models, ctx.work / "latency"), sources, gen, cfg.latency_repeats, "onnxruntime"
        )
    finally:
        torch.set_num_threads(threads)
    return {"latency_sentences": len(sources), "latency_repeats": cfg.latency_repeats, "latency_threads": 1, **out}


def onnx_decoders(models: dict[str, Transformer], folder: Path) -> dict:
    """Each model's fp32 step graphs (made as the export stage makes them), in one-thread
    onnxruntime sessions: the graphs alone, no package around them (nothing here ships)."""
    import onnxruntime as ort
    from mt_runtime.translator import OnnxDecoder

    from ..export.float_graphs import float32_graphs, variant_graphs

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 1, 1
    options.log_severity_level = 3
    decoders = {}
    for name, model in models.items():
        graphs, _ = float32_graphs(model, folder / name)
        graphs, _ = variant_graphs(graphs, "fp32", folder / name, model.cfg.d_model)
        sessions = [
            ort.InferenceSession(str(graphs[g]), options, providers=["CPUExecutionProvider"])
            for g in ("encoder", "decoder")
        ]
        decoders[name] = OnnxDecoder(*sessions, pad_id=model.cfg.pad_id)
    return decoders


def _timed(
    ctx: StageContext, decoders: dict, sources: list[list[int]], gen: GenerationConfig, repeats: int, runtime: str
) -> dict:
    token = np.array([gen.bos_id], dtype=np.int64)

    def forced_steps(dec):
        for _ in range(DECODER_STEPS):
            dec.step(token, None)

    with ctx.progress(
        f"latency unpruned vs pruned, {runtime}", total=2 * repeats * len(sources), unit="sentences"
    ) as bar:
        sentence = interleaved(
            {name: (lambda src, d=d: greedy_search(d, [src], gen)[0]) for name, d in decoders.items()},
            sources,
            repeats=repeats,
            on_item=bar.advance,
        )
        step = interleaved(
            {name: (lambda src, d=d: forced_steps(d)) for name, d in decoders.items()},
            sources,
            repeats=repeats,
            on_item=bar.advance,
            prepare={name: (lambda src, d=d: d.encode([src], 1)) for name, d in decoders.items()},
        )
    out: dict = {}
    for name in decoders:
        out[f"sentence_ms_{name}"] = sentence.median_ms(name)
        out[f"decoder_step_ms_{name}"] = round(1000 * step.median_s(name) / DECODER_STEPS, 4)
        lengths = sum(len(hyp) + 1 for hyp in sentence.outputs[name])  # + </s>: one decoder step each
        out[f"decoder_steps_per_sentence_{name}"] = round(lengths / max(len(sources), 1), 2)
    if "unpruned" in decoders and "pruned" in decoders:
        out["sentence_speedup"] = round(out["sentence_ms_unpruned"] / out["sentence_ms_pruned"], 3)
        out["decoder_step_speedup"] = round(out["decoder_step_ms_unpruned"] / out["decoder_step_ms_pruned"], 3)
    return out
