"""A report row: one model on one runtime, device and thread count, with its quality and speed.

The benchmark stage measures the speed part (pipeline/measure/rows.py), the report stage joins
the quality part and the ratios (pipeline/report/table.py), and `pipeline report`
(pipeline/commands/report_view.py) shows and compares rows. report.json is an interface others
script against: keys may be added, never renamed; the required ones below are checked before a
report is written.
"""

# No `from __future__ import annotations` here: TypedDict must see NotRequired itself, not a string.
from typing import NotRequired, TypedDict


class Latency(TypedDict):
    """Milliseconds per sentence at batch 1 (pipeline.measure.timing.percentiles)."""

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
    # Against CTranslate2: {peer, by_threads: {n: {points}}} (one process, taking turns), separate:
    # {rounds, by_threads: {n: {ours, ctranslate2, points}}} (each alone), best: {interleaved, separate}
    # (per point, each side at its own best thread count)
    versus: NotRequired[dict | None]
    # Our package on every core: {cores, batch, sentences, rounds, points: [{beam, sent_per_s,
    # speedup, same}], best} (pipeline/measure/cores.py); None on one core
    cores: NotRequired[dict | None]
    breakdown: NotRequired[dict | None]
    peak_rss_mb: NotRequired[float | None]
    gpu_mem_mb: NotRequired[float | None]
    parity: NotRequired[str]
    greedy_vs_beam: NotRequired[dict | None]  # its greedy BLEU minus its beam BLEU, with a paired interval
    # ONNX packages: {"<test set>.beam<k>": {identical, sentences, differ}}: test sentences translated
    # alone against the same in the evaluate stage's batches
    alone_identical: NotRequired[dict]
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
    return {
        "bleu": row["bleu"],
        "greedy_p50_ms": row["latency_ms"]["greedy_b1"]["p50"],
        "beam4_p50_ms": row["latency_ms"]["beam4_b1"]["p50"],
        "sent_per_s": row["throughput"]["sent_per_s"],
        "bytes": row["bytes"],
        "threads": row["threads"],
    }


def versus_lines(rows: list[dict]) -> list[str]:
    """One verdict line per point of each row's comparison with CTranslate2 at each thread count
    (one process; each alone beside it, where measured), then one per point with each side at
    its own best thread count."""
    lines = []
    for r in rows:
        versus = r.get("versus")
        if not versus:
            continue
        by_batch = any(
            "round_ratios" in p for result in versus["by_threads"].values() for p in result.get("points", [])
        )
        median_round = all(
            p.get("figures") == "median round"
            for result in versus["by_threads"].values()
            for p in result.get("points", [])
        )
        how = (
            "taking turns batch by batch over the same sentences; throughput ours / theirs, the median of the "
            "rounds' own ratios"
            + (" (the figures are that round's)" if median_round else "")
            + ", their range in brackets"
            if by_batch
            else "interleaved pass after pass over the same sentences; throughput ours / theirs"
        )
        separate = versus.get("separate") or {}
        alone_how = (
            f'; "alone": each in a fresh process of its own, the other not loaded, {separate["rounds"]} '
            "rounds each, their median, the two processes minutes apart"
            if separate
            else ""
        )
        lines += [
            "",
            f"**{r['name']} against {versus['peer']}** (same weights, one process, the two {how}{alone_how}; "
            "above 1 is ours faster):",
            "",
        ]
        for n, result in versus["by_threads"].items():
            if result.get("skipped"):
                lines.append(f"- {n} thread{'s' if int(n) > 1 else ''}: skipped: {result['skipped']}")
                continue
            alone = separate.get("by_threads", {}).get(n) or {}
            ratios = {(p["batch"], p["beam"]): p["ratio"] for p in alone.get("points", [])}
            lines += [
                f"- {n} thread{'s' if int(n) > 1 else ''}, {result['sentences']} sentences, "
                f"{result['rounds']} rounds: {p['verdict']}"
                + (
                    f"; alone {ratios[p['batch'], p['beam']]:.2f}x"
                    if (p["batch"], p["beam"]) in ratios
                    else f"; alone: skipped: {alone['skipped']}"
                    if alone.get("skipped")
                    else ""
                )
                for p in result["points"]
            ]
        lines += best_lines(versus)
    return lines


def best_lines(versus: dict) -> list[str]:
    """Per point, each side at its own best thread count: one process and each alone."""
    best = versus.get("best") or {}
    if not best.get("interleaved"):
        return []
    counts = sorted({int(n) for n in versus["by_threads"]})
    alone = {(p["batch"], p["beam"]): p for p in best.get("separate") or []}
    lines = [
        "",
        f"Each side at its own best thread count (the faster of {' and '.join(map(str, counts))} for it at "
        f"that point; CTranslate2's: {threads_said(best['interleaved'], 'ctranslate2')} taking turns"
        + (f", {threads_said(best['separate'], 'ctranslate2')} alone" if alone else "")
        + "):",
        "",
    ]
    for p in best["interleaved"]:
        what, _, one_process = p["verdict"].partition(": ")
        across = (
            ""
            if p.get("same_process", True)
            else (
                f" (each one's median round: ours from the {p['ours_threads']}-thread process, CTranslate2 from the "
                f"{p['ctranslate2_threads']}-thread one)"
            )
        )
        line = f"- {what}: taking turns, {one_process}{across}"
        if (p["batch"], p["beam"]) in alone:
            line += f"; each alone, {alone[p['batch'], p['beam']]['verdict'].partition(': ')[2]}"
        lines.append(line)
    return lines


def threads_said(points: list[dict], side: str) -> str:
    """Which thread counts a side was best at over the points: "1 thread at every point", or
    "1 thread at 4 points, 2 at 2"."""
    found: dict[int, int] = {}
    for p in points:
        found[p[f"{side}_threads"]] = found.get(p[f"{side}_threads"], 0) + 1
    said = [f"{n} thread{'s' if n > 1 else ''}" if i == 0 else str(n) for i, n in enumerate(sorted(found))]
    if len(found) == 1:
        return f"{said[0]} at every point"
    return ", ".join(f"{word} at {found[n]} point{'s' if found[n] > 1 else ''}" for word, n in zip(said, sorted(found)))
