"""Benchmark stage: latency, throughput, memory and size of every variant on every runtime here.

Rows, in report order:
  - each variant the graph lists (models in PyTorch, ONNX packages in onnxruntime) on its device;
  - the float32 ones again on CUDA when the recipe's devices include it;
  - CTranslate2, the peer, on the final model: int8 and float32 on the CPU (float16 and
    int8_float16 on CUDA). If the final model has uneven heads per layer, which CTranslate2
    cannot express, zero heads are added (same outputs, more work for it; the row says so).
A row that cannot be measured here is kept, with `skipped` saying why; it never fails the stage.

Each row is measured once per thread count in `threads` (1 and all cores by default), each time
in a fresh process (pipeline/measure/speed.py). The row shows the thread count with the lower
batch-1 greedy p50; every measurement stays in the manifest under `by_threads`.
The CTranslate2 rows also translate and score the whole test set (no evaluate stage covers
them), and their greedy outputs are compared with our PyTorch model's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import statistics
import subprocess
from pathlib import Path

from model.ctranslate2_export import NotConvertible, compare_greedy, export_ctranslate2, uniform_heads

from ...corpora.splits import read_split
from ...engine.context import StageContext
from ...engine.errors import UserInputError
from ...engine.machine import usable_cores
from ...engine.stage import Variant
from ...engine.store import Artifact, tool_versions
from ...measure import speed as measurement  # what the measurement processes run: in this stage's fingerprint
from . import BenchmarkInputs, BenchmarkNode

PARITY_SENTENCES = 10  # sentences whose greedy output ids CTranslate2 must reproduce
CT2_TYPES = {"cpu": ("int8", "float32"), "cuda": ("int8_float16", "float16")}


def run(ctx: StageContext) -> dict:
    cfg: BenchmarkNode = ctx.settings
    data = ctx.inputs.data
    test_sets = data.metrics.get("test_sets", [])
    test_set = cfg.test_set or (test_sets[0] if test_sets else None)
    if test_set not in test_sets:
        raise UserInputError(f"benchmark.test_set: {test_set!r} not produced by the data stage (it has {test_sets})")
    src, _ = read_split(data.path, f"test.{test_set}")
    # A fixed sample: the first N non-empty sentences, so `head -n N` reproduces it.
    sample = [s for s in src if s.strip()][: cfg.sentences]
    (ctx.out / "sample.src").write_text("".join(s + "\n" for s in sample), encoding="utf-8")

    machine = describe_machine(cfg.machine or {})
    has_cuda = bool(machine.get("gpu"))
    threads = thread_counts(cfg.threads, machine["usable_cores"])
    rows = variant_rows(ctx, cfg, has_cuda) + peer_rows(ctx, cfg, has_cuda, sample) + imported_teacher_rows(ctx, cfg)
    ctx.log(
        f"{len(rows)} rows ({sum(1 for r in rows if not r['skipped'])} to measure) on {test_set}: "
        f"{len(sample)} sentences, threads {threads}, batch {cfg.batch_size}"
    )

    jobs = [(row, n) for row in rows if not row["skipped"] for n in threads]
    score_spec = {
        "src": str(data.file(f"test.{test_set}.src")),
        "refs": str(data.file(f"test.{test_set}.tgt")),
        "beams": [1, 4],
        "test_set": test_set,
    }
    with ctx.progress("benchmark", total=len(jobs), unit="measurements") as bar:
        for row, n in jobs:
            score = None
            if row["runtime"] == "ctranslate2" and not row["by_threads"]:
                score = {**score_spec, "hypotheses": str(ctx.out / "hypotheses" / row["name"])}
                row["hypotheses"] = f"hypotheses/{row['name']}"
            row["by_threads"][str(n)] = measure(ctx, row, n, sample, cfg, score)
            bar.advance(1, postfix=f"{row['name']} ({n} thread{'s' if n > 1 else ''})")
    for row in rows:
        if not row["skipped"]:
            pick_best(row)  # may find every measurement skipped (e.g. a runtime without CUDA)
    paired_rounds(ctx, rows, sample, cfg)
    versus_sample = [s for s in src if s.strip()][: cfg.versus.sentences]
    versus_ctranslate2(ctx, rows, versus_sample, cfg, threads)
    for row in rows:
        row.pop("folder")  # a path into the store (or this stage's temporary folder): not for readers
        ctx.log(f"{row['name']}: skipped: {row['skipped']}" if row["skipped"] else summary_line(row))
        for result in row["by_threads"].values():
            versions = result.pop("versions", None)  # once per runtime is enough, in `machine`
            if versions:
                machine["runtimes"][row["runtime"]] = versions

    report = {
        "test_set": test_set,
        "sentences": len(sample),
        "threads": threads,
        "batch_size": cfg.batch_size,
        "throughput_beam": cfg.throughput_beam,
        "machine": machine,
        "rows": rows,
    }
    (ctx.out / "benchmark.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return {
        "rows": len(rows),
        "measured": sum(1 for r in rows if not r["skipped"]),
        "skipped_rows": sum(1 for r in rows if r["skipped"]),
        **{k: v for k, v in report.items() if k != "rows"},
        "results": rows,
    }


# ---------------------------------------------------------------------------------- rows
def new_row(v: Variant) -> dict:
    """A row of the benchmark's results (kept as JSON in its manifest): the variant, then what
    was measured."""
    return {
        "name": v.name,
        "variant": v.variant,
        "runtime": v.runtime,
        "device": v.device,
        "compute_type": v.compute_type,
        "node": v.node,
        "package": v.package,
        "source": v.source,
        "artifact": None,
        "files": None,
        "folder": None,
        "params": None,
        "heads": None,
        "bytes": None,
        "threads": None,
        "latency_ms": None,
        "throughput": None,
        "peak_rss_mb": None,
        "gpu_mem_mb": None,
        "load_s": None,
        "breakdown": None,
        "skipped": v.skipped,
        "note": None,
        "by_threads": {},
    }


def variant_rows(ctx: StageContext, cfg: BenchmarkNode, has_cuda: bool) -> list[dict]:
    rows = []
    onnx_ready = importlib.util.find_spec("mt_runtime.translator") is not None
    inputs: BenchmarkInputs = ctx.inputs
    for v in cfg.variants:
        rows.append(new_row(v))
        # On a GPU machine the float32 models also run on CUDA (int8 ONNX kernels are CPU-only).
        if "cuda" in cfg.devices and v.device == "cpu" and v.compute_type == "float32":
            rows.append(new_row(v.model_copy(update={"name": f"{v.name}_cuda", "device": "cuda"})))
    for row in rows:
        base = row["name"].removesuffix("_cuda")
        row["skipped"] = row["skipped"] or skip_reason(row, cfg, has_cuda, onnx_ready)
        artifact = inputs.variants.get(base)
        if artifact is None:
            row["skipped"] = row["skipped"] or f"no input artifact for {base}"
            continue
        row["artifact"] = artifact.id
        row["folder"] = str(artifact.path / row["package"] if row["package"] else artifact.path)
        row["bytes"] = model_bytes(Path(row["folder"])) if Path(row["folder"]).is_dir() else None
        source = inputs.variants.get(row["source"])
        if source is not None:
            row["params"], row["heads"] = model_facts(source)
    return rows


def skip_reason(row: dict, cfg: BenchmarkNode, has_cuda: bool, onnx_ready: bool) -> str | None:
    if row["runtime"] not in cfg.runtimes:
        return f"runtime {row['runtime']} not in benchmark.runtimes"
    if row["device"] not in cfg.devices:
        return f"device {row['device']} not in benchmark.devices"
    if row["device"] == "cuda" and not has_cuda:
        return "no CUDA device on this machine"
    if row["runtime"] == "onnxruntime" and not onnx_ready:
        return "the ONNX runtime (mt_runtime/translator.py) is not available in this checkout"
    return None


def peer_rows(ctx: StageContext, cfg: BenchmarkNode, has_cuda: bool, sample: list[str]) -> list[dict]:
    """CTranslate2 rows on the final model: convert it, check its greedy outputs against ours, and
    leave the timing to measure(). A final model with uneven heads per layer (CTranslate2 has one
    count per stack) is converted with zero heads added: the same function, more heads computed."""
    model = cfg.final_model
    if model is None:
        return []
    rows = [
        new_row(
            Variant(
                name=f"ctranslate2_{model}_{ct}" + ("_cuda" if device == "cuda" else ""),
                variant=model,
                node=model,
                source=model,
                runtime="ctranslate2",
                device=device,
                compute_type=ct,
            )
        )
        for device in ("cpu", "cuda")
        for ct in CT2_TYPES[device]
    ]
    missing = (
        None if importlib.util.find_spec("ctranslate2") else "ctranslate2 is not installed (pip install '.[peer]')"
    )
    artifact = ctx.inputs.variants[model]
    params, heads = model_facts(artifact)
    pad, note = False, None
    try:
        uniform_heads(json.loads(artifact.file("config.json").read_text(encoding="utf-8")))
    except NotConvertible as exc:
        pad, note = True, f"{exc}; zero heads were added up to each stack's largest count"
    for row in rows:
        row["skipped"] = skip_reason(row, cfg, has_cuda, onnx_ready=True) or missing
        if row["skipped"]:
            continue
        folder = ctx.out / "ctranslate2" / f"{model}-{row['compute_type']}"
        meta = export_ctranslate2(artifact.path, folder, row["compute_type"], pad_heads=pad)
        row.update(
            artifact=artifact.id,
            folder=str(folder),
            bytes=model_bytes(folder),
            params=params,
            heads=heads,
            source=model,
            files=folder.relative_to(ctx.out).as_posix(),
            heads_computed=meta["heads_computed"],
        )
        if pad:
            row["note"] = f"{note} (CTranslate2 computes {meta['heads_computed']} heads, ours {meta['heads']})"
        if row["device"] == "cpu":
            check = compare_greedy(artifact.path, folder, sample[:PARITY_SENTENCES])
            row["parity"] = check
            ctx.log(
                f"CTranslate2 {model} {row['compute_type']}: greedy outputs identical to ours on "
                f"{check['identical']}/{check['sentences']} sentences"
            )
    return rows


def imported_teacher_rows(ctx: StageContext, cfg: BenchmarkNode) -> list[dict]:
    """An imported teacher through CTranslate2 (its own converter), int8 and float32 on the CPU,
    beside its transformers row: what the model the user started from costs at its fastest."""
    artifact = ctx.inputs.variants.get("teacher")
    if artifact is None or not artifact.metrics.get("imported"):
        return []
    rows = []
    for ct in CT2_TYPES["cpu"]:
        row = new_row(
            Variant(
                name=f"ctranslate2_teacher_{ct}",
                variant="teacher",
                node="teacher",
                source="teacher",
                runtime="ctranslate2",
                compute_type=ct,
            )
        )
        rows.append(row)
        row["skipped"] = skip_reason(row, cfg, False, onnx_ready=True) or (
            None if importlib.util.find_spec("ctranslate2") else "ctranslate2 is not installed (pip install '.[peer]')"
        )
        if row["skipped"]:
            continue
        from model.hf_translator import convert_for_serving

        folder = ctx.out / "ctranslate2" / f"teacher-{ct}"
        try:
            convert_for_serving(artifact.path / "checkpoint", folder, ct)
        except Exception as exc:  # the converter's refusals are of many kinds
            row["skipped"] = f"CTranslate2 cannot convert this model: {type(exc).__name__}: {str(exc)[:200]}"
            continue
        row.update(
            artifact=artifact.id,
            folder=str(folder),
            bytes=model_bytes(folder),
            params=artifact.metrics["params"],
            source="teacher",
            files=folder.relative_to(ctx.out).as_posix(),
        )
    return rows


# ------------------------------------------------------------------------------ measuring
def engine(row: dict, threads: int) -> dict:
    """What a measurement process needs to open a row's translator."""
    return {
        "runtime": row["runtime"],
        "device": row["device"],
        "compute_type": row["compute_type"],
        "folder": row["folder"],
        "threads": threads,
    }


def measure(
    ctx: StageContext,
    row: dict,
    threads: int,
    sample: list[str],
    cfg: BenchmarkNode,
    score: dict | None,
    latency_only: bool = False,
    tag: str = "",
) -> dict:
    """One measurement in a fresh process; a process that fails gives a skipped result, not a crash."""
    job = {
        **engine(row, threads),
        "sentences": sample,
        "batch_size": cfg.batch_size,
        "throughput_beam": cfg.throughput_beam,
        "min_repeats": cfg.min_repeats,
        "max_repeats": cfg.max_repeats,
        "stable_within": cfg.stable_within,
        "score": score,
        "latency_only": latency_only,
    }
    return run_job(ctx, f"{row['name']}-t{threads}{'-' + tag if tag else ''}", job, threads)


def run_job(ctx: StageContext, tag: str, job: dict, threads: int) -> dict:
    """pipeline.measure.speed on `job` in a fresh process with `threads` for the math libraries."""
    return measurement.run_process(ctx.work / "jobs", tag, job, threads)


def peer_pairs(rows: list[dict], cfg: BenchmarkNode) -> list[tuple[dict, dict]]:
    """(our row, the CTranslate2 row of the same compute type): the final model on the CPU."""
    final = cfg.final_model
    peers = {
        r["compute_type"]: r
        for r in rows
        if r["runtime"] == "ctranslate2" and r["device"] == "cpu" and not r["skipped"] and r["source"] == final
    }
    return [
        (r, peers[r["compute_type"]])
        for r in rows
        if r["runtime"] != "ctranslate2"
        and r["device"] == "cpu"
        and not r["skipped"]
        and r["source"] == final
        and r["compute_type"] in peers
    ]


def versus_ctranslate2(
    ctx: StageContext, rows: list[dict], sample: list[str], cfg: BenchmarkNode, threads: list[int]
) -> None:
    """Each of our ONNX packages of the final model against CTranslate2 on the same weights and
    compute type, at every (batch, beam) of `benchmark.versus` and every thread count: one
    process per thread count holding both, taking turns (pipeline.measure.speed.measure_versus);
    then, with `versus.separate_rounds`, each side alone in processes of its own (versus_alone).
    Stored as row["versus"]: per thread count, the one-process points with their one-line
    verdicts (by_threads) and the separate processes' (separate); per point, each side at its own
    best thread count, from each (best: pipeline.measure.speed.best_vs_best)."""
    pairs = [(ours, theirs) for ours, theirs in peer_pairs(rows, cfg) if ours["runtime"] == "onnxruntime"]
    spec = cfg.versus
    if not spec.rounds or not pairs or not sample:
        return
    points = [[batch, beam] for batch in spec.batches for beam in spec.beams]
    with ctx.progress("ours vs CTranslate2, one process", total=len(pairs) * len(threads), unit="processes") as bar:
        for ours, theirs in pairs:
            ours["versus"] = {"peer": theirs["name"], "by_threads": {}}
            for n in threads:
                job = {
                    "kind": "versus",
                    "ours": engine(ours, n),
                    "theirs": engine(theirs, n),
                    "threads": n,
                    "sentences": sample,
                    "points": points,
                    "rounds": spec.rounds,
                    "tokenizer": batching_file(ours),
                }
                result = run_job(ctx, f"versus-{ours['name']}-t{n}", job, n)
                ours["versus"]["by_threads"][str(n)] = result
                bar.advance(1)
                log_points(ctx, ours, theirs, f"{n} thread{'s' if n > 1 else ''}", result)
    if spec.separate_rounds:
        versus_alone(ctx, pairs, sample, points, spec.separate_rounds, threads)
    for ours, theirs in pairs:
        versus = ours["versus"]
        alone = (versus.get("separate") or {}).get("by_threads")
        versus["best"] = measurement.best_vs_best(versus["by_threads"], alone)
        for how, best in versus["best"].items():
            log_points(ctx, ours, theirs, f"each at its best thread count, {how}", {"points": best})


def versus_alone(
    ctx: StageContext,
    pairs: list[tuple[dict, dict]],
    sample: list[str],
    points: list[list[int]],
    rounds: int,
    threads: list[int],
) -> None:
    """Each side of every pair alone in a fresh process, the other runtime not loaded, at every
    thread count (pipeline.measure.speed.measure_alone): the same sentences, batches and points as
    the one-process comparison, `rounds` rounds each. A CTranslate2 row compared with several of
    our packages is timed once, just before them. Stored as row["versus"]["separate"]: {rounds,
    by_threads: {n: {"ours": its result, "ctranslate2": the peer's, "points": ours / theirs}}}."""
    peers = {theirs["name"]: theirs for _, theirs in pairs}
    order = [row for name, peer in peers.items() for row in (peer, *(o for o, t in pairs if t["name"] == name))]
    batching = {theirs["name"]: batching_file(ours) for ours, theirs in reversed(pairs)}  # the first pair's
    alone: dict[tuple[str, int], dict] = {}
    with ctx.progress("ours and CTranslate2, each alone", total=len(order) * len(threads), unit="processes") as bar:
        for n in threads:
            for row in order:
                job = {
                    "kind": "alone",
                    "engine": engine(row, n),
                    "threads": n,
                    "sentences": sample,
                    "points": points,
                    "rounds": rounds,
                    "tokenizer": batching.get(row["name"]) or batching_file(row),
                }
                alone[row["name"], n] = run_job(ctx, f"alone-{row['name']}-t{n}", job, n)
                bar.advance(1)
    for ours, theirs in pairs:
        by_threads = {}
        for n in threads:
            mine, peer = alone[ours["name"], n], alone[theirs["name"], n]
            skipped = mine.get("skipped") or peer.get("skipped")
            by_threads[str(n)] = {
                "ours": mine,
                "ctranslate2": peer,
                "rounds": rounds,
                "sentences": len(sample),
                "points": [] if skipped else measurement.separate_points(mine, peer),
                **({"skipped": skipped} if skipped else {}),
            }
            log_points(ctx, ours, theirs, f"{n} thread{'s' if n > 1 else ''}, each alone", by_threads[str(n)])
        ours["versus"]["separate"] = {"rounds": rounds, "by_threads": by_threads}


def batching_file(row: dict) -> str | None:
    """The tokenizer file that sorts a comparison's sentences into batches: our package's (the
    CTranslate2 model of the same weights tokenizes with the same file)."""
    path = Path(row["folder"]) / "tokenizer.json"
    return str(path) if path.is_file() else None


def log_points(ctx: StageContext, ours: dict, theirs: dict, how: str, result: dict) -> None:
    for point in result.get("points", []):
        ctx.log(f"{ours['name']} vs {theirs['name']}, {how}: {point['verdict']}")
    if result.get("skipped"):
        ctx.log(f"{ours['name']} vs {theirs['name']}, {how}: skipped: {result['skipped']}")


def paired_rounds(ctx: StageContext, rows: list[dict], sample: list[str], cfg: BenchmarkNode) -> None:
    """Ours against CTranslate2, same weights, same compute type, on the CPU: `paired_rounds`
    rounds of one batch-1 latency measurement each, ours and theirs process after process (the
    order alternating), both at the same thread count: the one CTranslate2's row chose (its best
    setting, so the comparison never favours us by the threads). The rows themselves are
    measured minutes apart, and a small VM's speed drifts by tens of percent over minutes: the
    median of the rounds' ratios is the comparison to read. Stored as row["paired"] on our rows.
    (Each at its own row's thread count, one run put ours at 2 threads against theirs at 1 and
    read 1.41 / 2.12 where the rows read 1.09 / 1.30: two threads on two busy vCPUs wait on
    each other.)"""
    pairs = peer_pairs(rows, cfg)
    if not cfg.paired_rounds or not pairs:
        return
    once = cfg.model_copy(update={"min_repeats": 1, "max_repeats": 1})
    with ctx.progress("paired rounds vs CTranslate2", total=len(pairs) * cfg.paired_rounds, unit="rounds") as bar:
        for ours, theirs in pairs:
            rounds = []
            for k in range(cfg.paired_rounds):
                order = (ours, theirs) if k % 2 == 0 else (theirs, ours)
                got = {
                    id(r): measure(ctx, r, theirs["threads"], sample, once, None, latency_only=True, tag=f"paired{k}")
                    for r in order
                }
                a, b = got[id(ours)], got[id(theirs)]
                bar.advance(1)
                if a.get("skipped") or b.get("skipped"):
                    continue
                lat = {
                    key: (a["latency_ms"][key]["p50"], b["latency_ms"][key]["p50"]) for key in ("greedy_b1", "beam4_b1")
                }
                rounds.append(
                    {
                        "first": order[0]["name"],
                        **{f"{key}_p50_ms": list(v) for key, v in lat.items()},
                        **{f"{key}_p50_ratio": round(x / y, 3) for key, (x, y) in lat.items()},
                    }
                )
            if rounds:
                ours["paired"] = {
                    "peer": theirs["name"],
                    "threads": [theirs["threads"], theirs["threads"]],
                    "rounds": rounds,
                    **{
                        f"{key}_p50_ratio": round(statistics.median(r[f"{key}_p50_ratio"] for r in rounds), 3)
                        for key in ("greedy_b1", "beam4_b1")
                    },
                }
                ctx.log(
                    f"{ours['name']} vs {theirs['name']}, {len(rounds)} paired rounds: p50 ratio "
                    f"{ours['paired']['greedy_b1_p50_ratio']} greedy, {ours['paired']['beam4_b1_p50_ratio']} beam 4"
                )


def pick_best(row: dict) -> None:
    """The row shows the thread count with the lowest batch-1 greedy p50 latency."""
    done = [r for r in row["by_threads"].values() if not r.get("skipped")]
    if not done:
        row["skipped"] = next(iter(row["by_threads"].values()))["skipped"]
        return
    best = min(done, key=lambda r: r["latency_ms"]["greedy_b1"]["p50"])
    for key in ("threads", "latency_ms", "throughput", "peak_rss_mb", "gpu_mem_mb", "load_s", "breakdown"):
        row[key] = best.get(key)
    scored = [r["scores"] for r in row["by_threads"].values() if r.get("scores")]
    if scored:
        row["scores"] = scored[0]


def summary_line(row: dict) -> str:
    lat, tp = row["latency_ms"], row["throughput"]
    return (
        f"{row['name']} ({row['runtime']}, {row['device']}, {row['compute_type']}, {row['threads']} thr): "
        f"greedy p50 {lat['greedy_b1']['p50']:.1f} ms, beam4 p50 {lat['beam4_b1']['p50']:.1f} ms, "
        f"{tp['sent_per_s']:.1f} sent/s at batch {tp['batch']}, RSS {row['peak_rss_mb']:.0f} MB"
    )


# ------------------------------------------------------------------------------ facts
def thread_counts(spec: list, cores: int) -> list[int]:
    counts = [1 if t == "one" else cores if t == "all" else int(t) for t in spec]
    return list(dict.fromkeys(counts))  # "one" and "all" are the same on a 1-core machine


def model_bytes(folder: Path) -> int:
    """Bytes of the weights a runtime loads: safetensors, ONNX graphs and their external data,
    CTranslate2's model.bin. Tokenizer and small JSON files are not counted."""
    folders = [folder] + ([folder / "checkpoint"] if (folder / "checkpoint").is_dir() else [])  # an imported teacher
    weights = [
        p
        for f in folders
        for p in f.iterdir()
        if p.is_file()
        and (
            p.name in ("model.safetensors", "model.bin", "pytorch_model.bin")
            or p.suffix in (".onnx", ".data")
            or p.name.endswith("_data")
        )
    ]
    return sum(p.stat().st_size for p in weights)


def model_facts(artifact: Artifact) -> tuple[int | None, int | None]:
    """(parameters, attention heads in total) of a PyTorch model artifact: its metrics, else its files."""
    metrics = artifact.metrics
    if metrics.get("params") is not None and (metrics.get("heads") is not None or metrics.get("imported")):
        return metrics["params"], metrics.get("heads")
    config = json.loads((artifact.path / "config.json").read_text(encoding="utf-8"))
    heads = sum(config["enc_heads"]) + sum(config["dec_self_heads"]) + sum(config["dec_cross_heads"])
    from safetensors import safe_open

    params = 0
    with safe_open(str(artifact.path / "model.safetensors"), "np") as f:
        for key in f.keys():
            size = 1
            for dim in f.get_slice(key).get_shape():
                size *= dim
            params += size
    return params, heads


def describe_machine(machine: dict) -> dict:
    """What a reader needs to interpret the numbers: CPU, cores, GPU, library versions."""
    info = {
        "cpu": machine.get("cpu"),
        "isa": machine.get("isa"),
        "cores": machine.get("cores") or os.cpu_count() or 1,
        "gpu": machine.get("gpu"),
        "system": machine.get("system"),
        "versions": tool_versions(),
        "runtimes": {},
    }
    info["usable_cores"] = usable_cores()  # what "all" threads means here
    if info["gpu"] and shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader", "-i", "0"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            driver, memory = (x.strip() for x in out.split(",", 1))
            info.update(gpu_driver=driver, gpu_memory=memory)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            pass
    return info
