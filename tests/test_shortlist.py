"""The lexical shortlist (model/shortlist.py): what it keeps, the files it refuses, the step graphs'
shortlisted output projection, translations through it, and the export stage that makes it."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch

from model.files import sha256_file
from model import onnx_generate
from model.onnx_generate import LEFT_OUT_SAMPLE, output_vocabulary, shortlist_width
from model.runtime import GraphSearch, PackageError, Translator
from model.search import beam_search, prepare_sources
from model.shortlist import Shortlist, ShortlistError, build_shortlist
from model.subword import SubwordTokenizer
from model.transformer import Transformer, TransformerConfig
from pipeline.corpus import read_split
from pipeline.package_builder import build_package

from .conftest import multi30k_head
from .test_quantize import assert_same_but_near_ties

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
    tokenizer = SubwordTokenizer.train(en + fr, vocab_size=200)
    tokenizer.save(folder / "tokenizer.json")
    pairs = list(zip(tokenizer.encode(en), tokenizer.encode(fr)))
    vocab = tokenizer.vocab_size
    tables = {"narrow": build_shortlist(pairs, vocab, frequent=20, per_word=5, always=[0, 1, 2, 3])[0],
              "everything": build_shortlist(pairs, vocab, frequent=1, per_word=1, always=range(vocab))[0]}
    torch.manual_seed(5)
    cfg = TransformerConfig(vocab_size=tokenizer.vocab_size, d_model=32, head_dim=8, enc_heads=[4, 2],
                            dec_self_heads=[2, 2], dec_cross_heads=[4, 4], enc_ffn=[64, 48], dec_ffn=[48, 64],
                            max_positions=64, dropout=0.0)
    model = Transformer(cfg).eval()
    with torch.no_grad():  # sharper outputs than the init gives: fewer near-ties
        for p in model.parameters():
            p.mul_(1.5)
    built = {}
    for name, table in tables.items():
        table.save(folder / f"{name}.npz")
        for precision in ("fp32", "int8_dynamic"):
            built[precision, name] = folder / f"{precision}-{name}"
            build_package(model, precision, built[precision, name], tokenizer=folder / "tokenizer.json",
                          work=folder / "work" / f"{precision}-{name}", shortlist=folder / f"{name}.npz")
    built["int8_dynamic", None] = folder / "int8-none"
    build_package(model, "int8_dynamic", built["int8_dynamic", None], tokenizer=folder / "tokenizer.json",
                  work=folder / "work" / "int8-none")
    return built, tables, tokenizer, en[:24]


@pytest.mark.parametrize("precision", ["fp32", "int8_dynamic"])
def test_the_shortlisted_projection_gives_the_whole_ones_columns(packages, precision):
    built, tables, tokenizer, sentences = packages
    translator = Translator(built[precision, "narrow"], threads=1)
    decoder = translator.decoder
    src = prepare_sources(tokenizer, sentences[:6], 64)
    decoder.encode(src, 1)
    shortlist_feed, words = decoder._projection_feed(scores=False)
    assert decoder._projection_feed(scores=True) == (decoder.no_shortlist_feed, None)
    vocab = tokenizer.vocab_size
    assert words.tolist() == tables["narrow"].for_sources(src).tolist() and 20 <= len(words) < vocab
    feed = {n: decoder.feed[n] for n in decoder.greedy_inputs if n in decoder.feed}
    feed["tokens"] = np.full((6, 1), translator.generation.bos_id, np.int64)
    shortlisted = decoder.greedy.run(["logits"], {**feed, **shortlist_feed})[0]
    whole = decoder.greedy.run(["logits"], {**feed, **decoder.no_shortlist_feed})[0]
    assert whole.shape == (6, vocab) and shortlisted.shape == (6, len(words))
    np.testing.assert_allclose(shortlisted, whole[:, words], rtol=0, atol=1e-5)


@pytest.mark.parametrize("precision", ["fp32", "int8_dynamic"])
def test_greedy_batches_translate_into_the_shortlist_and_beams_over_every_word(packages, precision):
    built, tables, tokenizer, sentences = packages
    sources = prepare_sources(tokenizer, sentences, 64)
    narrow = Translator(built[precision, "narrow"], threads=1)
    whole = Translator(built[precision, "narrow"], threads=1, shortlist=False)
    assert narrow.describe()["shortlist"] and not whole.describe()["shortlist"]
    greedy = dataclasses.replace(narrow.generation, beam=1)
    outside = 0
    for batch in [sources[i: i + 8] for i in range(0, len(sources), 8)]:
        allowed = set(tables["narrow"].for_sources(batch).tolist())
        for out, free in zip(narrow.searcher(batch, greedy), whole.searcher(batch, greedy)):
            assert set(out) <= allowed
            outside += not set(free) <= allowed
    assert outside  # the untrained model's free choices leave the list: the shortlist did restrict them
    # Beam search compares scores across beams: a batch's list would shift them, so beams never use
    # it (int8 beams search the package's output vocabulary whatever the runtime is told).
    assert narrow.translate(sentences, beam=3, max_batch=8) == whole.translate(sentences, beam=3, max_batch=8)
    # A shortlist of every word: the same greedy translations as the whole vocabulary, so the ids
    # that come back through the shortlist are the right ones. int8 only: its products are exact
    # integer sums, where float32 over a fed weight and a prepacked one may round apart on some CPUs.
    if precision == "int8_dynamic":
        everything = Translator(built[precision, "everything"], threads=1)
        assert everything.translate(sentences, beam=1, max_batch=8) == \
            whole.translate(sentences, beam=1, max_batch=8)


def test_int8_beam_search_keeps_to_the_words_the_shortlist_can_list(packages):
    """int8 with a shortlist: beam steps project onto output_vocabulary (every word the shortlist
    can list, filled to a multiple of 64). decoder_batch.onnx's top k are those words' log-
    probabilities over the whole vocabulary (the words left out estimated from a sample of them,
    here all of them: exact), with word ids; beam outputs, of the op at one sentence and of the
    loop over batches, stay inside them."""
    built, tables, tokenizer, sentences = packages
    vocab = tokenizer.vocab_size
    words = output_vocabulary(tables["narrow"], [0, 1, 2])
    assert words is not None and len(words) % 64 == 0 and len(words) < vocab
    assert set(tables["narrow"].always.tolist()) | set(tables["narrow"].words.tolist()) <= set(words.tolist())
    assert output_vocabulary(tables["everything"], [0, 1, 2]) is None  # nothing to leave out
    narrow, plain = (Translator(built["int8_dynamic", name], threads=1) for name in ("narrow", None))
    sources = prepare_sources(tokenizer, sentences, 64)
    values, ids, whole = _first_step(narrow, plain, sources[:6], vocab)
    log_probs = whole - _log_sum_exp(whole)  # over every word
    assert vocab - len(words) <= LEFT_OUT_SAMPLE  # every left-out word in the sample
    np.testing.assert_allclose(values, np.sort(log_probs[:, words], axis=1)[:, ::-1][:, :6], rtol=0, atol=1e-4)
    np.testing.assert_allclose(np.take_along_axis(log_probs, ids, 1), values, rtol=0, atol=1e-4)  # word ids
    assert set(ids.ravel().tolist()) <= set(words.tolist())
    beams = dataclasses.replace(narrow.generation, beam=3)
    assert narrow.searcher.which(sources[:1]) == "graph" and narrow.searcher.which(sources[:4]) == "python"
    outputs = [narrow.searcher([src], beams)[0] for src in sources] + narrow.searcher(sources, beams)
    assert all(set(out) <= set(words.tolist()) for out in outputs)
    # The op normalises over those words alone: it finds what our beam search finds over the same
    # int8 logits log-softmaxed over them (near ties aside), so its tokens, places in the
    # vocabulary, are mapped to the right words on the way in and out.
    logits = Translator(built["int8_dynamic", "narrow"], threads=1, search="python", shortlist=False).decoder
    over_words = _OverWords(logits, words, vocab)
    # (A wrong mapping costs nats; the op adds its scores in float32 over this untrained model's
    # 60-token outputs, where near ties abound: 0.17 of -116 apart at worst here.)
    assert_same_but_near_ties(over_words, sources, outputs[: len(sources)],
                              [beam_search(over_words, [src], beams)[0] for src in sources], beam=True, tie=0.3)


def test_beam_batches_estimate_the_left_out_words_from_a_sample(packages, tmp_path, monkeypatch):
    """Where fewer left-out words are sampled than left out, decoder_batch.onnx's values are the
    listed words' log-softmax less log(1 + left-out mass / listed mass), the left-out mass being
    the sample's scaled to every left-out word."""
    built, tables, tokenizer, sentences = packages
    package = tmp_path / "package"
    shutil.copytree(built["int8_dynamic", "narrow"], package)
    monkeypatch.setattr(onnx_generate, "LEFT_OUT_SAMPLE", 3)
    generation = json.loads((package / "generation.json").read_text())
    onnx_generate.write_many_rows_decoder(package, shortlist=True, generation=generation)
    meta = json.loads((package / "package.json").read_text())
    for name in ("decoder_batch.onnx", "decoder_greedy.onnx", "shortlist.onnx"):
        meta["files"][name] = {"sha256": sha256_file(package / name), "bytes": (package / name).stat().st_size}
    (package / "package.json").write_text(json.dumps(meta))
    vocab = tokenizer.vocab_size
    words = output_vocabulary(tables["narrow"], [0, 1, 2])
    left_out = np.setdiff1d(np.arange(vocab), words)
    assert len(left_out) > 3
    # The graph's sample (model/onnx_generate.py, _restricted_projection): seed 0, sorted.
    sample = np.sort(np.random.default_rng(0).choice(left_out, 3, replace=False))
    sampled, plain = Translator(package, threads=1), Translator(built["int8_dynamic", None], threads=1)
    values, ids, whole = _first_step(sampled, plain, prepare_sources(tokenizer, sentences[:6], 64), vocab)
    listed_mass = _log_sum_exp(whole[:, words])
    left_out_mass = _log_sum_exp(whole[:, sample]) + np.log(len(left_out) / len(sample))
    estimated = whole - listed_mass - np.log1p(np.exp(left_out_mass - listed_mass))
    np.testing.assert_allclose(values, np.take_along_axis(estimated, ids, 1), rtol=0, atol=1e-4)
    np.testing.assert_allclose(values, np.sort(estimated[:, words], axis=1)[:, ::-1][:, :6], rtol=0, atol=1e-4)
    exact = whole - _log_sum_exp(whole)
    assert np.abs(np.take_along_axis(exact, ids, 1) - values).max() > 1e-3  # an estimate, not everything


def _log_sum_exp(x: np.ndarray) -> np.ndarray:
    top = x.max(axis=1, keepdims=True)
    return top + np.log(np.exp(x - top).sum(axis=1, keepdims=True))


def _first_step(restricted: Translator, plain: Translator, sources, vocab: int):
    """A step of six rows: the top 6 of `restricted`'s decoder_batch.onnx (values, ids) and the
    whole vocabulary's logits of `plain`, a package of the same weights without a shortlist."""
    tokens = np.array([5, 9, 1, 17, 2, 40], np.int64)
    for t in (restricted, plain):
        t.decoder.encode(sources, 1)
    values, ids = restricted.decoder.step_top_k(tokens, None, 6, scores=True)
    logits, columns = plain.decoder.step_top_k(tokens, None, vocab, scores=False)  # every word, best first
    whole = np.empty((len(tokens), vocab), np.float32)
    whole[np.arange(len(tokens))[:, None], columns] = logits
    return values, ids, whole


class _OverWords:
    """An IncrementalDecoder: a package's int8 logits (decoder_batch.onnx's and decoder_greedy.onnx's
    whole vocabulary) log-softmaxed over `words`, -inf elsewhere."""

    def __init__(self, decoder, words, vocab):
        self.decoder, self.words, self.vocab = decoder, words, vocab

    def encode(self, src, beam):
        self.decoder.encode(src, beam)

    def step(self, tokens, parents):
        rows = np.arange(len(tokens))
        # Parents always: decoder_batch.onnx (decoder_greedy.onnx takes no beams grouped by sentence).
        values, ids = self.decoder.step_top_k(tokens, rows if parents is None else parents, self.vocab, scores=False)
        logits = np.empty((len(tokens), self.vocab), np.float32)
        logits[rows[:, None], ids] = values
        listed = logits[:, self.words]
        out = np.full_like(logits, -np.inf)
        out[:, self.words] = listed - np.log(np.exp(listed).sum(axis=1, keepdims=True))
        return out


def test_one_sentence_greedy_in_generate_onnx_keeps_to_the_sentences_list(packages):
    """generate.onnx, int8 with a shortlist: a greedy call of one sentence runs over that
    sentence's word list (model/onnx_generate.py, _shortlisted_search) and every other call over
    the whole vocabulary, as the same weights without a shortlist do."""
    built, tables, tokenizer, sentences = packages
    narrow, plain = (Translator(built["int8_dynamic", name], threads=1) for name in ("narrow", None))
    free = Translator(built["int8_dynamic", "narrow"], threads=1, search="python", shortlist=False)
    assert narrow.search == plain.search == "graph"  # one sentence: generate.onnx
    greedy = dataclasses.replace(narrow.generation, beam=1)
    sources = prepare_sources(tokenizer, sentences, 64)
    table, vocab = tables["narrow"], tokenizer.vocab_size
    width = shortlist_width(table)
    assert width < vocab
    outside = 0
    for src in sources:
        listed = table.for_sources([src])
        assert len(listed) <= width  # the sentence's list fits whole
        # ... filled up to the width with the lowest other ids, as the graph does
        filled = set(listed.tolist()) | set([w for w in range(vocab) if w not in set(listed.tolist())][: width - len(listed)])
        [out] = narrow.searcher([src], greedy)
        assert set(out) <= filled, (src, out)
        [unrestricted] = free.searcher([src], greedy)
        outside += not set(unrestricted) <= filled
    assert outside  # the untrained model's free choices leave the list: the list did restrict them
    # shortlist=False: generate.onnx's whole vocabulary, as the same weights without a list give.
    unlisted = Translator(built["int8_dynamic", "narrow"], threads=1, shortlist=False)
    assert [unlisted.searcher([s], greedy) for s in sources] == [plain.searcher([s], greedy) for s in sources]
    # More than one row (beams, or several sentences): the whole vocabulary, as without a list.
    beams = dataclasses.replace(greedy, beam=3)
    one_graph = [GraphSearch(t.graph_search.session) for t in (narrow, plain)]
    for src in sources[:6]:
        assert one_graph[0]([src], beams) == one_graph[1]([src], beams)
    assert one_graph[0](sources[:4], greedy) == one_graph[1](sources[:4], greedy)


def test_one_sentence_greedy_over_a_list_of_every_word_is_the_whole_vocabularys(packages):
    """A list of every word in another order: the op's tokens are places in the list, mapped back
    to ids on the way in and out; the translations are the whole vocabulary's but near-ties (the
    list's projection is float32 over the dequantized int8 rows, MatMulNBits' quantizes its input)."""
    built, _, tokenizer, sentences = packages
    everything = Translator(built["int8_dynamic", "everything"], threads=1)
    whole = Translator(built["int8_dynamic", "everything"], threads=1, search="python", shortlist=False)
    greedy = dataclasses.replace(everything.generation, beam=1)
    sources = prepare_sources(tokenizer, sentences, 64)
    ours = [everything.searcher([src], greedy)[0] for src in sources]
    theirs = [whole.searcher([src], greedy)[0] for src in sources]
    assert_same_but_near_ties(whole.decoder, sources, ours, theirs)


def test_a_package_without_a_shortlist_has_no_shortlist_inputs(packages):
    built, _, _, sentences = packages
    plain = Translator(built["int8_dynamic", None], threads=1)
    files = plain.package["files"]
    assert "shortlist.npz" not in files and "shortlist.onnx" not in files
    assert not any(i.name.startswith("shortlist") for i in plain.decoder.many_rows.get_inputs())
    assert not plain.describe()["shortlist"]
    everything = Translator(built["int8_dynamic", "everything"], threads=1)
    assert "mt_runtime/shortlist.py" in everything.package["files"]
    assert plain.translate(sentences, beam=2, max_batch=8) == everything.translate(sentences, beam=2, max_batch=8)


def test_a_damaged_shortlist_is_refused(packages, tmp_path):
    built, _, tokenizer, _ = packages
    copy = tmp_path / "package"
    shutil.copytree(built["int8_dynamic", "narrow"], copy)
    table = Shortlist.load(copy / "shortlist.npz", tokenizer.vocab_size)
    dataclasses.replace(table, always=np.array([0, tokenizer.vocab_size])).save(copy / "shortlist.npz")
    meta = json.loads((copy / "package.json").read_text())
    with pytest.raises(PackageError):  # its digest no longer matches
        Translator(copy, threads=1)
    meta["files"]["shortlist.npz"] = {"sha256": sha256_file(copy / "shortlist.npz"),
                                      "bytes": (copy / "shortlist.npz").stat().st_size}
    (copy / "package.json").write_text(json.dumps(meta))
    with pytest.raises(PackageError, match="word ids outside the vocabulary"):  # listed, but not this model's
        Translator(copy, threads=1)


def test_the_export_stage_ships_a_shortlist_where_the_recipe_asks(smoke):
    store, arts = smoke.build("export", NO_PRUNE, "export.shortlist={frequent: 40, per_word: 8}")
    art = arts["export.student"]
    made = art.metrics["shortlist"]
    assert 300 < made["pairs"] <= 400 and made["frequent"] >= 40
    assert 40 <= made["mean_words_batch_32"] <= made["max_words_batch_32"] <= made["vocab_size"]
    assert 0.5 < made["valid_reference_coverage"] <= 1.0
    package = art.path / "fp32"
    files = json.loads((package / "package.json").read_text())["files"]
    assert {"shortlist.npz", "shortlist.onnx", "mt_runtime/shortlist.py"} <= set(files)
    assert "shortlist.npz" not in json.loads((art.path / "fp16" / "package.json").read_text())["files"]
    # Parity with PyTorch was judged on the whole vocabulary, as without a shortlist.
    assert art.metrics["greedy_identical"] == art.metrics["beam_identical"] == "20/20"
    src, _ = read_split(arts["data"].path, "valid")
    translator = Translator(package, threads=1)
    table = translator.decoder.shortlist
    sources = prepare_sources(translator.tokenizer, src[:8], 128)
    allowed = set(table.for_sources(sources).tolist())
    for out in translator.searcher(sources, dataclasses.replace(translator.generation, beam=1)):
        assert set(out) <= allowed
