"""Where the batch-1 greedy time of an ONNX package goes: tokenizer, encoder, decoder steps,
the search loop around them, and inside the decoder graph the operators ORT spends it on
(through the step graphs; where the package has generate.onnx, its total is shown too).

    python scripts/profile_runtime.py PACKAGE_DIR SENTENCES.txt [--threads 1] [--sentences 40]

It times the same sentences as the benchmark stage (one at a time, after a warm-up pass), then
runs them once more with onnxruntime's profiler on to split the decoder's time by operator type.

    python scripts/profile_runtime.py PACKAGE_DIR SENTENCES --batch 32 [--beam 4] [--sentences 64]

Batches instead, as `translate` searches them (SENTENCES: text, .gz, or a shape bench package's
job.json, whose every hypothesis is forced to its steps): the ms a batch with and without the
profiler, then per graph the ms a run and the operator types' and the heaviest nodes' shares of it.
The profiler adds a few microseconds a node, so small nodes read heavier than they are; an If's
share holds its branch's nodes, which are also listed on their own.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import time
from pathlib import Path

import onnxruntime as ort
from mt_runtime.search import greedy_search, prepare_sources
from mt_runtime.translator import OnnxDecoder, Translator


class TimedDecoder:
    """An IncrementalDecoder that adds up the time spent inside encode() and step()."""

    def __init__(self, inner: OnnxDecoder):
        self.inner = inner
        self.encode_s = self.step_s = 0.0
        self.steps = 0

    def encode(self, src, beam):
        t = time.perf_counter()
        self.inner.encode(src, beam)
        self.encode_s += time.perf_counter() - t

    def step(self, tokens, parents):
        t = time.perf_counter()
        out = self.inner.step(tokens, parents)
        self.step_s += time.perf_counter() - t
        self.steps += 1
        return out


def sessions(folder: Path, threads: int, pad_id: int, profile: bool) -> OnnxDecoder:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.enable_profiling = profile
    made = [
        ort.InferenceSession(str(folder / f"{g}.onnx"), options, providers=["CPUExecutionProvider"])
        for g in ("encoder", "decoder")
    ]
    return OnnxDecoder(*made, pad_id=pad_id)


def profile_totals(trace: Path) -> tuple[list[float], dict[str, float], dict[str, float]]:
    """From onnxruntime's profile: each run's microseconds, and the kernels' by operator type and by node."""
    events = json.loads(trace.read_text())
    runs = [e["dur"] for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    by_op: dict[str, float] = collections.defaultdict(float)
    by_node: dict[str, float] = collections.defaultdict(float)
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_op[event["args"]["op_name"]] += event["dur"]
            by_node[event["name"].removesuffix("_kernel_time")] += event["dur"]
    return runs, by_op, by_node


def profile_batches(args) -> None:
    """Every graph the Translator runs for batches of `args.batch` at `args.beam`, profiled."""
    from runtime_ab import batches  # scripts/: the same batches as the A/B of two runtimes

    plain = Translator(args.package, threads=args.threads)
    work, gen = batches(plain, args.sentences, args.count, args.batch)
    gen = dataclasses.replace(gen, beam=args.beam)

    def ms_a_batch(translator) -> float:
        for batch in work[:1]:
            translator.searcher(batch, gen)
        start = time.perf_counter()
        for batch in work:
            translator.searcher(batch, gen)
        return 1000 * (time.perf_counter() - start) / len(work)

    plain_ms = ms_a_batch(plain)
    opened = ort.InferenceSession.__init__
    made: list[tuple[ort.InferenceSession, str]] = []

    def profiling(session, path, options=None, *rest, **named):
        if options is not None:
            options.enable_profiling = True
        opened(session, path, options, *rest, **named)
        made.append((session, Path(path).name if isinstance(path, (str, Path)) else "a graph from bytes"))

    ort.InferenceSession.__init__ = profiling
    try:
        profiled = Translator(args.package, threads=args.threads)
    finally:
        ort.InferenceSession.__init__ = opened
    profiled_ms = ms_a_batch(profiled)
    print(
        f"{args.package}: batches of {args.batch} ({len(work)}), beam {args.beam}, {args.threads} thread(s): "
        f"{plain_ms:.2f} ms a batch, {profiled_ms:.2f} profiled"
    )
    for session, name in made:
        trace = Path(session.end_profiling())
        runs, by_op, by_node = profile_totals(trace)
        trace.unlink()
        if not runs:
            continue
        total = sum(runs)
        print(f"  {name}: {len(runs)} runs, {total / 1000 / len(runs):.3f} ms a run")
        for label, table in (("op", by_op), ("node", by_node)):
            heaviest = sorted(table.items(), key=lambda kv: -kv[1])[: args.top]
            print("    " + "; ".join(f"{key} {100 * us / total:.1f}%" for key, us in heaviest) + f" (by {label})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("package", type=Path)
    ap.add_argument("sentences", type=Path)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sentences", dest="count", type=int, default=40)
    ap.add_argument("--batch", type=int, default=1, help="above 1: batches as translate searches them")
    ap.add_argument("--beam", type=int, default=1, help="with --batch")
    ap.add_argument("--top", type=int, default=8, help="with --batch: operator types and nodes shown a graph")
    args = ap.parse_args()
    if args.batch > 1:
        profile_batches(args)
        return

    translator = Translator(args.package, threads=args.threads)
    gen = dataclasses.replace(translator.generation, beam=1)
    lines = args.sentences.read_text(encoding="utf-8").splitlines()[: args.count]

    decoder = TimedDecoder(sessions(args.package, args.threads, gen.pad_id, profile=False))
    for line in lines:  # warm-up
        greedy_search(decoder, prepare_sources(translator.tokenizer, [line], gen.max_positions), gen)
    decoder = TimedDecoder(decoder.inner)
    tokenize_s = detok_s = 0.0
    start = time.perf_counter()
    for line in lines:
        t = time.perf_counter()
        src = prepare_sources(translator.tokenizer, [line], gen.max_positions)
        tokenize_s += time.perf_counter() - t
        out = greedy_search(decoder, src, gen)
        t = time.perf_counter()
        translator.tokenizer.decode(out)
        detok_s += time.perf_counter() - t
    total = time.perf_counter() - start
    n = len(lines)
    ms = lambda s: round(1000 * s / n, 3)  # noqa: E731  per sentence
    breakdown = {
        "sentences": n,
        "threads": args.threads,
        "total_ms": ms(total),
        "tokenize_ms": ms(tokenize_s),
        "encoder_ms": ms(decoder.encode_s),
        "decoder_ms": ms(decoder.step_s),
        "search_loop_ms": ms(total - tokenize_s - detok_s - decoder.encode_s - decoder.step_s),
        "detokenize_ms": ms(detok_s),
        "steps_per_sentence": round(decoder.steps / n, 2),
        "ms_per_decoder_step": round(1000 * decoder.step_s / decoder.steps, 4),
    }

    if translator.graph_search:  # the package's own path: the loop inside onnxruntime, one opaque call
        for _ in range(2):  # a warm-up pass, then the timed one (as for the step graphs)
            start = time.perf_counter()
            for line in lines:
                translator.translate([line], beam=1, max_batch=1)
        breakdown["generate_onnx_total_ms"] = ms(time.perf_counter() - start)

    profiled = sessions(args.package, args.threads, gen.pad_id, profile=True)
    for line in lines:
        greedy_search(profiled, prepare_sources(translator.tokenizer, [line], gen.max_positions), gen)
    trace = Path(profiled.decoder.end_profiling())
    profiled.encoder.end_profiling()
    runs, by_op, _ = profile_totals(trace)
    run_us = sum(runs)
    kernels = sum(by_op.values())
    breakdown["decoder_graph"] = {
        "kernel_share_of_run": round(kernels / run_us, 3) if run_us else None,
        "ops_ms_per_sentence": {
            op: round(us / 1000 / n, 3) for op, us in sorted(by_op.items(), key=lambda kv: -kv[1])[:12]
        },
    }
    for path in Path(".").glob("onnxruntime_profile_*.json"):
        path.unlink()
    print(json.dumps(breakdown, indent=2))


if __name__ == "__main__":
    main()
