"""One package on every core, three ways, taking turns in one process (a CoresJob): one thread; one
Translator of N threads (whole batches at once, one a thread: mt_runtime/cores.py); N child
processes of one thread each (Translator(processes=N): mt_runtime/processes.py). What each makes
of `translate` in batches, and which way a server should use here (docs/serving.md): threads share
one interpreter lock, processes do not, and which costs less depends on the machine and the model.
"""

from __future__ import annotations

import math
import statistics

from .jobs import CoresJob
from .timing import interleaved

MODES = ("one", "threads", "processes")


def measure_cores(job: CoresJob) -> dict:
    """Sentences a second of each mode at each beam: every round translates the whole sample once
    with each (the order alternating round by round, so a busy machine slows each alike); a figure
    is the median round's, a speed-up the median of the rounds' own ratios to one thread. Every
    mode must give the one-thread translations (`same`)."""
    from mt_runtime.translator import Translator

    n = job.cores
    translators = {
        "one": Translator(job.package, threads=1),
        "threads": Translator(job.package, threads=n),
        "processes": Translator(job.package, threads=1, processes=n),
    }
    points = []
    try:
        for beam in job.beams:
            kw = dict(beam=beam, max_batch=job.batch, batch_tokens=10**9)
            timed = interleaved(
                {mode: (lambda s, t=t: t.translate(s, **kw)) for mode, t in translators.items()},
                [job.sentences],
                repeats=job.rounds,
                warmup=1,
            )
            seconds = timed.seconds
            points.append(
                {
                    "beam": beam,
                    "sent_per_s": {m: round(len(job.sentences) / statistics.median(seconds[m]), 1) for m in MODES},
                    "speedup": {
                        m: round(statistics.median(o / s for o, s in zip(seconds["one"], seconds[m])), 3)
                        for m in MODES[1:]
                    },
                    "same": all(timed.outputs[m] == timed.outputs["one"] for m in MODES[1:]),
                }
            )
    finally:
        for t in translators.values():
            t.close()
    return {
        "cores": n,
        "batch": job.batch,
        "sentences": len(job.sentences),
        "rounds": job.rounds,
        "points": points,
        "best": best_mode(points),
    }


def best_mode(points: list[dict]) -> str | None:
    """The mode with the higher speed-up over the beams measured (their geometric mean)."""
    if not points:
        return None
    score = {m: math.prod(p["speedup"][m] for p in points) for m in MODES[1:]}
    return max(score, key=score.get)


def serve_flags(best: str, cores: int) -> str:
    """The mt-runtime serve flags of a mode."""
    return f"--threads 1 --processes {cores}" if best == "processes" else f"--threads {cores}"


def cores_line(result: dict) -> str:
    """The measurement in one line: per beam, each mode's sentences/s and speed-up, then the serve
    flags of the faster mode."""
    if result.get("skipped"):
        return f"skipped: {result['skipped']}"
    n = result["cores"]
    parts = []
    for p in result["points"]:
        speed, up = p["sent_per_s"], p["speedup"]
        parts.append(
            f"{'greedy' if p['beam'] == 1 else 'beam ' + str(p['beam'])}: 1 thread {speed['one']:.0f} sentences/s, "
            f"{n} threads {speed['threads']:.0f} ({up['threads']:.2f}x), "
            f"{n} processes {speed['processes']:.0f} ({up['processes']:.2f}x)"
            + ("" if p["same"] else " (TRANSLATIONS DIFFER from one thread's)")
        )
    best = result["best"]
    return (
        f"{'; '.join(parts)}; faster here: {n} {best} "
        f"(mt-runtime serve {serve_flags(best, n)}; translate in batches of {result['batch']}, "
        f"{result['sentences']} sentences, {result['rounds']} rounds taking turns, median)"
    )
