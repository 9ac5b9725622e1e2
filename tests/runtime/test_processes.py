"""Translator(processes=N) (mt_runtime/processes.py): batches searched in child processes give the
translations this process gives; a child that dies or cannot load is named in one error; close()
ends the children."""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import pytest
from mt_runtime.processes import ChildGone, start_children
from mt_runtime.search import prepare_sources
from mt_runtime.translator import Translator

from tests.helpers import multi30k_head


@pytest.fixture(scope="module")
def sentences(data_dir):
    return [s[:30] for s in multi30k_head(data_dir, "en", 30)]


def test_batches_in_child_processes_translate_as_this_process_does(package, sentences):
    one = Translator(package, threads=1)
    two = Translator(package, threads=1, processes=2)
    try:
        assert two.describe()["processes"] == 2 and one.describe()["processes"] == 0
        children = two.searcher.children
        assert len({c.pid for c in children} | {os.getpid()}) == 3
        for beam in (1, 3):
            # several batches: whole ones, one a child at a time; one batch: split between them
            assert two.translate(sentences, beam=beam, max_batch=4) == one.translate(sentences, beam=beam, max_batch=4)
            gen = dataclasses.replace(one.generation, beam=beam)
            batch = prepare_sources(one.tokenizer, sentences[:9], one.generation.max_positions)
            assert two.searcher(batch, gen) == one.searcher(batch, gen)
            assert two.searcher(batch[:1], gen) == one.searcher(batch[:1], gen)  # one sentence: here
        # The shortlist switch reaches the children.
        one.decoder.use_shortlist = two.decoder.use_shortlist = False
        assert two.translate(sentences, beam=1, max_batch=4) == one.translate(sentences, beam=1, max_batch=4)
        # Here generate.onnx searched the single sentences: the step graphs, whose weights would
        # be a copy beside each child's, were checked and let go (mt_runtime/lazy_session.py).
        mine = two.decoder
        assert not any(s.opened for s in (mine.encoder, mine.decoder, mine.many_rows, mine.inplace.session))
    finally:
        two.close()
    assert all(c.process.poll() is not None for c in children)
    two.close()  # a second time: nothing left to do


def test_a_child_that_dies_is_named_in_one_error_and_started_again(package, sentences, tmp_path):
    translator = Translator(package, threads=1, processes=1)
    alone = Translator(package, threads=1)
    child = translator.searcher.children[0]
    first = child.pid
    # Dead before a call: started again, the call answered.
    os.kill(first, signal.SIGKILL)
    child.process.wait()
    assert translator.translate(sentences[:5], beam=1) == alone.translate(sentences[:5], beam=1)
    assert child.pid != first
    # Ctrl-C reaches the children too (the terminal's process group): they leave it to this process.
    interrupted = child.pid
    os.kill(interrupted, signal.SIGINT)
    assert translator.translate(sentences[:5], beam=1) == alone.translate(sentences[:5], beam=1)
    time.sleep(0.2)
    assert child.pid == interrupted and child.process.poll() is None
    # Dead during a call (as if it died after the check): that call fails, naming it; the next works.
    second = child.pid
    os.kill(second, signal.SIGKILL)
    child.process.poll = lambda: None
    with pytest.raises(ChildGone, match=rf"translation process {second} ended \(exit status -9\)"):
        translator.translate(sentences[:5], beam=1)
    del child.process.poll
    assert translator.translate(sentences[:5], beam=3) == alone.translate(sentences[:5], beam=3)
    # One sentence runs in this process (with the children's threads to choose from): no child needed.
    os.kill(child.pid, signal.SIGKILL)
    child.process.wait()
    child.process.poll = lambda: None
    assert translator.translate(sentences[:1], beam=1) == alone.translate(sentences[:1], beam=1)
    del child.process.poll
    translator.close()
    with pytest.raises(ChildGone, match=r"could not load .*: PackageError: .*package\.json"):
        start_children(2, tmp_path, {"threads": 1})
    with pytest.raises(ValueError, match="CPU only"):
        Translator(package, device="cuda", processes=2)
