"""The kd_corpus stage: the teacher translates the training sources once, and the student learns
from its translations (sequence-level knowledge distillation; build.py). Its settings are the
recipe's `distill.corpus` (pipeline/training/settings.py)."""

from __future__ import annotations

from dataclasses import dataclass

from ...engine.stage import Inputs, Output, Planner, Stage
from ...engine.store import Artifact
from ...training.settings import KDCorpusConfig


@dataclass(frozen=True)
class KDCorpusInputs(Inputs):
    data: Artifact
    teacher: Artifact


@dataclass(frozen=True)
class KDCorpusOutput(Output):
    sentences: int  # pairs in kd.src/kd.tgt
    empty_translations: int  # sources whose translation came out empty (left out)
    beam: int
    seconds: float
    sentences_per_s: float | None
    processes: int
    device: str
    length_ratio: float  # target words per source word
    threads: int | None  # None on a GPU
    precision: str
    decoder: str | None = None  # an imported teacher: the runtime that translated
    decoders: dict | None = None  # an imported teacher: both decoders on the first sentences
    top_k: dict | None = None  # word-level KD from the corpus: the stored distributions
    selection: dict | None = None  # selection closest_to_reference: how often it was not the top


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
    output=KDCorpusOutput,
    headline=("sentences",),
)
