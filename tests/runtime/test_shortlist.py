"""The lexical shortlist (mt_runtime/shortlist.py): what it keeps, the files it refuses, the step graphs'
shortlisted output projection, translations through it, and the export stage that makes it."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from mt_runtime.files import sha256_file
from mt_runtime.search import prepare_sources
from mt_runtime.shortlist import Shortlist, ShortlistError, build_shortlist, sentence_width
from mt_runtime.translator import OnnxDecoder, PackageError, Translator

from model.onnx_passes.edit import graph_nodes
from model.onnx_passes.output_vocabulary import output_vocabulary
from model.subword_training import train_subword
from model.transformer import Transformer, TransformerConfig
from tests.helpers import multi30k_head
from tests.helpers.packages import build_packages

NO_PRUNE = "prune=null"


def test_a_word_keeps_the_words_seen_with_it_more_than_by_chance():
    # Source word 10 comes with target 20; 11 with 21 or 22; 5 and target 7 are everywhere.
    pairs = [([5, 10], [7, 20])] * 6 + [([5, 11], [7, 21])] * 3 + [([5, 11], [7, 22])] * 2 + [([5, 12], [7])] * 4
    table, made = build_shortlist(pairs, vocab_size=30, frequent=1, per_word=1, always=[0, 2])
    assert made["pairs"] == 15 and made["per_word"] == 1
    assert table.always.tolist() == [0, 2, 7]  # the most frequent target word and the special ids
    assert table.for_sources([[10]]).tolist() == [0, 2, 7, 20]
    assert table.for_sources([[11]]).tolist() == [0, 2, 7, 21]  # one per word: the more frequent partner
    # 7 comes with 5 in every pair, no more than by chance: not a candidate of 5; 12 has none above chance.
    assert table.for_sources([[5, 12]]).tolist() == [0, 2, 7]
    assert table.for_sources([[10], [11, 29]]).tolist() == [0, 2, 7, 20, 21]  # a batch: the union
    wider, _ = build_shortlist(pairs, vocab_size=30, frequent=1, per_word=5)
    assert wider.for_sources([[11]]).tolist() == [7, 21, 22]


def test_a_shortlist_file_is_checked_before_use(tmp_path):
    table, _ = build_shortlist([([3, 4], [5, 6])] * 3, vocab_size=10, frequent=2, per_word=2)
    table.save(tmp_path / "ok.npz")
    again = Shortlist.load(tmp_path / "ok.npz", 10)
    assert again.for_sources([[3]]).tolist() == table.for_sources([[3]]).tolist()
    with pytest.raises(ShortlistError, match="made for 10 words, the model has 12"):
        Shortlist.load(tmp_path / "ok.npz", 12)
    bad = dataclasses.replace(table, words=np.array([4, 99], np.int32), offsets=np.array([0] * 4 + [2] * 7))
    bad.save(tmp_path / "bad.npz")
    with pytest.raises(ShortlistError, match="word ids outside the vocabulary"):
        Shortlist.load(tmp_path / "bad.npz", 10)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ShortlistError, match="not a shortlist"):
        Shortlist.load(tmp_path / "junk.npz", 10)


@pytest.fixture(scope="module")
def packages(tmp_path_factory, data_dir):
    folder = tmp_path_factory.mktemp("shortlist")

    en, fr = multi30k_head(data_dir, "en"), multi30k_head(data_dir, "fr")
    tokenizer = train_subword(en + fr, vocab_size=200)
    tokenizer.save(folder / "tokenizer.json")
    pairs = list(zip(tokenizer.encode(en), tokenizer.encode(fr)))
    vocab = tokenizer.vocab_size
    tables = {
        "narrow": build_shortlist(pairs, vocab, frequent=20, per_word=5, always=[0, 1, 2, 3])[0],
        "everything": build_shortlist(pairs, vocab, frequent=1, per_word=1, always=range(vocab))[0],
    }
    torch.manual_seed(5)
    cfg = TransformerConfig(
        vocab_size=tokenizer.vocab_size,
        d_model=32,
        head_dim=8,
        enc_heads=[4, 2],
        dec_self_heads=[2, 2],
        dec_cross_heads=[4, 4],
        enc_ffn=[64, 48],
        dec_ffn=[48, 64],
        max_positions=64,
        dropout=0.0,
    )
    model = Transformer(cfg).eval()
    with torch.no_grad():  # sharper outputs than the init gives: fewer near-ties
        for p in model.parameters():
            p.mul_(1.5)
    for name, table in tables.items():
        table.save(folder / f"{name}.npz")
    wanted = {
        (precision, name): (precision, folder / f"{name}.npz")
        for name in tables
        for precision in ("fp32", "int8_dynamic")
    }
    built = build_packages(model, folder, {**wanted, ("int8_dynamic", None): ("int8_dynamic", None)})
    return built, tables, tokenizer, en[:24]


SPECIALS = (0, 1, 2)


def test_a_sentences_words_are_the_specials_the_frequent_words_then_its_candidates_by_id():
    # Sources 10 and 11 each have candidates; width 6 leaves room for 3 words after the specials.
    pairs = [([5, 10], [7, 20, 25])] * 6 + [([5, 11], [7, 21, 22, 23])] * 3 + [([5, 12], [7])] * 4
    table, _ = build_shortlist(pairs, vocab_size=30, frequent=1, per_word=5, always=[0, 1, 2])
    assert table.sentence_words([10, 2], SPECIALS, 16).tolist() == [0, 1, 2, 7, 20, 25]
    # A long sentence's candidates that do not fit: the lower ids stay (7 is frequent, not a candidate)
    assert table.sentence_words([10, 11], SPECIALS, 6).tolist() == [0, 1, 2, 7, 20, 21]
    words, allowed = table.batch_words([[10], [11], [12]], SPECIALS, 16)
    assert words.tolist() == [0, 1, 2, 7, 20, 21, 22, 23, 25]
    assert [words[row].tolist() for row in allowed] == [[0, 1, 2, 7, 20, 25], [0, 1, 2, 7, 21, 22, 23], [0, 1, 2, 7]]


@pytest.mark.parametrize("width,cut", [(8, True), (20, True), (64, False)])
def test_a_batchs_words_are_its_sentences_lists(width, cut):
    """batch_words (the batch at once) gives each row exactly sentence_words' list, long sentences
    cut included, and their union."""
    rng = np.random.default_rng(width)
    pairs = [(rng.integers(3, 60, 8).tolist(), rng.integers(3, 60, 6).tolist()) for _ in range(300)]
    table, _ = build_shortlist(pairs, vocab_size=60, frequent=4, per_word=5, always=[0, 1, 2])
    sources = [rng.integers(0, 60, rng.integers(1, 30)).tolist() for _ in range(20)]
    union, allowed = table.batch_words(sources, SPECIALS, width)
    lists = [table.sentence_words(src, SPECIALS, width) for src in sources]
    assert union.tolist() == sorted(set().union(*(set(w.tolist()) for w in lists)))
    assert [union[row].tolist() for row in allowed] == [sorted(w.tolist()) for w in lists]
    assert (max(len(w) for w in lists) == width) == cut  # some sentences were cut, or none


@pytest.mark.slow
def test_the_shortlisted_projection_gives_the_whole_ones_columns_exactly(packages):
    """int8 products are exact integer sums: a batch's columns are the whole projection's to the bit."""
    built, tables, tokenizer, sentences = packages
    translator = Translator(built["int8_dynamic", "narrow"], threads=1)
    decoder = translator.decoder
    src = prepare_sources(tokenizer, sentences[:6], 64)
    decoder.encode(src, 1)
    shortlist_feed, words = decoder._projection_feed(scores=False)
    assert decoder._projection_feed(scores=True) == (decoder.no_shortlist_feed, None)
    vocab = tokenizer.vocab_size
    union, allowed = tables["narrow"].batch_words(src, SPECIALS, sentence_width(tables["narrow"]))
    assert words.tolist() == union.tolist() and 20 <= len(words) < vocab
    np.testing.assert_array_equal(decoder.masked == 0, allowed)
    greedy = ort.InferenceSession(str(built["int8_dynamic", "narrow"] / "decoder_greedy.onnx"))
    feed = {i.name: decoder.feed[i.name] for i in greedy.get_inputs() if i.name in decoder.feed}
    feed["tokens"] = np.full((6, 1), translator.generation.bos_id, np.int64)
    shortlisted = greedy.run(["logits"], {**feed, **shortlist_feed})[0]
    whole = greedy.run(["logits"], {**feed, **decoder.no_shortlist_feed})[0]
    assert whole.shape == (6, vocab) and shortlisted.shape == (6, len(words))
    np.testing.assert_array_equal(shortlisted, whole[:, words])


@pytest.mark.slow
def test_a_rows_best_word_is_the_best_of_its_own_sentences_words():
    """Greedy steps over a batch's shortlist: the mask is added only to rows whose best word overall
    is not their sentence's; the choice and value are those of masking every row, ties included."""
    rng = np.random.default_rng(4)
    for _ in range(50):
        rows, width = int(rng.integers(1, 9)), int(rng.integers(2, 40))
        logits = rng.integers(-3, 4, (rows, width)).astype(np.float32)  # many ties
        allowed = rng.random((rows, width)) < 0.5
        allowed[np.arange(rows), rng.integers(0, width, rows)] = True
        masked = np.where(allowed, np.float32(0), np.float32(-np.inf))
        words = rng.permutation(1000)[:width]
        want = (logits + masked).argmax(axis=1)
        # What _best_words reads of a decoder: the mask, and its rows' arange (stale half the time).
        arange = np.arange(rows if rng.random() < 0.5 else rows + 1)
        step = dataclasses.make_dataclass("Step", ["masked", "arange"])(masked, arange)
        values, ids = OnnxDecoder._best_words(step, logits.copy(), words, 1)
        assert ids[:, 0].tolist() == words[want].tolist()
        assert values[:, 0].tolist() == logits[np.arange(rows), want].tolist()


def test_a_float32_package_decodes_over_the_whole_vocabulary(packages):
    """Float products over a fed weight and a prepacked one may round apart: float32 packages
    keep the whole vocabulary on every path (the shortlist ships only for the int8 packages made
    from them)."""
    built, _, tokenizer, sentences = packages
    fp32 = Translator(built["fp32", "narrow"], threads=1)
    assert not fp32.describe()["shortlist"] and "shortlist.onnx" not in fp32.package["files"]
    assert not any(i.name.startswith("shortlist") for i in fp32.decoder.many_rows.get_inputs())


@pytest.mark.slow
def test_greedy_translations_keep_to_each_sentences_own_words_in_any_batch(packages):
    """A greedy row may choose from its own sentence's words only (Shortlist.sentence_words), the
    list generate.onnx uses for one sentence: the same translation alone and in any batch, inside
    that list, and the list did restrict the untrained model's free choices."""
    built, tables, tokenizer, sentences = packages
    sources = prepare_sources(tokenizer, sentences, 64)
    narrow = Translator(built["int8_dynamic", "narrow"], threads=1)
    free = Translator(built["int8_dynamic", "narrow"], threads=1, shortlist=False)
    assert narrow.describe()["shortlist"] and not free.describe()["shortlist"]
    greedy = dataclasses.replace(narrow.generation, beam=1)
    width = sentence_width(tables["narrow"])
    assert width < tokenizer.vocab_size
    alone = [narrow.searcher([src], greedy)[0] for src in sources]
    rng = np.random.default_rng(0)
    order = rng.permutation(len(sources))
    for size in (2, 5, 8):
        batched = {}
        for start in range(0, len(order), size):
            idx = order[start : start + size]
            batched.update(zip(idx.tolist(), narrow.searcher([sources[i] for i in idx], greedy)))
        assert [batched[i] for i in range(len(sources))] == alone
    outside = 0
    for src, out, unrestricted in zip(sources, alone, (free.searcher([s], greedy)[0] for s in sources)):
        allowed = set(tables["narrow"].sentence_words(src, SPECIALS, width).tolist())
        assert set(out) <= allowed
        outside += not set(unrestricted) <= allowed
    assert outside  # the untrained model's free choices leave the list: the list did restrict them
    # shortlist=False: the whole vocabulary alone and in batches, as the same weights without a list give.
    plain = Translator(built["int8_dynamic", None], threads=1)
    assert [free.searcher([s], greedy)[0] for s in sources] == [plain.searcher([s], greedy)[0] for s in sources]
    assert free.searcher(sources, greedy) == plain.searcher(sources, greedy)
    # A list of every word in another order: the op's tokens are places in the list, mapped back
    # to ids on the way in and out; the same translations as the whole vocabulary's, exactly.
    everything = Translator(built["int8_dynamic", "everything"], threads=1)
    assert [everything.searcher([s], greedy)[0] for s in sources] == [plain.searcher([s], greedy)[0] for s in sources]


@pytest.mark.slow
def test_int8_beam_search_keeps_to_the_words_the_shortlist_can_list(packages):
    """int8 with a shortlist: beam search runs over output_vocabulary (every word the shortlist
    can list, filled to a multiple of 64), normalized over those words, alone (the op in
    generate_batch.onnx) and in batches (decoder_batch.onnx): its top k are the words'
    log-softmax over them, with word ids, and a sentence's translation is the same both ways."""
    built, tables, tokenizer, sentences = packages
    vocab = tokenizer.vocab_size
    words = output_vocabulary(tables["narrow"], SPECIALS)
    assert words is not None and len(words) % 64 == 0 and len(words) < vocab
    assert set(tables["narrow"].always.tolist()) | set(tables["narrow"].words.tolist()) <= set(words.tolist())
    assert output_vocabulary(tables["everything"], SPECIALS) is None  # nothing to leave out
    narrow, plain = (Translator(built["int8_dynamic", name], threads=1) for name in ("narrow", None))
    sources = prepare_sources(tokenizer, sentences, 64)
    tokens = np.array([5, 9, 1, 17, 2, 40], np.int64)
    for t in (narrow, plain):
        t.decoder.encode(sources[:6], 1)
    values, ids = narrow.decoder.step_top_k(tokens, None, 6, scores=True)
    logits, columns = plain.decoder.step_top_k(tokens, None, vocab, scores=False)  # every word, best first
    whole = np.empty((len(tokens), vocab), np.float32)
    whole[np.arange(len(tokens))[:, None], columns] = logits
    listed = whole[:, words]
    top = listed.max(axis=1, keepdims=True)
    log_probs = listed - (top + np.log(np.exp(listed - top).sum(axis=1, keepdims=True)))
    np.testing.assert_allclose(values, np.sort(log_probs, axis=1)[:, ::-1][:, :6], rtol=0, atol=1e-5)
    assert set(ids.ravel().tolist()) <= set(words.tolist())
    beams = dataclasses.replace(narrow.generation, beam=3)
    assert narrow.searcher.which(sources[:1]) == "graph" and narrow.searcher.which(sources[:4]) == "python"
    alone = [narrow.searcher([src], beams)[0] for src in sources]
    assert all(set(out) <= set(words.tolist()) for out in alone)
    assert narrow.searcher(sources, beams) == alone
    assert narrow.searcher(sources[::-1][:7], beams) == alone[::-1][:7]


@pytest.mark.slow
def test_a_package_without_a_shortlist_has_no_shortlist_inputs(packages):
    built, _, _, sentences = packages
    plain = Translator(built["int8_dynamic", None], threads=1)
    files = plain.package["files"]
    assert "shortlist.npz" not in files and "shortlist.onnx" not in files
    assert not any(i.name.startswith("shortlist") for i in plain.decoder.many_rows.get_inputs())
    assert not plain.describe()["shortlist"]
    everything = Translator(built["int8_dynamic", "everything"], threads=1)
    assert {"shortlist.npz", "shortlist.onnx"} <= set(everything.package["files"])
    assert plain.translate(sentences, beam=2, max_batch=8) == everything.translate(sentences, beam=2, max_batch=8)


@pytest.mark.slow
def test_a_damaged_shortlist_is_refused(packages, tmp_path):
    built, _, tokenizer, _ = packages
    copy = tmp_path / "package"
    shutil.copytree(built["int8_dynamic", "narrow"], copy)
    table = Shortlist.load(copy / "shortlist.npz", tokenizer.vocab_size)
    dataclasses.replace(table, always=np.array([0, tokenizer.vocab_size])).save(copy / "shortlist.npz")
    meta = json.loads((copy / "package.json").read_text())
    with pytest.raises(PackageError):  # its digest no longer matches
        Translator(copy, threads=1)
    meta["files"]["shortlist.npz"] = {
        "sha256": sha256_file(copy / "shortlist.npz"),
        "bytes": (copy / "shortlist.npz").stat().st_size,
    }
    (copy / "package.json").write_text(json.dumps(meta))
    with pytest.raises(PackageError, match="word ids outside the vocabulary"):  # listed, but not this model's
        Translator(copy, threads=1)


@pytest.mark.slow
def test_the_export_stage_ships_a_shortlist_where_the_recipe_asks(smoke):
    store, arts = smoke.build("export", NO_PRUNE, "export.shortlist={frequent: 40, per_word: 8}")
    art = arts["export.student"]
    made = art.metrics["shortlist"]
    assert 300 < made["pairs"] <= 400 and made["frequent"] >= 40
    assert 40 <= made["mean_words_batch_32"] <= made["max_words_batch_32"] <= made["vocab_size"]
    assert 0.5 < made["valid_reference_coverage"] <= 1.0
    package = art.path / "fp32"
    files = json.loads((package / "package.json").read_text())["files"]
    assert "shortlist.npz" in files and "shortlist.onnx" not in files
    assert "shortlist.npz" not in json.loads((art.path / "fp16" / "package.json").read_text())["files"]
    # Parity with PyTorch was judged on the whole vocabulary, as without a shortlist.
    assert art.metrics["greedy_identical"] == art.metrics["beam_identical"] == "20/20"
    assert not Translator(package, threads=1).describe()["shortlist"]  # float32: the whole vocabulary


@pytest.mark.slow
def test_a_calls_word_list_gathers_whole_rows(packages):
    """Every Gather in generate.onnx whose indices change from call to call (the sentence's list,
    its projection columns) takes whole rows (axis 0): on axis 1 onnxruntime copies byte by
    byte, which was a fifth of a student's greedy sentence. Gathers by constants fold at load."""
    built, _, _, _ = packages
    model = onnx.load(str(built["int8_dynamic", "narrow"] / "generate.onnx"), load_external_data=False)
    nodes = list(graph_nodes(model.graph))
    constant = {t.name for t in model.graph.initializer}
    for graph in (g for n in nodes for a in n.attribute if a.type == onnx.AttributeProto.GRAPH for g in [a.g]):
        constant |= {t.name for t in graph.initializer}
    made = {o: n for n in nodes for o in n.output}

    def is_constant(name: str) -> bool:
        return name in constant or (name in made and all(is_constant(i) for i in made[name].input if i))

    per_call = [n for n in nodes if n.op_type == "Gather" and not is_constant(n.input[1])]
    assert any(n.name == "shortlist/rows" for n in per_call)  # the list's projection columns
    sideways = [n.name for n in per_call if any(a.name == "axis" and a.i != 0 for a in n.attribute)]
    assert not sideways, sideways
