"""A Translator's batches searched in child processes (Translator(processes=N), docs/serving.md).

Threads of one process share its interpreter lock, and every decoder step holds it for the
search's own Python around the onnxruntime call. On 2 cores that costs a tenth of the second
thread (the default student's greedy batches of 32, whole batches one per thread: 1.75-1.81x one
thread; the same batches in two processes 2.05x), and on 16-64 cores the lock would queue the
shards. A child process has a lock of its own.

Each child is `python -c` running process_child.child_main, not a multiprocessing start: spawn
and forkserver import the parent's __main__ again, which a script without an `if __name__` guard
cannot bear, and fork would copy onnxruntime's threads' locks mid-use. Parent and child talk over two pipes
with multiprocessing's Connection (pickles, length-prefixed); a child holds a Translator of the
same package and options, and answers one batch at a time. The child checks the package as the
parent did; translations are the same in either, since a sentence's translation does not depend
on its batch.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Iterable, Iterator

from .cores import WAVE, ShardPool

_START_SECONDS = 300  # a child that has not loaded the package by then is taken for stuck


class ChildGone(RuntimeError):
    """A child process ended or failed: the message says which and why."""


class Child:
    """One child process with a Translator; `run(batch, gen, shortlist)` searches a batch there. A
    child that ended fails the call it was serving (ChildGone) and is started again for the next."""

    def __init__(self, folder: Path, options: dict):
        self.folder, self.options = folder, options
        self.lock = threading.Lock()  # one batch at a time; ShardPool gives a child to one thread anyway
        self._spawn()

    def _spawn(self) -> None:
        parent_read, child_write = os.pipe()
        child_read, parent_write = os.pipe()
        package_root = str(Path(__file__).resolve().parent.parent)
        code = (
            f"import sys; sys.path.insert(0, {package_root!r}); "
            "from mt_runtime.process_child import child_main; "
            f"child_main({child_read}, {child_write})"
        )
        self.process = subprocess.Popen(
            [sys.executable, "-c", code],
            pass_fds=(child_read, child_write),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # the pipes carry the answers; onnxruntime's messages go to stderr
        )
        os.close(child_read)
        os.close(child_write)
        self.to_child = Connection(parent_write, readable=False)
        self.from_child = Connection(parent_read, writable=False)
        self.pid = self.process.pid
        self.to_child.send((str(self.folder), self.options))

    def wait_ready(self) -> None:
        """Until the child has loaded the package; ChildGone with its reason where it could not."""
        if not self.from_child.poll(_START_SECONDS):
            raise ChildGone(f"a translation process did not load {self.folder} within {_START_SECONDS} s")
        kind, value = self._answer()
        if kind != "ready":
            raise ChildGone(f"a translation process could not load {self.folder}: {value}")

    def _answer(self):
        try:
            return self.from_child.recv()
        except (EOFError, OSError):
            raise self._gone() from None

    def _gone(self) -> ChildGone:
        return ChildGone(f"translation process {self.process.pid} ended (exit status {self.process.wait()})")

    def run(self, batch: list[list[int]], gen, shortlist: bool) -> list[list[int]]:
        with self.lock:
            if self.process.poll() is not None:  # ended since its last batch (that call said so)
                self._close_pipes()
                self._spawn()
                self.wait_ready()
            try:
                self.to_child.send((batch, gen, shortlist))
            except OSError:
                raise self._gone() from None
            kind, value = self._answer()
        if kind != "ok":
            raise ChildGone(f"translation process {self.pid} failed: {value}")
        return value

    def _close_pipes(self) -> None:
        for conn in (self.to_child, self.from_child):
            if not conn.closed:
                conn.close()

    def close(self) -> None:
        """Tell the child to end (it also ends when its pipe closes), then wait for it briefly."""
        if not self.to_child.closed:
            try:
                self.to_child.send(None)
            except OSError:
                pass
        self._close_pipes()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_children(count: int, folder: Path, options: dict) -> list[Child]:
    """`count` children with a Translator(folder, **options) each, loaded at once; all are stopped
    and ChildGone raised if any fails."""
    children: list[Child] = []
    try:
        for _ in range(count):
            children.append(Child(folder, options))
        for child in children:
            child.wait_ready()
    except BaseException:
        for child in children:
            child.close()
        raise
    return children


class ProcessSearch:
    """A Translator's searcher (PackageSearch's interface) over child processes: a batch of several
    sentences is split among the children (ShardPool, as threads split it), several batches run
    whole, one per child at a time; one sentence runs here, in `local`, the parent's own
    PackageSearch, since a round trip to a child would only add to its latency."""

    def __init__(self, local, decoder, children: list[Child]):
        self.local, self.decoder, self.children = local, decoder, children
        self.shards = ShardPool(children)
        self.one, self.many = local.one, local.many

    def which(self, batch: list[list[int]]) -> str:
        return self.local.which(batch)

    @property
    def at_once(self) -> int:
        # Batches kept handed over: each child takes the next as it finishes one (ShardPool.stream),
        # so a long batch does not hold the others' children idle until a wave ends.
        return WAVE * len(self.children)

    def _run(self, gen):
        shortlist = self.decoder.use_shortlist  # a caller may have turned it off here
        return lambda child, part: child.run(part, gen, shortlist)

    def __call__(self, batch: list[list[int]], gen) -> list[list[int]]:
        if len(batch) == 1:
            return self.local(batch, gen)
        return self.shards(batch, self._run(gen))

    def each(self, batches: list[list[list[int]]], gen) -> list[list[list[int]]]:
        if len(batches) < 2:  # a call of one batch: as __call__ runs it (one sentence here)
            return [self(batch, gen) for batch in batches]
        return self.shards.each(batches, self._run(gen))

    def stream(self, batches: Iterable[list[list[int]]], gen) -> Iterator[list[list[int]]]:
        """each(), lazily, for a translate call: results in order as they are ready (ShardPool.stream)."""
        return self.shards.stream(batches, self._run(gen), self.at_once)

    def describe(self) -> dict:
        return self.local.describe()

    def close(self) -> None:
        for child in self.children:
            child.close()
