"""What Python's interpreter lock costs threads: a package's greedy step graph in a loop, with a
pure-Python pause held after each run, in one worker, in two threads of one process and in two
processes.

    python scripts/lock_cost.py PACKAGE [--rows 32] [--pauses 0,70,145,290] [--seconds 6]

Each worker runs decoder_greedy_inplace.onnx (one thread, its cache bound in place, random keys
and values, the whole vocabulary) as fast as it can for --seconds, then spins in Python for the
pause (in microseconds), holding the lock as a search's NumPy and bookkeeping would. Printed per
pause: that pause's share of one worker's step, the steps a second of each configuration and the
two-worker ones over one worker. Where threads fall behind processes, the lock is the difference:
compare with the Python share a real search measures (docs/results.md, "What the interpreter
lock costs threads"). Each configuration runs in a fresh process of its own.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

GRAPH = "decoder_greedy_inplace.onnx"


def step_loop(package: Path, rows: int):
    """A function running one step of the package's greedy graph, every input bound once."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(package / GRAPH), options, providers=["CPUExecutionProvider"])
    sizes = {"batch": rows, "past_batch": rows, "src_len": 16, "capacity": 64}
    rng = np.random.default_rng(0)
    binding, kept = session.io_binding(), []
    for value in session.get_inputs():
        shape = [sizes.get(d, 0) if not isinstance(d, int) else d for d in value.shape]
        if value.name == "tokens":
            array = np.full(shape, 5, np.int64)
        elif value.name == "src_mask":
            array = np.ones(shape, bool)
        elif value.name == "past_sequence_length":
            array = np.array([10], np.int32)
        elif value.name == "shortlisted":
            array = np.array([False])  # the whole vocabulary
        elif value.name.startswith("shortlist_"):
            array = np.zeros(shape, np.int8 if value.type == "tensor(int8)" else np.float32)
        else:
            array = rng.standard_normal(shape).astype(np.float32)
        if value.name.startswith("past_") and value.name != "past_sequence_length":
            buffer = ort.OrtValue.ortvalue_from_numpy(array)  # written in place, as the runtime binds it
            binding.bind_ortvalue_input(value.name, buffer)
            binding.bind_ortvalue_output(value.name.replace("past_", "present_", 1), buffer)
        else:
            binding.bind_cpu_input(value.name, array)
        kept.append(array)
    for value in session.get_outputs():
        if not value.name.startswith("present_"):
            binding.bind_output(value.name, "cpu")
    return lambda: (kept, session.run_with_iobinding(binding))  # kept: the bound arrays must outlive the binding


def steps_a_second(package: Path, rows: int, pause_us: float, seconds: float, threads: int, numpy: bool) -> float:
    counts = [0] * threads

    def worker(index: int) -> None:
        step = step_loop(package, rows)
        scores = np.random.default_rng(index).standard_normal((rows, 2000)).astype(np.float32)
        for _ in range(20):
            step()
        done, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            step()
            resume = time.perf_counter() + pause_us * 1e-6
            while time.perf_counter() < resume:  # Python holding the lock (NumPy: letting it go inside each call)
                if numpy:
                    scores.argmax(axis=-1)
            done += 1
        counts[index] = done

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(counts) / seconds


def at_once(workers: list[list[str]]) -> list[float]:
    """Steps a second of each worker process (this script's --worker), all started together."""
    started = [subprocess.Popen([sys.executable, __file__, *w], stdout=subprocess.PIPE, text=True) for w in workers]
    return [float(json.loads(p.communicate()[0].strip().splitlines()[-1])) for p in started]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("package", type=Path)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--pauses", default="0,70,145,290", help="microseconds of Python after each step")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--numpy", action="store_true", help="spend the pause in NumPy calls (argmax over [rows, 2000])")
    ap.add_argument("--worker", nargs=2, metavar=("PAUSE", "THREADS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not (args.package / GRAPH).is_file():
        raise SystemExit(f"{args.package}: no {GRAPH} (a package of format 2.1 or later)")
    common = [
        str(args.package),
        "--rows",
        str(args.rows),
        "--seconds",
        str(args.seconds),
        *(["--numpy"] if args.numpy else []),
    ]
    if args.worker:
        pause, threads = float(args.worker[0]), int(args.worker[1])
        print(json.dumps(steps_a_second(args.package, args.rows, pause, args.seconds, threads, args.numpy)))
        return
    print(f"{args.package / GRAPH}: {args.rows} rows, {args.seconds:g} s a configuration")
    for pause in (float(p) for p in args.pauses.split(",")):
        single, double = [*common, "--worker", str(pause), "1"], [*common, "--worker", str(pause), "2"]
        (one,), (two_threads,) = at_once([single]), at_once([double])
        two_processes = sum(at_once([single, single]))
        share = pause * 1e-6 * one
        print(
            f"  pause {pause:g} us ({share:.0%} of a step): 1 worker {one:.0f} steps/s, "
            f"2 threads {two_threads:.0f} ({two_threads / one:.2f}x), "
            f"2 processes {two_processes:.0f} ({two_processes / one:.2f}x)"
        )


if __name__ == "__main__":
    main()
