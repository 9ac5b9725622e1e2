"""Benchmark stage: latency, throughput, memory and size of every variant on every runtime here.

Rows, in report order:
  - each variant the graph lists (models in PyTorch, ONNX packages in onnxruntime) on its device;
  - the float32 ones again on CUDA when the recipe's devices include it;
  - CTranslate2, the peer, on the final model: int8 and float32 on the CPU (float16 and
    int8_float16 on CUDA). If the final model has uneven heads per layer, which CTranslate2
    cannot express, zero heads are added (same outputs, more work for it; the row says so);
  - an imported teacher through CTranslate2 and through Optimum (its export, its int8), int8 and
    float32 on the CPU: what a Hugging Face user would run without this pipeline. Optimum runs in
    an environment of its own (scripts/optimum_env.sh); without it its rows say so.
A row that cannot be measured here is kept, with `skipped` saying why; it never fails the stage.

Each row is measured once per thread count in `threads` (1 and all cores by default), each time
in a fresh process (pipeline/measure/process.py). The row shows the thread count with the lower
batch-1 greedy p50; every measurement stays in the manifest under `by_threads`.
The CTranslate2 rows also translate and score the whole test set (no evaluate stage covers
them), and their greedy outputs are compared with our PyTorch model's.
"""

from __future__ import annotations

import importlib.util
import json

from model.ctranslate2_export import NotConvertible, compare_greedy, export_ctranslate2, uniform_heads

from ...corpora.data_output import DataOutput
from ...corpora.splits import read_split
from ...engine.context import StageContext
from ...engine.errors import UserInputError
from ...engine.stage import Variant
from ...measure import optimum_peer, peers
from ...measure.facts import describe_machine, model_bytes, model_facts
from ...measure.host_speed import HostSpeed, host_line
from ...measure.jobs import ScoreSpec
from ...measure.rows import BenchmarkRow, pick_best, summary_line, thread_counts
from . import BenchmarkInputs, BenchmarkNode

PARITY_SENTENCES = 10  # sentences whose greedy output ids CTranslate2 must reproduce
CT2_TYPES = {"cpu": ("int8", "float32"), "cuda": ("int8_float16", "float16")}
SCORED_HERE = ("ctranslate2", optimum_peer.RUNTIME)  # runtimes no evaluate stage covers


def run(ctx: StageContext) -> dict:
    cfg: BenchmarkNode = ctx.settings
    data = ctx.inputs.data
    test_sets = DataOutput.of(data.metrics, data.id).test_sets
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
        f"{len(rows)} rows ({sum(1 for r in rows if not r.skipped)} to measure) on {test_set}: "
        f"{len(sample)} sentences, threads {threads}, batch {cfg.batch_size}"
    )

    how = peers.Measuring(cfg.batch_size, cfg.throughput_beam, cfg.min_repeats, cfg.max_repeats, cfg.stable_within)
    host = HostSpeed()
    host.after("the start")
    rows = measure_rows(ctx, rows, threads, sample, how, test_set, machine, host)
    paired = peers.paired_rounds(ctx, rows, sample, how, cfg.final_model, cfg.paired_rounds)
    host.after("the paired rounds")
    spec = cfg.versus
    versus = peers.versus_ctranslate2(
        ctx,
        rows,
        [s for s in src if s.strip()][: spec.sentences],
        cfg.final_model,
        [[batch, beam] for batch in spec.batches for beam in spec.beams],
        spec.rounds,
        spec.separate_rounds,
        threads,
    )
    host.after("the comparison with CTranslate2")
    sample_cores = [s for s in src if s.strip()][: cfg.cores.sentences]
    cores = peers.on_every_core(ctx, rows, sample_cores, cfg.final_model, cfg.cores, cfg.batch_size, machine)
    host.after("the cores' measurement")
    machine["host_speed"] = host.summary()
    ctx.log(host_line(machine["host_speed"]).replace("**", ""))
    rows = [r.but(paired=paired.get(r.name), versus=versus.get(r.name), cores=cores.get(r.name)) for r in rows]
    for row in rows:
        ctx.log(f"{row.name}: skipped: {row.skipped}" if row.skipped else summary_line(row))

    results = [r.to_json() for r in rows]
    report = {
        "test_set": test_set,
        "sentences": len(sample),
        "threads": threads,
        "batch_size": cfg.batch_size,
        "throughput_beam": cfg.throughput_beam,
        "machine": machine,
        "rows": results,
    }
    (ctx.out / "benchmark.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return {
        "rows": len(rows),
        "measured": sum(1 for r in rows if not r.skipped),
        "skipped_rows": sum(1 for r in rows if r.skipped),
        **{k: v for k, v in report.items() if k != "rows"},
        "results": results,
    }


def measure_rows(
    ctx: StageContext,
    rows: list[BenchmarkRow],
    threads: list[int],
    sample: list[str],
    how: peers.Measuring,
    test_set: str,
    machine: dict,
    host: HostSpeed,
) -> list[BenchmarkRow]:
    """Every row not skipped measured at every thread count, each in a fresh process, showing its
    fastest; the peers' rows (CTranslate2, Optimum) also translate and score the whole test set (once). The runtimes'
    versions go to `machine` (once per runtime is enough); `host` is probed after each."""
    data = ctx.inputs.data
    jobs = [(row, n) for row in rows if not row.skipped for n in threads]
    by_threads: dict[str, dict] = {row.name: {} for row in rows}
    hypotheses: dict[str, str] = {}
    with ctx.progress("benchmark", total=len(jobs), unit="measurements") as bar:
        for row, n in jobs:
            score = None
            if row.runtime in SCORED_HERE and not by_threads[row.name]:
                hypotheses[row.name] = f"hypotheses/{row.name}"
                score = ScoreSpec(
                    str(data.file(f"test.{test_set}.src")),
                    str(data.file(f"test.{test_set}.tgt")),
                    [1, 4],
                    test_set,
                    str(ctx.out / hypotheses[row.name]),
                )
            result = by_threads[row.name][str(n)] = peers.measure(ctx, row, n, sample, how, score)
            versions = result.pop("versions", None)
            if versions:
                machine["runtimes"][row.runtime] = versions
            at = f"{n} thread{'s' if n > 1 else ''}"
            bar.advance(1, postfix=f"{row.name} ({at})")
            host.after(f"{row.name} at {at}")  # between two measurements, never during one
    return [
        row if row.skipped else pick_best(row.but(by_threads=by_threads[row.name], hypotheses=hypotheses.get(row.name)))
        for row in rows
    ]


# ---------------------------------------------------------------------------------- rows
def variant_rows(ctx: StageContext, cfg: BenchmarkNode, has_cuda: bool) -> list[BenchmarkRow]:
    rows = []
    onnx_ready = importlib.util.find_spec("mt_runtime.translator") is not None
    inputs: BenchmarkInputs = ctx.inputs
    for v in cfg.variants:
        rows.append(BenchmarkRow.of(v))
        # On a GPU machine the float32 models also run on CUDA (int8 ONNX kernels are CPU-only).
        if "cuda" in cfg.devices and v.device == "cpu" and v.compute_type == "float32":
            rows.append(BenchmarkRow.of(v.model_copy(update={"name": f"{v.name}_cuda", "device": "cuda"})))
    out = []
    for row in rows:
        base = row.name.removesuffix("_cuda")
        row = row.but(skipped=row.skipped or skip_reason(row, cfg, has_cuda, onnx_ready))
        artifact = inputs.variants.get(base)
        if artifact is None:
            out.append(row.but(skipped=row.skipped or f"no input artifact for {base}"))
            continue
        folder = artifact.path / row.package if row.package else artifact.path
        row = row.but(artifact=artifact.id, folder=str(folder), bytes=model_bytes(folder) if folder.is_dir() else None)
        source = inputs.variants.get(row.source)
        if source is not None:
            params, heads = model_facts(source)
            row = row.but(params=params, heads=heads)
        out.append(row)
    return out


def skip_reason(row: BenchmarkRow, cfg: BenchmarkNode, has_cuda: bool, onnx_ready: bool) -> str | None:
    if row.runtime not in cfg.runtimes:
        return f"runtime {row.runtime} not in benchmark.runtimes"
    if row.device not in cfg.devices:
        return f"device {row.device} not in benchmark.devices"
    if row.device == "cuda" and not has_cuda:
        return "no CUDA device on this machine"
    if row.runtime == "onnxruntime" and not onnx_ready:
        return "the ONNX runtime (mt_runtime/translator.py) is not available in this checkout"
    return None


def peer_rows(ctx: StageContext, cfg: BenchmarkNode, has_cuda: bool, sample: list[str]) -> list[BenchmarkRow]:
    """CTranslate2 rows on the final model: convert it, check its greedy outputs against ours, and
    leave the timing to measure_rows(). A final model with uneven heads per layer (CTranslate2 has
    one count per stack) is converted with zero heads added: the same function, more heads computed."""
    model = cfg.final_model
    if model is None or imported_teacher(ctx) is not None and model == "teacher":
        return []  # an imported teacher alone: not our format; its peers are imported_teacher_rows
    rows = [
        BenchmarkRow.of(
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
    missing = ctranslate2_missing()
    artifact = ctx.inputs.variants[model]
    params, heads = model_facts(artifact)
    pad, note = False, None
    try:
        uniform_heads(json.loads(artifact.file("config.json").read_text(encoding="utf-8")))
    except NotConvertible as exc:
        pad, note = True, f"{exc}; zero heads were added up to each stack's largest count"
    out = []
    for row in rows:
        row = row.but(skipped=skip_reason(row, cfg, has_cuda, onnx_ready=True) or missing)
        if row.skipped:
            out.append(row)
            continue
        folder = ctx.out / "ctranslate2" / f"{model}-{row.compute_type}"
        meta = export_ctranslate2(artifact.path, folder, row.compute_type, pad_heads=pad)
        row = row.but(
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
            row = row.but(note=f"{note} (CTranslate2 computes {meta['heads_computed']} heads, ours {meta['heads']})")
        if row.device == "cpu":
            check = compare_greedy(artifact.path, folder, sample[:PARITY_SENTENCES])
            row = row.but(parity=check)
            ctx.log(
                f"CTranslate2 {model} {row.compute_type}: greedy outputs identical to ours on "
                f"{check['identical']}/{check['sentences']} sentences"
            )
        out.append(row)
    return out


def ctranslate2_missing() -> str | None:
    return None if importlib.util.find_spec("ctranslate2") else "ctranslate2 is not installed (pip install '.[peer]')"


def teacher_peer_row(runtime: str, compute_type: str) -> BenchmarkRow:
    """A peer's row of the imported teacher on the CPU, nothing measured yet."""
    return BenchmarkRow.of(
        Variant(
            name=f"{runtime}_teacher_{compute_type}",
            variant="teacher",
            node="teacher",
            source="teacher",
            runtime=runtime,
            compute_type=compute_type,
        )
    )


def imported_teacher(ctx: StageContext):
    """The teacher's artifact where it was imported from a checkpoint, else None."""
    artifact = ctx.inputs.variants.get("teacher")
    return artifact if artifact is not None and artifact.metrics.get("imported") else None


def imported_teacher_rows(ctx: StageContext, cfg: BenchmarkNode) -> list[BenchmarkRow]:
    """An imported teacher through CTranslate2 (its own converter), int8 and float32 on the CPU,
    beside its transformers row: what the model the user started from costs at its fastest."""
    artifact = imported_teacher(ctx)
    if artifact is None:
        return []
    rows = []
    for ct in CT2_TYPES["cpu"]:
        row = teacher_peer_row("ctranslate2", ct)
        row = row.but(skipped=skip_reason(row, cfg, False, onnx_ready=True) or ctranslate2_missing())
        if row.skipped:
            rows.append(row)
            continue
        from model.hf_translator import convert_for_serving

        folder = ctx.out / "ctranslate2" / f"teacher-{ct}"
        try:
            convert_for_serving(artifact.path / "checkpoint", folder, ct)
        except Exception as exc:  # the converter's refusals are of many kinds
            rows.append(
                row.but(skipped=f"CTranslate2 cannot convert this model: {type(exc).__name__}: {str(exc)[:200]}")
            )
            continue
        rows.append(converted(ctx, row, artifact, folder))
    return rows + optimum_teacher_rows(ctx, cfg, artifact)


def optimum_teacher_rows(ctx: StageContext, cfg: BenchmarkNode, artifact) -> list[BenchmarkRow]:
    """The imported teacher as a Hugging Face user would run it by default: Optimum's export and
    its own int8 quantization, ORTModelForSeq2SeqLM's generate, int8 and float32 on the CPU, in
    the Optimum environment (pipeline/measure/optimum_peer.py); skipped with the reason without one."""
    rows = []
    for ct in optimum_peer.COMPUTE_TYPES:
        row = teacher_peer_row(optimum_peer.RUNTIME, ct)
        row = row.but(skipped=skip_reason(row, cfg, False, onnx_ready=True) or optimum_peer.missing(cfg.optimum_env))
        if row.skipped:
            rows.append(row)
            continue
        folder = ctx.out / "optimum" / f"teacher-{ct}"
        try:
            facts = optimum_peer.export(artifact.path / "checkpoint", folder, ct)
        except optimum_peer.OptimumFailed as exc:
            rows.append(row.but(skipped=str(exc)))
            continue
        ctx.log(f"Optimum teacher {ct}: {optimum_peer.note(facts)}")
        rows.append(converted(ctx, row, artifact, folder).but(note=optimum_peer.note(facts)))
    return rows


def converted(ctx: StageContext, row: BenchmarkRow, teacher, folder) -> BenchmarkRow:
    """A peer's row of the imported teacher with the folder its converter wrote, to be measured."""
    return row.but(
        artifact=teacher.id,
        folder=str(folder),
        bytes=model_bytes(folder),
        params=teacher.metrics["params"],
        files=folder.relative_to(ctx.out).as_posix(),
    )
