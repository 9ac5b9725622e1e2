"""A training step's batch, made on the host: collation and the teacher's top k gathered with a
few NumPy calls over the memory-mapped corpus, and a loader thread that makes batches ahead.

A batch holds what a step needs on the device: the padded source and decoder input, where the
target tokens are among the flattened [batch * positions] (the model selects them with
index_select: a boolean mask would make a CUDA host wait for the device), the targets there and,
for word-level distillation, the teacher's k words and probabilities there. Each is a function
of the batch's pair indices alone, so the batches, and the training, are the same whether a
thread makes them ahead or the step makes them when it needs them.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from ..corpora.encoded import Corpus, Ragged


@dataclass
class Batch:
    src: torch.Tensor  # [B, S] source ids, padded
    tgt_in: torch.Tensor  # [B, T] BOS + target ids, padded
    keep: torch.Tensor  # [N] positions of the target tokens in the flattened [B * T], in order
    target: torch.Tensor  # [N] the target token at each
    soft_ids: torch.Tensor | None = None  # [N, k] the teacher's words there (zero probabilities: none)
    soft_probs: torch.Tensor | None = None  # [N, k] float32
    tokens: int = 0  # N, known without asking the device

    def to(self, device, non_blocking: bool = False) -> "Batch":
        """On `device` (the same tensors where they are there already); non_blocking from pinned memory."""

        def move(t):
            return None if t is None else t.to(device, non_blocking=non_blocking)

        return Batch(
            move(self.src),
            move(self.tgt_in),
            move(self.keep),
            move(self.target),
            move(self.soft_ids),
            move(self.soft_probs),
            self.tokens,
        )


def _rows(rows: Ragged, index: np.ndarray, extra: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows `index` of `rows` side by side, `extra` columns wider than the longest: (ids [B, W]
    int64, anything past a row's end; inside [B, W], True within it; lengths [B])."""
    starts = rows.offsets[index]
    lengths = rows.offsets[index + 1] - starts
    cols = np.arange((int(lengths.max()) if len(index) else 0) + extra)
    inside = cols < lengths[:, None]
    flat = np.asarray(rows.ids)  # a memory map's plain view: indexing it makes no memmap objects
    ids = flat[np.where(inside, starts[:, None] + cols, 0)] if flat.size else np.zeros(inside.shape, flat.dtype)
    return ids.astype(np.int64), inside, lengths


def collate_arrays(corpus: Corpus, index, pad: int, bos: int, eos: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(source [B, S], decoder input BOS + target [B, T], decoder output target + EOS [B, T]),
    padded, T one more than the longest target."""
    index = np.asarray(index, dtype=np.int64)
    src, inside, _ = _rows(corpus.src, index, 0)
    src[~inside] = pad
    tgt, inside, lengths = _rows(corpus.tgt, index, 1)
    tgt_out = np.where(inside, tgt, pad)
    tgt_out[np.arange(len(index)), lengths] = eos
    tgt_in = np.empty_like(tgt_out)
    tgt_in[:, 0] = bos
    tgt_in[:, 1:] = np.where(inside[:, :-1], tgt[:, :-1], pad)
    return src, tgt_in, tgt_out


def _soft_at(corpus: Corpus, index: np.ndarray, row_of: np.ndarray, col: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The stored teacher distributions at positions (batch row, column): ids [N, k] int64 and
    probabilities [N, k] float32, zero past a pair's stored positions and for a pair without any
    (then it learns from its label alone); k is 1 where no pair of the batch has any."""
    soft = corpus.soft
    rows = np.asarray(soft.rows[index])
    has = rows >= 0
    store = soft.store
    lengths = np.where(has, store.lengths[np.maximum(rows, 0)], 0) if has.any() else np.zeros(len(rows), np.int64)
    if not (lengths > 0).any():
        return np.zeros((len(col), 1), np.int64), np.zeros((len(col), 1), np.float32)
    inside = col < lengths[row_of]
    at = np.where(inside, store.offsets[np.maximum(rows, 0)][row_of] + col, 0)
    ids = np.asarray(store.ids)[at].astype(np.int64)
    probs = np.asarray(store.probs)[at].astype(np.float32)
    ids[~inside] = 0
    probs[~inside] = 0
    return ids, probs


def prepare_batch(corpus: Corpus, index, pad: int, bos: int, eos: int, soft: bool = False, pin: bool = False) -> Batch:
    """The batch of pairs `index` on the host (pinned for a non-blocking copy where `pin`); with
    `soft`, the teacher's stored distributions at its target positions."""
    index = np.asarray(index, dtype=np.int64)
    src, tgt_in, tgt_out = collate_arrays(corpus, index, pad, bos, eos)
    keep = np.flatnonzero(tgt_out != pad)
    arrays = [src, tgt_in, keep, tgt_out.reshape(-1)[keep]]
    if soft:
        arrays += _soft_at(corpus, index, *np.divmod(keep, tgt_out.shape[1]))
    tensors = [torch.from_numpy(a) for a in arrays]
    if pin:
        tensors = [t.pin_memory() for t in tensors]
    return Batch(*tensors, tokens=len(keep))


def collate(corpus: Corpus, index, pad: int, bos: int, eos: int, device) -> tuple:
    """(source, decoder input, decoder output) of pairs `index` as tensors on `device` (collate_arrays)."""
    return tuple(torch.from_numpy(a).to(device) for a in collate_arrays(corpus, index, pad, bos, eos))


def collate_soft(corpus: Corpus, index, positions: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The pairs' stored teacher distributions as ids and probabilities [batch, positions, k]; zero
    probabilities past a target's end and for a pair without any (it learns from its labels alone)."""
    index = np.asarray(index, dtype=np.int64)
    row_of, col = np.divmod(np.arange(len(index) * positions), positions)
    ids, probs = _soft_at(corpus, index, row_of, col)
    shape = (len(index), positions, ids.shape[1])
    return torch.from_numpy(ids.reshape(shape)).to(device), torch.from_numpy(probs.reshape(shape)).to(device)


# ------------------------------------------------------------------------- the loader
@dataclass
class _Failed:
    error: BaseException
    position: int


class BatchFeed:
    """The batches `prepare(index)` makes of `indices`, in their order. With `ahead` > 0 a thread
    makes them, at most `ahead` waiting (a bounded queue), while the steps run; an error there
    is raised here, once and as itself, when its batch is asked for. Leave the `with` (or close)
    to stop the thread: it finishes the batch in hand and ends. With `ahead` 0 each batch is
    made when asked for, in this thread."""

    def __init__(self, prepare: Callable, indices: Sequence, ahead: int = 0):
        self._prepare, self._indices = prepare, indices
        self._taken = 0
        self._thread: threading.Thread | None = None
        if ahead > 0 and len(indices):
            self._queue: queue.Queue = queue.Queue(maxsize=ahead)
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._work, name="batch-loader", daemon=True)
            self._thread.start()

    def __iter__(self) -> "BatchFeed":
        return self

    def __next__(self):
        if self._taken >= len(self._indices):
            raise StopIteration
        if self._thread is None:
            item = self._prepare(self._indices[self._taken])
        else:
            item = self._queue.get()
            if isinstance(item, _Failed):
                self._taken = len(self._indices)
                self.close()
                item.error.add_note(
                    f"(raised in the batch loader thread, making batch {item.position + 1} of {len(self._indices)})"
                )
                raise item.error
        self._taken += 1
        return item

    def _work(self) -> None:
        for position in range(len(self._indices)):
            if self._stop.is_set():
                return
            try:
                item = self._prepare(self._indices[position])
            except BaseException as error:  # noqa: BLE001 - raised in the consumer's thread
                item = _Failed(error, position)
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.05)
                    break
                except queue.Full:
                    continue
            if isinstance(item, _Failed):
                return

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._taken = len(self._indices)

    def __enter__(self) -> "BatchFeed":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
