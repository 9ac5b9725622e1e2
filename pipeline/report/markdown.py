"""report.md: the machine, training, how it was measured, the recommendation, the table, what each
step cost and bought, the targets, the comparisons with CTranslate2, and notes."""

from __future__ import annotations

import math

from ..measure.cores import cores_line
from ..measure.host_speed import host_line
from .rows import versus_lines


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
        *([host_line(m["host_speed"]), ""] if m.get("host_speed") else []),
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
    lines += cores_lines(report["rows"])
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


def cores_lines(rows: list[dict]) -> list[str]:
    """Our packages on every core: one thread, N threads, N child processes (pipeline/measure/cores.py)."""
    measured = [r for r in rows if r.get("cores")]
    if not measured:
        return []
    return [
        "",
        "**On every core** (`translate`, one package three ways, taking turns in one process: one thread; "
        "N threads, whole batches one a thread; N child processes of one thread; speed-ups over one thread, "
        "the median of the rounds' own ratios):",
        "",
        *(f"- {r['name']}: {cores_line(r['cores'])}" for r in measured),
    ]


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
