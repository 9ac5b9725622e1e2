"""Greedy batches with the cache written in place (decoder_greedy_inplace.onnx, format 2.1): the
same logits as the copying graph, bit for bit, through row drops, buffer growth and a switch to
the other step graphs; and the pass that makes it leaves a graph it does not know alone."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
from mt_runtime import inplace
from mt_runtime.layout import DECODER_GREEDY, DECODER_GREEDY_INPLACE, PAST_SEQUENCE_LENGTH
from mt_runtime.translator import Translator

from model.onnx_passes.cache import cache_in_place

SOURCES = [[5, 9, 14, 22, 2], [7, 2], [30, 31, 32, 33, 34, 35, 2], [11, 12, 2]]


def _steps(decoder, drop_at: int, steps: int, scores_at: int | None = None, kept=(0, 2, 3)):
    """Greedy steps over SOURCES, row r fed its r-th best word (so that rows' caches differ); at
    `drop_at` the second row ends (keep `kept`, then parents); at `scores_at` one step asks for
    scores (decoder_batch.onnx)."""
    decoder.encode(SOURCES, 1)
    tokens, parents, seen = np.full(len(SOURCES), 1, dtype=np.int64), None, []
    for t in range(steps):
        values, ids = decoder.step_top_k(tokens, parents, 20, scores=t == scores_at)
        seen.append((values, ids))
        tokens, parents = ids[np.arange(len(ids)), np.arange(len(ids))].astype(np.int64), None
        if t == drop_at:
            rows = np.array(kept) if len(tokens) == 4 else np.arange(len(tokens))
            decoder.keep(rows)
            tokens, parents = tokens[rows], rows
    return seen


@pytest.mark.parametrize("kept", [(0, 2, 3), (0, 3, 2)])  # the rows after it moved up; the last in its place
@pytest.mark.parametrize("scores_at", [None, 6])
def test_greedy_steps_in_place_give_the_copying_graphs_numbers_bit_for_bit(package, monkeypatch, scores_at, kept):
    monkeypatch.setattr(inplace, "_FIRST_CAPACITY", 4)  # so that the buffers grow twice
    translator = Translator(package, threads=1, shortlist=False)
    in_place = translator.decoder
    copying = in_place.twin()
    copying.inplace = None
    assert in_place.inplace is not None
    got = _steps(in_place, drop_at=2, steps=12, scores_at=scores_at, kept=kept)
    want = _steps(copying, drop_at=2, steps=12, scores_at=scores_at, kept=kept)
    for t, ((gv, gi), (wv, wi)) in enumerate(zip(got, want)):
        assert gv.shape == wv.shape and np.array_equal(gi, wi) and np.array_equal(gv, wv), t
    assert in_place.inplace.buffers["past_k_0"].shape[2] >= 12 or scores_at is not None


def test_take_rows_is_numpys_take_done_in_place():
    """Rows kept in place, dropped ones' places filled from the end, a permutation, a cache's
    filled positions only: the same as array[rows], in the array's own memory."""
    rng = np.random.default_rng(3)
    for rows in ([0, 1, 2, 3, 4], [0, 4, 2, 3], [4, 1, 3], [2, 3], [4, 0, 3, 1, 2], [], [1, 1, 0], [3, 0, 4]):
        for positions in (None, 3):
            array = rng.standard_normal((5, 2, 6, 4)).astype(np.float32)
            want = array[rows].copy()
            got = inplace.take_rows(array, np.array(rows, dtype=np.int64), positions)
            assert np.shares_memory(got, array) or not rows
            filled = slice(None) if positions is None else slice(0, positions)
            assert np.array_equal(got[:, :, filled], want[:, :, filled]), (rows, positions)
    with pytest.raises(ValueError):
        inplace.take_rows(np.zeros((2, 3)), np.array([0, 1, 1]))


def test_batches_translate_the_same_with_and_without_the_in_place_graph(package):
    """Batches of several sizes one after another: the buffers kept from an earlier batch are
    reused where they fit and made anew where it was more than twice as large."""
    translator = Translator(package, threads=1)
    text = ["A man is riding a bicycle.", "Two dogs.", "People walk down a busy street in the city.", "A girl."]
    text = text * 3
    sizes = (12, 2, 5, 3)
    with_it = [translator.translate(text[:n], beam=1, max_batch=n) for n in sizes]
    assert translator.decoder.inplace._store["past_k_0"].shape[0] <= 2 * 3  # not the batch of 12's
    translator.decoder.inplace = None
    assert [translator.translate(text[:n], beam=1, max_batch=n) for n in sizes] == with_it


def _greedy_graph(package) -> onnx.ModelProto:
    return onnx.load(str(package / DECODER_GREEDY), load_external_data=False)


def test_the_pass_makes_the_packages_in_place_graph(package):
    made = _greedy_graph(package)
    assert cache_in_place(made.graph)
    shipped = onnx.load(str(package / DECODER_GREEDY_INPLACE), load_external_data=False)
    assert [i.name for i in made.graph.input] == [i.name for i in shipped.graph.input]
    attention = [n for n in shipped.graph.node if n.op_type == "MultiHeadAttention" and len(n.input) > 8]
    assert attention and all(n.input[8] == PAST_SEQUENCE_LENGTH for n in attention)
    assert not any(n.op_type == "Shape" and n.input[0].startswith("past_") for n in shipped.graph.node)


def test_the_pass_leaves_a_cache_it_does_not_know_alone(package):
    model = _greedy_graph(package)
    model.graph.node.append(onnx.helper.make_node("Identity", ["past_k_0"], ["seen"]))
    model.graph.output.append(onnx.helper.make_tensor_value_info("seen", onnx.TensorProto.FLOAT, None))
    before = copy.deepcopy(model)
    assert not cache_in_place(model.graph)
    assert model == before
