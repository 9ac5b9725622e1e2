"""The report's library on rows built in the test: the Pareto front, the targets and their
verdicts, what each step of the chain cost in BLEU with its interval, the plot's labels, and
benchmark rows read back typed (pipeline/report/, pipeline/measure/rows.py)."""

from __future__ import annotations

import json
import random

import pytest

from pipeline.measure.evaluation import EvaluateOutput
from pipeline.measure.rows import BenchmarkRow, RowError
from pipeline.measure.scoring import bleu_only, paired_bootstrap
from pipeline.report.markdown import markdown, step_lines
from pipeline.report.pareto import pareto_front
from pipeline.report.steps import bleu_uncertainty
from pipeline.report.table import report_row
from pipeline.report.targets import targets
from pipeline.stages.report import ReportTargets


def test_pareto_front():
    # (latency ms, BLEU): faster-and-better wins; ties in both are both kept.
    pts = [(10, 30.0), (5, 29.0), (20, 29.5), (5, 28.0), (50, 31.0), (10, 30.0)]
    assert pareto_front(pts) == [True, True, False, False, True, True]
    assert pareto_front([]) == [] and pareto_front([(1, 0.0)]) == [True]


def test_the_peer_goal_is_judged_on_paired_rounds_when_there_are_some():
    """Rows measured minutes apart drift on a shared VM; paired rounds do not, so they decide."""

    def row(name, runtime, compute, greedy, beam, paired=None):
        return {
            "name": name,
            "variant": "pruned",
            "runtime": runtime,
            "compute_type": compute,
            "device": "cpu",
            "skipped": None,
            "source": "pruned",
            "paired": paired,
            "latency_ms": {"greedy_b1": {"p50": greedy}, "beam4_b1": {"p50": beam}},
        }

    peer = row("ctranslate2_pruned_int8", "ctranslate2", "int8", 2.4, 4.1)
    paired = {
        "peer": peer["name"],
        "greedy_b1_p50_ratio": 1.08,
        "beam4_b1_p50_ratio": 1.27,
        "threads": [2, 1],
        "rounds": [{}, {}, {}],
    }
    ours = row("int8_dynamic", "onnxruntime", "int8", 1.96, 4.06, paired)
    vs = targets([ours, peer], ReportTargets())["int8_dynamic"]["vs_ctranslate2_int8"]
    assert vs["greedy_b1_p50_ratio"] == 0.817 and vs["beam4_b1_p50_ratio"] == 0.99  # the rows alone would pass
    assert vs["verdict"] == {"basis": "paired", "greedy_b1_p50_ratio": 1.08, "beam4_b1_p50_ratio": 1.27, "met": False}
    md = markdown(
        {
            "recipe": "r",
            "machine": {},
            "rows": [],
            "recommendation": "-",
            "recommendations": {},
            "benchmark": {"sentences": 4, "test_set": "t", "batch_size": 2, "throughput_beam": 4, "threads": [1]},
            "targets": targets([ours, peer], ReportTargets(speedup=4, bytes_ratio=0.25)),
        }
    )
    assert "1.08 greedy, 1.27 beam 4 in 3 paired rounds" in md and "goal <= 1.0: not met" in md
    assert "(target >= 4)" in md and "(target >= -1)" in md and "(target <= 0.25)" in md  # the recipe's targets

    alone = row("int8_dynamic", "onnxruntime", "int8", 1.96, 4.06)
    vs = targets([alone, peer], ReportTargets())["int8_dynamic"]["vs_ctranslate2_int8"]
    assert vs["verdict"] == {"basis": "rows", "greedy_b1_p50_ratio": 0.817, "beam4_b1_p50_ratio": 0.99, "met": True}


def test_plot_labels_of_clustered_points_stay_in_the_axes_and_do_not_overlap():
    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    from pipeline.report.plotting import _label_points

    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    # Four variants within 2-3.5 ms and 0.3 BLEU of each other, as int8 / fp32 / CTranslate2 rows are.
    points = [
        (2.1, 53.0, "int8_dynamic/onnxruntime/int8"),
        (2.15, 52.85, "pruned/ctranslate2/int8"),
        (2.5, 52.78, "pruned/onnxruntime/float32"),
        (2.55, 52.77, "pruned/ctranslate2/float32"),
        (3.4, 52.9, "int8_static/onnxruntime/int8"),
        (48.0, 55.6, "teacher/torch/float32"),
    ]
    ax.scatter([p[0] for p in points], [p[1] for p in points])
    ax.set_xscale("log")
    ax.margins(x=0.2, y=0.12)
    fig.canvas.draw()
    labels = _label_points(fig, ax, points)
    renderer = fig.canvas.get_renderer()
    boxes = [Text.get_window_extent(label, renderer) for label in labels]
    assert [label.get_text() for label in labels] == [p[2] for p in points]
    frame = ax.get_window_extent(renderer)
    for box in boxes:  # the leftmost and the topmost label too: none over the axis labels
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1, (box, frame)
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b), (a, b)
    plt.close(fig)


# ------------------------------------------------------------------------------ BLEU uncertainty
def _corrupted(references: list[str], share: float, seed: int) -> list[str]:
    """Each word replaced by a wrong one with probability `share`."""
    rng = random.Random(seed)
    return [
        " ".join(w if rng.random() >= share else f"x{rng.randrange(99)}" for w in ref.split()) for ref in references
    ]


def _references(n: int = 300) -> list[str]:
    rng = random.Random(0)
    words = [f"w{i}" for i in range(400)]
    return [" ".join(rng.choice(words) for _ in range(rng.randrange(6, 16))) for _ in range(n)]


def test_paired_bootstrap_tells_a_real_difference_from_none():
    refs = _references()
    better, worse = _corrupted(refs, 0.1, 1), _corrupted(refs, 0.3, 2)
    result = paired_bootstrap(better, worse, refs)
    assert result["delta"] == pytest.approx(bleu_only(better, refs) - bleu_only(worse, refs), abs=0.011)
    low, high = result["ci95"]
    assert 0 < low < result["delta"] < high and result["p_value"] < 0.01
    assert paired_bootstrap(better, worse, refs) == result  # seeded: the same figures every time
    # Two systems of the same quality (different errors): the interval spans 0, no small p.
    same = paired_bootstrap(_corrupted(refs, 0.2, 3), _corrupted(refs, 0.2, 4), refs)
    assert same["ci95"][0] < 0 < same["ci95"][1] and same["p_value"] > 0.05
    identical = paired_bootstrap(better, better, refs)
    assert identical["delta"] == 0 and identical["ci95"] == [0, 0] and identical["p_value"] == 1.0
    with pytest.raises(ValueError, match="hypotheses for"):
        paired_bootstrap(better[:-1], worse, refs)


def _row(name, variant, runtime, compute_type, source, device="cpu", skipped=None, ms=10.0):
    return {
        "name": name,
        "variant": variant,
        "runtime": runtime,
        "device": device,
        "compute_type": compute_type,
        "source": source,
        "skipped": skipped,
        "bleu_beam": 4,
        "bleu_greedy": 1.0,
        "bytes": 1000,
        "params": 100,
        "latency_ms": {"greedy_b1": {"mean": ms}, "beam4_b1": {"mean": 2 * ms}},
        "vs_teacher": {},
    }


@pytest.mark.slow
def test_each_step_gets_its_bleu_difference_with_an_interval():
    refs = _references()
    share = {
        "teacher": 0.10,
        "student": 0.14,
        "student_ref": 0.2,
        "pruned": 0.16,
        "pruned_onnx": 0.16,
        "int8_dynamic": 0.17,
    }
    hyps = {
        (name, beam): _corrupted(refs, s + (0.03 if beam == 1 else 0), seed=10 * i + beam)
        for i, (name, s) in enumerate(share.items())
        for beam in (1, 4)
    }
    hyps[("pruned_onnx", 4)] = hyps[("pruned", 4)]  # an export that changes nothing
    hyps[("ctranslate2_pruned_int8", 4)] = hyps[("int8_dynamic", 4)]
    hyps[("ctranslate2_pruned_int8", 1)] = _corrupted(refs, 0.2, 99)
    rows = [
        _row("teacher", "teacher", "torch", "float32", "teacher", ms=40),
        _row("teacher_cuda", "teacher", "torch", "float32", "teacher", device="cuda", skipped="no CUDA"),
        _row("student", "student", "torch", "float32", "student"),
        _row("student_ref", "student_ref", "torch", "float32", "student_ref"),
        _row("pruned", "pruned", "torch", "float32", "pruned"),
        _row("pruned_onnx", "pruned", "onnxruntime", "float32", "pruned", ms=2),
        _row("int8_dynamic", "int8_dynamic", "onnxruntime", "int8", "pruned", ms=1.6),
        _row("ctranslate2_pruned_int8", "pruned", "ctranslate2", "int8", "pruned", ms=1.5),
        _row("ctranslate2_pruned_float32", "pruned", "ctranslate2", "float32", "pruned", ms=1.5),
    ]
    read = lambda name, beam: (hyps[(name, beam)], refs) if (name, beam) in hyps else None  # noqa: E731
    steps = bleu_uncertainty(rows, read)
    assert [(s["step"], s["from"], s["to"]) for s in steps] == [
        ("distillation", "teacher", "student"),
        ("distillation vs references only", "student_ref", "student"),
        ("head pruning", "student", "pruned"),
        ("ONNX export", "pruned", "pruned_onnx"),
        ("int8 dynamic", "pruned_onnx", "int8_dynamic"),
        ("CTranslate2 instead of onnxruntime (int8)", "int8_dynamic", "ctranslate2_pruned_int8"),
        ("CTranslate2 instead of onnxruntime (float32)", "pruned_onnx", "ctranslate2_pruned_float32"),
    ]
    for s in steps[:-1]:
        for key, beam in (("bleu", 4), ("bleu_greedy", 1)):
            expected = bleu_only(hyps[(s["to"], beam)], refs) - bleu_only(hyps[(s["from"], beam)], refs)
            assert s[key]["delta"] == pytest.approx(expected, abs=0.011)
            assert s[key]["ci95"][0] <= s[key]["delta"] <= s[key]["ci95"][1]
    assert steps[3]["bleu"]["ci95"] == [0, 0] and steps[3]["greedy_b1_speedup"] == 5.0
    assert steps[0]["bleu"]["delta"] < 0 < steps[1]["bleu"]["delta"]
    by_name = {r["name"]: r for r in rows}
    student = by_name["student"]
    assert student["greedy_vs_beam"]["delta"] == pytest.approx(
        bleu_only(hyps[("student", 1)], refs) - bleu_only(hyps[("student", 4)], refs), abs=0.011
    )
    assert student["vs_teacher"]["bleu_delta_ci95"] == steps[0]["bleu"]["ci95"]
    assert steps[5]["bleu"]["ci95"] == [0, 0] and steps[5]["greedy_b1_speedup"] == pytest.approx(1.6 / 1.5, abs=1e-3)
    assert by_name["ctranslate2_pruned_int8"]["greedy_vs_beam"]["delta"] < 0
    # A row without hypotheses (and a skipped one) gets no interval rather than a failure.
    assert steps[6]["bleu"] is None and by_name["ctranslate2_pruned_float32"]["greedy_vs_beam"] is None
    assert by_name["teacher_cuda"]["greedy_vs_beam"] is None
    md = "\n".join(step_lines(steps, rows))
    assert (
        "| head pruning | student → pruned |" in md and "student " + "%+.2f" % student["greedy_vs_beam"]["delta"] in md
    )


def test_the_verdict_needs_best_against_best_both_ways():
    """Met only when ours is at least as fast at every point, each side at its best thread count,
    taking turns and alone; not measured alone (or a point missing) is no verdict, not a pass."""
    from pipeline.measure.versus import best_vs_best, versus_point
    from pipeline.report.targets import versus_summary

    def together(ours, theirs):
        return {
            "sentences": 8,
            "points": [
                {**versus_point(b, 1, o, t, 8, [o / t] * 3), "median_sent_per_s": {"ours": o, "ctranslate2": t}}
                for b, o, t in zip((1, 32), ours, theirs)
            ],
        }

    def alone(speeds):
        return {"sentences": 8, "points": [{"batch": b, "beam": 1, "sent_per_s": x} for b, x in zip((1, 32), speeds)]}

    one_process = {"1": together((100, 300), (90, 280)), "2": together((120, 200), (20, 60))}
    best = best_vs_best(one_process)
    # Greedy batch 1: ours fastest at 2 threads, CTranslate2 at 1; batch 32: both at 1, the same process's point.
    assert [(p["ours_threads"], p["ctranslate2_threads"], p["same_process"]) for p in best["interleaved"]] == [
        (2, 1, False),
        (1, 1, True),
    ]
    assert (
        best["interleaved"][0]["ratio"] == pytest.approx(120 / 90, abs=1e-3)
        and "[rounds" not in best["interleaved"][0]["verdict"]
        and best["interleaved"][1]["round_ratios"] == [round(300 / 280, 3)] * 3
    )
    assert best["separate"] == []
    versus = {"peer": "ct2", "by_threads": one_process, "best": best}
    assert versus_summary(versus)["met"] is None  # nothing alone: not measured
    separate = {
        "1": {"ours": alone((95, 290)), "ctranslate2": alone((90, 300))},
        "2": {"ours": alone((118, 210)), "ctranslate2": alone((18, 50))},
    }
    versus["best"] = best_vs_best(one_process, separate)
    assert [(p["ours_threads"], p["ctranslate2_threads"], p["ratio"]) for p in versus["best"]["separate"]] == [
        (2, 1, round(118 / 90, 3)),
        (1, 1, round(290 / 300, 3)),
    ]
    summary = versus_summary(versus)
    assert (summary["best_interleaved"]["met"], summary["best_separate"]["met"], summary["met"]) == (True, False, False)
    separate["1"]["ours"] = alone((95, 310))
    versus["best"] = best_vs_best(one_process, separate)
    assert versus_summary(versus)["met"] is True
    versus["best"]["separate"] = versus["best"]["separate"][:1]  # a point not measured alone
    assert versus_summary(versus)["met"] is None


def test_the_report_reads_benchmark_rows_typed_and_a_renamed_key_is_an_error_naming_it():
    measured = {
        "threads": 1,
        "latency_ms": {k: {"p50": 2.0, "p90": 3.0, "p99": 4.0, "mean": 2.5} for k in ("greedy_b1", "beam4_b1")},
        "throughput": {"sent_per_s": 9.0, "tok_per_s": 90.0, "batch": 4, "beam": 4, "sentences": 8},
    }
    row = BenchmarkRow("pruned_onnx", "pruned", "onnxruntime", "cpu", "float32", source="pruned", **measured)
    data = json.loads(json.dumps(row.to_json()))  # as benchmark.json holds it
    assert "folder" not in data and "paired" not in data and list(data)[:3] == ["name", "variant", "runtime"]
    typed = BenchmarkRow.from_json(data)
    assert typed == row
    evaluation = {"bleu": 30.0, "chrf": 50.0, "bleu_greedy": 29.0, "beam": 4, "test_set": "t"}
    signatures = {"bleu_signature": "b", "chrf_signature": "c", "results": {}, "model_artifact": "export-1"}
    head = {"variant": "pruned", "runtime": "onnxruntime", "device": "cpu", "search": "graph", **signatures}
    out = report_row(typed, {"pruned_onnx": EvaluateOutput.of({**head, **evaluation})})
    assert out["bleu"] == 30.0 and out["bleu_beam"] == 4 and out["latency_ms"]["greedy_b1"]["p50"] == 2.0
    assert out["throughput"] == {"sent_per_s": 9.0, "tok_per_s": 90.0, "batch": 4, "beam": 4}

    renamed = {("latency" if k == "latency_ms" else k): v for k, v in data.items()}  # a key renamed on one side
    with pytest.raises(RowError, match="benchmark row 'pruned_onnx' lacks key 'latency_ms'"):
        BenchmarkRow.from_json(renamed)
    with pytest.raises(RowError, match="benchmark row 'pruned_onnx' holds undeclared key 'latency'"):
        BenchmarkRow.from_json({**data, "latency": 1})
    with pytest.raises(RowError, match="holds undeclared key 'folder'"):  # a store path is never written
        BenchmarkRow.from_json({**data, "folder": "/x"})


def test_the_report_says_when_the_host_slowed_between_measurements():
    """The benchmark probes the host between its measurements; a slowest probe under 0.9 of the
    fastest is called out, naming where it fell, and a steady host is said to be steady."""
    from pipeline.measure.host_speed import HostSpeed, probe

    speeds = iter([(20.0, 15.0), (19.5, 14.8), (9.0, 14.0), (19.8, 15.0)])
    host = HostSpeed(measure=lambda: dict(zip(("python", "memory"), next(speeds))))
    for point in ("the start", "teacher at 1 thread", "int8_static at 1 thread", "the end"):
        host.after(point)
    summary = host.summary()
    assert summary["python"] == {"lowest_share": 0.45, "lowest_after": "int8_static at 1 thread", "median": 19.65}
    assert summary["memory"]["lowest_share"] == 0.933 and summary["steady"] is False
    page = markdown(
        {
            "recipe": "r",
            "machine": {"host_speed": summary},
            "rows": [],
            "recommendation": "-",
            "recommendations": {},
            "benchmark": {"sentences": 4, "test_set": "t", "batch_size": 2, "throughput_beam": 4, "threads": [1]},
            "targets": {},
        }
    )
    assert "the slowest at 0.45 and 0.93 of the fastest (after int8_static at 1 thread; after" in page
    assert "**not steady**" in page
    steady = HostSpeed()  # the real probe: both figures, each time
    steady.after("a")
    steady.after("b")
    assert steady.summary()["probes"] == 2 and set(probe()) == {"python", "memory"}
