"""The kd_corpus stage: the teacher translates the training sources once, and the student learns
from its translations (sequence-level knowledge distillation; build.py). Its settings are the
recipe's `distill.corpus` (pipeline/training/settings.py)."""

from __future__ import annotations

from dataclasses import dataclass

from ...engine.stage import Inputs, Planner, Stage
from ...engine.store import Artifact
from ...training.settings import KDCorpusConfig


@dataclass(frozen=True)
class KDCorpusInputs(Inputs):
    data: Artifact
    teacher: Artifact


def plan(p: Planner) -> None:
    if p.recipe.distill is not None:
        p.need("teacher", "distill")
        p.add("kd_corpus", p.recipe.distill.corpus, {"data": "data", "teacher": "teacher"})


STAGE = Stage(
    "kd_corpus",
    1,
    "translate the training sources with the teacher",
    settings=KDCorpusConfig,
    inputs=KDCorpusInputs,
    plan=plan,
    build="pipeline.stages.kd_corpus.build",
    headline=("sentences",),
)
