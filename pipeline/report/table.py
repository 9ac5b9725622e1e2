"""The report's rows: each benchmark row joined with its quality figures (report_row), how each
model was trained and which rows a time cap cut, ratios against the teacher in PyTorch on the CPU,
and how the scores were computed. report.json's row keys: rows.py."""

from __future__ import annotations

from ..measure.evaluation import EvaluateOutput
from ..measure.rows import BenchmarkRow
from .rows import ReportRow

TEACHER = "teacher"  # the row every ratio is taken against: the teacher in PyTorch on the CPU


def training_summary(metrics: dict) -> dict:
    """How a model artifact was trained, as this machine ran it: steps against the budget, the
    precision and threads its probe chose, minutes, and a time cap's cut if there was one (the
    metrics the train and prune stages declare as their `cut`)."""
    if isinstance(metrics.get("steps"), list):  # pruning: its fine-tunes
        tunes = [s["finetune"] for s in metrics["steps"] if s.get("finetune")]
        return {
            "kind": "pruning fine-tune",
            "steps": sum(t["steps"] for t in tunes),
            "budget": ", ".join(t.get("budget") or "?" for t in tunes),
            "precision": ", ".join(sorted({t.get("precision") or "?" for t in tunes})),
            "minutes": round(sum(t.get("train_minutes") or 0 for t in tunes), 2),
            "cut_by_time": "; ".join(t["cut_by_time"] for t in tunes if t.get("cut_by_time")) or None,
        }
    if metrics.get("imported"):
        return {
            "kind": "imported",
            "steps": None,
            "budget": f"{metrics.get('model_type')} from {metrics.get('source')}",
            "precision": "float32",
            "threads": None,
            "minutes": None,
            "cut_by_time": None,
        }
    speed = metrics.get("speed") or {}
    return {
        "kind": "training",
        "steps": metrics.get("steps"),
        "budget": metrics.get("budget"),
        "precision": metrics.get("precision"),
        "threads": metrics.get("threads"),
        "attention": speed.get("attention"),
        "precision_reason": (speed.get("reasons") or {}).get("bf16"),
        "minutes": metrics.get("train_minutes"),
        "cut_by_time": metrics.get("cut_by_time") or None,
    }


# What each model was made from: a time cap that cut one of them cuts all that follow.
LINEAGE = {
    "teacher": ("teacher",),
    "student": ("teacher", "student"),
    "student_ref": ("student_ref",),
    "pruned": ("teacher", "student", "pruned"),
}


def mark_cut_rows(rows: list[dict], training: dict) -> None:
    final = next((m for m in ("pruned", "student", "teacher") if m in training), None)
    for row in rows:
        model = row["variant"] if row["variant"] in LINEAGE else final
        cuts = [
            f"{m} {training[m]['cut_by_time']}"
            for m in LINEAGE.get(model, ())
            if m in training and training[m]["cut_by_time"]
        ]
        row["training_cut"] = "; ".join(cuts) or None


def report_row(row: BenchmarkRow, evaluations: dict[str, EvaluateOutput]) -> ReportRow:
    """A benchmark row with its quality figures (its variant's evaluation) and the keys report.json promises."""
    out = {
        "name": row.name,
        "variant": row.variant,
        "runtime": row.runtime,
        "device": row.device,
        "compute_type": row.compute_type,
        "threads": row.threads,
        "params": row.params,
        "heads": row.heads,
        "bytes": row.bytes,
        "latency_ms": row.latency_ms,
        "throughput": row.throughput,
        "peak_rss_mb": row.peak_rss_mb,
        "gpu_mem_mb": row.gpu_mem_mb,
        "breakdown": row.breakdown,
        "skipped": row.skipped,
        "note": row.note,
        "source": row.source,
        "artifact": row.artifact,
        "paired": row.paired,
        "versus": row.versus,
        "cores": row.cores,
    }
    out.update(bleu=None, chrf=None, bleu_greedy=None, chrf_greedy=None, bleu_beam=None, bleu_source=None)
    if row.latency_ms:
        out["latency_ms"] = {k: row.latency_ms[k] for k in ("greedy_b1", "beam4_b1")}
    if row.throughput:
        out["throughput"] = {k: row.throughput.get(k) for k in ("sent_per_s", "tok_per_s", "batch", "beam")}
    base = row.name.removesuffix("_cuda")
    if row.scores:  # CTranslate2: scored by the benchmark on the whole test set
        beam4, greedy = row.scores.get("beam4", {}), row.scores.get("beam1", {})
        out.update(
            bleu=beam4.get("bleu"),
            chrf=beam4.get("chrf"),
            bleu_greedy=greedy.get("bleu"),
            chrf_greedy=greedy.get("chrf"),
            bleu_beam=4,
            bleu_source=f"scored by the benchmark with this runtime: {beam4.get('sentences')} sentences, "
            "beam 4 and greedy",
        )
    elif base in evaluations:
        ev = evaluations[base]
        out.update(
            bleu=ev.bleu,
            chrf=ev.chrf,
            bleu_greedy=ev.bleu_greedy,
            chrf_greedy=ev.chrf_greedy,
            bleu_beam=ev.beam,
            bleu_source=f"evaluate.{base}: {ev.test_set}, beam {ev.beam}"
            + (" (run on the CPU; same weights)" if base != row.name else ""),
        )
        if ev.alone_identical and base == row.name:
            out["alone_identical"] = ev.alone_identical
    if row.parity:
        p = row.parity
        out["parity"] = f"greedy outputs identical to our PyTorch model on {p['identical']}/{p['sentences']} sentences"
    return out


def teacher_row(rows: list[dict]) -> dict | None:
    return next((r for r in rows if r["name"] == TEACHER and not r["skipped"]), None)


def ratio(a, b):
    return round(a / b, 3) if a is not None and b not in (None, 0) else None


def add_ratios(rows: list[dict]) -> None:
    """vs_teacher: speedups (teacher time / row time: batch-1 sentences per second, from the mean
    latency), throughput and size ratios (row / teacher), BLEU differences (row - teacher)."""
    t = teacher_row(rows)
    for row in rows:
        if t is None:
            row["vs_teacher"] = None
            continue
        lat, tlat = row.get("latency_ms") or {}, t["latency_ms"]
        tp, ttp = row.get("throughput") or {}, t["throughput"]
        row["vs_teacher"] = {
            "greedy_b1_speedup": ratio(tlat["greedy_b1"]["mean"], (lat.get("greedy_b1") or {}).get("mean")),
            "beam4_b1_speedup": ratio(tlat["beam4_b1"]["mean"], (lat.get("beam4_b1") or {}).get("mean")),
            "throughput_ratio": ratio(tp.get("sent_per_s"), ttp["sent_per_s"]),
            "bytes_ratio": ratio(row.get("bytes"), t.get("bytes")),
            "bleu_delta": None if row["bleu"] is None or t["bleu"] is None else round(row["bleu"] - t["bleu"], 2),
            "bleu_greedy_delta": None
            if row["bleu_greedy"] is None or t["bleu_greedy"] is None
            else round(row["bleu_greedy"] - t["bleu_greedy"], 2),
        }


def scoring(evaluations: dict[str, EvaluateOutput]) -> dict:
    """How every BLEU and chrF in the report was computed: sacrebleu's signatures, as the
    evaluate artifacts recorded them (one of each unless something scored differently)."""

    def one_or_all(key: str):
        found = sorted({getattr(e, key) for e in evaluations.values() if getattr(e, key)})
        return found[0] if len(found) == 1 else found or None

    return {
        "bleu_signature": one_or_all("bleu_signature"),
        "chrf_signature": one_or_all("chrf_signature"),
        "test_set": one_or_all("test_set"),
    }
