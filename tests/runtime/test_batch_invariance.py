"""One sentence, one translation (issue 52): every CPU package variant gives a sentence the same
translation alone and in batches of any size and composition, greedy and beam, with and without
a shortlist (the package format's promise: no tolerance on the CPU)."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from mt_runtime.cores import WAVE
from mt_runtime.search import beam_search_nbest, prepare_sources
from mt_runtime.shortlist import build_shortlist
from mt_runtime.translator import Translator

from tests.helpers import tiny_model
from tests.helpers.packages import build_packages

pytestmark = pytest.mark.slow  # the packages fixture builds every CPU variant (about 20 s)


VARIANTS = ("fp32", "int8_dynamic", "int8_static")


@pytest.fixture(scope="module")
def packages(tmp_path_factory, data_dir):
    folder = tmp_path_factory.mktemp("invariance")
    model, tokenizer, en, pairs = tiny_model(data_dir, folder)
    # A list that leaves the special ids out (a hand-made one): no output vocabulary for beams, and
    # greedy still over each sentence's words.
    bare, _ = build_shortlist(pairs, tokenizer.vocab_size, frequent=30, per_word=6)
    bare.save(folder / "bare.npz")
    calibration = prepare_sources(tokenizer, en[100:140], 64)
    wanted = {("int8_dynamic", "bare"): ("int8_dynamic", folder / "bare.npz")}
    for variant in VARIANTS:
        for listed in (True, False):
            wanted[variant, listed] = (variant, folder / "shortlist.npz" if listed else None)
    built = build_packages(model, folder, wanted, calibration)
    return built, prepare_sources(tokenizer, en[:48], 64)


@pytest.mark.parametrize(
    "variant,listed", [(v, listed) for v in VARIANTS for listed in (True, False)] + [("int8_dynamic", "bare")]
)
def test_a_sentence_translates_the_same_alone_and_in_any_batch(packages, variant, listed):
    built, sources = packages
    translator = Translator(built[variant, listed], threads=1)
    assert translator.describe()["shortlist"] == (bool(listed) and variant != "fp32")
    if listed == "bare":
        assert "generate_batch.onnx" not in translator.package["files"]
    rng = np.random.default_rng(len(variant) + len(str(listed)))
    for beam in (1, 3):
        gen = dataclasses.replace(translator.generation, beam=beam)
        alone = [translator.searcher([src], gen)[0] for src in sources]
        assert len({len(a) for a in alone}) > 3  # outputs of many lengths: rows end at different steps
        for size, shuffled in ((48, False), (7, True), (16, True), (2, True)):
            order = rng.permutation(len(sources)) if shuffled else np.argsort([len(s) for s in sources])
            got = {}
            for start in range(0, len(order), size):
                rows = order[start : start + size].tolist()
                got.update(zip(rows, translator.searcher([sources[i] for i in rows], gen)))
            assert [got[i] for i in range(len(sources))] == alone, (variant, listed, beam, size)
        # The text path a user calls, in length-sorted batches as translate() makes them.
        texts = translator.translate(
            [translator.tokenizer.decode([s[:-1]])[0] for s in sources], beam=beam, max_batch=16
        )
        assert len(texts) == len(sources)


@pytest.mark.parametrize("variant", ["int8_static", "int8_dynamic"])
def test_a_sentence_translates_the_same_alone_and_in_batches_without_generate_onnx(packages, variant):
    """search="python": every call runs over the step graphs, a sentence alone as a batch of one,
    over the shortlist as in its batches (decoder.onnx's one-row loop has no shortlist)."""
    built, sources = packages
    translator = Translator(built[variant, True], threads=1, search="python")
    assert translator.describe()["search"] == "python" and translator.describe()["shortlist"]
    for beam in (1, 3):
        gen = dataclasses.replace(translator.generation, beam=beam)
        alone = [translator.searcher([src], gen)[0] for src in sources]
        batched = [out for i in range(0, len(sources), 7) for out in translator.searcher(sources[i : i + 7], gen)]
        assert alone == batched, (variant, beam)


@pytest.mark.parametrize("variant,listed", [("fp32", False), ("int8_static", True)])
def test_more_threads_split_batches_and_change_no_translation(packages, variant, listed):
    """threads=3: batches split into three shards on one-thread sessions, and a single sentence on
    generate.onnx at 1 or 3 threads, whichever its first calls measured faster (mt_runtime/cores.py);
    every translation is the one-thread Translator's."""
    built, sources = packages
    one, three = Translator(built[variant, listed], threads=1), Translator(built[variant, listed], threads=3)
    assert one.describe()["shards"] == 1 and three.describe()["shards"] == 3
    for beam in (1, 3):
        gen = dataclasses.replace(one.generation, beam=beam)
        for size in (48, 5, 2):
            batches = [sources[i : i + size] for i in range(0, len(sources), size)]
            assert [three.searcher(b, gen) for b in batches] == [one.searcher(b, gen) for b in batches]
        assert [three.searcher([s], gen) for s in sources[:12]] == [one.searcher([s], gen) for s in sources[:12]]
        # The shortlist switch reaches every shard's decoder.
        three.decoder.use_shortlist = one.decoder.use_shortlist = False
        assert three.searcher(sources[:9], gen) == one.searcher(sources[:9], gen)
        three.decoder.use_shortlist = one.decoder.use_shortlist = listed
    # Several batches in one call: whole batches at once, one per shard (ShardPool.each).
    texts = [one.tokenizer.decode([s[:-1]])[0] for s in sources]
    assert three.searcher.at_once == 3 * WAVE and one.searcher.at_once == 1
    for beam in (1, 3):
        assert three.translate(texts, beam=beam, max_batch=5) == one.translate(texts, beam=beam, max_batch=5)
    chosen = three.describe()["one_sentence_threads"]
    assert set(chosen) == {"greedy", "beam"} and set(chosen.values()) <= {1, "n"}


def test_calls_from_several_threads_on_one_translator_each_get_their_own_translations(packages):
    """A Translator's decoders hold one search each: calls made at once from several threads take
    turns (a web app's request threads sharing one), each answered as if alone."""
    built, sources = packages
    texts = [Translator(built["int8_static", True], threads=1).tokenizer.decode([s[:-1]])[0] for s in sources]
    for threads in (1, 2):
        shared = Translator(built["int8_static", True], threads=threads)
        parts = [texts[i::3] for i in range(3)]
        alone = [shared.translate(part, beam=beam, max_batch=4) for part in parts for beam in (1, 3)]
        together: dict[int, list[str]] = {}

        def call(i: int) -> None:
            together[i] = shared.translate(parts[i // 2], beam=(1, 3)[i % 2], max_batch=4)

        callers = [threading.Thread(target=call, args=(i,)) for i in range(6)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join()
        assert [together[i] for i in range(6)] == alone


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_sentences_scores_are_the_same_bits_beside_a_longer_sentence(packages, variant):
    """The step graphs' first scores of a sentence alone and in a batch with a longer one: equal to
    the bit. The runtime pads sources to a multiple of four positions (mt_runtime/search.py
    source_width); padded to its own length instead, a float32 cross-attention over 7 or 11
    positions sums otherwise than over the batch's (onnxruntime's one-row product)."""
    built, sources = packages
    translator = Translator(built[variant, False], threads=1)
    decoder, bos = translator.decoder, np.array([translator.generation.bos_id])
    # a shard (mt_runtime/cores.py) pads alike
    assert decoder.twin().max_positions == decoder.max_positions == translator.generation.max_positions
    longest = max(sources, key=len)
    assert {len(s) % 4 for s in sources} == {0, 1, 2, 3}  # lengths of every remainder
    for source in sources:
        decoder.encode([source], 1)
        alone = decoder.step(bos, None)[0].copy()
        decoder.encode([source, longest], 1)
        beside = decoder.step(np.repeat(bos, 2), None)[0]
        assert np.array_equal(alone, beside), (variant, len(source), len(longest))


def _op_with_scores(path) -> ort.InferenceSession:
    """The package's search op with its optional `sequences_scores` output (the best hypothesis'
    score) wired out: the graph as shipped, one more output."""
    model = onnx.load(str(path))
    [op] = [n for n in model.graph.node if n.op_type == "BeamSearch"]
    op.output.append("sequences_scores")
    model.graph.output.append(onnx.helper.make_tensor_value_info("sequences_scores", onnx.TensorProto.FLOAT, None))
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(
    "variant,listed,graph", [("fp32", False, "generate.onnx"), ("int8_static", True, "generate_batch.onnx")]
)
def test_the_search_op_scores_a_sentence_to_the_bit_as_beam_batches_do(packages, variant, listed, graph):
    """A sentence alone at beam > 1 runs in the BeamSearch op, in batches over decoder_batch.onnx
    with its beams grouped in each cross-attention. The op's best score equals the batch loop's to
    the bit: with one product per beam instead, the float sums differed by an ulp (3.6e-7 in a
    cross-attention), which on a default run's int8 model changed one sentence of test_2017's 1000."""
    built, sources = packages
    translator = Translator(built[variant, listed], threads=1, search="python")
    op = _op_with_scores(built[variant, listed] / graph)
    gen = dataclasses.replace(translator.generation, beam=3)
    for source in sources:
        [[(loop_score, loop_tokens), *_]] = beam_search_nbest(translator.decoder, [source], gen)
        ids = np.array([source], dtype=np.int32)
        feed = {"input_ids": ids, "max_length": np.array([gen.max_len(len(source))], np.int32)}
        feed |= {"num_beams": np.array([3], np.int32), "length_penalty": np.array([gen.length_penalty], np.float32)}
        sequences, [[op_score]] = op.run(None, feed)
        assert np.float32(op_score) == np.float32(loop_score), (variant, len(source))


def _op_decoders(path) -> dict[str, onnx.GraphProto]:
    """generate.onnx's BeamSearch decoders by the If branch that holds them ("" outside an If)."""
    found = {}

    def walk(graph: onnx.GraphProto, branch: str) -> None:
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.name == "decoder":
                    found[branch] = attribute.g
                elif attribute.type == onnx.AttributeProto.GRAPH:
                    walk(attribute.g, attribute.name)

    walk(onnx.load(str(path)).graph, "")
    return found


def test_the_one_sentence_branch_reads_the_cross_keys_in_place(packages):
    """generate.onnx's one-row branch (a listed package's greedy sentence alone) runs one row only,
    so its cross-attentions take the op's keys as they come: the beam groups' Slices would copy
    every key and value each step (2.5% of a greedy sentence on the default run's int8_static). The
    branch for beams still groups them, as decoder_batch.onnx does (the test above)."""
    built, _ = packages

    def slices(graph: onnx.GraphProto) -> int:
        cross = ("past_key_cross", "past_value_cross")
        return sum(n.op_type == "Slice" and n.input[0].startswith(cross) for n in graph.node)

    decoders = _op_decoders(built["int8_static", True] / "generate.onnx")
    assert set(decoders) == {"then_branch", "else_branch"}
    assert slices(decoders["then_branch"]) == 0
    assert slices(decoders["else_branch"]) > 0
