"""Pruning in steps, the pipeline's side of model/pruning.py: each step measures head (and FFN
neuron) importance (Michel et al., 2019) on validation batches of the current model, removes the
lowest-ranked so that the cumulative count reaches its share of the goal, and fine-tunes on the
pairs the model was trained on; with `max_bleu_drop`, a step whose fine-tuned model has lost more
valid BLEU than that (against the unpruned model) is rolled back and pruning stops there.

Resumable: work/step<i>/pruned/ holds the model right after step i's pruning, step<i>/train/ the
fine-tune's checkpoints (loop.Trainer resumes from them) and step<i>/done/ the step's outcome; a
rerun after a kill skips whatever is already there.

`cfg` below is the recipe's prune section (pipeline/stages/prune: PruneConfig).
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from model import pruning
from model.torch_greedy import greedy_hypotheses
from model.transformer import Transformer, load_model, save_model

from ..corpora.distilled import TrainingText, stored_word_level, training_pairs
from ..corpora.encoded import Corpus, make_batches
from ..engine.context import StageContext
from ..measure.scoring import bleu_only
from . import speed_probe
from .loop import Trainer, collate
from .settings import TrainConfig
from .validation import ValidationSet


@dataclass
class Pruned:
    """What the steps left: the model of the last step kept (the unpruned one if none was), every
    step's record, why pruning stopped, and the unpruned model's figures."""

    model: Transformer
    records: list[dict]
    stopped_by: str
    bleu_before: float
    heads_before: dict[str, list[int]]
    ffn_before: dict[str, list[int]]
    total_heads: int
    total_neurons: int
    bleu_sentences: int


def finetune_pairs(data: Path, kd_corpus: Path | None, trained: dict, log) -> tuple[TrainingText, str]:
    """What the model learnt from (`trained`: its train node's config): the distillation corpus,
    with the share of references its recipe mixed in (the same pairs, drawn with the same seed), and
    the teacher's stored distributions if it learnt from those too; else the training split. Returns
    those pairs and where they come from, in words.
    Fine-tuning a KD + references student on the KD corpus alone moves it away from the
    references the test set is scored against."""
    text = training_pairs(
        data,
        kd_corpus,
        trained.get("reference_mix", 0.0),
        (trained.get("train") or {}).get("seed", TrainConfig().seed),
        stored_word_level(trained) is not None,
        log,
    )
    if kd_corpus is None:
        return text, "train split"
    mixed = text.info.get("reference_pairs_mixed", 0)
    return text, (
        "kd_corpus"
        + (f" + {mixed} references" if mixed else "")
        + (" with the teacher's distributions" if text.top_k is not None else "")
    )


def prune_in_steps(
    ctx: StageContext,
    cfg,
    original: Transformer,
    train: Corpus,
    train_origin: str,
    valid: ValidationSet,
    tokenizer,
    device: str,
    source_config: dict | None,
) -> Pruned:
    """Prune a copy of `original` (left as it is) on `device` in cfg.steps steps, each fine-tuned on
    `train`; ctx.work keeps each step's progress."""
    model = copy.deepcopy(original).to(device)
    pad, bos, eos = original.cfg.pad_id, original.cfg.bos_id, original.cfg.eos_id
    held_out = [
        collate(valid.corpus, index, pad, bos, eos, device)
        for index in make_batches(valid.corpus, cfg.importance_batch_tokens, seed=0, epoch=0)[: cfg.importance_batches]
    ]
    ctx.log(
        f"{original.num_parameters():,} parameters, {original.cfg.total_heads()} heads; importance on "
        f"{len(held_out)} validation batches; fine-tune on {len(train)} pairs ({train_origin})"
    )

    heads_before, ffn_before = pruning.head_counts(original), pruning.ffn_widths(original)
    total_heads, total_neurons = original.cfg.total_heads(), sum(sum(w) for w in ffn_before.values())
    heads_goal = round(cfg.target_fraction * total_heads)
    neurons_goal = round(cfg.ffn_fraction * total_neurons)
    origins = {kind: [list(range(n)) for n in counts] for kind, counts in heads_before.items()}

    bleu_before = greedy_bleu(ctx, model, valid, tokenizer, device, "valid BLEU, unpruned")
    ctx.log(f"valid BLEU (greedy, {len(valid.sources)} sentences) before pruning: {bleu_before:.2f}")

    records: list[dict] = []
    stopped_by = "target reached"
    for step in range(1, cfg.steps + 1):
        folder = ctx.work / f"step{step}"
        record_path = folder / "done" / "record.json"
        if record_path.is_file():  # finished before a kill: take its outcome as it was
            record = json.loads(record_path.read_text(encoding="utf-8"))
            ctx.log(f"step {step}: already done ({'kept' if record['accepted'] else 'rolled back'})")
        else:
            remove_heads = round(heads_goal * step / cfg.steps) - (total_heads - model.cfg.total_heads())
            remove_neurons = round(neurons_goal * step / cfg.steps) - (total_neurons - neurons(model))
            if remove_heads <= 0 and remove_neurons <= 0:
                continue
            record = prune_step(
                ctx,
                cfg,
                step,
                model,
                held_out,
                remove_heads,
                remove_neurons,
                origins,
                train,
                valid,
                tokenizer,
                device,
                bleu_before,
                source_config,
            )
        records.append(record)
        if record["accepted"]:
            model = load_model(folder / "done", device)
            origins = record["origins"]
        else:
            stopped_by = (
                f"max_bleu_drop: step {step} would lose {bleu_before - record['valid_bleu_finetuned']:.2f} "
                f"BLEU (> {cfg.max_bleu_drop:g}); rolled back"
            )
            ctx.log(stopped_by)
            break
    return Pruned(
        model,
        records,
        stopped_by,
        bleu_before,
        heads_before,
        ffn_before,
        total_heads,
        total_neurons,
        bleu_sentences=len(valid.sources),
    )


def prune_step(
    ctx: StageContext,
    cfg,
    step: int,
    model: Transformer,
    held_out: list,
    remove_heads: int,
    remove_neurons: int,
    origins: dict,
    train: Corpus,
    valid: ValidationSet,
    tokenizer,
    device: str,
    bleu_before: float,
    source_config,
) -> dict:
    """Score, prune, fine-tune; write step<i>/done/ (the model, if kept, and the step's record)."""
    folder = ctx.work / f"step{step}"
    pruned_dir, done_dir = folder / "pruned", folder / "done"
    if (pruned_dir / "record.json").is_file():  # pruned before a kill: the fine-tune resumes
        record = json.loads((pruned_dir / "record.json").read_text(encoding="utf-8"))
        candidate = load_model(pruned_dir, device)
        ctx.log(f"step {step}: resuming its fine-tune")
    else:
        candidate, record = score_and_prune(
            ctx, cfg, step, model, held_out, remove_heads, remove_neurons, origins, device
        )
        record["valid_bleu_pruned"] = greedy_bleu(
            ctx, candidate, valid, tokenizer, device, f"step {step} valid BLEU, pruned"
        )
        save_model(candidate, pruned_dir)
        _write_json(pruned_dir / "record.json", record)  # last: its presence means the folder is complete
    ctx.log(
        f"step {step}: removed {record['heads_removed']} heads"
        + (f" and {record['neurons_removed']} FFN neurons" if record["neurons_removed"] else "")
        + f" -> {record['heads_left']} heads; valid BLEU {record['valid_bleu_pruned']:.2f} before fine-tuning"
    )

    ft = cfg.finetune
    smoothing = ((source_config or {}).get("train") or {}).get("label_smoothing", 0.1)
    train_cfg = TrainConfig(
        lr=ft.lr,
        warmup_steps=ft.warmup_steps,
        batch_tokens=ft.batch_tokens,
        label_smoothing=smoothing,
        max_epochs=None,
        max_steps=ft.steps,
        max_minutes=ft.max_minutes,
        seed=ft.seed + step - 1,
        bf16=ft.bf16,
        valid_bleu_sentences=len(valid.sources),
        average_checkpoints=1,
    )
    word_level = stored_word_level(source_config or {})
    # The switches an earlier build of this artifact id chose for this step's fine-tune (the lock).
    recorded = ((ctx.recorded or {}).get("finetune") or {}).get(str(step))
    speed, why = speed_probe.from_record(recorded, speed_probe.device_isa(device), torch.get_num_threads())
    if why:
        ctx.log(why)
    trainer = Trainer(
        candidate,
        train_cfg,
        train,
        valid,
        tokenizer,
        folder / "train",
        ctx.log,
        ctx.progress,
        device,
        kd_alpha=word_level["alpha"] if word_level else 0.0,
        speed=speed,
    )
    result = trainer.fit()
    candidate = trainer.model.eval()
    record["speed_choice"] = trainer.speed.record()
    record["finetune"] = {
        k: result[k]
        for k in ("steps", "train_minutes", "stopped_by", "best_valid_loss", "budget", "precision", "speed")
    }
    if "cut_by_time" in result:
        record["finetune"]["cut_by_time"] = result["cut_by_time"]
    record["valid_bleu_finetuned"] = greedy_bleu(
        ctx, candidate, valid, tokenizer, device, f"step {step} valid BLEU, fine-tuned"
    )
    drop = bleu_before - record["valid_bleu_finetuned"]
    record["accepted"] = cfg.max_bleu_drop is None or drop <= cfg.max_bleu_drop
    ctx.log(
        f"step {step}: valid BLEU {record['valid_bleu_finetuned']:.2f} after fine-tuning "
        f"({-drop:+.2f} against the unpruned model)"
    )
    if record["accepted"]:
        save_model(candidate, done_dir)
    else:
        done_dir.mkdir(parents=True, exist_ok=True)
    _write_json(done_dir / "record.json", record)
    return record


def score_and_prune(
    ctx: StageContext,
    cfg,
    step: int,
    model: Transformer,
    held_out: list,
    remove_heads: int,
    remove_neurons: int,
    origins: dict,
    device: str,
) -> tuple[Transformer, dict]:
    with ctx.progress(f"step {step} importance", total=len(held_out), unit="batches") as bar:

        def batches():
            for batch in held_out:
                yield batch
                bar.advance(1)

        head_raw, neuron_raw, used = pruning.importance(model, batches(), neurons=remove_neurons > 0)
    head_scores = pruning.ranking_scores(head_raw, cfg.normalize)
    head_plan = pruning.select_lowest(head_scores, max(0, remove_heads), cfg.min_heads_per_layer, cfg.ranking)
    candidate = copy.deepcopy(model)
    pruning.prune_heads(candidate, head_plan)
    record = {
        "step": step,
        "heads_removed": pruning.plan_size(head_plan),
        "neurons_removed": 0,
        "importance_batches": used,
    }
    table = pruning.importance_table(head_raw, cfg.normalize, origins)
    for row in table:
        row["pruned"] = row["head"] in head_plan[row["kind"]][row["layer"]]
    record["importance"] = table
    if neuron_raw is not None:
        neuron_scores = pruning.ranking_scores(neuron_raw, cfg.normalize)
        neuron_plan = pruning.select_lowest(neuron_scores, max(0, remove_neurons), 1, cfg.ranking)
        pruning.prune_neurons(candidate, neuron_plan)
        record["neurons_removed"] = pruning.plan_size(neuron_plan)
        record["neuron_importance"] = {
            kind: [[float(f"{v:.4g}") for v in s.tolist()] for s in layers] for kind, layers in neuron_raw.items()
        }
    record["heads_left"] = candidate.cfg.total_heads()
    record["heads_per_layer"] = pruning.head_counts(candidate)
    record["ffn_per_layer"] = pruning.ffn_widths(candidate)
    record["origins"] = pruning.surviving(origins, head_plan)
    return candidate, record


def greedy_bleu(
    ctx: StageContext, model: Transformer, valid: ValidationSet, tokenizer, device: str, what: str
) -> float:
    """Corpus BLEU of greedy translations of the validation sentences (as the Trainer scores them)."""
    model.eval()
    with ctx.progress(what, total=len(valid.sources), unit="sentences") as bar:
        hyps = greedy_hypotheses(model, valid.sources, device, on_chunk=bar.advance)
    return bleu_only(tokenizer.decode(hyps), valid.references)


def importance_tables(cfg, records: list[dict]) -> tuple[list[dict], dict]:
    """Every step's head importance rows (each with its step) and importance.json's content."""
    table = [{"step": r["step"], **row} for r in records for row in r["importance"]]
    return table, {
        "method": "Michel et al. 2019: raw = E|dL/d gate| over held-out batches, normalized = raw / the "
        "layer's L2 norm; score = what the ranking used",
        "ranking": cfg.ranking,
        "normalize": cfg.normalize,
        "heads": table,
        "neurons": {str(r["step"]): r["neuron_importance"] for r in records if r.get("neuron_importance")},
    }


def prune_metrics(
    cfg,
    source_id: str,
    train_origin: str,
    original: Transformer,
    model: Transformer,
    pruned: Pruned,
    latency: dict,
    bytes_before: int,
    bytes_after: int,
    table: list[dict],
    log,
) -> dict:
    """The prune artifact's metrics (the report reads them by these names), `model` being what
    ships; logs the before/after summary."""
    records, bleu_before, total_heads = pruned.records, pruned.bleu_before, pruned.total_heads
    accepted = [r for r in records if r["accepted"]]
    bleu_after = accepted[-1]["valid_bleu_finetuned"] if accepted else bleu_before
    heads_left = model.cfg.total_heads()
    log(
        f"{total_heads} -> {heads_left} heads, {original.num_parameters():,} -> {model.num_parameters():,} "
        f"parameters, valid BLEU {bleu_before:.2f} -> {bleu_after:.2f}"
    )
    for runtime, figures in (("PyTorch", latency), ("onnxruntime", latency["onnxruntime"])):
        log(
            f"{runtime}, 1 thread: sentence {figures['sentence_ms_unpruned']:.2f} -> "
            f"{figures['sentence_ms_pruned']:.2f} ms, decoder step {figures['decoder_step_ms_unpruned']:.3f} "
            f"-> {figures['decoder_step_ms_pruned']:.3f} ms"
        )
    return {
        "source_model": source_id,
        "ranking": cfg.ranking,
        "normalize": cfg.normalize,
        "finetune_data": train_origin,
        "heads_before": pruned.heads_before,
        "heads_after": pruning.head_counts(model),
        "heads_total_before": total_heads,
        "heads_total_after": heads_left,
        "heads_removed": total_heads - heads_left,
        "fraction_removed": round((total_heads - heads_left) / total_heads, 4),
        "ffn_before": pruned.ffn_before,
        "ffn_after": pruning.ffn_widths(model),
        "neurons_removed": pruned.total_neurons - neurons(model),
        "params_before": original.num_parameters(),
        "params_after": model.num_parameters(),
        "model_bytes_before": bytes_before,
        "model_bytes_after": bytes_after,
        "valid_bleu_before": bleu_before,
        "valid_bleu_pruned": accepted[-1]["valid_bleu_pruned"] if accepted else bleu_before,
        "valid_bleu_after": bleu_after,
        "valid_bleu_drop": round(bleu_before - bleu_after, 2),
        "valid_bleu_sentences": pruned.bleu_sentences,
        "stopped_by": pruned.stopped_by,
        "steps": [
            {k: v for k, v in r.items() if k not in ("importance", "neuron_importance", "origins")} for r in records
        ],
        "importance": table,
        **latency,
        # The names every model artifact uses (the report reads them).
        "params": model.num_parameters(),
        "heads": heads_left,
        "model_bytes": bytes_after,
        "choices": {"finetune": {str(r["step"]): r["speed_choice"] for r in records if "speed_choice" in r}},
    }


def neurons(model: Transformer) -> int:
    """The model's FFN hidden units, all layers."""
    return sum(model.cfg.enc_ffn) + sum(model.cfg.dec_ffn)


def _write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
