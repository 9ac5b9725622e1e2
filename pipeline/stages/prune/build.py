"""Prune stage: remove the least important attention heads (and, as an option, FFN neurons) of a
trained model, in one or more steps, each followed by a short fine-tune.

Each step measures head importance (Michel et al., 2019; model/pruning.py) on validation batches
of the current model, removes the lowest-ranked heads so that the cumulative count reaches its
share of `target_fraction`, and fine-tunes on the pairs the model was trained on (the
distillation corpus with its share of references, or the training split). With `max_bleu_drop`,
a step whose fine-tuned model has lost more valid BLEU than that (against the unpruned model)
is rolled back and pruning stops there.

The output is an ordinary model folder (model.safetensors with fewer weights, config.json with
the per-layer head counts, tokenizer.json) plus importance.json, so export, evaluate and the
rest load it like any trained model.

Resumable: ctx.work/step<i>/pruned/ holds the model right after step i's pruning,
step<i>/train/ the fine-tune's checkpoints (pipeline.training.loop.Trainer resumes from them) and
step<i>/done/ the step's outcome; a rerun after a kill skips whatever is already there.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import numpy as np
import torch
from mt_runtime.search import GenerationConfig, greedy_search
from mt_runtime.subword import SubwordTokenizer

from model import pruning
from model.subword_training import copy_tokenizer
from model.torch_decoder import TorchDecoder
from model.torch_greedy import greedy_hypotheses
from model.transformer import Transformer, load_model, save_model

from ...corpora.distilled import TrainingText, encoded_training_set, stored_word_level, training_pairs
from ...corpora.encoded import Corpus, encode_corpus, make_batches
from ...corpora.splits import read_split
from ...engine.context import StageContext
from ...engine.machine import cpu_isa
from ...measure.scoring import bleu_only
from ...measure.timing import interleaved
from ...training import speed_probe
from ...training.loop import Trainer, collate
from ...training.settings import TrainConfig
from ...training.validation import ValidationSet
from . import PruneConfig, PruneInputs

DECODER_STEPS = 20  # forced decoder steps per sentence when timing one step


def run(ctx: StageContext) -> dict:
    cfg: PruneConfig = ctx.settings
    device = "cuda" if torch.cuda.is_available() else "cpu"
    inputs: PruneInputs = ctx.inputs
    source, data = inputs.model, inputs.data
    source.file("model.safetensors")  # a clear error if the input is not a model artifact
    tokenizer = SubwordTokenizer.load(source.file("tokenizer.json"))
    original = load_model(source.path)  # kept unpruned, on the CPU, for the before/after figures
    model = copy.deepcopy(original).to(device)
    max_positions = original.cfg.max_positions

    text, train_origin = finetune_pairs(ctx)
    train, _ = encoded_training_set(text, tokenizer, max_positions, ctx.work, ctx.log, ctx.progress)
    valid_src, valid_tgt = read_split(data.path, "valid")
    valid_corpus = encode_corpus(tokenizer, valid_src, valid_tgt, max_positions, drop_long=False)
    n_bleu = min(cfg.valid_bleu_sentences or len(valid_src), len(valid_src))
    valid = ValidationSet(valid_corpus, valid_corpus.src.rows(n_bleu), valid_tgt[:n_bleu])
    pad, bos, eos = original.cfg.pad_id, original.cfg.bos_id, original.cfg.eos_id
    held_out = [
        collate(valid_corpus, index, pad, bos, eos, device)
        for index in make_batches(valid_corpus, cfg.importance_batch_tokens, seed=0, epoch=0)[: cfg.importance_batches]
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
    ctx.log(f"valid BLEU (greedy, {n_bleu} sentences) before pruning: {bleu_before:.2f}")

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
            remove_neurons = round(neurons_goal * step / cfg.steps) - (total_neurons - _neurons(model))
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
                source.config,
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

    model = model.cpu().eval()
    save_model(model, ctx.out)
    copy_tokenizer(source.file("tokenizer.json"), ctx.out)
    table = [{"step": r["step"], **row} for r in records for row in r["importance"]]
    (ctx.out / "importance.json").write_text(
        json.dumps(
            {
                "method": "Michel et al. 2019: raw = E|dL/d gate| over held-out batches, normalized = raw / the "
                "layer's L2 norm; score = what the ranking used",
                "ranking": cfg.ranking,
                "normalize": cfg.normalize,
                "heads": table,
                "neurons": {str(r["step"]): r["neuron_importance"] for r in records if r.get("neuron_importance")},
            },
            indent=1,
        )
        + "\n",
        encoding="utf-8",
    )

    latency = measure_latency(
        ctx, {"unpruned": original, "pruned": model}, valid_corpus.src.rows(len(valid_corpus)), cfg
    )
    heads_after, ffn_after = pruning.head_counts(model), pruning.ffn_widths(model)
    bytes_before = source.file("model.safetensors").stat().st_size
    bytes_after = (ctx.out / "model.safetensors").stat().st_size
    accepted = [r for r in records if r["accepted"]]
    bleu_after = accepted[-1]["valid_bleu_finetuned"] if accepted else bleu_before
    heads_left = model.cfg.total_heads()
    ctx.log(
        f"{total_heads} -> {heads_left} heads, {original.num_parameters():,} -> {model.num_parameters():,} "
        f"parameters, valid BLEU {bleu_before:.2f} -> {bleu_after:.2f}"
    )
    for runtime, figures in (("PyTorch", latency), ("onnxruntime", latency["onnxruntime"])):
        ctx.log(
            f"{runtime}, 1 thread: sentence {figures['sentence_ms_unpruned']:.2f} -> "
            f"{figures['sentence_ms_pruned']:.2f} ms, decoder step {figures['decoder_step_ms_unpruned']:.3f} "
            f"-> {figures['decoder_step_ms_pruned']:.3f} ms"
        )
    return {
        "source_model": source.id,
        "ranking": cfg.ranking,
        "normalize": cfg.normalize,
        "finetune_data": train_origin,
        "heads_before": heads_before,
        "heads_after": heads_after,
        "heads_total_before": total_heads,
        "heads_total_after": heads_left,
        "heads_removed": total_heads - heads_left,
        "fraction_removed": round((total_heads - heads_left) / total_heads, 4),
        "ffn_before": ffn_before,
        "ffn_after": ffn_after,
        "neurons_removed": total_neurons - _neurons(model),
        "params_before": original.num_parameters(),
        "params_after": model.num_parameters(),
        "model_bytes_before": bytes_before,
        "model_bytes_after": bytes_after,
        "valid_bleu_before": bleu_before,
        "valid_bleu_pruned": accepted[-1]["valid_bleu_pruned"] if accepted else bleu_before,
        "valid_bleu_after": bleu_after,
        "valid_bleu_drop": round(bleu_before - bleu_after, 2),
        "valid_bleu_sentences": n_bleu,
        "stopped_by": stopped_by,
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


def _isa(device: str) -> str:
    return cpu_isa() if torch.device(device).type == "cpu" else torch.cuda.get_device_name(torch.device(device))


def finetune_pairs(ctx: StageContext) -> tuple[TrainingText, str]:
    """What the model learnt from: the distillation corpus, with the share of references its
    recipe mixed in (the same pairs, drawn with the same seed), and the teacher's stored
    distributions if it learnt from those too; else the training split.
    Fine-tuning a KD + references student on the KD corpus alone moves it away from the
    references the test set is scored against."""
    trained = ctx.inputs.model.config or {}
    kd = ctx.inputs.kd_corpus
    text = training_pairs(
        ctx.inputs.data.path,
        kd.path if kd else None,
        trained.get("reference_mix", 0.0),
        (trained.get("train") or {}).get("seed", TrainConfig().seed),
        stored_word_level(trained) is not None,
        ctx.log,
    )
    if kd is None:
        return text, "train split"
    mixed = text.info.get("reference_pairs_mixed", 0)
    return text, (
        "kd_corpus"
        + (f" + {mixed} references" if mixed else "")
        + (" with the teacher's distributions" if text.top_k is not None else "")
    )


def prune_step(
    ctx: StageContext,
    cfg: PruneConfig,
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
    speed, why = speed_probe.from_record(recorded, _isa(device), torch.get_num_threads())
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
    cfg: PruneConfig,
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


# ------------------------------------------------------------------------- measuring
def greedy_bleu(
    ctx: StageContext, model: Transformer, valid: ValidationSet, tokenizer, device: str, what: str
) -> float:
    """Corpus BLEU of greedy translations of the validation sentences (as the Trainer scores them)."""
    model.eval()
    with ctx.progress(what, total=len(valid.sources), unit="sentences") as bar:
        hyps = greedy_hypotheses(model, valid.sources, device, on_chunk=bar.advance)
    return bleu_only(tokenizer.decode(hyps), valid.references)


def measure_latency(
    ctx: StageContext, models: dict[str, Transformer], sources: list[list[int]], cfg: PruneConfig
) -> dict:
    """Batch-1 greedy latency on the CPU, one thread, of each model on the same sentences, in
    PyTorch eager (keys sentence_ms_<name>, decoder_step_ms_<name>) and in onnxruntime with each
    model's fp32 step graphs as the export stage makes them (the same keys under
    "onnxruntime"): the runtime the pruned model ships in, where a step is not dominated by
    PyTorch's per-operator overhead.

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

    from ...export.float_graphs import float32_graphs, variant_graphs

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


def _neurons(model: Transformer) -> int:
    return sum(model.cfg.enc_ffn) + sum(model.cfg.dec_ffn)


def _write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
