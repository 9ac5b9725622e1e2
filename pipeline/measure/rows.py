"""A benchmark row: one model on one runtime, device and compute type, with what was measured.

The benchmark stage makes them (pipeline/stages/benchmark/build.py), keeps them as JSON in its
benchmark.json and manifest (`results`), and the report reads them back typed (from_json): a key
renamed on one side is an error naming it, not a column of blanks. The JSON is the one rows had as
dicts: the declared keys in this order, `folder` never written (a path into the store, not for
readers), the keys of OPTIONAL only where a row has them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from ..engine.stage import Output, Variant


@dataclass(frozen=True)
class BenchmarkRow:
    name: str  # the variant's name, or ctranslate2_<model>_<type>, with _cuda on a CUDA copy
    variant: str
    runtime: str  # torch, onnxruntime, ctranslate2
    device: str  # cpu, cuda
    compute_type: str
    node: str | None = None  # the graph node that holds the model
    package: str | None = None  # the package folder inside that node's artifact
    source: str | None = None  # the PyTorch model whose weights these are
    artifact: str | None = None  # the artifact id measured
    files: str | None = None  # a model the benchmark made (CTranslate2's), inside its artifact
    folder: str | None = None  # where the model was opened from: never written
    params: int | None = None
    heads: int | None = None
    bytes: int | None = None  # of the weights the runtime loads (facts.model_bytes)
    threads: int | None = None  # of the measurement shown (the fastest)
    latency_ms: dict | None = None  # greedy_b1, beam4_b1: {p50, p90, p99, mean}
    throughput: dict | None = None
    peak_rss_mb: float | None = None
    gpu_mem_mb: float | None = None
    load_s: float | None = None
    breakdown: dict | None = None  # where batch-1 greedy time goes (ours)
    skipped: str | None = None  # why the row was not measured here; None when it was
    note: str | None = None
    by_threads: dict = field(default_factory=dict)  # "<threads>": that measurement's result
    heads_computed: int | None = None  # CTranslate2 with zero heads added to uneven layers
    parity: dict | None = None  # CTranslate2's greedy outputs against ours: {identical, sentences, ...}
    hypotheses: str | None = None  # CTranslate2's translations of the test set, inside the artifact
    scores: dict | None = None  # CTranslate2's BLEU / chrF: {"beam4": ..., "beam1": ...}
    paired: dict | None = None  # ours against the peer in paired rounds (peers.paired_rounds)
    versus: dict | None = None  # ours against the peer in one process and alone (peers.versus_ctranslate2)
    cores: dict | None = None  # ours on every core: threads against processes (peers.on_every_core)

    @classmethod
    def of(cls, v: Variant, **changes) -> BenchmarkRow:
        """A row for a variant of the graph, nothing measured yet."""
        return cls(
            name=v.name,
            variant=v.variant,
            runtime=v.runtime,
            device=v.device,
            compute_type=v.compute_type,
            node=v.node,
            package=v.package,
            source=v.source,
            skipped=v.skipped,
            **changes,
        )

    def but(self, **changes) -> BenchmarkRow:
        return replace(self, **changes)

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in JSON_KEYS if k not in OPTIONAL or getattr(self, k) is not None}

    @classmethod
    def from_json(cls, data: dict) -> BenchmarkRow:
        """A row as benchmark.json holds it; a declared key missing, or an undeclared one, is a
        RowError naming it."""
        name = data.get("name", "?")
        missing = [k for k in JSON_KEYS if k not in OPTIONAL and k not in data]
        if missing:
            raise RowError(f"benchmark row {name!r} lacks key {missing[0]!r} (declared in pipeline/measure/rows.py)")
        extra = [k for k in data if k not in JSON_KEYS]
        if extra:
            raise RowError(f"benchmark row {name!r} holds undeclared key {extra[0]!r} (see pipeline/measure/rows.py)")
        return cls(**data)


JSON_KEYS = tuple(f.name for f in fields(BenchmarkRow) if f.name != "folder")
# Written only where a row has them (in this order, after the others), as rows always had them.
OPTIONAL = frozenset({"heads_computed", "parity", "hypotheses", "scores", "paired", "versus", "cores"})


@dataclass(frozen=True)
class BenchmarkOutput(Output):
    """What the benchmark stage returns (its manifest's metrics; benchmark.json holds the same
    with `rows` the rows): the report reads it."""

    rows: int
    measured: int
    skipped_rows: int
    test_set: str
    sentences: int
    threads: list[int]
    batch_size: int
    throughput_beam: int
    machine: dict
    results: list[dict]  # BenchmarkRow.to_json() of each row


class RowError(ValueError):
    """A benchmark row's JSON does not match BenchmarkRow."""


# The fields a row takes from its fastest measurement.
MEASURED = ("threads", "latency_ms", "throughput", "peak_rss_mb", "gpu_mem_mb", "load_s", "breakdown")


def pick_best(row: BenchmarkRow) -> BenchmarkRow:
    """The row with the figures of its thread count with the lowest batch-1 greedy p50 latency (and
    the first scores measured); skipped for the first reason if every measurement was."""
    done = [r for r in row.by_threads.values() if not r.get("skipped")]
    if not done:
        return row.but(skipped=next(iter(row.by_threads.values()))["skipped"])
    best = min(done, key=lambda r: r["latency_ms"]["greedy_b1"]["p50"])
    scored = [r["scores"] for r in row.by_threads.values() if r.get("scores")]
    return row.but(**{key: best.get(key) for key in MEASURED}, **({"scores": scored[0]} if scored else {}))


def summary_line(row: BenchmarkRow) -> str:
    lat, tp = row.latency_ms, row.throughput
    return (
        f"{row.name} ({row.runtime}, {row.device}, {row.compute_type}, {row.threads} thr): "
        f"greedy p50 {lat['greedy_b1']['p50']:.1f} ms, beam4 p50 {lat['beam4_b1']['p50']:.1f} ms, "
        f"{tp['sent_per_s']:.1f} sent/s at batch {tp['batch']}, RSS {row.peak_rss_mb:.0f} MB"
    )


def thread_counts(spec: list, cores: int) -> list[int]:
    """The thread counts `benchmark.threads` names ("one", "all" or a number), each once."""
    counts = [1 if t == "one" else cores if t == "all" else int(t) for t in spec]
    return list(dict.fromkeys(counts))  # "one" and "all" are the same on a 1-core machine
