"""The self-attention cache of greedy batches, written in place by decoder_greedy_inplace.onnx.

decoder_greedy.onnx returns each step's cache as new arrays, one position longer: onnxruntime's
MultiHeadAttention copies the whole cache into them. decoder_greedy_inplace.onnx takes buffers of
`capacity` positions and `past_sequence_length`, and writes only the step's row, into the buffer
it reads: its present_* are bound here to the same memory as its past_* (onnxruntime's I/O
binding). Same products, same softmax over the same positions: the logits are bit-identical to
decoder_greedy.onnx's (docs/decisions.md). Rows that change place (a batch dropping its finished
sentences) are gathered here with NumPy, once, instead of by the graph.

Everything a step writes or reads each time (the cache, the tokens, the position, the logits) is
a NumPy array bound once and written in place: at batch 32 of the default student a step's
graph run is a few hundred microseconds, and binding anew, allocating the logits and moving every
row after a dropped one had added a fifth to it (docs/decisions.md, issue 58).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from .layout import LOGITS, PAST_SEQUENCE_LENGTH, TOKENS

_FIRST_CAPACITY = 32  # positions; doubled when a step needs more


def row_moves(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The places that change when `rows` are taken, and the rows they take: computed once for
    all of a search's arrays (take_rows's `moves`)."""
    moved = np.flatnonzero(rows != np.arange(len(rows)))
    return moved, rows[moved]


def take_rows(
    array: np.ndarray, rows: np.ndarray, positions: int | None = None, moves: tuple | None = None
) -> np.ndarray:
    """array[:len(rows)] = array[rows] in place, copying only the rows that change place: the
    searches fill a dropped sentence's place with the last rows (search.fill_from_the_end), so
    dropping one moves one row, not every row after it. `positions`: only that many of axis 2
    (a cache's filled part); `moves`: row_moves(rows), if known. Returns the view of the rows taken."""
    n = len(rows)
    if n > len(array):
        raise ValueError(f"take_rows: {n} rows asked of {len(array)}")
    moved, sources = row_moves(rows) if moves is None else moves
    if len(moved):
        part = (slice(None), slice(0, positions)) if positions is not None else ()
        if sources.min() >= n:  # no row is read after it is written (fill_from_the_end's moves)
            for place, source in zip(moved.tolist(), sources.tolist()):
                array[(place, *part)] = array[(source, *part)]  # a row's copy, no temporary
        else:
            array[(moved, *part)] = array[(sources, *part)]  # the right side is a copy
    return array[:n]


class InPlaceCache:
    """The buffers of one search (one decoder state) and the binding that feeds them."""

    def __init__(self, session: ort.InferenceSession, past_names: list[str]):
        self.session = session
        self.past_names = past_names
        fed_each_step = {TOKENS, PAST_SEQUENCE_LENGTH, *past_names}
        self.inputs = [i.name for i in session.get_inputs() if i.name not in fed_each_step]  # from the feed
        self.buffers: dict[str, np.ndarray] = {}  # the search's rows of _store's arrays
        self._store: dict[str, np.ndarray] = {}
        self.filled = 0  # positions of the cache that hold keys and values
        self._binding: ort.IOBinding | None = None  # made at the first step: the session may not be open yet
        self._position = np.zeros(1, np.int32)  # past_sequence_length, bound once
        self._tokens = np.zeros((0, 1), np.int64)  # the step's tokens: rows of _token_store
        self._token_store = self._tokens
        self._logits: np.ndarray | None = None  # the search's rows of _logit_store, once its width is known
        self._logit_store: np.ndarray | None = None
        self._stale = True  # the buffers above moved: bind them again before the next step
        # name -> (the feed's array, what is bound): a binding holds a pointer, not a reference
        self._bound: dict[str, tuple] = {}
        self._bound[PAST_SEQUENCE_LENGTH] = (self._position, ort.OrtValue.ortvalue_from_numpy(self._position))

    def load(self, past: dict[str, np.ndarray]) -> None:
        """Start from a cache given as arrays [rows, heads, filled, head_size] (decoder.onnx's form)."""
        self.filled = past[self.past_names[0]].shape[2]
        rows = past[self.past_names[0]].shape[0]
        capacity = self._capacity() if self._capacity() > self.filled else max(_FIRST_CAPACITY, 2 * (self.filled + 1))
        self._hold(rows, capacity, {name: a.shape for name, a in past.items()})
        for name in self.past_names:
            self.buffers[name][:, :, : self.filled] = past[name]
        if len(self._token_store) < rows or len(self._token_store) > 2 * max(rows, 1):
            self._token_store = np.zeros((rows, 1), np.int64)
        self._tokens = self._token_store[:rows]
        self._logits = None  # a new search may project onto other words: its width is learnt at its first step

    def _capacity(self) -> int:
        return next(iter(self._store.values())).shape[2] if self._store else 0

    def _hold(self, rows: int, capacity: int, shapes: dict, grow: bool = False) -> None:
        """Buffers of `rows` rows: the first rows of arrays kept from search to search (a fresh
        array is page faults and zeroing every batch), made anew when they do not fit; `grow`:
        the same search goes on in them (its filled positions are carried over)."""
        for name in self.past_names:
            _, heads, _, dim = shapes[name]
            store = self._store.get(name)
            # A store of more than twice the rows (an earlier, larger batch) is let go: what a
            # server holds between batches stays within twice what its batches need.
            if store is None or not rows <= store.shape[0] <= 2 * max(rows, 1) or store.shape[2] != capacity:
                grown = np.zeros((rows, heads, capacity, dim), np.float32)
                if grow:
                    grown[:, :, : self.filled] = self.buffers[name][:, :, : self.filled]
                self._store[name] = grown
            self.buffers[name] = self._store[name][:rows]
        self._stale = True

    def arrays(self) -> dict[str, np.ndarray]:
        """The cache as decoder.onnx's arrays (copies): for a step through another graph."""
        return {name: np.ascontiguousarray(b[:, :, : self.filled]) for name, b in self.buffers.items()}

    def reorder(self, parents: np.ndarray) -> None:
        """Row i continues row parents[i] from now on: within the same arrays, the rows that change
        place only, their filled positions only (take_rows)."""
        n = len(parents)
        moves = row_moves(parents)
        for name, buffer in self.buffers.items():
            take_rows(buffer, parents, self.filled, moves)
            self.buffers[name] = self._store[name][:n]
        self._tokens = self._token_store[:n]
        if self._logits is not None:
            self._logits = self._logit_store[:n]
        self._stale = True

    def _bind_buffers(self) -> None:
        if self._binding is None:
            self._binding = self.session.io_binding()
            self._binding.bind_ortvalue_input(PAST_SEQUENCE_LENGTH, self._bound[PAST_SEQUENCE_LENGTH][1])
        binding = self._binding
        for name, buffer in self.buffers.items():
            # One OrtValue over the NumPy buffer as both input and output: the step writes
            # where it reads.
            value = ort.OrtValue.ortvalue_from_numpy(buffer)
            binding.bind_ortvalue_input(name, value)
            binding.bind_ortvalue_output(name.replace("past_", "present_", 1), value)
            self._bound[name] = (buffer, value)
        for name, array in ((TOKENS, self._tokens), (LOGITS, self._logits)):
            if array is None:  # the logits' width is not known yet: onnxruntime allocates them
                binding.bind_output(LOGITS, "cpu")
                continue
            value = ort.OrtValue.ortvalue_from_numpy(array)
            (binding.bind_ortvalue_input if name == TOKENS else binding.bind_ortvalue_output)(name, value)
            self._bound[name] = (array, value)
        self._stale = False

    def step(self, tokens: np.ndarray, feed: dict) -> np.ndarray:
        """One step: the logits [rows, words], an array the next step overwrites; the buffers then
        hold one position more. `feed` gives every other input by name (src_mask, cross_*, the
        shortlist's)."""
        if self.filled + 1 > self._capacity():
            rows = len(next(iter(self.buffers.values())))
            self._hold(rows, 2 * self._capacity(), {name: b.shape for name, b in self.buffers.items()}, grow=True)
        if self._stale:
            self._bind_buffers()
        binding = self._binding
        for name in self.inputs:  # rebound only when the feed holds another array (keep, a new list)
            value = feed[name]
            if self._bound.get(name, (None,))[0] is not value:
                array = np.ascontiguousarray(value)
                binding.bind_cpu_input(name, array)
                self._bound[name] = (value, array)
        self._tokens[:, 0] = tokens
        self._position[0] = self.filled
        self.session.run_with_iobinding(binding)
        self.filled += 1
        if self._logits is not None:
            return self._logits
        logits = binding.get_outputs()[-1].numpy()
        # From the next step on they are written into arrays of ours, kept from search to search.
        store = self._logit_store
        rows, width = logits.shape
        if store is None or store.shape[1] != width or not rows <= len(store) <= 2 * max(rows, 1):
            store = self._logit_store = np.empty((rows, width), np.float32)
        self._logits = store[:rows]
        self._stale = True
        return logits
