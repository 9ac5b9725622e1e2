"""The train stage: the teacher, the distilled student and its reference-only ablation (build.py).
It owns the recipe's `teacher` and `distill` sections (pipeline/training/settings.py); the
kd_corpus stage plans the corpus the student learns from, import_teacher a teacher not trained
here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ...engine.recipe import Fraction, Strict, dump_config
from ...engine.stage import Inputs, Node, Output, Planner, Section, Stage
from ...engine.store import Artifact
from ...training.settings import DistillConfig, ModelSpec, TeacherConfig, TrainConfig, WordLevelKD


class TrainNode(Strict):
    """What one train node runs: the teacher, the distilled student or its reference-only ablation."""

    role: Literal["teacher", "student", "student_ref"]
    model: ModelSpec
    train: TrainConfig
    reference_mix: Fraction = 0.0
    word_level: WordLevelKD | None = None
    embeddings_from_teacher: bool = False
    budget: Literal["student_steps", "own", "side_by_side"] | None = None  # the ablation's
    # The nodes built at the same time, each on its share of the cores (a model trained on a
    # share is not taken for one trained on all of them).
    side_by_side: list[str] = []


@dataclass(frozen=True)
class TrainInputs(Inputs):
    data: Artifact
    tokenizer: Artifact
    kd_corpus: Artifact | None = None  # the student's: the teacher's translations
    teacher: Artifact | None = None  # word-level distillation, or its embedding as the start
    steps_of: Artifact | None = None  # the ablation trains as many steps as this model took


@dataclass(frozen=True)
class TrainOutput(Output):
    """A trained model: the keys every model artifact has (role, params, heads, model_bytes), what
    it learnt from (pipeline/corpora/distilled.py) and how the training went (training/loop.py)."""

    role: str  # teacher, student, student_ref
    params: int
    heads: int
    model_bytes: int
    train_pairs: int
    source: str  # references, kd_corpus
    encode_seconds: float
    pairs_too_long: int
    steps: int
    epochs: int
    train_minutes: float
    stopped_by: str
    train_tokens: int
    resumed_from_steps: list[int]
    tokens_per_s: float
    budget: str
    precision: str
    speed: dict  # the speed probe's choices (training/speed_probe.py)
    chosen_checkpoint: dict
    best_valid_loss: float
    valid_bleu: float | None
    device: str
    processes: int
    threads: int
    kd_pairs: int | None = None  # source kd_corpus
    reference_pairs_mixed: int | None = None  # source kd_corpus
    word_level_pairs: int | None = None  # word-level KD from the corpus's stored distributions
    embeddings_from_teacher: dict | None = None
    cut_by_time: str | None = None  # stopped by max_minutes before its budget
    steps_matched_to: dict | None = None  # the ablation with budget student_steps
    choices: dict | None = None  # what the speed probe chose, recorded in the lock for this id


def plan(p: Planner) -> None:
    recipe = p.recipe
    if recipe.teacher is not None and recipe.teacher.pretrained is None:
        p.need("tokenizer", "teacher")
        p.add(
            "teacher",
            TrainNode(role="teacher", model=recipe.teacher.model, train=recipe.teacher.train),
            {"data": "data", "tokenizer": "tokenizer"},
            model=True,
        )
    if recipe.distill is None:
        return
    p.need("teacher", "distill")
    d = recipe.distill
    inputs = {"data": "data", "tokenizer": "tokenizer", "kd_corpus": "kd_corpus"}
    if d.student.word_level.enabled or d.student.embeddings_from_teacher:
        inputs["teacher"] = "teacher"
    asked = [
        key
        for key, on in (
            ("distill.student.embeddings_from_teacher", d.student.embeddings_from_teacher),
            ("distill.ablation_embeddings_from_teacher", d.ablation and d.ablation_embeddings_from_teacher),
        )
        if on
    ]
    imported = recipe.teacher.pretrained is not None
    if asked and not imported and d.student.model.d_model > recipe.teacher.model.d_model:
        raise p.error(
            f"{' and '.join(asked)}: the student's d_model ({d.student.model.d_model}) is wider than "
            f"the teacher's ({recipe.teacher.model.d_model}); there is nothing to project"
        )
    student = p.add("student", TrainNode(role="student", **dict(d.student)), inputs, model=True)
    if not d.ablation:
        return
    shape = d.student.model
    if d.ablation_dropout is not None:
        shape = shape.model_copy(update={"dropout": d.ablation_dropout})
    reference_only = TrainNode(
        role="student_ref",
        model=shape,
        train=d.student.train,
        budget=d.ablation_budget,
        embeddings_from_teacher=d.ablation_embeddings_from_teacher,
    )
    ref_inputs = {"data": "data", "tokenizer": "tokenizer"}
    if d.ablation_budget == "student_steps":
        ref_inputs["steps_of"] = "student"
    if d.ablation_embeddings_from_teacher:
        ref_inputs["teacher"] = "teacher"
    ablation = p.add("student_ref", reference_only, ref_inputs, model=True, final=False)
    if d.ablation_budget == "side_by_side":
        _side_by_side([student, ablation])


def _side_by_side(group: list[Node]) -> None:
    names = [n.name for n in group]
    for node in group:
        node.settings = node.settings.model_copy(update={"side_by_side": names})
        node.config = dump_config(node.settings)


STAGE = Stage(
    "train",
    3,
    "train a Transformer (teacher, student, ablation)",
    settings=TrainNode,
    inputs=TrainInputs,
    plan=plan,
    build="pipeline.stages.train.build",
    output=TrainOutput,
    sections=(Section("teacher", TeacherConfig), Section("distill", DistillConfig)),
    headline=("best_valid_loss", "params", "train_pairs", "valid_bleu"),
    cut=("cut_by_time",),
)
