"""Prune stage: remove the least important attention heads (and, as an option, FFN neurons) of a
trained model, in one or more steps, each followed by a short fine-tune
(pipeline/training/prune_steps.py; the model side in model/pruning.py), then time the unpruned
and pruned models (pipeline/training/prune_latency.py).

The output is an ordinary model folder (model.safetensors with fewer weights, config.json with
the per-layer head counts, tokenizer.json) plus importance.json, so export, evaluate and the
rest load it like any trained model. Resumable: ctx.work keeps each step's progress.
"""

from __future__ import annotations

import json

import torch
from mt_runtime.subword import SubwordTokenizer

from model.subword_training import copy_tokenizer
from model.transformer import load_model, save_model

from ...corpora.distilled import encoded_training_set
from ...engine.context import StageContext
from ...training.prune_latency import measure_latency
from ...training.prune_steps import finetune_pairs, importance_tables, prune_in_steps, prune_metrics
from ...training.validation import validation_set
from . import PruneConfig, PruneInputs


def run(ctx: StageContext) -> dict:
    cfg: PruneConfig = ctx.settings
    device = "cuda" if torch.cuda.is_available() else "cpu"
    inputs: PruneInputs = ctx.inputs
    source, data, kd = inputs.model, inputs.data, inputs.kd_corpus
    source.file("model.safetensors")  # a clear error if the input is not a model artifact
    tokenizer = SubwordTokenizer.load(source.file("tokenizer.json"))
    original = load_model(source.path)  # kept unpruned, on the CPU, for the before/after figures
    max_positions = original.cfg.max_positions

    text, train_origin = finetune_pairs(data.path, kd.path if kd else None, source.config or {}, ctx.log)
    train, _ = encoded_training_set(text, tokenizer, max_positions, ctx.work, ctx.log, ctx.progress)
    valid = validation_set(data.path, tokenizer, max_positions, cfg.valid_bleu_sentences)
    pruned = prune_in_steps(ctx, cfg, original, train, train_origin, valid, tokenizer, device, source.config)

    model = pruned.model.cpu().eval()
    save_model(model, ctx.out)
    copy_tokenizer(source.file("tokenizer.json"), ctx.out)
    table, importance = importance_tables(cfg, pruned.records)
    (ctx.out / "importance.json").write_text(json.dumps(importance, indent=1) + "\n", encoding="utf-8")

    latency = measure_latency(
        ctx, {"unpruned": original, "pruned": model}, valid.corpus.src.rows(len(valid.corpus)), cfg
    )
    bytes_before = source.file("model.safetensors").stat().st_size
    bytes_after = (ctx.out / "model.safetensors").stat().st_size
    return prune_metrics(
        cfg, source.id, train_origin, original, model, pruned, latency, bytes_before, bytes_after, table, ctx.log
    )
