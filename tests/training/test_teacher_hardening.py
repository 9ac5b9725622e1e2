"""An imported checkpoint is untrusted data (issue 48): no link, no custom code, no pickle, no
size the machine cannot hold; copied as regular files with no wider permissions, hashed as
copied; a teacher whose pieces hold line breaks still writes one line a sentence, and so does the
student's tokenizer taken from it. Checkpoints are the tiny Marian of tests/training/conftest.py,
changed here as a hostile or careless user would."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

from mt_runtime.lines import one_line  # noqa: E402

from model.hf_checkpoint import (  # noqa: E402
    UnsafeCheckpoint,
    check_checkpoint,
    checkpoint_files,
    copy_checkpoint,
    from_pretrained,
    size_problem,
)
from pipeline.engine.store import Store  # noqa: E402
from tests.helpers import REPO, _one_error, cli, run_with_peak_rss  # noqa: E402
from tests.helpers.marian import HUB_OFFLINE, _recipe, biased_to  # noqa: E402

CUSTOM_CODE = """import pathlib
pathlib.Path({marker!r}).write_text("the checkpoint's code ran")
from transformers import MarianConfig, MarianMTModel
class EvilConfig(MarianConfig):
    model_type = "evil"
class EvilModel(MarianMTModel):
    config_class = EvilConfig
"""


def _copy(marian: Path, tmp_path: Path, name: str = "ckpt") -> Path:
    folder = tmp_path / name
    shutil.copytree(marian, folder)
    return folder


def _private(tmp_path: Path) -> Path:
    secret = tmp_path / "private" / "id_rsa"
    secret.parent.mkdir()
    secret.write_text("PRIVATE KEY 48\n")
    secret.chmod(0o600)
    return secret


def _holds(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and needle in p.read_bytes()]


# ----------------------------------------------------------------- 1. regular files only, copied as they are
@pytest.mark.parametrize("where", ["merges.txt", "notes.txt", "extra/notes.txt"])
def test_a_linked_file_anywhere_in_the_checkpoint_is_refused_and_nothing_is_copied(marian, tmp_path, where):
    secret = _private(tmp_path)
    folder = _copy(marian, tmp_path)
    (folder / where).parent.mkdir(exist_ok=True)
    (folder / where).symlink_to(secret)
    store = tmp_path / "store"
    proc = cli("run", str(_recipe(tmp_path, folder)), "--until", "teacher", store=store, env=HUB_OFFLINE)
    line = _one_error(proc)
    assert "is a symbolic link" in line and where in line
    assert not _holds(store, b"PRIVATE KEY 48") and not list(store.glob("objects/teacher-*"))
    with pytest.raises(UnsafeCheckpoint, match="symbolic link"):
        copy_checkpoint(folder, tmp_path / "dest")


def test_a_link_swapped_in_after_the_check_is_not_followed(marian, tmp_path, monkeypatch):
    import model.hf_checkpoint as hf_checkpoint

    secret = _private(tmp_path)
    folder = _copy(marian, tmp_path)
    listed = checkpoint_files(folder)

    def swap_then_list(path, weights=True):  # the check passes, then vocab.json becomes a link
        (folder / "vocab.json").unlink()
        (folder / "vocab.json").symlink_to(secret)
        return listed

    monkeypatch.setattr(hf_checkpoint, "check_checkpoint", swap_then_list)
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(UnsafeCheckpoint, match="vocab.json"):
        copy_checkpoint(folder, dest)
    assert not _holds(dest, b"PRIVATE KEY 48")


def test_copies_keep_no_wider_permissions_and_are_hashed_as_written(marian, tmp_path):
    folder = _copy(marian, tmp_path)
    (folder / "model.safetensors").chmod(0o600)
    (folder / "vocab.json").chmod(0o640)
    (folder / "config.json").chmod(0o644)
    (folder / "pytorch_model.bin").write_bytes(b"a pickle beside safetensors: never read, never copied")
    (folder / "custom.py").write_text("raise SystemExit('never imported')\n")
    dest = tmp_path / "dest"
    dest.mkdir()
    digests = copy_checkpoint(folder, dest)
    assert set(digests) == {p.name for p in dest.iterdir()}
    assert not (dest / "pytorch_model.bin").exists() and not (dest / "custom.py").exists()
    for name, digest in digests.items():
        assert (
            hashlib.sha256((dest / name).read_bytes()).hexdigest()
            == digest
            == hashlib.sha256((folder / name).read_bytes()).hexdigest()
        )
        source, copy = (stat.S_IMODE(p.stat().st_mode) for p in (folder / name, dest / name))
        assert copy & ~source == 0, f"{name}: {oct(copy)} is wider than {oct(source)}"
    assert stat.S_IMODE((dest / "model.safetensors").stat().st_mode) & 0o077 == 0


def test_a_hub_cache_snapshot_is_read_through_its_own_links_only(marian, tmp_path):
    repo = tmp_path / "hub" / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    for path in marian.iterdir():
        blob = repo / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
        shutil.copyfile(path, blob)
        (snapshot / path.name).symlink_to(os.path.relpath(blob, snapshot))
    assert set(checkpoint_files(snapshot)) == {p.name for p in marian.iterdir()}
    check_checkpoint(snapshot)
    (snapshot / "notes.txt").symlink_to(_private(tmp_path))  # a link out of the cache is still refused
    with pytest.raises(UnsafeCheckpoint, match="notes.txt is a symbolic link"):
        checkpoint_files(snapshot)


# ----------------------------------------------------------------------------- 2. data, never code
def _custom_code(marian: Path, tmp_path: Path, marker: Path) -> Path:
    folder = _copy(marian, tmp_path, "custom")
    (folder / "custom_config.py").write_text(CUSTOM_CODE.format(marker=str(marker)))
    config = json.loads((folder / "config.json").read_text())
    config.update(
        model_type="evil",
        auto_map={"AutoConfig": "custom_config.EvilConfig", "AutoModelForSeq2SeqLM": "custom_config.EvilModel"},
    )
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.slow
def test_custom_code_is_refused_up_front_by_run_and_by_translate_whatever_stdin_says(marian, tmp_path):
    marker = tmp_path / "MARKER"
    folder = _custom_code(marian, tmp_path, marker)
    proc = cli(
        "run",
        str(_recipe(tmp_path, folder)),
        "--until",
        "teacher",
        store=tmp_path / "s",
        input=b"y\ny\n",
        env=HUB_OFFLINE,
    )
    assert "auto_map" in _one_error(proc) and "never code" in proc.stderr.decode()
    # An imported teacher's folder (hf_import.json beside checkpoint/), handed over as it is: the
    # first text line ("y") would have answered transformers' prompt.
    handed = _copy(folder, tmp_path, "handed")
    shutil.copytree(folder, handed / "checkpoint")
    (handed / "hf_import.json").write_text('{"format": "huggingface"}')
    proc = cli(
        "translate",
        "--model",
        str(handed),
        "--beam",
        "1",
        store=tmp_path / "s",
        input=b"y\n1\nA man.\n",
        env=HUB_OFFLINE,
        timeout=120,
    )
    assert "auto_map" in _one_error(proc) and proc.stdout == b""
    assert not marker.exists()


def test_no_library_is_asked_before_the_check_and_none_can_read_stdin(tmp_path):
    class Loader:
        calls = 0

        @classmethod
        def from_pretrained(cls, *args, **kwargs):
            cls.calls += 1

    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "marian", "auto_map": {"AutoConfig": "x.Y"}}))
    with pytest.raises(UnsafeCheckpoint, match="auto_map"):
        from_pretrained(Loader, folder)
    (folder / "config.json").write_text('{"model_type": "marian"}')
    (folder / "tokenizer_config.json").write_text('{"auto_map": {"AutoTokenizer": ["t.T", null]}}')
    with pytest.raises(UnsafeCheckpoint, match="tokenizer_config.json: auto_map"):
        from_pretrained(Loader, folder)
    assert Loader.calls == 0
    # While a library loads, fd 0 and sys.stdin are /dev/null; the user's input is there after.
    script = (
        "import os, sys\nfrom model.hf_checkpoint import stdin_closed\n"
        "with stdin_closed():\n"
        "    seen = [sys.stdin.read(), os.read(0, 100)]\n"
        "    try:\n        input('run the custom code? [y/N] ')\n"
        "    except EOFError:\n        seen.append('EOF')\n"
        "print(repr(seen), sys.stdin.readline().strip())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], input=b"y\nthe user's text\n", capture_output=True, cwd=REPO, timeout=60
    )
    assert done.stdout.decode().endswith("['', b'', 'EOF'] y\n"), done.stderr.decode()


def test_pickle_only_weights_are_one_line_saying_to_convert(marian, tmp_path):
    import torch
    from safetensors.torch import load_file

    folder = _copy(marian, tmp_path, "pickled")
    torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    proc = cli("run", str(_recipe(tmp_path, folder)), "--until", "teacher", store=tmp_path / "s", env=HUB_OFFLINE)
    line = _one_error(proc)
    assert "pickles only (pytorch_model.bin)" in line and "convert it to safetensors" in line


# --------------------------------------------------------------------------- 3. sizes before memory
def test_an_oversized_config_is_refused_before_anything_is_allocated(marian, tmp_path):
    folder = _copy(marian, tmp_path, "huge")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 100_000_000}))
    code, peak_mb, _, err = run_with_peak_rss(
        "pipeline.commands.cli",
        "run",
        str(_recipe(tmp_path, folder)),
        "--until",
        "teacher",
        "--store",
        str(tmp_path / "s"),
        env=HUB_OFFLINE,
    )
    lines = [line for line in err.splitlines() if "error" in line.lower()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "max_position_embeddings must be an integer from 0 to 1,048,576, got 100000000" in lines[0]
    assert peak_mb < 500, f"peak RSS {peak_mb:.0f} MB"  # 3 GB in 13 s and growing before the check


@pytest.mark.parametrize(
    "change, field",
    [
        ({"vocab_size": -5}, "vocab_size"),
        ({"d_model": 32.0}, "d_model"),
        ({"encoder_layers": True}, "encoder_layers"),
        ({"decoder_ffn_dim": "64"}, "decoder_ffn_dim"),
        ({"encoder": {"num_heads": 10**40}}, "num_heads"),
        ({"vocab_size": 1_000_000, "d_model": 65536}, "vocab_size"),
    ],
)  # 500 GiB of token tables
def test_each_size_in_a_config_is_checked_and_named(marian, change, field):
    config = {**json.loads((marian / "config.json").read_text()), **change}
    problem = size_problem(config)
    assert problem is not None and field in problem, problem
    assert size_problem(json.loads((marian / "config.json").read_text())) is None


# ----------------------------------------------------------- pieces holding line breaks


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


@pytest.mark.slow
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
