"""A session opened when it first runs: for a graph the searches seldom run.

On the CPU, decoder.onnx (one row's whole distribution a step) serves only the paths that have no
step graph to take (search code driving a Translator step by step, parity checks); the searches
run decoder_batch.onnx and decoder_greedy_inplace.onnx. Each session holds its own copy of the
weights, prepacked for its kernels: at a 6+6-layer d512 model with 58k words, decoder.onnx's took
more memory than any other graph's (docs/decisions.md). A Translator opens it once to check it
against the format and to read its inputs and outputs, lets it go, and opens it again only if
something runs it.
"""

from __future__ import annotations

import threading
from typing import Callable, NamedTuple

import onnxruntime as ort


class Arg(NamedTuple):
    """A graph input's or output's name, shape and type: onnxruntime's NodeArg, copied (a NodeArg
    keeps its session, weights and all, alive)."""

    name: str
    shape: list
    type: str


def _args(node_args) -> list[Arg]:
    return [Arg(a.name, list(a.shape), a.type) for a in node_args]


class LazySession:
    """The inputs, outputs and providers of `session`, which is let go; `reopen()` makes it again
    the first time it runs (once, whichever thread asks first)."""

    def __init__(self, session: ort.InferenceSession, reopen: Callable[[], ort.InferenceSession]):
        self._inputs, self._outputs = _args(session.get_inputs()), _args(session.get_outputs())
        self._providers = session.get_providers()
        self._reopen = reopen
        self._session: ort.InferenceSession | None = None
        self._lock = threading.Lock()

    @property
    def opened(self) -> bool:
        return self._session is not None

    def get_inputs(self):
        return self._inputs

    def get_outputs(self):
        return self._outputs

    def get_providers(self):
        return self._providers

    def _open(self) -> ort.InferenceSession:
        session = self._session
        if session is None:
            with self._lock:
                if self._session is None:
                    self._session = self._reopen()
                session = self._session
        return session

    def run(self, *args, **kwargs):
        return self._open().run(*args, **kwargs)

    def io_binding(self):
        return self._open().io_binding()

    def run_with_iobinding(self, *args, **kwargs):
        return self._open().run_with_iobinding(*args, **kwargs)
