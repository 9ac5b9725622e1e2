"""What a float package's card and package.json say about it: the model it was exported from,
its shape and precision (int8 packages: pipeline/quantize/card.py)."""

from __future__ import annotations

import onnxruntime as ort

from model.transformer import Transformer

MISSING = object()  # a model artifact without a validation BLEU (a pruned one)


def package_about(model: Transformer, source, variant: str, src_lang: str | None, tgt_lang: str | None) -> dict:
    """The package's description: `source` is the model's artifact."""
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
        "src_lang": src_lang,
        "tgt_lang": tgt_lang,
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


def package_figures(report: dict, variant: str, threads: int, valid_bleu=MISSING) -> dict:
    """The parity checks' figures (pipeline/measure/parity.py's report), as the card shows them,
    and the model's validation BLEU where its training measured one."""
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
    if valid_bleu is not MISSING:
        figures["validation BLEU of the PyTorch model (greedy, during training)"] = valid_bleu
    return figures
