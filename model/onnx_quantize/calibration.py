"""Calibration inputs for int8_static: real encoder and decoder inputs, recorded while a float
package decodes."""

from __future__ import annotations

import numpy as np


class RecordingDecoder:
    """Wraps an OnnxDecoder (mt_runtime/translator.py) and keeps a copy of every graph input it feeds:
    real encoder and decoder inputs, from real decoding, for calibration."""

    def __init__(self, inner):
        self.inner = inner
        self.feeds: dict[str, list[dict]] = {"encoder": [], "decoder": []}

    def encode(self, src: list[list[int]], beam: int) -> None:
        self.inner.encode(src, beam)
        self.feeds["encoder"].append({"src_ids": self.inner.src_ids})

    def step(self, tokens: np.ndarray, parents: np.ndarray | None) -> np.ndarray:
        feed = dict(self.inner.feed)  # arrays are replaced each step, never changed: a shallow copy is a snapshot
        # First steps (empty cache) are left out: ORT's histogram calibrators fail on empty tensors.
        if feed[self.inner.past_names[0]].shape[2] > 0:
            feed["tokens"] = np.ascontiguousarray(tokens.reshape(-1, 1))
            feed["cache_index"] = self.inner.arange if parents is None else np.array(parents)
            self.feeds["decoder"].append(feed)
        return self.inner.step(tokens, parents)


CALIBRATION_BATCH = 16


def calibration_feeds(fp32, sentences: list[str], on_batch=None) -> dict[str, list[dict]]:
    """Real encoder and decoder inputs, recorded while the fp32 package (an mt_runtime
    Translator) decodes the calibration sentences greedily in batches of CALIBRATION_BATCH:
    every step of the growing cache is represented. `on_batch(n)` after each batch."""
    from mt_runtime.search import greedy_search, prepare_sources

    recorder = RecordingDecoder(fp32.decoder)
    src = prepare_sources(
        fp32.tokenizer, [s for s in sentences if s.strip()], fp32.generation.max_positions, warn=False
    )
    for start in range(0, len(src), CALIBRATION_BATCH):
        batch = src[start : start + CALIBRATION_BATCH]
        greedy_search(recorder, batch, fp32.generation)
        if on_batch:
            on_batch(len(batch))
    return recorder.feeds
