"""How a Translator given several threads uses them (docs/serving.md, "Using the cores").

A batch is split into contiguous shards, one per thread, each searched by its own decoder state
over the same onnxruntime sessions opened with one intra-op thread (session.run releases the GIL,
and a sentence's translation does not depend on what else is in its batch, so the answers are
the batch's). Measured on 2 cores, int8_static, batch 32 (issue 58, docs/results.md): two shards
ran 1.4-2.0x one thread, two intra-op threads 1.1-1.8x; a decoder step of 32 rows is too small
to split well inside onnxruntime, and the search's own Python between steps is serial there.
Where a call holds several batches (`translate` on more sentences than one batch takes), whole
batches run at once instead, one per thread, each thread taking the next batch as it finishes one
(ShardPool.stream).

One sentence cannot be split that way: it runs inside generate.onnx, whose intra-op threads
help greedy calls on some machines and slow beam calls on others (2 cores here: greedy 1.13-1.21x
faster at 2 threads, beam 4 0.92x; a 2-core EPYC: greedy 0.73x). So the first calls of each kind
(greedy, beam) alternate between a one-thread session and an N-thread one, and from then on that
kind runs on whichever was faster per token, so more threads never make one sentence slower
than one thread does.
"""

from __future__ import annotations

import collections
import queue
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

WAVE = 4  # batches a translate call keeps handed over and not yet read, per shard or child process
TRIALS = 3  # timed calls of each session per kind before choosing (after one untimed warm-up each)


def shards(batch: Sequence[T], count: int) -> list[Sequence[T]]:
    """`batch` in at most `count` contiguous parts whose sizes differ by one at most (batches
    come sorted by length, so neighbours pad alike)."""
    count = max(1, min(count, len(batch)))
    size, extra = divmod(len(batch), count)
    parts, start = [], 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        parts.append(batch[start:end])
        start = end
    return parts


class ShardPool:
    """Runs run(worker_state, part) for each shard of a batch on its own thread, in order; or,
    given several batches (`each`), each batch whole on a state of its own."""

    def __init__(self, states: list):
        self.states = states
        self.pool = ThreadPoolExecutor(len(states), thread_name_prefix="mt-shard") if len(states) > 1 else None

    def each(self, batches: Sequence[Sequence[T]], run: Callable[[object, Sequence[T]], list[R]]) -> list[list[R]]:
        """run(state, batch) for every batch, as many at once as there are states, each state
        used by one batch at a time; results in the batches' order. Whole batches on separate
        threads scale better than one batch split: a step of 16 rows costs most of what 32 do
        (the default student's greedy batches of 32 on 2 cores: 1.80x one thread, split 1.41x)."""
        return list(self.stream(batches, run, ahead=max(1, len(batches))))

    def stream(
        self, batches: Iterable[Sequence[T]], run: Callable[[object, Sequence[T]], list[R]], ahead: int
    ) -> Iterator[list[R]]:
        """each(), lazily: results in the batches' order as they are ready, a batch handed over
        whenever one is yielded, at most `ahead` handed over and not yet yielded. No wave waits
        for its longest batch, and the caller's work on a result (detokenizing) overlaps the
        shards' search of the next ones: waves of 8 batches at 2 threads left each shard 8-10%
        of a greedy `translate` waiting for work (py-spy, issue 58)."""
        if self.pool is None:
            for batch in batches:
                yield run(self.states[0], batch)
            return
        free: queue.SimpleQueue = queue.SimpleQueue()
        for state in self.states:
            free.put(state)

        def one(batch: Sequence[T]) -> list[R]:
            state = free.get()
            try:
                return run(state, batch)
            finally:
                free.put(state)

        pending: collections.deque[Future] = collections.deque()
        try:
            for batch in batches:
                pending.append(self.pool.submit(one, batch))
                if len(pending) >= ahead:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:  # an error, or a caller that stopped reading: start no more of its batches,
            for future in pending:  # and return only once none runs (their states are free again)
                future.cancel()
            wait(pending)

    def __call__(self, batch: Sequence[T], run: Callable[[object, Sequence[T]], list[R]]) -> list[R]:
        if self.pool is None or len(batch) < 2:
            return run(self.states[0], batch)
        parts = shards(batch, len(self.states))
        done = self.pool.map(run, self.states[: len(parts)], parts)
        return [result for part in done for result in part]


class FasterOfTwo:
    """Chooses, per kind of call, the faster of two interchangeable callables (same answers, other
    thread counts) by timing the first calls of that kind in turns, per unit of work."""

    def __init__(self, one_thread: Callable[..., R], many_threads: Callable[..., R]):
        self.sides = (one_thread, many_threads)
        self.times: dict[str, tuple[list[float], list[float]]] = {}
        self.chosen: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, kind: str, work: Callable[[R], int], *args) -> R:
        if kind in self.chosen:
            return self.sides[self.chosen[kind]](*args)
        with self.lock:
            times = self.times.setdefault(kind, ([], []))
            side = 0 if len(times[0]) <= len(times[1]) else 1
        started = time.perf_counter()
        result = self.sides[side](*args)
        seconds = (time.perf_counter() - started) / max(1, work(result))
        with self.lock:
            times[side].append(seconds)
            if min(len(t) for t in times) > TRIALS:  # the first of each side is a warm-up
                one, many = (statistics.median(t[1:]) for t in times)
                self.chosen[kind] = 0 if one <= many else 1
        return result

    def describe(self) -> dict[str, int]:
        """Intra-op threads chosen so far per kind of call: 1 or 'n' (the Translator's)."""
        return {kind: (1 if side == 0 else "n") for kind, side in self.chosen.items()}
