"""How fast the machine runs a fixed piece of work now, against the rest of the same benchmark.

A shared VM's speed moves by tens of percent over minutes, and the benchmark's rows are measured
minutes apart (one thread's greedy `translate` of the same package read 2191 sentences/s in one
run's benchmark and 1336 in the next's, on the same 2-core VM, docs/results.md): a reader should
know how far it moved before comparing rows. So the stage times a fixed pure-Python loop (the
CPU a core gives this process) and a copy of 32 MB (the memory bandwidth left to it) between its
measurements, never during one, and the report says how far the slowest probe fell below the
fastest.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

STEADY = 0.9  # the slowest probe at or above this share of the fastest: the host held steady
_COPY_BYTES = 32 << 20
_LOOP = 200_000


def probe() -> dict[str, float]:
    """One probe (about 40 ms): the loop's iterations a microsecond, the copy's GB/s; each the best of 3."""
    loop, copy = [], []
    source, target = np.ones(_COPY_BYTES // 8), np.empty(_COPY_BYTES // 8)
    for _ in range(3):
        start = time.perf_counter()
        total = 0
        for i in range(_LOOP):
            total += i & 7
        loop.append(_LOOP / (time.perf_counter() - start) / 1e6)
        start = time.perf_counter()
        np.copyto(target, source)
        copy.append(2 * _COPY_BYTES / (time.perf_counter() - start) / 1e9)  # read and write
    return {"python": max(loop), "memory": max(copy)}


class HostSpeed:
    """Probes taken through a stage, each after a named point of it."""

    def __init__(self, measure=probe):
        self.measure = measure
        self.probes: list[dict] = []

    def after(self, point: str) -> None:
        self.probes.append({"after": point, **self.measure()})

    def summary(self) -> dict:
        """Per kind, the slowest probe as a share of the fastest, where it was, and the median;
        `steady`: every share at or above STEADY."""
        if not self.probes:
            return {}
        out: dict = {"probes": len(self.probes)}
        for kind in ("python", "memory"):
            values = [p[kind] for p in self.probes]
            slowest = min(range(len(values)), key=values.__getitem__)
            out[kind] = {
                "lowest_share": round(values[slowest] / max(values), 3),
                "lowest_after": self.probes[slowest]["after"],
                "median": round(statistics.median(values), 2),
            }
        out["steady"] = all(out[k]["lowest_share"] >= STEADY for k in ("python", "memory"))
        return out


def host_line(
    summary: dict,
    over: str = "the benchmark",
    unsteady: str = "figures of rows measured minutes apart differ by the host as well as by the models; "
    "comparisons taking turns in one process (below) hold better",
) -> str | None:
    """The line on the host's speed over `over` (None without probes); `unsteady`: what that means there."""
    if not summary:
        return None
    python, memory = summary["python"], summary["memory"]
    verdict = "steady: figures measured minutes apart compare" if summary["steady"] else f"**not steady**: {unsteady}"
    return (
        f"**Host speed** over {over} ({summary['probes']} probes between its measurements: a fixed "
        f"Python loop, a 32 MB copy): the slowest at {python['lowest_share']:.2f} and {memory['lowest_share']:.2f} "
        f"of the fastest (after {python['lowest_after']}; after {memory['lowest_after']}); {verdict}."
    )
