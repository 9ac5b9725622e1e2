"""Report stage: BLEU against latency, as report.md, report.json and bleu_vs_latency.png.

One row per benchmark row (variant x runtime x device), joined with the BLEU / chrF of its
evaluate artifact (the CTranslate2 rows bring their own: the benchmark scored them), with ratios
against the teacher in PyTorch on the CPU, the Pareto front marked, and recommendation lines.

report.json is an interface others script against; its keys are documented in
pipeline/report/rows.py and only ever added to. Its "run" is null here: an artifact is shared by
every run that reuses it, so the stage cannot know a run id; `pipeline report` fills it in when
showing the file (the latest run whose log lists this report artifact).
"""

from __future__ import annotations

import json

from ...engine.context import StageContext
from ...engine.errors import StageFailed
from ...measure.evaluation import EvaluateOutput
from ...measure.rows import BenchmarkOutput, BenchmarkRow, RowError
from ...report.hypotheses import hypotheses_reader
from ...report.markdown import markdown
from ...report.pareto import mark_pareto, recommend
from ...report.rows import missing_keys
from ...report.steps import bleu_uncertainty
from ...report.table import TEACHER, add_ratios, mark_cut_rows, report_row, scoring, training_summary
from ...report.targets import targets
from . import ReportInputs, ReportNode


def run(ctx: StageContext) -> dict:
    inputs: ReportInputs = ctx.inputs
    bench = BenchmarkOutput.of(inputs.benchmark.metrics, inputs.benchmark.id)
    evaluations = {name: EvaluateOutput.of(art.metrics, art.id) for name, art in inputs.evaluate.items()}
    try:
        bench_rows = [BenchmarkRow.from_json(row) for row in bench.results]
    except RowError as exc:
        raise StageFailed(f"{inputs.benchmark.id}: {exc}") from None
    rows = [report_row(row, evaluations) for row in bench_rows]
    if not rows:
        raise StageFailed("the benchmark artifact has no rows to report")
    training = {name: training_summary(art.metrics) for name, art in inputs.trained.items()}
    mark_cut_rows(rows, training)
    add_ratios(rows)
    steps = bleu_uncertainty(
        rows, hypotheses_reader(inputs.data, inputs.benchmark, inputs.evaluate, inputs.benchmark.metrics)
    )
    mark_pareto(rows)
    cfg: ReportNode = ctx.settings
    max_loss = cfg.max_bleu_loss
    recommendations = {mode: recommend(rows, mode, max_loss) for mode in ("greedy", "beam4")}
    if any(r["device"] == "cuda" and not r["skipped"] for r in rows):
        recommendations.update(
            {f"{mode}_cuda": recommend(rows, mode, max_loss, "cuda") for mode in ("greedy", "beam4")}
        )
    report = {
        "recipe": cfg.recipe,
        "run": None,
        "run_note": "null in the artifact (shared by every run that reuses it); `pipeline report` fills in "
        "the latest run whose log lists this report artifact",
        "machine": bench.machine,
        "training": training,
        "benchmark": {
            k: getattr(bench, k) for k in ("test_set", "sentences", "threads", "batch_size", "throughput_beam")
        },
        "teacher": TEACHER,
        "rows": rows,
        "recommendation": recommendations["greedy"],
        "recommendations": recommendations,
        "targets": targets(rows, cfg.targets),
        "steps": steps,
        "scoring": scoring(evaluations),
    }
    check_schema(report)
    (ctx.out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    from ...report.plotting import plot_bleu_vs_latency  # matplotlib only when a report is made

    plot_bleu_vs_latency(rows, ctx.out / "bleu_vs_latency.png", title=f"{report['recipe']}: BLEU against latency")
    (ctx.out / "report.md").write_text(markdown(report), encoding="utf-8")
    ctx.log(report["recommendation"])
    return {
        "rows": len(rows),
        "measured": sum(1 for r in rows if not r["skipped"]),
        "recommendation": report["recommendation"],
        "targets": report["targets"],
    }


def check_schema(report: dict) -> None:
    missing = missing_keys(report)
    if missing:
        raise StageFailed(f"report.json would lack promised keys: {', '.join(missing[:5])}")
