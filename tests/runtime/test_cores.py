"""mt_runtime/cores.py: how a batch is split among threads, and the measured choice between two
thread counts for one sentence."""

from __future__ import annotations

import threading
import time

import pytest
from mt_runtime.cores import TRIALS, FasterOfTwo, ShardPool, shards


def test_shards_are_contiguous_and_even():
    assert shards(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert shards(list(range(2)), 4) == [[0], [1]]
    assert shards([], 2) == [[]]


def test_the_pool_runs_each_shard_on_its_own_state_and_keeps_the_order():
    pool = ShardPool(["a", "b"])
    seen = []
    out = pool(list(range(5)), lambda state, part: seen.append((state, list(part))) or [f"{state}{x}" for x in part])
    assert out == ["a0", "a1", "a2", "b3", "b4"]
    assert sorted(seen) == [("a", [0, 1, 2]), ("b", [3, 4])]
    assert ShardPool(["a"])(list(range(3)), lambda state, part: [state] * len(part)) == ["a", "a", "a"]


def test_whole_batches_run_at_once_each_on_a_state_no_state_shared():
    pool = ShardPool(["a", "b"])
    busy, lock, overlapped = set(), threading.Lock(), []

    def run(state, batch):
        with lock:
            assert state not in busy  # a state serves one batch at a time
            busy.add(state)
            overlapped.append(len(busy))
        time.sleep(0.02)
        with lock:
            busy.discard(state)
        return [f"{state}:{x}" for x in batch]

    out = pool.each([[0, 1], [2], [3, 4, 5], [6]], run)
    assert [[x.split(":")[1] for x in b] for b in out] == [["0", "1"], ["2"], ["3", "4", "5"], ["6"]]
    assert max(overlapped) == 2  # two batches ran at once
    assert ShardPool(["a"]).each([[1], [2]], run) == [["a:1"], ["a:2"]]


def test_a_stream_keeps_ahead_batches_handed_over_and_yields_them_in_order():
    """No wave waits for its slowest batch: a batch is handed over as soon as one is read, never
    more than `ahead` handed over and unread, and the results come in the batches' order."""
    pulled = []

    def batches():
        for i in range(10):
            pulled.append(i)
            yield [i]

    def run(state, batch):
        time.sleep(0.03 if batch[0] % 3 == 0 else 0.001)  # a slow batch now and then
        return [f"{state}:{batch[0]}"]

    seen = []
    for i, out in enumerate(ShardPool(["a", "b"]).stream(batches(), run, ahead=4)):
        seen.append(int(out[0].split(":")[1]))
        assert len(pulled) == min(10, i + 4)  # handed over: the ones read and the next 4 at most
    assert seen == list(range(10))
    assert list(ShardPool(["a"]).stream(([i] for i in range(3)), run, ahead=4)) == [["a:0"], ["a:1"], ["a:2"]]


def test_a_stream_left_unread_starts_no_more_of_its_batches():
    started = []

    def run(state, batch):
        started.append(batch[0])
        time.sleep(0.02)
        return batch

    stream = ShardPool(["a", "b"]).stream(([i] for i in range(20)), run, ahead=3)
    assert next(stream) == [0]
    stream.close()  # the caller stopped reading (an error in its own work, say)
    time.sleep(0.1)
    assert len(started) <= 4  # the 3 handed over, and the one handed over as the first was read


def test_a_stream_that_fails_returns_only_once_none_of_its_batches_runs():
    """An error in one batch: the others handed over finish (or never start) before the error
    reaches the caller, so the caller's next call finds every state free."""
    running = set()

    def run(state, batch):
        running.add(batch[0])
        try:
            if batch[0] == 0:
                raise RuntimeError("batch 0 failed")
            time.sleep(0.1)
            return batch
        finally:
            running.discard(batch[0])

    with pytest.raises(RuntimeError, match="batch 0"):
        list(ShardPool(["a", "b"]).stream(([i] for i in range(6)), run, ahead=4))
    assert not running


def test_the_faster_side_is_chosen_per_kind_after_its_trials():
    def sleeper(seconds):
        return lambda x: time.sleep(seconds) or [x]

    calls = {"slow": 0, "fast": 0}

    def counted(name, seconds):
        def run(x):
            calls[name] += 1
            return sleeper(seconds)(x)

        return run

    choice = FasterOfTwo(counted("slow", 0.02), counted("fast", 0.001))
    for i in range(2 * (TRIALS + 1)):
        assert choice("greedy", len, i) == [i]
    assert choice.describe() == {"greedy": "n"}
    before = dict(calls)
    for i in range(5):
        choice("greedy", len, i)
    assert calls["fast"] == before["fast"] + 5 and calls["slow"] == before["slow"]
    assert "beam" not in choice.describe()  # another kind measures anew
