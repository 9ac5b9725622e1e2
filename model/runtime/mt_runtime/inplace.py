"""The self-attention cache of greedy batches, written in place by decoder_greedy_inplace.onnx.

decoder_greedy.onnx returns each step's cache as new arrays, one position longer: onnxruntime's
MultiHeadAttention copies the whole cache into them. decoder_greedy_inplace.onnx takes buffers of
`capacity` positions and `past_sequence_length`, and writes only the step's row, into the buffer
it reads: its present_* are bound here to the same memory as its past_* (onnxruntime's I/O
binding). Same products, same softmax over the same positions: the logits are bit-identical to
decoder_greedy.onnx's (docs/decisions.md). Rows that change place (a batch dropping its finished
sentences) are gathered here with NumPy, once, instead of by the graph.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from .layout import LOGITS, PAST_SEQUENCE_LENGTH, TOKENS

_FIRST_CAPACITY = 32  # positions; doubled when a step needs more


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
        self._binding = None
        # name -> (the feed's array, the array bound): a binding holds a pointer, not a reference
        self._bound: dict[str, tuple] = {}

    def load(self, past: dict[str, np.ndarray]) -> None:
        """Start from a cache given as arrays [rows, heads, filled, head_size] (decoder.onnx's form)."""
        self.filled = past[self.past_names[0]].shape[2]
        rows = past[self.past_names[0]].shape[0]
        capacity = self._capacity() if self._capacity() > self.filled else max(_FIRST_CAPACITY, 2 * (self.filled + 1))
        self._hold(rows, capacity, {name: a.shape for name, a in past.items()})
        for name in self.past_names:
            self.buffers[name][:, :, : self.filled] = past[name]

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
        self._binding = None

    def arrays(self) -> dict[str, np.ndarray]:
        """The cache as decoder.onnx's arrays (copies): for a step through another graph."""
        return {name: np.ascontiguousarray(b[:, :, : self.filled]) for name, b in self.buffers.items()}

    def reorder(self, parents: np.ndarray) -> None:
        """Row i continues row parents[i] from now on. Where the rows only leave (a batch dropping
        its ended sentences: parents increasing), the others move up within the same arrays, one
        row at a time, their filled positions only."""
        n = len(parents)
        moved = np.flatnonzero(parents != np.arange(n)).tolist() if np.all(np.diff(parents) > 0) else None
        for name, buffer in self.buffers.items():
            if moved is not None:
                for row in moved:
                    buffer[row, :, : self.filled] = buffer[parents[row], :, : self.filled]
            else:
                buffer[:n, :, : self.filled] = buffer[parents, :, : self.filled]  # the right side is a copy
            self.buffers[name] = self._store[name][:n]
        self._binding = None

    def step(self, tokens: np.ndarray, feed: dict) -> np.ndarray:
        """One step: the logits [rows, words]; the buffers then hold one position more. `feed`
        gives every other input by name (src_mask, cross_*, the shortlist's)."""
        if self.filled + 1 > self._capacity():
            rows = len(next(iter(self.buffers.values())))
            self._hold(rows, 2 * self._capacity(), {name: b.shape for name, b in self.buffers.items()}, grow=True)
        binding = self._binding
        if binding is None:
            binding = self._binding = self.session.io_binding()
            self._bound = {}
            for name, buffer in self.buffers.items():
                # One OrtValue over the NumPy buffer as both input and output: the step writes
                # where it reads.
                value = ort.OrtValue.ortvalue_from_numpy(buffer)
                binding.bind_ortvalue_input(name, value)
                binding.bind_ortvalue_output(name.replace("past_", "present_", 1), value)
                self._bound[name] = (buffer, value)
            binding.bind_output(LOGITS, "cpu")
        for name in self.inputs:  # rebound only when the feed holds another array (keep, a new list)
            value = feed[name]
            if self._bound.get(name, (None,))[0] is not value:
                array = np.ascontiguousarray(value)
                binding.bind_cpu_input(name, array)
                self._bound[name] = (value, array)
        for name, array in (
            (TOKENS, np.ascontiguousarray(tokens.reshape(-1, 1), dtype=np.int64)),
            (PAST_SEQUENCE_LENGTH, np.array([self.filled], dtype=np.int32)),
        ):
            binding.bind_cpu_input(name, array)
            self._bound[name] = (array, array)
        self.session.run_with_iobinding(binding)
        self.filled += 1
        return binding.get_outputs()[-1].numpy()
