"""Hardening, third round (issue 48), part A: no token, piece or decoded string adds or removes a
line where text is written a sentence a line (the KD corpus, hypotheses), and files a stage reads
side by side must have as many lines. The teacher is the tiny Marian of tests/test_hf_teacher.py
with pieces holding line breaks."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

from mt_runtime.lines import one_line  # noqa: E402

from pipeline.corpora.splits import check_aligned  # noqa: E402
from pipeline.engine.errors import StageFailed  # noqa: E402
from pipeline.engine.store import Store  # noqa: E402

from .conftest import SMOKE, cli  # noqa: E402
from .test_hf_teacher import _recipe, biased_to, marian  # noqa: E402,F401 (the fixture, built once for this module)

HUB_OFFLINE = {"HF_HUB_OFFLINE": "1"}


def _one_error(proc, code: int = 2) -> str:
    """The one error line of a command that failed (a run prints its progress too, no traceback)."""
    err = proc.stderr.decode()
    lines = [line for line in err.splitlines() if "error" in line.lower()]
    assert proc.returncode == code, err[-3000:]
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: "), err[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def newline_marian(marian, tmp_path_factory):
    """The tiny Marian with three of its pieces holding a line break, biased to write them."""
    folder = tmp_path_factory.mktemp("newline") / "opus-mt-newline"
    shutil.copytree(marian, folder)
    vocab = json.loads((folder / "vocab.json").read_text())
    pieces = [p for p in vocab if p.startswith("▁") and len(p) > 3][:3]
    ids = [vocab.pop(p) for p in pieces]
    for piece, i, brk in zip(pieces, ids, ("\n", "\r\n", "\u2028")):
        vocab[piece[:2] + brk + piece[2:]] = i
    (folder / "vocab.json").write_text(json.dumps(vocab))
    return biased_to(folder, ids)


def test_a_teacher_piece_holding_a_line_break_keeps_the_kd_corpus_aligned(newline_marian, tmp_path):
    store = Store(tmp_path / "store")
    proc = cli("run", str(_recipe(tmp_path, newline_marian)), "--until", "kd_corpus", store=store.root, env=HUB_OFFLINE)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    kd = next((store.objects).glob("kd_corpus-*"))
    src = (kd / "kd.src").read_bytes().decode("utf-8")
    tgt = (kd / "kd.tgt").read_bytes().decode("utf-8")
    sentences = json.loads((kd / "manifest.json").read_text())["metrics"]["sentences"]
    assert src.count("\n") == tgt.count("\n") == len(src.splitlines()) == len(tgt.splitlines()) == sentences > 0
    assert tgt.count("\n") == 100 - json.loads((kd / "manifest.json").read_text())["metrics"]["empty_translations"]
    # (kd.tgt had 5121 lines for kd.src's 100 before.) Both decoders write one line a sentence.
    from model.hf_translator import HFTranslator

    for text in HFTranslator(newline_marian).translate(["A man is riding a bike.", "Two dogs."], beam=2):
        assert text and len(text.splitlines()) == 1 and one_line(text) == text


def test_the_students_tokenizer_from_such_a_teacher_decodes_to_one_line(newline_marian):
    from mt_runtime.subword import SubwordTokenizer

    from model.hf_tokenizer import teacher_tokenizers

    tok = SubwordTokenizer(*teacher_tokenizers(newline_marian))
    vocab = json.loads((newline_marian / "vocab.json").read_text())
    broken = [i for p, i in vocab.items() if len(p.splitlines()) > 1]
    assert len(broken) == 3
    for text in tok.decode([broken, broken[::-1] + [5, 6]]):
        assert len(text.splitlines()) == 1 and one_line(text) == text
    assert one_line("a\r\nb\x0bc\x0cd\x85e\u2028f\u2029g\x1ch") == "a  b c d e f g h"


def test_files_read_side_by_side_must_have_as_many_lines(smoke, tmp_path):
    a, b = tmp_path / "kd.src", tmp_path / "kd.tgt"
    a.write_text("one\ntwo\nthree\n")
    b.write_text("un\ndeux\n")
    with pytest.raises(StageFailed, match=f"{a} has 3 lines but {b} has 2"):
        check_aligned(a, b)
    # Through a run: a data artifact whose valid.tgt lost a line (its manifest rewritten to match).
    _, arts = smoke.build("data")
    store = Store(tmp_path / "store")
    copy = store.objects / arts["data"].id
    shutil.copytree(arts["data"].path, copy)
    tgt = copy / "valid.tgt"
    tgt.write_bytes(b"".join(tgt.read_bytes().splitlines(keepends=True)[:-1]))
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"]["valid.tgt"] = {
        "sha256": hashlib.sha256(tgt.read_bytes()).hexdigest(),
        "bytes": tgt.stat().st_size,
    }
    (copy / "manifest.json").write_text(json.dumps(manifest))
    recipe = tmp_path / "smoke.yaml"
    shutil.copyfile(SMOKE, recipe)
    line = _one_error(cli("run", str(recipe), "--until", "tokenizer", store=store.root, timeout=120), 1)
    assert f"{copy / 'valid.src'} has 40 lines but {copy / 'valid.tgt'} has 39" in line
