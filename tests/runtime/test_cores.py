"""mt_runtime/cores.py: how a batch is split among threads, and the measured choice between two
thread counts for one sentence."""

from __future__ import annotations

import threading
import time

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
