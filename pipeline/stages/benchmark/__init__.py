"""The benchmark stage: latency, throughput, memory and size of every variant on every runtime here,
CTranslate2 on the same weights beside ours, Optimum beside an imported teacher (build.py); the
recipe's `benchmark` section. Its numbers depend on the machine, which enters its fingerprint."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ...engine.recipe import NonNegInt, PositiveFloat, PositiveInt, Strict
from ...engine.stage import Inputs, Planner, Section, Stage, Variant
from ...engine.store import Artifact
from ...measure import optimum_peer
from ...measure.rows import BenchmarkOutput


class VersusConfig(Strict):
    """Ours against CTranslate2 on the same weights (the final model's int8 and float32 packages),
    both in one process at the same thread count, taking turns batch by batch, and each alone in
    a process of its own: sentences/s at each point, and each side at its own best thread count."""

    sentences: PositiveInt = 256  # the test set's first N: enough for several batches of 64
    batches: list[PositiveInt] = [1, 32, 64]
    beams: list[PositiveInt] = [1, 4]
    rounds: NonNegInt = 5  # passes over the sample each; the ratio is the rounds' median; 0: not measured
    # Passes of each side alone, in a process of its own per thread count (0: not measured);
    # fewer than `rounds` to keep the stage's time: about 4 minutes at 3 on the default recipe.
    separate_rounds: NonNegInt = 3


class CoresConfig(Strict):
    """The final model's ONNX packages on every usable core (2 or more), three ways, taking turns
    in one process: one thread, one Translator of N threads, N child processes of one thread; the
    faster way is the serving advice (docs/serving.md)."""

    sentences: PositiveInt = 1000  # the test set's first N, repeated to 4 batches a core where fewer
    beams: list[PositiveInt] = [1, 4]
    rounds: NonNegInt = 5  # passes over the sample each; 0: not measured


class BenchmarkConfig(Strict):
    test_set: str | None = None  # null: the first test set
    sentences: PositiveInt = 100
    batch_size: PositiveInt = 32
    throughput_beam: PositiveInt = 4  # beam of the throughput runs (bulk translation); latency: greedy and 4
    threads: list[Literal["one", "all"] | PositiveInt] = ["one", "all"]
    # optimum: an imported teacher through Optimum, in an environment of its own (pipeline/measure/optimum_peer.py)
    runtimes: list[Literal["torch", "onnxruntime", "ctranslate2", "optimum"]] = [
        "torch",
        "onnxruntime",
        "ctranslate2",
        "optimum",
    ]
    devices: list[Literal["cpu", "cuda"]] = ["cpu", "cuda"]
    min_repeats: PositiveInt = 2
    max_repeats: PositiveInt = 6
    stable_within: PositiveFloat = 0.05  # stop repeating once the p50 moves less than this
    # Rounds of ours-then-CTranslate2 (alternating order) latency passes, process after process,
    # for the final model's rows: a ratio that machine-speed drift between rows does not move.
    paired_rounds: NonNegInt = 3
    versus: VersusConfig = VersusConfig()
    cores: CoresConfig = CoresConfig()


class BenchmarkNode(BenchmarkConfig):
    """What the benchmark node runs: the recipe's section, the variants to measure (the graph's
    rows: name, runtime, device, compute type, the node and package that hold each), the final
    model (the peer runtimes' source) and, on a GPU machine, which GPU."""

    variants: list[Variant] = []
    final_model: str | None = None
    machine: dict | None = None
    # The Optimum environment's releases where the teacher is imported and one exists (None: its
    # rows are skipped): in the fingerprint, so that making the environment measures them.
    optimum_env: str | None = None


@dataclass(frozen=True)
class BenchmarkInputs(Inputs):
    data: Artifact
    variants: dict[str, Artifact] = field(default_factory=dict)  # variant name -> the artifact holding it


def plan(p: Planner) -> None:
    cfg = p.recipe.benchmark
    if cfg is None:
        return
    if not p.models:
        raise p.error("benchmark: needs a model (a 'teacher' section at least)")
    inputs = {"data": "data", **{f"variants.{v.name}": v.node for v in p.variants}}
    teacher = p.recipe.teacher
    imported = teacher is not None and teacher.pretrained is not None
    optimum_env = optimum_peer.env_versions() if imported and "optimum" in cfg.runtimes else None
    p.add(
        "benchmark",
        BenchmarkNode(
            **cfg.model_dump(),
            variants=p.variants,
            final_model=p.final_model,
            machine=p.machine,
            optimum_env=optimum_env,
        ),
        inputs,
    )


STAGE = Stage(
    "benchmark",
    6,
    "latency and throughput of every variant",
    settings=BenchmarkNode,
    inputs=BenchmarkInputs,
    plan=plan,
    build="pipeline.stages.benchmark.build",
    output=BenchmarkOutput,  # pipeline/measure/rows.py: the report reads it
    sections=(Section("benchmark", BenchmarkConfig),),
    headline=("rows", "sentences"),
)
