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
import math

from ...engine.context import StageContext
from ...engine.errors import StageFailed
from ...engine.store import training_cut
from ...measure.scoring import paired_bootstrap
from ...report.hypotheses import hypotheses_reader
from ...report.rows import ReportRow, missing_keys, versus_lines
from . import ReportInputs, ReportNode, ReportTargets

TEACHER = "teacher"  # the row every ratio is taken against: the teacher in PyTorch on the CPU


def run(ctx: StageContext) -> dict:
    inputs: ReportInputs = ctx.inputs
    bench = inputs.benchmark.metrics
    evaluations = {name: art.metrics for name, art in inputs.evaluate.items()}
    rows = [report_row(row, evaluations) for row in bench.get("results", [])]
    if not rows:
        raise StageFailed("the benchmark artifact has no rows to report")
    training = {name: training_summary(art.metrics) for name, art in inputs.trained.items()}
    mark_cut_rows(rows, training)
    add_ratios(rows)
    steps = bleu_uncertainty(rows, hypotheses_reader(inputs.data, inputs.benchmark, inputs.evaluate, bench))
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
        "machine": bench.get("machine"),
        "training": training,
        "benchmark": {k: bench.get(k) for k in ("test_set", "sentences", "threads", "batch_size", "throughput_beam")},
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


# ------------------------------------------------------------------------------ BLEU uncertainty
def step_pairs(rows: list[dict]) -> list[tuple[str, dict, dict]]:
    """(step, from row, to row) along the recipe's chain, CPU rows only: distillation (teacher ->
    student), what it bought over the references (student_ref -> student), pruning (student, or the
    teacher without one -> pruned), ONNX export (a model in PyTorch -> its fp32 package), and each
    int8 variant (fp32 package -> int8 package of the same weights), and the peer (our package ->
    CTranslate2 on the same weights and compute type)."""
    measured = {r["name"]: r for r in rows if not r["skipped"] and r["device"] == "cpu"}
    pairs = [
        ("distillation", "teacher", "student"),
        ("distillation vs references only", "student_ref", "student"),
        ("head pruning", "student" if "student" in measured else "teacher", "pruned"),
    ]
    out = [(step, measured[a], measured[b]) for step, a, b in pairs if a in measured and b in measured]
    torch_rows = {r["source"]: r for r in measured.values() if r["runtime"] == "torch"}
    fp32_packages = {
        r["source"]: r for r in measured.values() if r["runtime"] == "onnxruntime" and r["compute_type"] == "float32"
    }
    for source, package in fp32_packages.items():
        if source in torch_rows:
            out.append(("ONNX export", torch_rows[source], package))
    for r in measured.values():
        if r["runtime"] == "onnxruntime" and r["compute_type"] == "int8" and r["source"] in fp32_packages:
            out.append((r["variant"].replace("_", " "), fp32_packages[r["source"]], r))
    for r in (r for r in measured.values() if r["runtime"] == "ctranslate2"):
        ours = next(
            (
                o
                for o in measured.values()
                if o["runtime"] == "onnxruntime"
                and o["compute_type"] == r["compute_type"]
                and o["source"] == r["source"]
            ),
            None,
        )
        if ours is not None:
            out.append((f"CTranslate2 instead of onnxruntime ({r['compute_type']})", ours, r))
    return out


def bleu_uncertainty(rows: list[dict], read) -> list[dict]:
    """What one test set can say about each BLEU difference the report shows (paired bootstrap,
    scoring.paired_bootstrap), written where the difference is: `vs_teacher` gains
    bleu_delta_ci95 / bleu_greedy_delta_ci95, each row `greedy_vs_beam` (its greedy BLEU minus its
    beam BLEU), and the returned steps say what each step of the chain cost in BLEU beside what it
    bought in speed and size. Rows without hypotheses get none."""
    done: dict[tuple, dict | None] = {}  # the student's distance from the teacher is also a step

    def compare(a: dict, b: dict, beam_a: int | None, beam_b: int | None) -> dict | None:
        if beam_a is None or beam_b is None:
            return None
        key = (a["name"], beam_a, b["name"], beam_b)
        if key not in done:
            ha, hb = read(a["name"], beam_a), read(b["name"], beam_b)
            done[key] = None if ha is None or hb is None or ha[1] != hb[1] else paired_bootstrap(ha[0], hb[0], ha[1])
        return done[key]

    teacher = _teacher(rows)
    for row in rows:
        row["greedy_vs_beam"] = None
        if row["skipped"]:
            continue
        beam = row.get("bleu_beam")
        if row.get("bleu_greedy") is not None and beam not in (None, 1):
            row["greedy_vs_beam"] = compare(row, row, 1, beam)
        if teacher is not None and row.get("vs_teacher") is not None and row is not teacher:
            t_beam = teacher.get("bleu_beam")
            row["vs_teacher"]["bleu_delta_ci95"] = _ci(compare(row, teacher, beam, t_beam if t_beam == beam else None))
            row["vs_teacher"]["bleu_greedy_delta_ci95"] = _ci(compare(row, teacher, 1, 1))
    steps = []
    for step, a, b in step_pairs(rows):
        beam = b.get("bleu_beam") if b.get("bleu_beam") == a.get("bleu_beam") else None
        la, lb = a.get("latency_ms") or {}, b.get("latency_ms") or {}
        steps.append(
            {
                "step": step,
                "from": a["name"],
                "to": b["name"],
                "beam": beam,
                "bleu": compare(b, a, beam, beam),
                "bleu_greedy": compare(b, a, 1, 1),
                "greedy_b1_speedup": _ratio(
                    (la.get("greedy_b1") or {}).get("mean"), (lb.get("greedy_b1") or {}).get("mean")
                ),
                "beam4_b1_speedup": _ratio(
                    (la.get("beam4_b1") or {}).get("mean"), (lb.get("beam4_b1") or {}).get("mean")
                ),
                "bytes_ratio": _ratio(b.get("bytes"), a.get("bytes")),
                "params_ratio": _ratio(b.get("params"), a.get("params")),
            }
        )
    return steps


def _ci(result: dict | None) -> list[float] | None:
    return None if result is None else result["ci95"]


# ------------------------------------------------------------------------------ rows
def training_summary(metrics: dict) -> dict:
    """How a model artifact was trained, as this machine ran it: steps against the budget, the
    precision and threads its probe chose, minutes, and a time cap's cut if there was one."""
    if isinstance(metrics.get("steps"), list):  # pruning: its fine-tunes
        tunes = [s["finetune"] for s in metrics["steps"] if s.get("finetune")]
        return {
            "kind": "pruning fine-tune",
            "steps": sum(t["steps"] for t in tunes),
            "budget": ", ".join(t.get("budget") or "?" for t in tunes),
            "precision": ", ".join(sorted({t.get("precision") or "?" for t in tunes})),
            "minutes": round(sum(t.get("train_minutes") or 0 for t in tunes), 2),
            "cut_by_time": training_cut(metrics),
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
        "cut_by_time": training_cut(metrics),
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


def report_row(row: dict, evaluations: dict) -> ReportRow:
    """A benchmark row with its quality figures and the keys report.json promises."""
    out = {
        k: row.get(k)
        for k in (
            "name",
            "variant",
            "runtime",
            "device",
            "compute_type",
            "threads",
            "params",
            "heads",
            "bytes",
            "latency_ms",
            "throughput",
            "peak_rss_mb",
            "gpu_mem_mb",
            "breakdown",
            "skipped",
            "note",
            "source",
            "artifact",
            "paired",
            "versus",
        )
    }
    out.update(bleu=None, chrf=None, bleu_greedy=None, chrf_greedy=None, bleu_beam=None, bleu_source=None)
    if row.get("latency_ms"):
        out["latency_ms"] = {k: row["latency_ms"][k] for k in ("greedy_b1", "beam4_b1")}
    if row.get("throughput"):
        out["throughput"] = {k: row["throughput"].get(k) for k in ("sent_per_s", "tok_per_s", "batch", "beam")}
    scores = row.get("scores")
    base = row["name"].removesuffix("_cuda")
    if scores:  # CTranslate2: scored by the benchmark on the whole test set
        beam4, greedy = scores.get("beam4", {}), scores.get("beam1", {})
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
            bleu=ev.get("bleu"),
            chrf=ev.get("chrf"),
            bleu_greedy=ev.get("bleu_greedy"),
            chrf_greedy=ev.get("chrf_greedy"),
            bleu_beam=ev.get("beam"),
            bleu_source=f"evaluate.{base}: {ev.get('test_set')}, beam {ev.get('beam')}"
            + (" (run on the CPU; same weights)" if base != row["name"] else ""),
        )
        if ev.get("alone_identical") and base == row["name"]:
            out["alone_identical"] = ev["alone_identical"]
    if row.get("parity"):
        p = row["parity"]
        out["parity"] = f"greedy outputs identical to our PyTorch model on {p['identical']}/{p['sentences']} sentences"
    return out


def _teacher(rows: list[dict]) -> dict | None:
    return next((r for r in rows if r["name"] == TEACHER and not r["skipped"]), None)


def _ratio(a, b):
    return round(a / b, 3) if a is not None and b not in (None, 0) else None


def add_ratios(rows: list[dict]) -> None:
    """vs_teacher: speedups (teacher time / row time: batch-1 sentences per second, from the mean
    latency), throughput and size ratios (row / teacher), BLEU differences (row - teacher)."""
    t = _teacher(rows)
    for row in rows:
        if t is None:
            row["vs_teacher"] = None
            continue
        lat, tlat = row.get("latency_ms") or {}, t["latency_ms"]
        tp, ttp = row.get("throughput") or {}, t["throughput"]
        row["vs_teacher"] = {
            "greedy_b1_speedup": _ratio(tlat["greedy_b1"]["mean"], (lat.get("greedy_b1") or {}).get("mean")),
            "beam4_b1_speedup": _ratio(tlat["beam4_b1"]["mean"], (lat.get("beam4_b1") or {}).get("mean")),
            "throughput_ratio": _ratio(tp.get("sent_per_s"), ttp["sent_per_s"]),
            "bytes_ratio": _ratio(row.get("bytes"), t.get("bytes")),
            "bleu_delta": None if row["bleu"] is None or t["bleu"] is None else round(row["bleu"] - t["bleu"], 2),
            "bleu_greedy_delta": None
            if row["bleu_greedy"] is None or t["bleu_greedy"] is None
            else round(row["bleu_greedy"] - t["bleu_greedy"], 2),
        }


def points(rows: list[dict], mode: str) -> list[tuple[int, float, float]]:
    """(row index, latency p50 ms, BLEU) of measured rows with a BLEU. Greedy latency pairs with
    greedy BLEU, beam-4 latency with the main BLEU (the evaluate stage's beam)."""
    key, bleu_key = ("greedy_b1", "bleu_greedy") if mode == "greedy" else ("beam4_b1", "bleu")
    out = []
    for i, r in enumerate(rows):
        bleu = r.get(bleu_key)
        if r["skipped"] or not r.get("latency_ms") or bleu is None:
            continue
        out.append((i, r["latency_ms"][key]["p50"], bleu))
    return out


def pareto_front(pts: list[tuple[float, float]]) -> list[bool]:
    """For (latency, bleu) points: True where no other point is at least as fast and at least
    as good, and strictly better in one of the two."""
    flags = []
    for i, (x, y) in enumerate(pts):
        dominated = any(x2 <= x and y2 >= y and (x2 < x or y2 > y) for j, (x2, y2) in enumerate(pts) if j != i)
        flags.append(not dominated)
    return flags


def mark_pareto(rows: list[dict]) -> None:
    """`pareto` (greedy latency vs greedy BLEU) and `pareto_beam4`, within each device: a GPU row
    does not push CPU rows off the front, since a user picks a device first."""
    for row in rows:
        row["pareto"], row["pareto_beam4"] = False, False
    for mode, flag in (("greedy", "pareto"), ("beam4", "pareto_beam4")):
        pts = points(rows, mode)
        for device in {rows[i]["device"] for i, _, _ in pts}:
            mine = [(i, x, y) for i, x, y in pts if rows[i]["device"] == device]
            for (i, _, _), on in zip(mine, pareto_front([(x, y) for _, x, y in mine])):
                rows[i][flag] = on


def label(row: dict) -> str:
    extra = "" if row["device"] == "cpu" else f", {row['device']}"
    return f"{row['variant']} ({row['runtime']} {row['compute_type']}{extra})"


def recommend(rows: list[dict], mode: str, max_loss: float, device: str = "cpu") -> str:
    """The fastest row on `device` whose BLEU is within `max_loss` of the teacher's (same decoding).
    Speed and size are compared with the teacher in PyTorch on the CPU."""
    t = _teacher(rows)
    bleu_key, lat_key = ("bleu_greedy", "greedy_b1") if mode == "greedy" else ("bleu", "beam4_b1")
    what = f"batch-1 {'greedy' if mode == 'greedy' else 'beam 4'}, {device.upper()}"
    if t is None or t.get(bleu_key) is None:
        return f"no recommendation ({what}): the teacher has no measured row with a BLEU to compare against"
    ok = [
        r
        for r in rows
        if not r["skipped"]
        and r["device"] == device
        and r.get(bleu_key) is not None
        and r.get("latency_ms")
        and r[bleu_key] >= t[bleu_key] - max_loss
    ]
    if not ok:
        return f"no recommendation ({what}): no measured row within {max_loss:g} BLEU of the teacher"
    best = min(ok, key=lambda r: r["latency_ms"][lat_key]["p50"])
    speed = _ratio(t["latency_ms"][lat_key]["mean"], best["latency_ms"][lat_key]["mean"])
    size = _ratio(best.get("bytes"), t.get("bytes"))
    return (
        f"fastest variant within {max_loss:g} BLEU of the teacher ({what}): {label(best)}, "
        f"{best['threads']} thread(s): p50 {best['latency_ms'][lat_key]['p50']:.1f} ms, "
        f"{speed:.2f}x the teacher's sentences/s, BLEU {best[bleu_key]:.2f} vs {t[bleu_key]:.2f}"
        + (f", {size:.3f} of its bytes" if size is not None else "")
    )


def scoring(evaluations: dict) -> dict:
    """How every BLEU and chrF in the report was computed: sacrebleu's signatures, as the
    evaluate artifacts recorded them (one of each unless something scored differently)."""

    def one_or_all(key: str):
        found = sorted({e[key] for e in evaluations.values() if e.get(key)})
        return found[0] if len(found) == 1 else found or None

    return {
        "bleu_signature": one_or_all("bleu_signature"),
        "chrf_signature": one_or_all("chrf_signature"),
        "test_set": one_or_all("test_set"),
    }


def targets(rows: list[dict], goals: ReportTargets = ReportTargets()) -> dict:
    """The recipe's targets, measured: int8 (pruned) student in onnxruntime vs the teacher in
    PyTorch, and vs CTranslate2 int8 at batch 1 (ours / theirs, lower is better for us)."""
    out = {}
    t = _teacher(rows)
    peer = next(
        (
            r
            for r in rows
            if r["runtime"] == "ctranslate2"
            and r["compute_type"] == "int8"
            and r["device"] == "cpu"
            and not r["skipped"]
            and r.get("source") != "teacher"
        ),
        None,
    )
    for r in rows:
        if r["runtime"] != "onnxruntime" or r["compute_type"] != "int8" or r["skipped"]:
            continue
        vs = r.get("vs_teacher") or {}
        entry = {
            "greedy_b1_speedup": vs.get("greedy_b1_speedup"),
            "speedup_target": goals.speedup,
            "bleu_delta": vs.get("bleu_delta"),
            "bleu_delta_target": goals.bleu_delta,
            "bytes_ratio": vs.get("bytes_ratio"),
            "bytes_ratio_target": goals.bytes_ratio,
        }
        if t is None:
            entry["note"] = "no teacher row to compare against"
        if peer is not None:
            ours, theirs = r["latency_ms"], peer["latency_ms"]
            entry["vs_ctranslate2_int8"] = {
                "greedy_b1_p50_ratio": _ratio(ours["greedy_b1"]["p50"], theirs["greedy_b1"]["p50"]),
                "beam4_b1_p50_ratio": _ratio(ours["beam4_b1"]["p50"], theirs["beam4_b1"]["p50"]),
                "goal": "<= 1.0 (ours no slower)",
                "peer_variant": peer["variant"],
                "same_weights": peer.get("source") == r.get("source"),
                "ours_breakdown": r.get("breakdown"),
            }
            paired = r.get("paired")
            if paired and paired["peer"] == peer["name"]:
                entry["vs_ctranslate2_int8"]["paired"] = {
                    k: paired[k] for k in ("greedy_b1_p50_ratio", "beam4_b1_p50_ratio", "threads")
                }
                entry["vs_ctranslate2_int8"]["paired"]["rounds"] = len(paired["rounds"])
            entry["vs_ctranslate2_int8"]["verdict"] = _peer_verdict(entry["vs_ctranslate2_int8"])
        if r.get("versus"):
            entry["vs_ctranslate2_one_process"] = versus_summary(r["versus"])
        out[r["name"]] = entry
    return out


def versus_summary(versus: dict) -> dict:
    """The comparison's verdict. `met`: ours at least as fast as CTranslate2 (throughput ours /
    theirs >= 1) at every point with each side at its own best thread count, both taking turns in
    one process and each alone in a process of its own (None where either was not measured, or
    left a point out, and none fell short). `points`, `ours_faster` and `lowest_ratio` count the
    one-process points at the same thread count on both sides (`same_threads_met`: all won); on a
    machine where one side is slow at some count, those flatter the other."""
    points = [{"threads": int(n), **p} for n, result in versus["by_threads"].items() for p in result.get("points", [])]
    won = sum(1 for p in points if p["met"])
    expected = len({(p["batch"], p["beam"]) for p in points})
    best = versus.get("best") or {}
    out = {
        "peer": versus["peer"],
        "points": len(points),
        "ours_faster": won,
        "same_threads_met": None if not points else won == len(points),
        "lowest_ratio": min((p["ratio"] for p in points if p["ratio"] is not None), default=None),
        "separate_rounds": (versus.get("separate") or {}).get("rounds"),
    }
    for how in ("interleaved", "separate"):
        mine = best.get(how) or []
        lowest = min((p for p in mine if p["ratio"] is not None), key=lambda p: p["ratio"], default=None)
        met = False if any(p["met"] is False for p in mine) else True if mine and len(mine) == expected else None
        out[f"best_{how}"] = {
            "points": len(mine),
            "ours_faster": sum(1 for p in mine if p["met"]),
            "met": met,
            "lowest_ratio": lowest and lowest["ratio"],
            "lowest_point": lowest and lowest["verdict"].partition(":")[0],
            "ctranslate2_threads": sorted({p["ctranslate2_threads"] for p in mine}),
            "ours_threads": sorted({p["ours_threads"] for p in mine}),
        }
    verdicts = [out["best_interleaved"]["met"], out["best_separate"]["met"]]
    out["met"] = False if False in verdicts else None if None in verdicts else True
    out["goal"] = (
        ">= 1.0 at every point, each side at its own best thread count, taking turns in one process "
        "and each alone in its own"
    )
    return out


def versus_target_line(summary: dict) -> str:
    """versus_summary in words: the best-vs-best verdicts, naming the thread counts each side was
    fastest at, then the same-thread count."""

    def said(how: str, where: str) -> str:
        best = summary[f"best_{how}"]
        if not best["points"]:
            return f"{where}: not measured"
        theirs, ours = (" or ".join(map(str, best[f"{side}_threads"])) for side in ("ctranslate2", "ours"))
        return (
            f"{where} {best['ours_faster']} of {best['points']} ours faster "
            f"(lowest {_f(best['lowest_ratio'], '{:.2f}')}x at {best['lowest_point']}; CTranslate2 fastest at "
            f"{theirs} thread{'s' if theirs != '1' else ''}, ours at {ours})"
        )

    met = {True: "met", False: "not met", None: "not measured"}[summary["met"]]
    rounds = summary.get("separate_rounds")
    return (
        f"vs {summary['peer']}, throughput at every point, each side at its own best thread count: "
        f"{said('interleaved', 'taking turns in one process')}; "
        f"{said('separate', f'each alone in its own process ({rounds} rounds)' if rounds else 'each alone')}; "
        f"goal >= 1.0 at every point, both ways: {met}. At the same thread count on both sides, one process: "
        f"{summary['ours_faster']} of {summary['points']} ours faster "
        f"(lowest {_f(summary['lowest_ratio'], '{:.2f}')}x)"
    )


def _peer_verdict(peer: dict) -> dict:
    """Which ratios decide the goal: the paired rounds where there are some (ours and theirs
    timed process after process, so the machine's drift between two rows measured minutes apart
    cannot make the ratio), else the rows."""
    basis = "paired" if peer.get("paired") else "rows"
    source = peer["paired"] if basis == "paired" else peer
    ratios = [source.get("greedy_b1_p50_ratio"), source.get("beam4_b1_p50_ratio")]
    met = None if None in ratios else all(x <= 1.0 for x in ratios)
    return {"basis": basis, "greedy_b1_p50_ratio": ratios[0], "beam4_b1_p50_ratio": ratios[1], "met": met}


# ------------------------------------------------------------------------------ markdown
def _delta(d: dict | None) -> str:
    if d is None:
        return "–"
    lo, hi = d["ci95"]
    return f"{d['delta']:+.2f} [{lo:+.2f}, {hi:+.2f}] p={d['p_value']:.3f}"


def step_lines(steps: list[dict], rows: list[dict]) -> list[str]:
    if not steps:
        return []
    lines = [
        "",
        "**What each step cost and bought** (BLEU: to minus from on the whole test set, [95% interval] "
        "and p-value of paired bootstrap resampling over its sentences, 1000 samples; a difference whose "
        "interval spans 0 is within what this test set can tell apart):",
        "",
        "| step | from → to | BLEU (beam) | BLEU (greedy) | greedy speedup | beam 4 speedup | bytes | params |",
        "|" + "---|" * 8,
    ]
    for s in steps:
        lines.append(
            f"| {s['step']} | {s['from']} → {s['to']} | {_delta(s['bleu'])} | {_delta(s['bleu_greedy'])} | "
            f"{_f(s['greedy_b1_speedup'], '{:.2f}x')} | {_f(s['beam4_b1_speedup'], '{:.2f}x')} | "
            f"{_f(s['bytes_ratio'], '{:.3f}')} | {_f(s['params_ratio'], '{:.3f}')} |"
        )
    gaps = [r for r in rows if r.get("greedy_vs_beam")]
    if gaps:
        lines += [
            "",
            "Greedy minus beam BLEU, per row: "
            + "; ".join(f"{r['name']} {_delta(r['greedy_vs_beam'])}" for r in gaps)
            + ".",
        ]
    return lines


def _f(value, fmt="{:.1f}", none="–"):
    return none if value is None or (isinstance(value, float) and math.isnan(value)) else fmt.format(value)


def _size(n) -> str:
    if n is None:
        return "–"
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.0f} kB"


def _scoring_lines(scoring: dict | None) -> list[str]:
    if not scoring or not scoring.get("bleu_signature"):
        return []
    return [
        f"**Scores**: sacrebleu on all of {scoring['test_set']}, each row at its own beam (BLEU greedy: "
        f"beam 1); BLEU `{scoring['bleu_signature']}`, chrF `{scoring['chrf_signature']}`.",
        "",
    ]


def markdown(report: dict) -> str:
    m, b = report.get("machine") or {}, report["benchmark"]
    versions = ", ".join(f"{k} {v}" for k, v in (m.get("versions") or {}).items())
    training = report.get("training") or {}
    lines = [
        f"# {report['recipe']}: BLEU against latency",
        "",
        f"**Machine**: {m.get('cpu')} ({m.get('isa') or 'instruction level not recorded'}), {m.get('cores')} "
        f"cores ({m.get('usable_cores')} usable), GPU: {m.get('gpu') or 'none'}. {versions}.",
        "",
        *(
            [
                "**Training** (as this machine ran it):",
                "",
                *[
                    f"- {name}: imported, not trained ({t['budget']})"
                    if t["kind"] == "imported"
                    else f"- {name}: {t['steps']} steps ({t['kind']}; budget {t['budget']}), {t['precision']}"
                    + (f", {t['threads']} thread{'s' if t['threads'] != 1 else ''}" if t.get("threads") else "")
                    + f", {_f(t['minutes'], '{:.1f}')} min"
                    + (f"; **{t['cut_by_time']}**" if t["cut_by_time"] else "")
                    for name, t in training.items()
                ],
                "",
            ]
            if training
            else []
        ),
        f"**How**: the first {b['sentences']} sentences of {b['test_set']}, text in to text out (tokenization "
        f"included). Latency: one sentence at a time, warm-up excluded, passes repeated until the p50 is stable; "
        f"p50/p90/p99 over all timed sentences. Throughput: the same sentences in batches of {b['batch_size']}, "
        f"beam {b['throughput_beam']}. Each runtime measured at {' and '.join(map(str, b['threads'] or []))} "
        f"thread(s) in a fresh process; a row shows the faster (batch-1 greedy p50). "
        "Speedups are the teacher's (PyTorch, CPU) mean latency over the row's.",
        "",
        *_scoring_lines(report.get("scoring")),
        f"**Recommendation**: {report['recommendation']}.",
        "",
        *[f"- {line}." for mode, line in report["recommendations"].items() if mode != "greedy"],
        "",
        "![BLEU against latency](bleu_vs_latency.png)",
        "",
        "| variant | runtime | device | type | thr | params | heads | size | BLEU | BLEU greedy | chrF | "
        "greedy p50 / p90 / p99 ms | beam4 p50 ms | sent/s | tok/s | RSS MB | speedup | size ratio | Pareto |",
        "|" + "---|" * 19,
    ]
    for r in report["rows"]:
        if r["skipped"]:
            continue
        lat, tp, vs = r["latency_ms"], r["throughput"], r.get("vs_teacher") or {}
        g = lat["greedy_b1"]
        pareto = ("greedy" if r["pareto"] else "") + (" beam4" if r["pareto_beam4"] else "")
        lines.append(
            f"| {r['variant']}{' (' + r['training_cut'] + ')' if r.get('training_cut') else ''} | {r['runtime']} | "
            f"{r['device']} | {r['compute_type']} | {r['threads']} | "
            f"{_f(r['params'], '{:,}')} | {_f(r['heads'], '{}')} | {_size(r['bytes'])} | {_f(r['bleu'], '{:.2f}')} | "
            f"{_f(r['bleu_greedy'], '{:.2f}')} | {_f(r['chrf'], '{:.1f}')} | "
            f"{g['p50']:.1f} / {g['p90']:.1f} / {g['p99']:.1f} | {lat['beam4_b1']['p50']:.1f} | "
            f"{tp['sent_per_s']:.1f} | {tp['tok_per_s']:.0f} | {_f(r['peak_rss_mb'], '{:.0f}')} | "
            f"{_f(vs.get('greedy_b1_speedup'), '{:.2f}x')} | {_f(vs.get('bytes_ratio'), '{:.3f}')} | "
            f"{pareto.strip() or ''} |"
        )
    lines += step_lines(report.get("steps") or [], report["rows"])
    skipped = [r for r in report["rows"] if r["skipped"]]
    if skipped:
        lines += ["", "**Not measured here**:", ""]
        lines += [
            f"- {r['name']} ({r['runtime']}, {r['device']}, {r['compute_type']}): skipped: {r['skipped']}"
            for r in skipped
        ]
    if report["targets"]:
        lines += ["", "**Targets** (int8 student in onnxruntime):", ""]
        for name, t in report["targets"].items():
            lines.append(
                f"- {name}: {_f(t['greedy_b1_speedup'], '{:.2f}')}x the teacher's batch-1 greedy "
                f"sentences/s (target >= {t['speedup_target']:g}), BLEU {_f(t['bleu_delta'], '{:+.2f}')} "
                f"(target >= {t['bleu_delta_target']:g}), {_f(t['bytes_ratio'], '{:.3f}')} of its bytes "
                f"(target <= {t['bytes_ratio_target']:g})"
            )
            peer = t.get("vs_ctranslate2_int8")
            if peer:
                bd = peer.get("ours_breakdown") or {}
                paired = peer.get("paired")
                met = {True: "met", False: "not met", None: "not measured"}[peer["verdict"]["met"]]
                rows_ratio = (
                    f"{_f(peer['greedy_b1_p50_ratio'], '{:.2f}')} greedy, "
                    f"{_f(peer['beam4_b1_p50_ratio'], '{:.2f}')} beam 4"
                )
                lines.append(
                    f"  - vs CTranslate2 int8 ({peer['peer_variant']}): ours / theirs batch-1 p50 = "
                    + (
                        f"{_f(paired['greedy_b1_p50_ratio'], '{:.2f}')} greedy, "
                        f"{_f(paired['beam4_b1_p50_ratio'], '{:.2f}')} beam 4 in {paired['rounds']} paired "
                        f"rounds (ours and theirs process after process, threads {paired['threads'][0]} / "
                        f"{paired['threads'][1]}, median; goal <= 1.0: {met}); the two rows, measured minutes "
                        f"apart: {rows_ratio}"
                        if paired
                        else f"{rows_ratio} (goal <= 1.0: {met})"
                    )
                    + (
                        "; our greedy time per sentence"
                        + (
                            f": {bd['graph_total_ms']:.2f} ms with generate.onnx (the loop inside "
                            "onnxruntime); with the step graphs and the Python loop"
                            if "graph_total_ms" in bd
                            else ""
                        )
                        + f": encoder {bd['encode_ms']:.2f} ms, "
                        f"{bd['steps_per_sentence']:.1f} decoder steps {bd['decode_steps_ms']:.2f} ms, "
                        f"search and tokenization {bd['other_ms']:.2f} ms"
                        if bd
                        else ""
                    )
                )
            if t.get("vs_ctranslate2_one_process"):
                lines.append(f"  - {versus_target_line(t['vs_ctranslate2_one_process'])}")
    lines += versus_lines(report["rows"])
    lines += alone_lines(report["rows"])
    measured = [r for r in report["rows"] if not r["skipped"]]
    notes = [
        f"- {r['name']}: BLEU {r['bleu_source']}"
        for r in measured
        if r.get("bleu_source") and ("benchmark" in r["bleu_source"] or "CPU" in r["bleu_source"])
    ]
    beams = sorted({r["bleu_beam"] for r in measured if r.get("bleu_beam")})
    if len(beams) > 1:
        notes.append(
            f"- the BLEU column mixes beams {beams} (evaluate's beam, and beam 4 for the rows the "
            "benchmark scored); the greedy BLEU column compares like with like"
        )
    notes += [f"- {r['name']}: {r['parity']}" for r in measured if r.get("parity")]
    notes += [f"- {r['name']}: {r['note']}" for r in report["rows"] if r.get("note")]
    if notes:
        lines += ["", "**Notes**:", "", *notes]
    return "\n".join(lines) + "\n"


def alone_lines(rows: list[dict]) -> list[str]:
    """Which packages gave every test sentence the same translation alone and in batches: for those,
    the BLEU above is also that of single requests (the path the batch-1 latency times)."""
    checked = [r for r in rows if r.get("alone_identical")]
    if not checked:
        return []
    lines = [
        "",
        "**One sentence, one translation** (each test sentence translated again alone, a batch of one, "
        "against its translation in the evaluate stage's batches; identical / sentences):",
        "",
    ]
    for r in checked:
        parts = [
            f"{key.replace('.beam', ', beam ')} {v['identical']}/{v['sentences']}"
            for key, v in r["alone_identical"].items()
        ]
        same = all(v["identical"] == v["sentences"] for v in r["alone_identical"].values())
        lines.append(
            f"- {r['name']}: {'; '.join(parts)}"
            + (": one BLEU for every batch size" if same else ": the BLEU is that of the batches")
        )
    return lines
