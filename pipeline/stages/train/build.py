"""Train stage: the teacher, the distilled student and the reference-only student.

With `--nproc N` the same code runs under torchrun (DistributedDataParallel: gloo on CPU, nccl
on GPU); run as `python -m pipeline.stages.train.build JOB.json` it is one such worker, or, built side by
side with another training, a process of its own on its share of the cores.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from mt_runtime.subword import SubwordTokenizer

from model.subword_training import copy_tokenizer
from model.transformer import Transformer, TransformerConfig, save_model

from ...corpora.distilled import encoded_training_set, training_pairs
from ...engine.context import StageContext
from ...engine.machine import usable_cores
from ...engine.recipe import Strict
from ...engine.workers import launch, launch_alone, worker_main, world_size
from ...training import speed_probe
from ...training.from_teacher import embedding_from_teacher, teacher_token_table, teacher_with_our_vocabulary
from ...training.loop import Trainer
from ...training.validation import validation_set
from . import TrainInputs, TrainNode


class TrainJob(Strict):
    """What one training is given: its node's settings, with the budget this build uses, and where
    its inputs and output are. Handed as it is where the training runs in the stage's process; as
    job.json where it is a process of its own (side by side, or under torchrun)."""

    node: TrainNode
    steps_matched_to: dict | None = None
    data: str
    tokenizer: str  # the tokenizer file
    kd_corpus: str | None = None
    teacher: str | None = None
    out: str
    work: str
    # The speed switches an earlier build of this artifact id chose (the lock's choices.speed).
    recorded_speed: dict | None = None


def run(ctx: StageContext) -> dict:
    cfg: TrainNode = ctx.settings
    inputs: TrainInputs = ctx.inputs
    train, matched = cfg.train, None
    if inputs.steps_of is not None:  # the ablation: the same number of steps as the model it is compared with
        other = inputs.steps_of
        matched = {"model": other.id, "steps": int(other.metrics["steps"])}
        train = train.model_copy(update={"max_steps": matched["steps"], "max_minutes": None, "max_epochs": None})
        ctx.log(f"budget: {matched['steps']} steps, as many as {other.id} took")
    if ctx.cores is not None:  # built side by side with another training
        train = train.model_copy(update={"num_threads": min(train.num_threads or ctx.cores, ctx.cores)})
    job = TrainJob(
        node=cfg.model_copy(update={"train": train}),
        steps_matched_to=matched,
        data=str(inputs.data.path),
        tokenizer=str(inputs.tokenizer.file("tokenizer.json")),
        kd_corpus=str(inputs.kd_corpus.path) if inputs.kd_corpus is not None else None,
        teacher=str(inputs.teacher.path) if inputs.teacher is not None else None,
        out=str(ctx.out),
        work=str(ctx.work),
        recorded_speed=(ctx.recorded or {}).get("speed"),
    )
    if ctx.nproc > 1:
        return launch(ctx, "pipeline.stages.train.build", job.model_dump(mode="json"))
    if ctx.cores is not None:
        return launch_alone(ctx, "pipeline.stages.train.build", job.model_dump(mode="json"), train.num_threads)
    return train_job(job, ctx.log, ctx.progress)


def train_job(job: TrainJob | dict, log, progress, rank: int = 0, device: str | None = None) -> dict:
    """One training (in a worker process, `job` is job.json's content)."""
    job = TrainJob.model_validate(job)
    node, train_cfg = job.node, job.node.train
    cores = max(1, usable_cores() // world_size())
    torch.set_num_threads(train_cfg.num_threads or cores)
    # Threads left to the machine are measured (all the cores against half); a recipe's are kept.
    probe_threads = [cores, cores // 2] if train_cfg.num_threads is None and world_size() == 1 and cores > 1 else None
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = SubwordTokenizer.load(job.tokenizer)
    model_cfg = TransformerConfig.from_spec(node.model, tokenizer.vocab_size, tokenizer.special_ids())
    torch.manual_seed(train_cfg.seed)
    model = Transformer(model_cfg)

    word_level = node.word_level if node.word_level is not None and node.word_level.enabled else None
    from_kd_corpus = word_level is not None and word_level.from_kd_corpus
    text = training_pairs(
        Path(job.data), job.kd_corpus and Path(job.kd_corpus), node.reference_mix, train_cfg.seed, from_kd_corpus, log
    )
    train, data_info = encoded_training_set(
        text, tokenizer, model_cfg.max_positions, Path(job.work), log, progress, rank
    )
    valid = validation_set(Path(job.data), tokenizer, model_cfg.max_positions, train_cfg.valid_bleu_sentences)

    teacher, alpha, temperature = None, 0.0, 1.0
    if word_level is not None:
        if not from_kd_corpus:  # else the KD corpus holds what the teacher would say
            teacher = teacher_with_our_vocabulary(Path(job.teacher), tokenizer, device, "word-level distillation")
        alpha, temperature = word_level.alpha, word_level.temperature
        if from_kd_corpus:
            with_soft = train.soft.present()
            data_info["word_level_pairs"] = with_soft
            log(
                f"word-level distillation from the KD corpus's stored distributions: {with_soft} of "
                f"{len(train)} pairs (the rest learn from their labels alone)"
            )
    if node.embeddings_from_teacher:
        table = teacher.token_table() if teacher is not None else teacher_token_table(Path(job.teacher), tokenizer)
        data_info["embeddings_from_teacher"] = embedding_from_teacher(model, table, log)

    log(
        f"{model.num_parameters():,} parameters, {len(train)} training pairs, "
        f"device {device}, threads {torch.get_num_threads()}, processes {world_size()}"
    )
    # A choice recorded for this artifact id is used as it was: the probe times a machine whose
    # load changes from one minute to the next, and another choice is another model.
    speed, why = speed_probe.from_record(
        job.recorded_speed, speed_probe.device_isa(device), train_cfg.num_threads or cores
    )
    if why:
        log(why)
    trainer = Trainer(
        model,
        train_cfg,
        train,
        valid,
        tokenizer,
        Path(job.work),
        log,
        progress,
        device,
        teacher=None if from_kd_corpus else teacher,
        kd_alpha=alpha,
        kd_temperature=temperature,
        probe_threads=probe_threads,
        speed=speed,
    )
    result = trainer.fit()
    if rank != 0:
        return result
    out = Path(job.out)
    model = trainer.model.cpu().eval()
    save_model(model, out)
    copy_tokenizer(job.tokenizer, out)
    (out / "training.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return {
        "role": node.role,
        "params": model.num_parameters(),
        "heads": model_cfg.total_heads(),
        "model_bytes": (out / "model.safetensors").stat().st_size,
        **data_info,
        **{k: v for k, v in result.items() if k != "history"},
        **({"steps_matched_to": job.steps_matched_to} if job.steps_matched_to else {}),
        "device": device,
        "processes": world_size(),
        "threads": torch.get_num_threads(),
        "choices": {"speed": trainer.speed.record()},
    }


if __name__ == "__main__":
    worker_main(train_job)
