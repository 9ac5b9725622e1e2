"""The report stage: BLEU against latency, the table, JSON and plot, and what each step of the
chain cost and bought (build.py); the recipe's `report` section."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...engine.recipe import PositiveFloat, Strict
from ...engine.stage import Inputs, Output, Planner, Section, Stage
from ...engine.store import Artifact


class ReportTargets(Strict):
    """What the report holds each int8 student in onnxruntime to, against the teacher in PyTorch."""

    speedup: PositiveFloat = 8.0  # batch-1 greedy sentences/s over the teacher's, at least
    bleu_delta: float = -1.0  # BLEU minus the teacher's, at least
    bytes_ratio: PositiveFloat = 0.1  # bytes over the teacher's, at most


class ReportConfig(Strict):
    max_bleu_loss: PositiveFloat = 1.0  # for the recommendation line
    targets: ReportTargets = ReportTargets()


class ReportNode(ReportConfig):
    recipe: str | None = None  # the recipe's name, for the report's title


@dataclass(frozen=True)
class ReportInputs(Inputs):
    benchmark: Artifact
    data: Artifact  # the references, for BLEU's uncertainty
    evaluate: dict[str, Artifact] = field(default_factory=dict)  # variant name -> its evaluation
    trained: dict[str, Artifact] = field(default_factory=dict)  # model -> its training: steps, precision, cut


@dataclass(frozen=True)
class ReportOutput(Output):
    """What the manifest keeps of report.json (the artifact's files hold the rest)."""

    rows: int
    measured: int
    recommendation: str
    targets: dict  # each target of the recipe, measured


def plan(p: Planner) -> None:
    if p.recipe.report is None:
        return
    p.need("evaluate", "report")
    p.need("benchmark", "report")
    inputs = {"benchmark": "benchmark", "data": "data"}
    for v in (v for v in p.variants if not v.skipped):
        inputs[f"evaluate.{v.name}"] = f"evaluate.{v.name}"
    for model in p.models:  # how each was trained: steps, precision, whether a time cap cut it
        inputs[f"trained.{model}"] = model
    p.add("report", ReportNode(**p.recipe.report.model_dump(), recipe=p.recipe.name), inputs)


STAGE = Stage(
    "report",
    8,
    "BLEU against latency: table, JSON and plot",
    settings=ReportNode,
    inputs=ReportInputs,
    plan=plan,
    build="pipeline.stages.report.build",
    output=ReportOutput,
    sections=(Section("report", ReportConfig),),
    headline=("rows",),
)
