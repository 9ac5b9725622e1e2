"""The evaluate stage: one node per variant (each model in PyTorch, each package in onnxruntime)
translating the test sets, BLEU and chrF (build.py); the recipe's `evaluate` section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from ...engine.recipe import PositiveInt, Strict
from ...engine.stage import Inputs, Planner, Section, Stage
from ...engine.store import Artifact
from ...measure.evaluation import EvaluateOutput


class EvaluateConfig(Strict):
    test_sets: list[str] | None = None  # null: every test set the data stage produced
    beam: PositiveInt = 4
    length_penalty: Annotated[float, Field(ge=0)] = 1.0
    batch_tokens: PositiveInt = 4000
    greedy_too: bool = True  # also score greedy decoding (what batch-1 serving uses)
    alone_too: bool = True  # ONNX packages: translate each sentence alone too, and count outputs that differ


class EvaluateNode(EvaluateConfig):
    """What one evaluate node runs: the recipe's evaluate section and the variant it scores."""

    variant: str  # the model (teacher, pruned, ...) or package variant (int8_dynamic, ...)
    package: str | None = None  # the package folder inside the model's artifact (None: the PyTorch model)
    runtime: Literal["torch", "onnxruntime"]
    device: Literal["cpu", "cuda"] = "cpu"
    machine: dict | None = None  # the GPU, for a CUDA node: another GPU gives another artifact


@dataclass(frozen=True)
class EvaluateInputs(Inputs):
    data: Artifact
    model: Artifact  # the model, or the artifact holding the package


def plan(p: Planner) -> None:
    cfg = p.recipe.evaluate
    if cfg is None:
        return
    if not p.models:
        raise p.error("evaluate: needs a model (a 'teacher' section at least)")
    for v in (v for v in p.variants if not v.skipped):
        settings = EvaluateNode(
            **cfg.model_dump(),
            variant=v.variant,
            package=v.package,
            runtime=v.runtime,
            device=v.device,
            machine=p.machine if v.device == "cuda" else None,
        )
        p.add(f"evaluate.{v.name}", settings, {"data": "data", "model": v.node})


STAGE = Stage(
    "evaluate",
    2,
    "translate the test sets, score BLEU and chrF",
    settings=EvaluateNode,
    inputs=EvaluateInputs,
    plan=plan,
    build="pipeline.stages.evaluate.build",
    output=EvaluateOutput,  # pipeline/measure/evaluation.py: the report reads it
    sections=(Section("evaluate", EvaluateConfig),),
    headline=("bleu", "chrf"),
)
