"""`pipeline report`: show a recipe's latest BLEU / latency table, or what changed between two runs.

The report artifact (pipeline/stages/report/build.py) does not know which run made it, since artifacts
are shared by every run that reuses them. Shown here, report.json's "run" is the newest run
whose log lists that report artifact (built or reused).
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..engine.errors import UserInputError
from ..engine.store import Store
from ..report.rows import ReportRow, figures, versus_lines


def _out() -> Console:
    console = Console(highlight=False)
    if not console.is_terminal:  # a pipe or a file: do not squeeze the table into 80 columns
        console = Console(highlight=False, width=200)
    return console


def run_of(store: Store, artifact_id: str) -> str | None:
    """The newest run whose log lists this artifact as built or reused (run ids start with the time)."""
    if not store.runs.is_dir():
        return None
    for path in sorted(store.runs.glob("*.json"), reverse=True):
        try:
            log = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        if any(
            rec.get("id") == artifact_id and rec.get("action") in ("built", "reused") for rec in log.get("nodes", [])
        ):
            return log.get("run", path.stem)
    return None


def load_report(store: Store, report_id: str) -> dict:
    artifact = store.get(report_id)
    report = json.loads(artifact.file("report.json").read_text(encoding="utf-8"))
    report["run"] = run_of(store, report_id)
    report["report_artifact"] = report_id
    report["files"] = {name: str(artifact.path / name) for name in ("report.md", "report.json", "bleu_vs_latency.png")}
    return report


def latest_report(store: Store, recipe_path: str | Path) -> dict:
    from . import read_recipe

    recipe, _ = read_recipe(recipe_path)
    pointer = store.latest(recipe.name, recipe_path)
    if pointer is None:
        raise UserInputError(
            f"no run of recipe '{recipe.name}' in {store.root}: run `pipeline run {recipe_path}` first"
        )
    node = pointer.get("nodes", {}).get("report")
    if node is None or not store.exists(node["id"]):
        raise UserInputError(
            f"no report from recipe '{recipe.name}' in {store.root}: run `pipeline run {recipe_path}` "
            "to the end (the recipe needs evaluate, benchmark and report sections)"
        )
    return load_report(store, node["id"])


def show_latest(store: Store, recipe_path: str | Path, json_out: bool = False) -> dict:
    report = latest_report(store, recipe_path)
    if json_out:
        print(json.dumps(report, indent=2))
        return report
    out = _out()
    m = report.get("machine") or {}
    out.print(
        f"[bold]{report['recipe']}[/bold], run {report['run'] or '(unknown)'}: "
        f"{m.get('cpu')}, {m.get('cores')} cores, GPU {m.get('gpu') or 'none'}"
    )
    out.print(report_table(report))
    if report.get("steps"):
        out.print(steps_table(report["steps"]))
    for r in report["rows"]:
        if r["skipped"]:
            out.print(
                f"[dim]{r['variant']} {r['runtime']} {r['device']} {r['compute_type']}: skipped: {r['skipped']}[/dim]"
            )
    for line in versus_lines(report["rows"]):
        out.print(line, markup=False)
    for mode, line in (report.get("recommendations") or {}).items():
        out.print(f"{mode}: {line}")
    out.print(f"[dim]{report['files']['report.md']}[/dim]")
    return report


def _num(value, fmt: str) -> str:
    return "–" if value is None else fmt.format(value)


def report_table(report: dict) -> Table:
    rows: list[ReportRow] = report["rows"]
    b = report.get("benchmark") or {}
    table = Table(
        title=f"BLEU against latency ({b.get('sentences')} sentences of {escape(str(b.get('test_set')))}, "
        f"throughput at batch {b.get('batch_size')})",
        title_justify="left",
    )
    for col in (
        "variant",
        "runtime",
        "device",
        "type",
        "thr",
        "BLEU",
        "chrF",
        "greedy p50 ms",
        "p90",
        "p99",
        "beam4 p50 ms",
        "sent/s",
        "size MB",
        "params",
        "heads",
        "speedup",
        "Pareto",
    ):
        table.add_column(col, justify="left" if col in ("variant", "runtime", "device", "type") else "right")
    for r in rows:
        if r["skipped"]:
            continue  # listed under the table, where the reason has room
        head = [escape(str(r[k])) for k in ("variant", "runtime", "device", "compute_type")]
        g = r["latency_ms"]["greedy_b1"]
        vs = r.get("vs_teacher") or {}
        table.add_row(
            *head,
            str(r["threads"]),
            _num(r["bleu"], "{:.2f}"),
            _num(r["chrf"], "{:.1f}"),
            f"{g['p50']:.1f}",
            f"{g['p90']:.1f}",
            f"{g['p99']:.1f}",
            f"{r['latency_ms']['beam4_b1']['p50']:.1f}",
            f"{r['throughput']['sent_per_s']:.1f}",
            _mb(r["bytes"]),
            _num(r["params"], "{:,}"),
            _num(r["heads"], "{}"),
            _num(vs.get("greedy_b1_speedup"), "{:.2f}x"),
            "*" if r.get("pareto") else "",
        )
    return table


def steps_table(steps: list[dict]) -> Table:
    table = Table(
        title="What each step cost and bought (BLEU: to - from, [95% interval] of paired bootstrap "
        "resampling over the test sentences)",
        title_justify="left",
    )
    for col in ("step", "from -> to", "BLEU (beam)", "BLEU (greedy)", "greedy speedup", "bytes"):
        table.add_column(col, justify="left" if col in ("step", "from -> to") else "right")

    def delta(d: dict | None) -> str:
        return "–" if d is None else f"{d['delta']:+.2f} [{d['ci95'][0]:+.2f}, {d['ci95'][1]:+.2f}]"

    for s in steps:
        table.add_row(
            escape(s["step"]),
            escape(f"{s['from']} -> {s['to']}"),
            delta(s["bleu"]),
            delta(s["bleu_greedy"]),
            _num(s["greedy_b1_speedup"], "{:.2f}x"),
            _num(s["bytes_ratio"], "{:.3f}"),
        )
    return table


# ------------------------------------------------------------------------------ compare
def compare_runs(store: Store, run_a: str, run_b: str) -> dict:
    """What changed from run A to run B: recipe settings, rebuilt stages, machine, and per
    report row the BLEU, latency, throughput and size. Prints it and returns it."""
    from ..engine.runner import _diff_keys

    logs = [store.read_run(run_a), store.read_run(run_b)]
    nodes = [
        {rec["node"]: rec["id"] for rec in log.get("nodes", []) if rec.get("action") in ("built", "reused")}
        for log in logs
    ]
    changed_nodes = [
        {"node": name, "a": nodes[0].get(name), "b": nodes[1].get(name)}
        for name in dict.fromkeys([*nodes[0], *nodes[1]])
        if nodes[0].get(name) != nodes[1].get(name)
    ]
    settings = _diff_keys(logs[0].get("recipe_resolved"), logs[1].get("recipe_resolved"))
    machine = _diff_keys(logs[0].get("machine"), logs[1].get("machine"))
    reports = [
        load_report(store, n["report"]) if n.get("report") and store.exists(n["report"]) else None for n in nodes
    ]
    rows = compare_rows(*reports) if all(reports) else []
    if all(reports):
        add_bleu_intervals(store, rows, *reports)
    result = {
        "a": run_a,
        "b": run_b,
        "recipes": [log.get("recipe") for log in logs],
        "settings_changed": settings,
        "machine_changed": machine,
        "nodes_changed": changed_nodes,
        "rows": rows,
        "reports": [r and r["report_artifact"] for r in reports],
    }
    print_comparison(result)
    return result


def compare_rows(a: dict, b: dict) -> list[dict]:
    """Per row name (variant x runtime x device): the figures of A and B side by side."""
    by_a, by_b = ({r["name"]: r for r in rep["rows"]} for rep in (a, b))
    out = []
    for name in dict.fromkeys([*by_a, *by_b]):
        fa, fb = (figures(row) if row else None for row in (by_a.get(name), by_b.get(name)))
        entry = {"name": name, "a": fa, "b": fb}
        if fa and fb and "skipped" not in fa and "skipped" not in fb:
            entry["bleu_delta"] = (
                None if fa["bleu"] is None or fb["bleu"] is None else round(fb["bleu"] - fa["bleu"], 2)
            )
            entry["greedy_p50_ratio"] = round(fb["greedy_p50_ms"] / fa["greedy_p50_ms"], 3)
            entry["sent_per_s_ratio"] = round(fb["sent_per_s"] / fa["sent_per_s"], 3)
        out.append(entry)
    return out


def add_bleu_intervals(store: Store, rows: list[dict], a: dict, b: dict) -> None:
    """entry["bleu_delta_ci95"]: the paired bootstrap interval of B's BLEU minus A's on the same
    test sentences (pipeline.measure.scoring.paired_bootstrap), where both reports can still reach their
    hypotheses; whether a change between two runs is more than one test set's noise."""
    from ..measure.scoring import paired_bootstrap
    from ..report.hypotheses import hypotheses_reader

    readers = []
    for report in (a, b):
        artifact = store.get(report["report_artifact"])
        inputs = {
            role: store.get(ref) for role, ref in (artifact.manifest.get("inputs") or {}).items() if store.exists(ref)
        }
        if "data" not in inputs:  # a report made before it took the references: its evaluations know them
            data = next(
                (
                    art.manifest["inputs"]["data"]
                    for role, art in inputs.items()
                    if role.startswith("evaluate.") and "data" in (art.manifest.get("inputs") or {})
                ),
                None,
            )
            if data is not None and store.exists(data):
                inputs["data"] = store.get(data)
        bench = inputs["benchmark"].metrics if "benchmark" in inputs else {}
        evaluations = {
            role.removeprefix("evaluate."): art for role, art in inputs.items() if role.startswith("evaluate.")
        }
        readers.append(hypotheses_reader(inputs.get("data"), inputs.get("benchmark"), evaluations, bench))
    beams = [{r["name"]: r.get("bleu_beam") for r in report["rows"]} for report in (a, b)]
    for entry in rows:
        entry["bleu_delta_ci95"] = None
        beam = beams[0].get(entry["name"])
        if entry.get("bleu_delta") is None or beam is None or beam != beams[1].get(entry["name"]):
            continue
        ha, hb = readers[0](entry["name"], beam), readers[1](entry["name"], beam)
        if ha is None or hb is None or ha[1] != hb[1]:
            continue
        result = paired_bootstrap(hb[0], ha[0], ha[1])
        # Only files that are what the reports scored: an artifact that failed verification is
        # rebuilt under the same id, so an older report may name translations replaced since.
        if abs(result["delta"] - entry["bleu_delta"]) <= 0.011:
            entry["bleu_delta_ci95"] = result["ci95"]


def print_comparison(result: dict) -> None:
    out = _out()
    out.print(f"[bold]{result['a']}[/bold] -> [bold]{result['b']}[/bold]")
    out.print("recipe settings changed: " + (", ".join(result["settings_changed"]) or "none"))
    if result["machine_changed"]:
        out.print("machine changed: " + ", ".join(result["machine_changed"]))
    if result["nodes_changed"]:
        out.print(
            "stages with different artifacts: "
            + ", ".join(
                f"{n['node']} ({'new' if n['a'] is None else 'gone' if n['b'] is None else 'rebuilt'})"
                for n in result["nodes_changed"]
            )
        )
    else:
        out.print("stages with different artifacts: none (same artifacts)")
    if not result["rows"]:
        missing = [run for run, rep in zip((result["a"], result["b"]), result["reports"]) if rep is None]
        out.print(f"no report to compare in {', '.join(missing)}" if missing else "no rows", markup=False)
        return
    table = Table(
        title="per row: A -> B (BLEU change: [95% interval] of paired bootstrap resampling over the "
        "test sentences, where both runs' translations are in the store)",
        title_justify="left",
    )
    for col in ("row", "BLEU", "BLEU change", "greedy p50 ms", "sent/s", "size MB", "threads"):
        table.add_column(col, justify="left" if col == "row" else "right")

    def pair(entry, key, fmt):
        fa, fb = entry["a"] or {}, entry["b"] or {}
        if "skipped" in fa or "skipped" in fb or not fa or not fb:
            return ""
        va, vb = fa.get(key), fb.get(key)
        return f"{_num(va, fmt)} -> {_num(vb, fmt)}"

    for entry in result["rows"]:
        fa, fb = entry["a"], entry["b"]
        if fa is None or fb is None or "skipped" in fa or "skipped" in fb:
            state = f"both {_state(fa)}" if fa == fb else f"{_state(fa)} -> {_state(fb)}"
            table.add_row(escape(entry["name"]), f"[dim]{escape(state)}[/dim]", "", "", "", "", "")
            continue
        ci = entry.get("bleu_delta_ci95")
        change = _num(entry.get("bleu_delta"), "{:+.2f}") + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else "")
        table.add_row(
            escape(entry["name"]),
            pair(entry, "bleu", "{:.2f}"),
            change,
            pair(entry, "greedy_p50_ms", "{:.1f}"),
            pair(entry, "sent_per_s", "{:.1f}"),
            f"{_mb(fa['bytes'])} -> {_mb(fb['bytes'])}",
            f"{fa['threads']} -> {fb['threads']}",
        )
    out.print(table)


def _state(figures: dict | None) -> str:
    if figures is None:
        return "absent"
    return f"skipped: {figures['skipped']}" if "skipped" in figures else "measured"


def _mb(n: int | None) -> str:
    return _num(None if n is None else n / 1e6, "{:.2f}")


def results_markdown(store: Store, recipe_path: str | Path) -> str:
    """The latest report of a recipe as a section of docs/results.md: which run and report it is,
    the machine and its CPU's instruction level, the run's wall time and each stage's, then the
    report's own tables (headings one level down), so that the figures there trace to a report id."""
    report = latest_report(store, recipe_path)
    m = report.get("machine") or {}
    run_path = store.runs / f"{report['run']}.json" if report.get("run") else None
    run = json.loads(run_path.read_text(encoding="utf-8")) if run_path and run_path.is_file() else {}
    built = [r for r in run.get("nodes", []) if r.get("action") == "built"]
    lines = [
        f"## {report['recipe']} on {m.get('cpu')} ({m.get('isa') or 'instruction level not recorded'}), "
        f"{m.get('cores')} cores",
        "",
        f"Run `{report.get('run') or 'unknown'}`, report `{report['report_artifact']}`"
        + (f": {run['total_s'] / 60:.1f} minutes in all" if run.get("total_s") else "")
        + (f", {len(built)} stages built" if built else "")
        + ".",
        "",
    ]
    if built:
        lines.append(
            "Stage minutes: "
            + ", ".join(f"{r['node']} {r['duration_s'] / 60:.1f}" for r in built if r.get("duration_s", 0) >= 30)
            + " (stages under half a minute left out)."
        )
        lines.append("")
    body = Path(report["files"]["report.md"]).read_text(encoding="utf-8").splitlines()[1:]  # its own title
    while body and not body[0].strip():
        body.pop(0)
    for line in body:
        if line.startswith("!["):  # the plot lives in the report artifact, not beside the results page
            lines.append(f"Plot: `bleu_vs_latency.png` in `{report['report_artifact']}`.")
        else:
            lines.append("#" + line if line.startswith("#") else line)
    return "\n".join(lines).rstrip() + "\n"
