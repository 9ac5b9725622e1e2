"""The prune stage: remove attention heads (and FFN neurons) of the final model so far, fine-tuning
after each step (build.py); the recipe's `prune` section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from ...engine.recipe import NonNegInt, OpenFraction, PositiveFloat, PositiveInt, Seed, Strict
from ...engine.stage import Inputs, Output, Planner, Section, Stage
from ...engine.store import Artifact
from ...training.settings import Bf16


class PruneFinetune(Strict):
    """The short fine-tune after each pruning step (on the KD corpus if there is one)."""

    steps: PositiveInt = 300
    lr: PositiveFloat = 3e-4
    # Fresh Adam moments after pruning: ramp up briefly, then decay as 1/sqrt(step).
    warmup_steps: NonNegInt = 50
    batch_tokens: PositiveInt = 4000
    max_minutes: PositiveFloat | None = None
    # Batch order (and dropout) of step i's fine-tune: seed + i - 1. Another seed is another draw
    # of the same recipe: how much of a pruned model's score is chance.
    seed: Seed = 1
    bf16: Bf16 = "auto"


class PruneConfig(Strict):
    # global: one ranking over all layers (scores normalised per layer); uniform: every attention
    # layer keeps the same number of heads (for runtimes that need one head count per model).
    ranking: Literal["global", "uniform"] = "global"
    # Scores a global ranking compares: raw E|dL/dgate| (none), or L2-normalised per layer as in
    # Michel et al. (layer). On a 3+2-layer, 4-head model trained on Multi30k, removing 50% of the
    # heads by layer-normalised scores left 7.2 greedy valid BLEU, by raw scores 18.4 (unpruned
    # 19.3; before fine-tuning): normalising 4 scores per layer erases the differences between layers.
    normalize: Literal["none", "layer"] = "none"
    # Prune to this fraction of all attention heads removed, in `steps` steps, each followed by a
    # fine-tune ...
    target_fraction: Annotated[float, Field(ge=0, lt=1)] = 0.5
    steps: PositiveInt = 2
    # ... but stop early: a step whose fine-tuned valid BLEU is more than this below the unpruned
    # model's is rolled back and pruning ends there (null: no limit).
    max_bleu_drop: Annotated[float, Field(ge=0)] | None = None
    min_heads_per_layer: PositiveInt = 1
    # Head importance: expected |gradient| over this many validation batches (all of valid if fewer).
    importance_batches: PositiveInt = 20
    # Small batches: the score averages |gradient| per batch, and one big batch's mean gradient
    # would let sentences that disagree about a head cancel out.
    importance_batch_tokens: PositiveInt = 1000
    finetune: PruneFinetune = PruneFinetune()
    # FFN neuron pruning with the same importance machinery (0 = off): this fraction of all FFN
    # hidden units is removed, spread over the same steps and ranked like the heads.
    ffn_fraction: OpenFraction = 0.0
    # Greedy valid BLEU (the before/after figures and the max_bleu_drop test) on the first N
    # validation sentences; null: all of them. A 0.5 tolerance needs the whole set (~1000).
    valid_bleu_sentences: PositiveInt | None = None
    # Latency of unpruned vs pruned (batch 1, greedy, one thread), interleaved sentence by sentence.
    latency_sentences: PositiveInt = 50
    latency_repeats: PositiveInt = 3


@dataclass(frozen=True)
class PruneInputs(Inputs):
    data: Artifact
    model: Artifact  # the student, else the teacher
    kd_corpus: Artifact | None = None  # what the fine-tune learns from, where there is one


@dataclass(frozen=True)
class PruneOutput(Output):
    """The pruned model: what was removed, BLEU and latency before and after, each step, and the
    keys every model artifact has (params, heads, model_bytes)."""

    source_model: str
    ranking: str
    normalize: str
    finetune_data: str  # kd_corpus, references
    heads_before: dict  # per kind: heads per layer
    heads_after: dict
    heads_total_before: int
    heads_total_after: int
    heads_removed: int
    fraction_removed: float
    ffn_before: dict
    ffn_after: dict
    neurons_removed: int
    params_before: int
    params_after: int
    model_bytes_before: int
    model_bytes_after: int
    valid_bleu_before: float
    valid_bleu_pruned: float  # before the fine-tune
    valid_bleu_after: float
    valid_bleu_drop: float
    valid_bleu_sentences: int
    stopped_by: str
    steps: list[dict]  # each step (its fine-tune's training record under "finetune")
    importance: list[dict]
    # Batch-1 greedy latency, one thread, in PyTorch (these) and onnxruntime (the same keys under it)
    latency_sentences: int
    latency_repeats: int
    latency_threads: int
    sentence_ms_unpruned: float
    decoder_step_ms_unpruned: float
    decoder_steps_per_sentence_unpruned: float
    sentence_ms_pruned: float
    decoder_step_ms_pruned: float
    decoder_steps_per_sentence_pruned: float
    sentence_speedup: float
    decoder_step_speedup: float
    onnxruntime: dict
    params: int
    heads: int
    model_bytes: int
    choices: dict | None = None  # the fine-tunes' speed choices, recorded in the lock for this id


def plan(p: Planner) -> None:
    if p.recipe.prune is None:
        return
    if not p.models:
        raise p.error("prune: needs a model to prune (a 'teacher' or 'distill' section)")
    source = "student" if "student" in p.models else "teacher"
    inputs = {"data": "data", "model": source}
    if p.planned("kd_corpus"):
        inputs["kd_corpus"] = "kd_corpus"
    p.add("pruned", p.recipe.prune, inputs, model=True)


STAGE = Stage(
    "prune",
    5,
    "remove attention heads (and FFN neurons), fine-tune",
    settings=PruneConfig,
    inputs=PruneInputs,
    plan=plan,
    build="pipeline.stages.prune.build",
    output=PruneOutput,
    sections=(Section("prune", PruneConfig),),
    headline=("heads_removed", "params"),
    cut=("steps[].finetune.cut_by_time",),
)
