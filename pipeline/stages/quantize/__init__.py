"""The quantize stage: the final model's int8 packages (dynamic, per-row activation scales; static,
calibrated ones), each held to a BLEU guard (build.py); the recipe's `quantize` section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from ...engine.recipe import NonNegInt, PositiveInt, Strict
from ...engine.stage import Inputs, Output, Planner, Section, Stage, Variant
from ...engine.store import Artifact


class QuantizeConfig(Strict):
    # int8_dynamic: int8 weights per output column, activations per row (model/onnx_quantize.py).
    dynamic: bool = True
    per_channel: bool = True  # int8_static's weights: a scale per output column (else one per matrix)
    static: bool = True
    calibration: Literal["minmax", "entropy", "percentile"] = "minmax"
    calibration_sentences: PositiveInt = 200
    max_bleu_drop: Annotated[float, Field(ge=0)] = 0.5
    guard_sentences: PositiveInt | None = None  # validation sentences scored by the guard (all if null)
    # Batch-1 greedy CPU latency of each variant against fp32, timed on this many validation
    # sentences, one thread, interleaved (0 = skip; the benchmark stage measures it properly).
    latency_sentences: NonNegInt = 50


@dataclass(frozen=True)
class QuantizeInputs(Inputs):
    data: Artifact
    export: Artifact  # the final model's export: its fp32 package


@dataclass(frozen=True)
class QuantizeOutput(Output):
    fp32_bleu: float  # the guard's, on its validation sentences
    guard_sentences: int
    beam: int
    max_bleu_drop: float
    fp32_onnx_bytes: int
    groups: list[str]  # the weight groups the guard may leave in float
    onnxruntime: str
    variants: dict  # per variant: the guard's search, bytes, latency (pipeline/quantize/)
    calibration: dict | None = None  # static: how it was calibrated
    bleu: float | None = None  # the first variant's, for the run summary (none without a variant)
    bytes_ratio: float | None = None


def plan(p: Planner) -> None:
    cfg = p.recipe.quantize
    if cfg is None:
        return
    p.need("export", "quantize")
    final = p.final_model
    p.add("quantize", cfg, {"data": "data", "export": f"export.{final}"})
    for kind, on in (("int8_dynamic", cfg.dynamic), ("int8_static", cfg.static)):
        if on:
            p.variants.append(
                Variant(
                    name=kind,
                    variant=kind,
                    node="quantize",
                    source=final,
                    package=kind,
                    runtime="onnxruntime",
                    compute_type="int8",
                )
            )


STAGE = Stage(
    "quantize",
    14,
    "int8 dynamic and static quantization with a guard",
    settings=QuantizeConfig,
    inputs=QuantizeInputs,
    plan=plan,
    build="pipeline.stages.quantize.build",
    output=QuantizeOutput,
    sections=(Section("quantize", QuantizeConfig),),
    headline=("bleu", "bytes_ratio"),
)
