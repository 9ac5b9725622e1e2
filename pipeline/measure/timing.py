"""How the pipeline times things, in one place, so that every latency figure means the same.

- `interleaved`: two or more contestants in one process (fp32 vs int8, unpruned vs pruned,
  PyTorch vs onnxruntime). They take turns item by item, the order alternating, so that a noisy
  neighbour slows each alike; each is warmed up first (first calls allocate); a figure is the
  median over repeats of the mean seconds per item.
- `until_stable`: one contestant per process (the benchmark stage), passes repeated until the
  median settles.
- `percentiles`: what a latency distribution is reported as.

Threads are the caller's to set (they differ by runtime); every caller records them beside the figure.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np


@dataclass
class Interleaved:
    """Per contestant: the mean seconds per item of each repeat, and the first repeat's outputs."""

    seconds: dict[str, list[float]]
    outputs: dict[str, list[Any]] = field(default_factory=dict)

    def median_s(self, name: str) -> float:
        return statistics.median(self.seconds[name])

    def median_ms(self, name: str, digits: int = 3) -> float:
        return round(1000 * self.median_s(name), digits)

    def per_second(self, name: str, digits: int = 1) -> float:
        seconds = self.median_s(name)
        return round(1 / seconds, digits) if seconds else 0.0

    def ratio(self, name: str, baseline: str, digits: int = 3) -> float | None:
        """name's time over baseline's: below 1 is faster."""
        base = self.median_s(baseline)
        return round(self.median_s(name) / base, digits) if base else None


def interleaved(
    contestants: dict[str, Callable[[Any], Any]],
    items: Sequence,
    *,
    repeats: int = 1,
    warmup: int = 2,
    prepare: dict[str, Callable[[Any], Any]] | None = None,
    on_item: Callable[[], None] | None = None,
) -> Interleaved:
    """Time each contestant on every item, turn about. `prepare[name](item)`, where given, runs
    untimed just before that contestant's timed call (an encoder pass before timing decoder
    steps, say). `on_item` is called once per item per repeat (a progress bar's advance)."""
    prepare = prepare or {}
    names = list(contestants)
    for name in names:
        for item in items[:warmup]:
            if name in prepare:
                prepare[name](item)
            contestants[name](item)
    result = Interleaved(seconds={n: [] for n in names}, outputs={n: [] for n in names})
    for r in range(repeats):
        total = dict.fromkeys(names, 0.0)
        for j, item in enumerate(items):
            for name in names if (r + j) % 2 == 0 else names[::-1]:
                if name in prepare:
                    prepare[name](item)
                start = time.perf_counter()
                out = contestants[name](item)
                total[name] += time.perf_counter() - start
                if r == 0:
                    result.outputs[name].append(out)
            if on_item:
                on_item()
        for name in names:
            result.seconds[name].append(total[name] / max(len(items), 1))
    return result


def until_stable(
    one_pass: Callable[[], list[float]], min_repeats: int, max_repeats: int, within: float
) -> tuple[list[float], list[float]]:
    """Run `one_pass()` (a list of numbers) until two consecutive passes' medians differ by less
    than `within` (relative), at least `min_repeats` and at most `max_repeats` times.
    Returns (all values pooled, each pass's median)."""
    pooled, medians = [], []
    for repeat in range(max(max_repeats, min_repeats)):
        values = one_pass()
        pooled += values
        medians.append(statistics.median(values))
        if (
            repeat + 1 >= min_repeats
            and len(medians) >= 2
            and abs(medians[-1] - medians[-2]) <= within * abs(medians[-2])
        ):
            break
    return pooled, medians


def percentiles(values: list[float]) -> dict:
    """p50 / p90 / p99 in milliseconds (linear interpolation, as numpy does), and the mean:
    1000 / mean is the sentences per second of one client translating one sentence at a time."""
    ms = np.asarray(values) * 1000.0
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return {
        "p50": round(float(p50), 3),
        "p90": round(float(p90), 3),
        "p99": round(float(p99), 3),
        "mean": round(float(ms.mean()), 3),
    }
