"""Benchmark and report stages on the smoke recipe, and `pipeline report`.

Built from the teacher alone (no distill / prune / export / quantize sections: the teacher's
artifacts and evaluation are shared with other tests, so this adds only the benchmark and the
report), with one thread count: a 2-thread measurement on a loaded 2-core machine can take
minutes (threads wait on each other); the thread selection is tested on its own below.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import struct

import pytest
import torch

from pipeline.commands.report_view import compare_runs, show_latest
from pipeline.measure.rows import BenchmarkRow
from pipeline.report.rows import ReportRow, missing_keys
from tests.helpers import SMOKE, cli

pytestmark = pytest.mark.slow  # the fixture runs the smoke recipe to its report


OVERRIDES = (
    "distill=null",
    "prune=null",
    "export=null",
    "quantize=null",
    "benchmark.threads=[one]",
    "benchmark.sentences=4",
    "benchmark.paired_rounds=2",
)
HAS_CT2 = importlib.util.find_spec("ctranslate2") is not None


@pytest.fixture(scope="module")
def built(smoke):
    with one_torch_thread():
        store, arts = smoke.build("report", *OVERRIDES)
    return store, arts, store.latest("smoke")["run"]


@contextlib.contextmanager
def one_torch_thread():
    """In-process stages (evaluate) on one thread: two threads on a loaded 2-core machine crawl.
    (The benchmark's own measurements run in processes that set their threads themselves.)"""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def test_every_benchmark_row_has_numbers_or_a_reason(built):
    store, arts, _ = built
    bench = arts["benchmark"].metrics
    rows = {r["name"]: r for r in bench["results"]}
    expected = {
        "teacher",
        "teacher_cuda",
        "ctranslate2_teacher_int8",
        "ctranslate2_teacher_float32",
        "ctranslate2_teacher_float16_cuda",
        "ctranslate2_teacher_int8_float16_cuda",
    }
    assert set(rows) == expected
    if not HAS_CT2:
        assert all(rows[n]["skipped"].startswith("ctranslate2 is not installed") for n in expected if "ctrans" in n)
    assert bench["threads"] == [1] and bench["sentences"] == 4
    machine = bench["machine"]
    assert machine["cpu"] and machine["cores"] >= 1 and "torch" in machine["versions"]
    # The host probed between measurements: the start, after each row's, and after the stage's three comparisons.
    measured = sum(1 for r in rows.values() if not r["skipped"]) * len(bench["threads"])
    assert machine["host_speed"]["probes"] == 1 + measured + 3
    for row in rows.values():
        if row["skipped"]:
            assert isinstance(row["skipped"], str) and row["skipped"]
            continue
        lat = row["latency_ms"]
        for key in ("greedy_b1", "beam4_b1"):
            assert 0 < lat[key]["p50"] <= lat[key]["p90"] <= lat[key]["p99"]
        assert row["throughput"]["sent_per_s"] > 0 and row["throughput"]["tok_per_s"] > 0
        assert row["throughput"]["batch"] == 4 and row["threads"] == 1 and list(row["by_threads"]) == ["1"]
        assert row["peak_rss_mb"] > 10 and row["bytes"] > 0 and row["params"] > 0 and row["heads"] > 0
    if not machine["gpu"]:
        assert all(r["skipped"] == "no CUDA device on this machine" for n, r in rows.items() if n.endswith("_cuda"))
    # The sample is the first sentences of the test set, so `head -n 4` reproduces it.
    sample = (arts["benchmark"].path / "sample.src").read_text(encoding="utf-8").splitlines()
    test = (arts["data"].path / f"test.{bench['test_set']}.src").read_text(encoding="utf-8").splitlines()
    assert sample == test[:4]
    # Our torch rows say where the time goes.
    breakdown = rows["teacher"]["breakdown"]
    assert breakdown["steps_per_sentence"] >= 1 and breakdown["decode_steps_ms"] > 0
    # Every row reads back typed and writes the same JSON, key for key and in benchmark.json's order
    # (the manifest keeps its metrics with sorted keys).
    on_disk = json.loads((arts["benchmark"].path / "benchmark.json").read_text(encoding="utf-8"))
    assert on_disk["rows"] == bench["results"] and "folder" not in on_disk["rows"][0]
    for row in on_disk["rows"]:
        assert json.dumps(BenchmarkRow.from_json(row).to_json()) == json.dumps(row)


@pytest.mark.skipif(not HAS_CT2, reason="ctranslate2 is not installed")
def test_ctranslate2_rows_are_checked_scored_and_stored(built):
    _, arts, _ = built
    rows = {r["name"]: r for r in arts["benchmark"].metrics["results"]}
    fp32, int8 = rows["ctranslate2_teacher_float32"], rows["ctranslate2_teacher_int8"]
    assert fp32["parity"]["identical"] == fp32["parity"]["sentences"] == 4
    assert int8["bytes"] < fp32["bytes"] and fp32["variant"] == "teacher" and fp32["source"] == "teacher"
    for row in (fp32, int8):
        assert row["scores"]["beam4"]["sentences"] == row["scores"]["beam1"]["sentences"] == 40
        assert (arts["benchmark"].path / row["files"] / "model.bin").is_file()
        for beam in ("beam4", "beam1"):  # the hypotheses scored, kept for the report's comparisons
            hyp = arts["benchmark"].path / row["hypotheses"] / row["scores"][beam]["hypotheses"]
            assert len(hyp.read_text(encoding="utf-8").splitlines()) == 40
    # The final model's row against the peer of its compute type, in rounds of alternating order.
    paired = rows["teacher"]["paired"]
    assert paired["peer"] == "ctranslate2_teacher_float32" and paired["threads"] == [1, 1]
    assert [r["first"] for r in paired["rounds"]] == ["teacher", "ctranslate2_teacher_float32"]
    for key in ("greedy_b1", "beam4_b1"):
        ratios = []
        for r in paired["rounds"]:
            ours, theirs = r[f"{key}_p50_ms"]
            assert ours > 0 and theirs > 0 and r[f"{key}_p50_ratio"] == pytest.approx(ours / theirs, abs=1e-3)
            ratios.append(r[f"{key}_p50_ratio"])
        assert paired[f"{key}_p50_ratio"] == pytest.approx(sum(ratios) / 2, abs=1e-3)  # the median of two
    report = json.loads(arts["report"].file("report.json").read_text(encoding="utf-8"))
    assert next(r for r in report["rows"] if r["name"] == "teacher")["paired"] == paired
    peer = next(r for r in report["rows"] if r["name"] == "ctranslate2_teacher_int8")
    assert peer["greedy_vs_beam"]["delta"] == pytest.approx(peer["bleu_greedy"] - peer["bleu"], abs=0.011)


def test_report_files(built):
    _, arts, _ = built
    report = json.loads(arts["report"].file("report.json").read_text(encoding="utf-8"))
    assert report["recipe"] == "smoke" and report["run"] is None
    assert {"cpu", "isa", "cores", "gpu", "versions"} <= set(report["machine"])
    teacher_training = report["training"]["teacher"]  # as this machine trained it
    assert teacher_training["steps"] > 0 and teacher_training["precision"] in ("bf16", "float32")
    assert teacher_training["cut_by_time"] is None and teacher_training["precision_reason"]
    types = {
        "variant": str,
        "runtime": str,
        "device": str,
        "compute_type": str,
        "params": int,
        "heads": int,
        "bytes": int,
        "bleu": float,
        "chrf": float,
    }
    for row in report["rows"]:
        assert {
            "variant",
            "runtime",
            "device",
            "compute_type",
            "params",
            "heads",
            "bytes",
            "bleu",
            "chrf",
            "latency_ms",
            "throughput",
            "skipped",
            "pareto",
            "vs_teacher",
        } <= set(row)
        assert row["runtime"] in ("torch", "onnxruntime", "ctranslate2")
        if row["skipped"]:
            assert isinstance(row["skipped"], str)
            continue
        for key, kind in types.items():
            assert isinstance(row[key], (int, float) if kind is float else kind), (key, row[key])
        assert set(row["latency_ms"]) == {"greedy_b1", "beam4_b1"}
        assert {"p50", "p90", "p99"} <= set(row["latency_ms"]["greedy_b1"])
        assert {"sent_per_s", "tok_per_s", "batch"} <= set(row["throughput"])
        assert isinstance(row["pareto"], bool)
    # Every key a row carries is declared (and so documented) in ReportRow; a dropped one is named.
    assert set().union(*report["rows"]) <= set(ReportRow.__annotations__)
    assert missing_keys(report) == []
    broken = {**report, "rows": [{k: v for k, v in report["rows"][0].items() if k != "bleu"}]}
    assert missing_keys(broken) == [f"rows[{report['rows'][0]['name']}].bleu"]
    teacher = next(r for r in report["rows"] if r["name"] == "teacher")
    assert teacher["vs_teacher"]["greedy_b1_speedup"] == 1.0 and teacher["vs_teacher"]["bytes_ratio"] == 1.0
    assert any(r["pareto"] for r in report["rows"])
    assert report["recommendation"].startswith("fastest variant within 1 BLEU of the teacher")

    png = arts["report"].file("bleu_vs_latency.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    width, height = struct.unpack(">II", png[16:24])
    assert width >= 800 and height >= 400 and len(png) > 20_000

    md = arts["report"].file("report.md").read_text(encoding="utf-8")
    assert "| variant | runtime |" in md and "![BLEU against latency](bleu_vs_latency.png)" in md
    assert report["recommendation"] in md
    assert report["machine"]["gpu"] or "skipped: no CUDA device" in md
    assert "**Host speed** over the benchmark (" in md
    # sacrebleu's signatures, as evaluate recorded them, in both files.
    signature = report["scoring"]["bleu_signature"]
    assert signature == arts["evaluate.teacher"].metrics["bleu_signature"] and signature.startswith("nrefs:1|")
    assert f"BLEU `{signature}`" in md and report["scoring"]["chrf_signature"] in md


def test_pipeline_report_and_compare(built, smoke, capsys):
    store, arts, report_run = built
    report = show_latest(store, SMOKE, json_out=True)
    assert json.loads(capsys.readouterr().out)["run"] == report_run == report["run"]

    # A rerun reuses every artifact: nothing changed, every measured row identical.
    smoke.build("report", *OVERRIDES)
    rerun = store.latest("smoke")["run"]
    same = compare_runs(store, report_run, rerun)
    assert same["nodes_changed"] == [] and same["settings_changed"] == []
    assert all(r.get("greedy_p50_ratio", 1.0) == 1.0 for r in same["rows"]) and same["rows"]
    teacher = next(r for r in same["rows"] if r["name"] == "teacher")
    assert teacher["bleu_delta"] == 0 and teacher["bleu_delta_ci95"] == [0, 0]  # the same translations
    assert "same artifacts" in capsys.readouterr().out

    # A run with no report: the comparison says so and lists what it lacks.
    smoke.build("data", *OVERRIDES)
    partial = store.latest("smoke")["run"]
    diff = compare_runs(store, rerun, partial)
    assert diff["rows"] == [] and {"report", "benchmark"} <= {n["node"] for n in diff["nodes_changed"]}
    assert f"no report to compare in {partial}" in capsys.readouterr().out

    # The CLI: --json prints report.json with the run filled in (the newest run that used it).
    proc = cli("report", str(SMOKE), "--json", store=store.root)
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(proc.stdout)["run"] == rerun

    # --markdown: the section docs/results.md is made of, naming the run and the report.
    proc = cli("report", str(SMOKE), "--markdown", store=store.root)
    text = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr.decode()
    assert f"Run `{rerun}`, report `{report['report_artifact']}`" in text and "minutes in all" in text
    assert "| variant | runtime |" in text and "**Training**" in text and report["machine"]["isa"] in text
    assert f"Plot: `bleu_vs_latency.png` in `{report['report_artifact']}`" in text and "![" not in text


def test_onnx_packages_are_measured_in_onnxruntime(smoke):
    # The smoke student's export and quantize artifacts (shared with the ONNX tests); only the
    # onnxruntime rows are measured, so the others must say why not.
    with one_torch_thread():
        _, arts = smoke.build(
            "benchmark",
            "prune=null",
            "benchmark.threads=[one]",
            "benchmark.sentences=4",
            "benchmark.runtimes=[onnxruntime]",
        )
    rows = {r["name"]: r for r in arts["benchmark"].metrics["results"]}
    assert {n for n, r in rows.items() if not r["skipped"]} == {"student_onnx", "int8_dynamic", "int8_static"}
    assert rows["teacher"]["skipped"] == "runtime torch not in benchmark.runtimes"
    assert rows["ctranslate2_student_int8"]["skipped"] == "runtime ctranslate2 not in benchmark.runtimes"
    assert rows["fp16"]["skipped"] and rows["fp16"]["device"] == "cuda"
    fp32, int8 = rows["student_onnx"], rows["int8_dynamic"]
    assert int8["bytes"] < fp32["bytes"] and int8["params"] == fp32["params"] == arts["student"].metrics["params"]
    assert int8["compute_type"] == "int8" and int8["runtime"] == "onnxruntime" and int8["source"] == "student"
    assert int8["latency_ms"]["greedy_b1"]["p50"] > 0 and int8["breakdown"]["steps_per_sentence"] >= 1
    # On 2 cores or more, each package also on every core: one thread, threads, child processes.
    cores = arts["benchmark"].metrics["machine"]["usable_cores"]
    for name in ("student_onnx", "int8_dynamic", "int8_static"):
        if cores < 2:
            assert "cores" not in rows[name]
            continue
        measured = rows[name]["cores"]
        # 16 sentences repeated to 4 batches of 4 a core
        assert (measured["cores"], measured["sentences"], measured["rounds"]) == (cores, 16 * cores, 1), measured
        assert [(p["beam"], p["same"]) for p in measured["points"]] == [(1, True)]
        assert measured["best"] in ("threads", "processes")


def test_the_smoke_report_says_how_far_greedy_is_from_beam(built):
    _, arts, _ = built
    report = json.loads(arts["report"].file("report.json").read_text(encoding="utf-8"))
    teacher = next(r for r in report["rows"] if r["name"] == "teacher")
    gap = teacher["greedy_vs_beam"]
    assert gap["delta"] == pytest.approx(teacher["bleu_greedy"] - teacher["bleu"], abs=0.011)
    assert gap["ci95"][0] <= gap["delta"] <= gap["ci95"][1] and gap["samples"] == 1000
