"""`mt-runtime serve`'s batching: worker threads, each with its own Translator, taking the
sentences of concurrent requests from one queue in batches (docs/serving.md, Batching)."""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import Callable

from .translator import Translator


class _Sentence:
    __slots__ = ("arrived", "beam", "future", "request", "text")

    def __init__(self, text: str, beam: int, future: asyncio.Future, request: int):
        self.text, self.beam, self.future, self.request, self.arrived = text, beam, future, request, time.monotonic()


class Workers:
    """Worker threads, each with its own Translator, taking sentences from one queue in batches
    of up to batch_size. A worker whose previous batch held several requests' sentences (requests
    come concurrently) gathers until max_wait after the first sentence arrived (one that waited
    that long already goes at once with what is there); one whose previous batch came from a
    single request takes what is queued and goes, since waiting would only delay a lone client.
    Sentences that arrive while every worker is busy make the next batches whatever the wait.
    Answers go back to the event loop's futures."""

    def __init__(self, make_translator: Callable[[], Translator], workers: int, batch_size: int, max_wait_ms: float):
        self.make_translator, self.count = make_translator, workers
        self.batch_size, self.max_wait = batch_size, max_wait_ms / 1000
        self.queue: queue.SimpleQueue[_Sentence | None] = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []
        self.translators: list[Translator] = []
        self.requests = itertools.count()
        self.batches = self.sentences = 0  # translated, counted on the event loop

    async def start(self) -> None:
        """Load a Translator in each worker thread and start them; raises what loading raised."""
        loop = asyncio.get_running_loop()
        loaded = [loop.create_future() for _ in range(self.count)]
        for i in range(self.count):
            thread = threading.Thread(target=self._run, args=(loop, loaded[i]), name=f"mt-worker-{i}", daemon=True)
            thread.start()
            self.threads.append(thread)
        self.translators = list(await asyncio.gather(*loaded))

    def submit(self, texts: list[str], beam: int) -> list[asyncio.Future]:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in texts]
        request = next(self.requests)
        for text, future in zip(texts, futures):
            self.queue.put(_Sentence(text, beam, future, request))
        return futures

    def stop(self, timeout: float = 10.0) -> None:
        for _ in self.threads:
            self.queue.put(None)
        for thread in self.threads:
            thread.join(timeout)

    def _run(self, loop: asyncio.AbstractEventLoop, loaded: asyncio.Future) -> None:
        try:
            translator = self.make_translator()
            for beam in sorted({1, translator.generation.beam}):  # onnxruntime's first runs allocate
                translator.translate(["warm up"], beam=beam)
                translator.translate(["warm", "up"], beam=beam)
        except Exception as exc:  # noqa: BLE001 (handed to the event loop, which says it in one line)
            loop.call_soon_threadsafe(_settle, loaded, None, exc)
            return
        loop.call_soon_threadsafe(_settle, loaded, translator, None)
        concurrent = False
        while (batch := self._gather(concurrent)) is not None:
            concurrent = len({s.request for s in batch}) > 1
            batch = [s for s in batch if not s.future.cancelled()]
            for beam in sorted({s.beam for s in batch}):
                group = [s for s in batch if s.beam == beam]
                try:
                    texts = [s.text for s in group]
                    out, error = translator.translate(texts, beam=beam, max_batch=self.batch_size), None
                except Exception as exc:  # noqa: BLE001 (answered as a 500 to the requests of this batch)
                    out, error = [None] * len(group), exc
                loop.call_soon_threadsafe(self._answer, [s.future for s in group], out, error)
        close = getattr(translator, "close", None)  # a Translator's child processes (--processes)
        if close is not None:
            close()

    def _gather(self, wait: bool) -> list[_Sentence] | None:
        first = self.queue.get()
        if first is None:
            return None
        batch, deadline = [first], first.arrived + (self.max_wait if wait else 0.0)
        while len(batch) < self.batch_size:
            left = deadline - time.monotonic()
            try:
                item = self.queue.get(timeout=left) if left > 0 else self.queue.get_nowait()
            except queue.Empty:
                break
            if item is None:  # stopping: leave the sign for this worker's next turn
                self.queue.put(None)
                break
            batch.append(item)
        return batch

    def _answer(self, futures: list[asyncio.Future], values: list, error: BaseException | None) -> None:
        """On the event loop: one batch's answers to its futures, and the batch counted."""
        self.batches += 1
        self.sentences += len(futures)
        for future, value in zip(futures, values):
            _settle(future, value, error)


def _settle(future: asyncio.Future, value, error: BaseException | None) -> None:
    if not future.done():
        future.set_exception(error) if error is not None else future.set_result(value)
