"""mt_runtime/lazy_session.py: a session a Translator seldom runs is let go once checked, and opened
again, once, when something runs it."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import onnxruntime as ort
from mt_runtime.lazy_session import LazySession
from mt_runtime.translator import Translator


def test_a_let_go_session_is_freed_and_opened_again_once_when_run(package):
    path = str(package / "encoder.onnx")
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    expected = [(a.name, a.shape, a.type) for a in session.get_inputs()], [o.name for o in session.get_outputs()]
    ids = np.array([[5, 6, 7, 2]], dtype=np.int64)
    want = session.run(None, {"src_ids": ids})
    opened = []

    def reopen():
        opened.append(1)
        return ort.InferenceSession(path, providers=["CPUExecutionProvider"])

    lazy = LazySession(session, reopen)
    native = weakref.ref(session._sess)
    del session
    gc.collect()
    # Its weights are gone: what it told of its inputs and outputs is kept as copies (onnxruntime's
    # NodeArgs would keep the whole session alive).
    assert native() is None and not lazy.opened
    assert ([(a.name, a.shape, a.type) for a in lazy.get_inputs()], [o.name for o in lazy.get_outputs()]) == expected
    got = []
    threads = [threading.Thread(target=lambda: got.append(lazy.run(None, {"src_ids": ids}))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert lazy.opened and len(opened) == 1 and len(got) == 4
    assert all(np.array_equal(a, b) for out in got for a, b in zip(out, want))


def test_a_translator_opens_decoder_onnx_only_for_what_runs_it(package):
    """decoder.onnx (one row's whole distribution) is no search's graph on the CPU where the step
    graphs are: translating leaves it closed; driving the Translator step by step opens it."""
    sentences = ["a man is walking .", "two dogs play in the snow .", "a girl ."]
    for search in ("python", "auto"):  # a sentence alone over the step graphs, or generate.onnx
        translator = Translator(package, threads=1, search=search)
        for beam in (1, 3):
            translator.translate(sentences, beam=beam)
            translator.translate(sentences[:1], beam=beam)
        assert not translator.decoder.decoder.opened and translator.decoder.greedy is None
    translator.encode([[5, 6, 2]], 1)
    scores = translator.step(np.array([translator.generation.bos_id]), None)
    assert translator.decoder.decoder.opened and scores.shape == (1, translator.vocab)
