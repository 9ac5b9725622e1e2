"""Hardening, issue 57: a package that lies about sizes is refused before anything large is
allocated, in one line (the author may have re-signed package.json, so the digests pass). Each
case is built here from a real tiny package; where the case is about memory, the load runs in a
fresh process whose peak RSS is read (a package of the default recipe took 1 to 3 GB)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import pytest
from mt_runtime.shortlist import MAX_PER_WORD, Shortlist
from mt_runtime.translator import PackageError, Translator

from tests.helpers import REPO, run_with_peak_rss
from tests.helpers.packages import _copy, _resign, streamed_shortlist

PEAK_MB = 300  # a tiny package's whole `pipeline translate` run is about 200 MB


def _translate(copy: Path, tmp_path: Path, *lines: str) -> tuple[int, float, str, str]:
    """`pipeline translate --model copy` in a fresh process: (code, peak RSS MB, stdout, stderr)."""
    model = ["--model", str(copy), "--store", str(tmp_path / "store"), "--threads", "1", "--beam", "1"]
    text = "".join(line + "\n" for line in lines).encode()
    return run_with_peak_rss("pipeline.commands.cli", "translate", *model, input=text)


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def _tokenizer(copy: Path) -> dict:
    return json.loads((copy / "tokenizer.json").read_text())


# ------------------------------------------------------------------------------ tokenizer.json
def test_a_tokenizer_that_pads_is_refused_before_it_pads_anything(package, tmp_path):
    copy = _copy(package, tmp_path)
    tokenizer = _tokenizer(copy)
    tokenizer["padding"] = {
        "strategy": {"Fixed": 300_000_000},
        "direction": "Right",
        "pad_to_multiple_of": None,
        "pad_id": 0,
        "pad_type_id": 0,
        "pad_token": "<pad>",
    }
    _resign(copy, "tokenizer.json", json.dumps(tokenizer).encode())
    code, peak, out, err = _translate(copy, tmp_path, "A man rides a bike.")
    line = _one_line(err)
    assert code == 1 and out == "", err
    assert f"{copy / 'tokenizer.json'}: padding: must be null (the runtime pads sources itself)" in line, line
    assert peak < PEAK_MB, f"peak RSS {peak:.0f} MB"  # 1.5-3 GB when the tokenizer padded each line


def test_a_tokenizers_truncation_is_ignored(package, tmp_path):
    """The runtime cuts a source to max_positions - 1 ids itself; a stride would have made a line
    of n ids n encodings."""
    copy = _copy(package, tmp_path)
    tokenizer = _tokenizer(copy)
    tokenizer["truncation"] = {"direction": "Right", "max_length": 2, "strategy": "LongestFirst", "stride": 1}
    _resign(copy, "tokenizer.json", json.dumps(tokenizer).encode())
    text = ["A man in a blue shirt is riding a bike down the street.", "Two dogs."]
    truncated = Translator(copy, threads=1)
    assert len(truncated.tokenizer.encode(text[:1])[0]) > 2
    assert truncated.translate(text, beam=2) == Translator(package, threads=1).translate(text, beam=2)


def _with_pieces(tokenizer: dict, pieces: int) -> dict:
    vocab = tokenizer["model"]["vocab"]
    vocab += [[f"z{i}", -20.0] for i in range(pieces - len(vocab))]
    return tokenizer


@pytest.mark.parametrize(
    "pieces, expect",
    [
        # 30 MB for a 200-word graph (within MAX_TOKENIZER_BYTES): refused before it is read whole.
        (1_300_000, "larger than 2148352 bytes, the most for graphs of 200 words (2 MiB + 256 bytes a word)"),
        # Within that size, 60,000 pieces: counted from the JSON before `tokenizers` builds it.
        (60_000, "model.vocab holds 60000 entries, more than the graphs' vocabulary of 200 words"),
    ],
)
def test_a_tokenizer_larger_than_the_graphs_vocabulary_is_refused_cheaply(package, tmp_path, pieces, expect):
    copy = _copy(package, tmp_path)
    data = json.dumps(_with_pieces(_tokenizer(copy), pieces)).encode()
    _resign(copy, "tokenizer.json", data)
    code, peak, _, err = _translate(copy, tmp_path, "A man.")
    line = _one_line(err)
    assert code == 1 and f"{copy / 'tokenizer.json'}: {expect}" in line, line
    assert peak < PEAK_MB, f"peak RSS {peak:.0f} MB for a {len(data) >> 20} MB tokenizer"  # 975 MB for 30 MB


# ----------------------------------------------------------------------------- shortlist.npz
def _fat_shortlist(path: Path, vocab: int, entries: int) -> None:
    """shortlist.npz whose `words` are `entries` ids, all in range and all one source word's (ids 0):
    a few hundred KB on disk."""
    offsets = np.full(vocab + 1, entries, np.int64)
    offsets[0] = 0
    streamed_shortlist(path, vocab, offsets, "<i4", entries, compresslevel=9)


def test_a_shortlist_with_more_entries_than_the_vocabulary_allows_is_refused_from_its_header(package, tmp_path):
    copy = _copy(package, tmp_path)
    _fat_shortlist(tmp_path / "fat.npz", 200, 60 << 20)
    assert (tmp_path / "fat.npz").stat().st_size < 400_000
    _resign(copy, "shortlist.npz", (tmp_path / "fat.npz").read_bytes())
    code, peak, _, err = _translate(copy, tmp_path, "A man.")
    line = _one_line(err)
    assert code == 1 and f"{copy / 'shortlist.npz'}: words: shape (62914560,) does not fit a vocabulary" in line
    assert f"({MAX_PER_WORD} candidates a word at most)" in line, line
    assert peak < PEAK_MB, f"peak RSS {peak:.0f} MB"  # 326 MB at ready, past 2 GB at the first request


def test_a_shortlist_giving_one_word_too_many_candidates_is_refused(package, tmp_path):
    copy = _copy(package, tmp_path)
    offsets = np.full(201, MAX_PER_WORD + 1, np.int64)
    offsets[0] = 0
    table = Shortlist(200, np.arange(4), offsets, np.arange(MAX_PER_WORD + 1, dtype=np.int32) % 200)
    table.save(tmp_path / "one.npz")
    _resign(copy, "shortlist.npz", (tmp_path / "one.npz").read_bytes())
    with pytest.raises(PackageError, match=f"source word 0 has {MAX_PER_WORD + 1} candidates, more than 256$"):
        Translator(copy, threads=1)


def test_what_a_batch_gathers_from_the_shortlist_is_bounded():
    """The fullest shortlist the runtime takes for 8,000 words (256 candidates each, 2M entries):
    256 sentences of 255 different words gather 16.7M candidates, 470 MB of index arrays at once;
    gathered PICKS at a time the batch's word lists cost a few tens of MB, and are the same."""
    vocab, rng = 8000, np.random.default_rng(0)
    offsets = np.arange(vocab + 1, dtype=np.int64) * MAX_PER_WORD
    table = Shortlist(vocab, np.arange(64), offsets, rng.integers(0, vocab, vocab * MAX_PER_WORD).astype(np.int32))
    sources = [rng.permutation(vocab)[:255].tolist() for _ in range(256)]
    tracemalloc.start()
    union, allowed = table.batch_words(sources, [0, 1, 2], 4096)
    peak = tracemalloc.get_traced_memory()[1] >> 20
    tracemalloc.stop()
    assert peak < 80, f"{peak} MB"
    for row in (0, 255):  # each sentence's list is its own, as alone
        assert np.array_equal(union[allowed[row]], np.sort(table.sentence_words(sources[row], [0, 1, 2], 4096)))


# ---------------------------------------------------------------------------------- the graphs
def _rename(copy: Path, graph: str, old: str, new: str) -> None:
    model = onnx.load(str(copy / graph), load_external_data=False)
    for value in (*model.graph.input, *model.graph.output):
        if value.name == old:
            value.name = new
    for node in model.graph.node:
        node.input[:] = [new if name == old else name for name in node.input]
        node.output[:] = [new if name == old else name for name in node.output]
    _resign(copy, graph, model.SerializeToString())


@pytest.mark.parametrize(
    "graph, old, new, expect",
    [
        ("encoder.onnx", "src_ids", "ids", "has no input 'src_ids' (it has 'ids' instead)"),
        ("decoder.onnx", "log_probs", "scores", "has no output 'log_probs' (it has 'scores' instead)"),
        ("decoder_greedy_inplace.onnx", "tokens", "previous", "has no input 'tokens' (it has 'previous' instead)"),
        ("shortlist.onnx", "words", "ids", "has no input 'words' (it has 'ids' instead)"),
    ],
)
def test_a_graph_whose_inputs_are_not_the_formats_is_refused_on_load(package, tmp_path, graph, old, new, expect):
    copy = _copy(package, tmp_path)
    _rename(copy, graph, old, new)
    with pytest.raises(PackageError) as caught:
        Translator(copy, threads=1)
    assert str(caught.value) == f"{copy / graph}: {expect}; not a mt-onnx-package/2 graph (docs/package-format.md)"


def test_a_graph_of_another_type_is_refused_on_load(package, tmp_path):
    """An encoder that takes int32 ids (cast to int64 inside): it runs, but not on what the format feeds."""
    copy = _copy(package, tmp_path)
    model = onnx.load(str(copy / "encoder.onnx"), load_external_data=False)
    for node in model.graph.node:
        node.input[:] = ["src_ids_64" if name == "src_ids" else name for name in node.input]
    model.graph.node.insert(0, onnx.helper.make_node("Cast", ["src_ids"], ["src_ids_64"], to=onnx.TensorProto.INT64))
    model.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.INT32
    _resign(copy, "encoder.onnx", model.SerializeToString())
    with pytest.raises(PackageError) as caught:
        Translator(copy, threads=1)
    assert str(caught.value) == (
        f"{copy / 'encoder.onnx'}: input 'src_ids' is tensor(int32), where mt-onnx-package/2 has int64 [batch, src_len]"
    )


def test_both_commands_name_the_graph_and_the_input_in_one_line(package, tmp_path):
    copy = _copy(package, tmp_path)
    _rename(copy, "encoder.onnx", "src_ids", "ids")
    code, _, out, err = _translate(copy, tmp_path, "A man.")
    line = _one_line(err)
    assert code == 1 and out == "" and f"{copy / 'encoder.onnx'}: has no input 'src_ids'" in line, err
    served = subprocess.run(
        [sys.executable, "-m", "mt_runtime.serve", "serve", str(copy), "--port", "0", "--threads", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "model" / "runtime")},
    )
    assert served.returncode == 1 and "Traceback" not in served.stderr, served.stderr
    assert f"cannot load {copy}: {copy / 'encoder.onnx'}: has no input 'src_ids'" in served.stderr, served.stderr


# --------------------------------------------------------------------------------- external data
def _weights_elsewhere(copy: Path, graph: str, location: str) -> None:
    """Move a graph's weights to `location` beside it and re-sign the graph alone."""
    model = onnx.load(str(copy / graph))  # the weights read in, wherever they were
    onnx.save_model(model, str(copy / graph), save_as_external_data=True, location=location, size_threshold=256)
    _resign(copy, graph, (copy / graph).read_bytes())


def test_a_file_a_graph_reads_must_be_listed_and_so_checked(package, tmp_path):
    copy = _copy(package, tmp_path)
    _weights_elsewhere(copy, "encoder.onnx", "weights.bin")
    with pytest.raises(PackageError) as caught:
        Translator(copy, threads=1)
    assert str(caught.value) == (
        f"{copy / 'encoder.onnx'}: reads external data 'weights.bin', which package.json does not list "
        "(nothing checks its content); refusing to load the package"
    )
    # Listed, it loads and translates as before; changed after that, it is refused as any listed file.
    _resign(copy, "weights.bin", (copy / "weights.bin").read_bytes())
    text = ["A man is riding a bike.", "Two dogs play."]
    assert Translator(copy, threads=1).translate(text, beam=2) == Translator(package, threads=1).translate(text, beam=2)
    weights = bytearray((copy / "weights.bin").read_bytes())
    weights[100] ^= 1
    (copy / "weights.bin").write_bytes(weights)
    with pytest.raises(PackageError, match=r"weights\.bin: modified after export"):
        Translator(copy, threads=1)


def test_the_spec_states_the_limits_the_runtime_holds():
    from mt_runtime import package_checks as checks
    from mt_runtime import shortlist

    text = (REPO / "docs" / "package-format.md").read_text()
    limits = " ".join(re.search(r"^## Limits\n(.*?)^## ", text, re.S | re.M).group(1).split())
    base, per_word, most = (
        checks.TOKENIZER_BASE_BYTES >> 20,
        checks.TOKENIZER_BYTES_PER_WORD,
        checks.MAX_TOKENIZER_BYTES,
    )
    assert f"at most {base} MiB + {per_word} bytes x V (and {most >> 20} MiB)" in limits
    assert f"at most {MAX_PER_WORD} candidates for one source word" in limits
    assert f"at most {MAX_PER_WORD} x V ids" in limits and f"{shortlist.MAX_BYTES >> 20} MiB of arrays" in limits
    assert f"`beam` at most {checks.MAX_BEAM}" in limits
