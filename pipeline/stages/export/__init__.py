"""The export stage: a model to ONNX packages (fp32, and fp16 for GPUs), optimised and checked
against PyTorch (build.py); the recipe's `export` section. The final model is always exported,
as quantization and shipping start from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from mt_runtime.shortlist import MAX_PER_WORD
from pydantic import Field

from ...engine.recipe import PositiveFloat, PositiveInt, Strict, dump_config
from ...engine.stage import Inputs, Output, Planner, Section, Stage, Variant
from ...engine.store import Artifact


class ParityConfig(Strict):
    max_abs_diff: PositiveFloat = 1e-4
    batch_sizes: list[PositiveInt] = [1, 3, 8]
    decode_sentences: PositiveInt = 200
    beam: PositiveInt = 4  # beam size of the beam-search half of the decode check (greedy is the other)
    # Intra-op threads of both runtimes during the checks; 1 keeps the batch-1 timing they
    # record (ONNX Runtime vs PyTorch) free of thread-pool noise on a shared machine.
    threads: PositiveInt = 1


class ShortlistConfig(Strict):
    # Every batch may produce the `frequent` most frequent target words, and for each of its
    # source words the `per_word` target words most above their base rate beside it (mt_runtime/shortlist.py,
    # whose runtime refuses more than MAX_PER_WORD a word).
    frequent: Annotated[int, Field(ge=1, le=1_000_000)] = 300
    per_word: Annotated[int, Field(ge=1, le=MAX_PER_WORD)] = 50
    max_pairs: Annotated[int, Field(ge=1, le=100_000_000)] = 2_000_000  # the first training pairs counted


class ExportConfig(Strict):
    # Model artifacts to export besides the final one (the last of teacher, student, pruned),
    # which is always exported because quantization and shipping start from it.
    also: list[Literal["teacher", "student", "student_ref"]] = []
    opset: Annotated[int, Field(ge=17, le=21)] = 17
    # Attention as onnxruntime's fused MultiHeadAttention contrib op (one node instead of ~15;
    # measured faster decoding); false: standard ONNX ops only, for runtimes other than ORT.
    fused_attention: bool = True
    optimize: bool = True
    fp16: bool = True
    parity: ParityConfig = ParityConfig()
    # A lexical shortlist for batches (the output projection over a batch's likely words); null: none.
    shortlist: ShortlistConfig | None = None


@dataclass(frozen=True)
class ExportInputs(Inputs):
    data: Artifact
    model: Artifact


@dataclass(frozen=True)
class ExportOutput(Output):
    opset: int
    fused_attention: bool
    onnxruntime: str
    torch: str
    source_artifact: str
    threads: int  # of both runtimes in the parity checks
    packages: dict  # per variant: bytes, onnx_bytes
    parity: dict  # per variant: pipeline/export/parity.py's report
    tied_embedding: dict  # what float_graphs did to the graphs
    positions_as_formula: dict
    layer_norms_unfused: dict
    parity_max_abs_diff: float  # fp32's, for the run summary
    greedy_identical: str
    beam_identical: str
    onnx_bytes: int
    greedy_speedup: float | None
    optimizer: dict | None = None  # optimize: true
    shortlist: dict | None = None  # a shortlist section: its size and coverage


def plan(p: Planner) -> None:
    cfg = p.recipe.export
    if cfg is None:
        return
    final = p.final_model
    if final is None:
        raise p.error("export: needs a model (a 'teacher' section at least)")
    config = dump_config(cfg)
    config.pop("also")
    for model in cfg.also:
        if model not in p.models:
            raise p.error(f"export.also: '{model}' is not built by this recipe")
    exports = [m for m in p.models if m in cfg.also or m == final]
    for model in exports:
        p.add(f"export.{model}", cfg, {"data": "data", "model": model}, config=config)
    p.variants += [
        Variant(
            name=f"{model}_onnx",
            variant=model,
            node=f"export.{model}",
            source=model,
            package="fp32",
            runtime="onnxruntime",
        )
        for model in exports
    ]
    if cfg.fp16:  # a GPU-only variant: evaluated only where a GPU is; elsewhere the report says why not
        p.variants.append(
            Variant(
                name="fp16",
                variant="fp16",
                node=f"export.{final}",
                source=final,
                package="fp16",
                runtime="onnxruntime",
                device="cuda",
                compute_type="float16",
                skipped=None if p.has_cuda else "no CUDA device on this machine",
            )
        )


STAGE = Stage(
    "export",
    8,
    "export to ONNX, optimise, check parity",
    settings=ExportConfig,
    inputs=ExportInputs,
    plan=plan,
    build="pipeline.stages.export.build",
    output=ExportOutput,
    sections=(Section("export", ExportConfig),),
    headline=("parity_max_abs_diff",),
)
