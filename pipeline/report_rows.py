"""A report row: one model on one runtime, device and thread count, with its quality and speed.

The benchmark stage measures the speed part, the report stage (pipeline/stages/report.py) joins
the quality part and the ratios, and `pipeline report` (pipeline/report_viewer.py) shows and
compares rows. report.json is an interface others script against: keys may be added, never
renamed; the required ones below are checked before a report is written.
"""

# No `from __future__ import annotations` here: TypedDict must see NotRequired itself, not a string.
from typing import NotRequired, TypedDict


class Latency(TypedDict):
    """Milliseconds per sentence at batch 1 (pipeline.timing.percentiles)."""

    p50: float
    p90: float
    p99: float
    mean: float


class Throughput(TypedDict):
    sent_per_s: float
    tok_per_s: float
    batch: int
    beam: int


class ReportRow(TypedDict):
    name: str  # variant, or variant_<runtime> / variant_cuda: unique within a report
    variant: str  # teacher, student, pruned, int8_dynamic, ...
    runtime: str  # torch, onnxruntime, ctranslate2
    device: str  # cpu, cuda
    compute_type: str
    threads: int | None
    params: int | None
    heads: int | None
    bytes: int | None
    bleu: float | None  # beam (bleu_beam), on the benchmark's test set
    chrf: float | None
    latency_ms: dict[str, Latency] | None  # greedy_b1, beam4_b1
    throughput: Throughput | None
    skipped: str | None  # why the row was not measured here; None when it was
    bleu_greedy: NotRequired[float | None]
    chrf_greedy: NotRequired[float | None]
    bleu_beam: NotRequired[int | None]
    bleu_source: NotRequired[str | None]  # which artifact (or runtime) scored it, on what
    note: NotRequired[str | None]
    source: NotRequired[str | None]
    artifact: NotRequired[str | None]
    paired: NotRequired[dict | None]
    versus: NotRequired[dict | None]  # against CTranslate2 in one process: {peer, by_threads: {n: {points}}}
    breakdown: NotRequired[dict | None]
    peak_rss_mb: NotRequired[float | None]
    gpu_mem_mb: NotRequired[float | None]
    parity: NotRequired[str]
    greedy_vs_beam: NotRequired[dict | None]  # its greedy BLEU minus its beam BLEU, with a paired interval
    vs_teacher: NotRequired[dict | None]  # ratios against the teacher in PyTorch on the CPU
    pareto: NotRequired[bool]  # on the greedy BLEU / latency front
    pareto_beam4: NotRequired[bool]
    training_cut: NotRequired[str | None]  # "teacher cut by time at step N of M" where a cap cut a training


REPORT_KEYS = ("recipe", "run", "machine", "rows")
MACHINE_KEYS = ("cpu", "cores", "gpu", "versions")
ROW_KEYS = tuple(k for k in ReportRow.__annotations__ if k in ReportRow.__required_keys__)


def missing_keys(report: dict) -> list[str]:
    """The promised keys a report lacks, as report.json paths."""
    missing = [k for k in REPORT_KEYS if k not in report]
    missing += [f"machine.{k}" for k in MACHINE_KEYS if k not in (report.get("machine") or {})]
    for row in report.get("rows", []):
        missing += [f"rows[{row.get('name')}].{k}" for k in ROW_KEYS if k not in row]
    return missing


def figures(row: ReportRow) -> dict:
    """What two runs' rows are compared on: BLEU, batch-1 latency, throughput, size, threads."""
    if row["skipped"]:
        return {"skipped": row["skipped"]}
    return {"bleu": row["bleu"], "greedy_p50_ms": row["latency_ms"]["greedy_b1"]["p50"],
            "beam4_p50_ms": row["latency_ms"]["beam4_b1"]["p50"], "sent_per_s": row["throughput"]["sent_per_s"],
            "bytes": row["bytes"], "threads": row["threads"]}


def versus_lines(rows: list[dict]) -> list[str]:
    """One verdict line per point of each row's one-process comparison with CTranslate2."""
    lines = []
    for r in rows:
        versus = r.get("versus")
        if not versus:
            continue
        by_batch = any("round_ratios" in p for result in versus["by_threads"].values() for p in result.get("points", []))
        median_round = all(p.get("figures") == "median round" for result in versus["by_threads"].values()
                           for p in result.get("points", []))
        how = ("taking turns batch by batch over the same sentences; throughput ours / theirs, the median of the "
               "rounds' own ratios" + (" (the figures are that round's)" if median_round else "") +
               ", their range in brackets" if by_batch else
               "interleaved pass after pass over the same sentences; throughput ours / theirs")
        lines += ["", f"**{r['name']} against {versus['peer']}** (same weights, one process, the two {how}; "
                      "above 1 is ours faster):", ""]
        for n, result in versus["by_threads"].items():
            if result.get("skipped"):
                lines.append(f"- {n} thread{'s' if int(n) > 1 else ''}: skipped: {result['skipped']}")
                continue
            lines += [f"- {n} thread{'s' if int(n) > 1 else ''}, {result['sentences']} sentences, "
                      f"{result['rounds']} rounds: {p['verdict']}" for p in result["points"]]
    return lines
