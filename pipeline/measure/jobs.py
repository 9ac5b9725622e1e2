"""What a measurement process is asked to do: one typed job per kind, written as JSON for
`python -m pipeline.measure.process JOB.json` (pipeline/measure/process.py) and read back there.

Four kinds: a LatencyJob (batch-1 latency, throughput, memory of one model: latency.py), a
VersusJob (ours and CTranslate2 taking turns in one process: versus.py), an AloneJob (one side
of that comparison alone) and a CoresJob (one of our packages on every core, threads against
child processes: cores.py). The JSON is the same as when jobs were dicts (a latency job has no
"kind", its engine's keys at the top); a key a reader does not declare, or a declared one missing,
is an error naming it, so that the stage and the process cannot drift apart.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields


@dataclass(frozen=True)
class Engine:
    """What opens a row's translator (pipeline.measure.speed.translator_for reads these keys)."""

    runtime: str  # torch, onnxruntime, ctranslate2
    device: str  # cpu, cuda
    compute_type: str
    folder: str  # the model folder or package
    threads: int

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class ScoreSpec:
    """A whole test set to translate and score with the measured translator (CTranslate2's rows:
    no evaluate stage covers them), its hypotheses kept in `hypotheses`."""

    src: str
    refs: str
    beams: list[int]
    test_set: str
    hypotheses: str


@dataclass(frozen=True)
class LatencyJob:
    engine: Engine
    sentences: list[str]
    batch_size: int
    throughput_beam: int
    min_repeats: int
    max_repeats: int
    stable_within: float
    score: ScoreSpec | None = None
    latency_only: bool = False  # a paired round: batch-1 latency alone

    @property
    def threads(self) -> int:
        return self.engine.threads


@dataclass(frozen=True)
class VersusJob:
    ours: Engine
    theirs: Engine
    threads: int
    sentences: list[str]
    points: list[list[int]]  # [batch, beam] each
    rounds: int
    tokenizer: str | None  # the file that sorts sentences into batches (our package's)


@dataclass(frozen=True)
class AloneJob:
    engine: Engine
    threads: int
    sentences: list[str]
    points: list[list[int]]
    rounds: int
    tokenizer: str | None


@dataclass(frozen=True)
class CoresJob:
    package: str  # our ONNX package's folder
    cores: int
    sentences: list[str]
    beams: list[int]
    batch: int
    rounds: int

    @property
    def threads(self) -> int:
        return self.cores


Job = LatencyJob | VersusJob | AloneJob | CoresJob
KINDS: dict[str, type] = {"versus": VersusJob, "alone": AloneJob, "cores": CoresJob}


class JobError(ValueError):
    """A job's JSON lacks a key its kind declares, or holds one it does not."""


def to_json(job: Job) -> dict:
    """The job as the process reads it: keys in the order they have always been written."""
    if isinstance(job, LatencyJob):
        return {
            **job.engine.as_dict(),
            **{f.name: _plain(getattr(job, f.name)) for f in fields(job) if f.name != "engine"},
        }
    kind = next(k for k, cls in KINDS.items() if isinstance(job, cls))
    return {"kind": kind, **{f.name: _plain(getattr(job, f.name)) for f in fields(job)}}


def from_json(data: dict) -> Job:
    """A job from its JSON (keys of the process's own, such as "result", removed first)."""
    data = dict(data)
    kind = data.pop("kind", None)
    if kind is None:
        engine = Engine(**_take(data, Engine, "latency job", rest=True))
        known = _take(data, LatencyJob, "latency job", skip={"engine"})
        score = known.pop("score", None)
        spec = ScoreSpec(**_take(dict(score), ScoreSpec, "latency job's score")) if score else None
        return LatencyJob(engine=engine, score=spec, **known)
    if kind not in KINDS:
        raise JobError(f"job kind {kind!r} unknown (known: latency, {', '.join(KINDS)})")
    known = _take(data, KINDS[kind], f"{kind} job")
    for key in ("ours", "theirs", "engine"):
        if key in known:
            known[key] = Engine(**_take(dict(known[key]), Engine, f"{kind} job's {key}"))
    return KINDS[kind](**known)


def _take(data: dict, cls: type, what: str, skip: set[str] = frozenset(), rest: bool = False) -> dict:
    """The keys of `data` that `cls` declares, removed from `data`. A declared key without a
    default that is missing is an error naming it; so is a key left over, unless `rest` (another
    class takes the others)."""
    declared = [f for f in fields(cls) if f.name not in skip]
    missing = [f.name for f in declared if f.name not in data and f.default is MISSING]
    if missing:
        raise JobError(f"{what}: lacks key {missing[0]!r}")
    out = {f.name: data.pop(f.name) for f in declared if f.name in data}
    if data and not rest:
        raise JobError(f"{what}: holds undeclared key {next(iter(data))!r}")
    return out


def _plain(value):
    """A nested engine or score spec as its JSON object."""
    if isinstance(value, (Engine, ScoreSpec)):
        return {f.name: getattr(value, f.name) for f in fields(value)}
    return value
