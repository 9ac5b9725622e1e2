"""Hardening, third round (issue 48), a shipped package is untrusted input to its runtime: every
generation.json field and the tokenizer are checked against the graphs (the author may have
re-signed package.json, so the digests pass), a shortlist's sizes before it is inflated, ids
handed in; and `pipeline translate` ends quietly on closed pipes and writes one line per line."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from mt_runtime.shortlist import build_shortlist
from mt_runtime.translator import PackageError, Translator

from model.subword_training import train_subword
from model.transformer import Transformer
from pipeline.export.package_builder import build_package

from .conftest import REPO, SOURCE_PATH, multi30k_head, one_layer_config, run_with_peak_rss

POSITIONS = 32  # the test model's position table: what generation.json's max_positions may reach


@pytest.fixture(scope="module")
def package(tmp_path_factory, data_dir) -> Path:
    """An int8 package with a shortlist, from a small untrained model (3 s)."""
    folder = tmp_path_factory.mktemp("package")
    en, fr = multi30k_head(data_dir, "en", 200), multi30k_head(data_dir, "fr", 200)
    tokenizer = train_subword(en + fr, vocab_size=200)
    tokenizer.save(folder / "tokenizer.json")
    table, _ = build_shortlist(
        list(zip(tokenizer.encode(en), tokenizer.encode(fr))),
        tokenizer.vocab_size,
        frequent=10,
        per_word=3,
        always=[0, 1, 2, 3],
    )
    table.save(folder / "shortlist.npz")
    torch.manual_seed(0)
    cfg = one_layer_config(tokenizer.vocab_size, head_dim=8, max_positions=POSITIONS, dropout=0.0)
    build_package(
        Transformer(cfg).eval(),
        "int8_dynamic",
        folder / "int8",
        tokenizer=folder / "tokenizer.json",
        work=folder / "work",
        shortlist=folder / "shortlist.npz",
    )
    return folder / "int8"


def _copy(package: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "pkg"
    shutil.copytree(package, copy)
    return copy


def _resign(folder: Path, rel: str, data: bytes) -> None:
    """Write `rel` and list its digest in package.json, as the package's author could."""
    (folder / rel).write_bytes(data)
    meta = json.loads((folder / "package.json").read_text())
    meta["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (folder / "package.json").write_text(json.dumps(meta))


def _cli(*args: str, input: bytes | None = b"", shell: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SOURCE_PATH, "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "pipeline.commands.cli", *args]
    if shell is not None:  # redirections Python cannot express: `<&-`, `>&-`, `> /dev/full`
        cmd = ["bash", "-c", " ".join(f"'{a}'" for a in cmd) + " " + shell]
    return subprocess.run(cmd, cwd=REPO, input=input, capture_output=True, timeout=120, env=env)


def _one_line(proc: subprocess.CompletedProcess, code: int) -> str:
    err = proc.stderr.decode()
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == code, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


# ------------------------------------------------------------------------------ generation.json
@pytest.mark.parametrize(
    "field, raw, expect",
    [
        ("max_positions", "1e999", "max_positions: must be an integer"),
        ("length_penalty", "1e999", "length_penalty: must be a finite number"),
        ("max_len_a", "NaN", "not JSON (NaN is not a JSON number)"),
        ("beam", "[4]", "beam: must be an integer, got a list"),
        ("beam", "true", "beam: must be an integer, got a boolean"),
        ("beam", "4.0", "beam: must be an integer, got a number"),
        ("pad_id", '"zero"', "pad_id: must be an integer, got a string"),
        ("max_positions", "1e12", "max_positions: must be an integer"),
        ("max_positions", "1000000000000", f"max_positions: must be from 2 to {POSITIONS} (the rows of the graphs'"),
        ("max_positions", "-5", f"max_positions: must be from 2 to {POSITIONS}"),
        ("max_positions", str(POSITIONS + 1), f"max_positions: must be from 2 to {POSITIONS}"),
        ("bos_id", "999999", "bos_id: must be from 0 to 199 (the graphs' vocabulary)"),
        ("eos_id", "-7", "eos_id: must be from 0 to 199"),
        ("eos_id", "0", "eos_id: 0 is not the tokenizer's </s> (2)"),
        ("beam", "0", "beam: must be from 1 to"),
        ("max_len_b", "-1", "max_len_b: must be from 0 to"),
        ("eos_id", None, "eos_id: missing"),
        (None, "{bad json", "not JSON"),
        (None, "[1, 2]", "not a JSON object"),
        (
            None,
            '{"beam": 1, "max_len_a": 0, "max_len_b": 1, "bos_id": 1, "eos_id": 2, "pad_id": 0, "max_positions": 32, '
            '"length_penalty": 1.0}',
            "a one-word sentence would get no word",
        ),
    ],
)
def test_every_generation_field_is_checked_against_the_graphs(package, tmp_path, field, raw, expect):
    copy = _copy(package, tmp_path)
    if field is None:
        text = raw
    else:
        values = json.loads((copy / "generation.json").read_text())
        values.pop(field)
        text = json.dumps(values) if raw is None else json.dumps(values)[:-1] + f', "{field}": {raw}}}'
    _resign(copy, "generation.json", text.encode())
    with pytest.raises(PackageError) as caught:
        Translator(copy, threads=1)
    message = str(caught.value)
    assert message.startswith(f"{copy / 'generation.json'}: ") and expect in message and "\n" not in message


def test_the_position_table_is_read_from_the_graphs(package):
    translator = Translator(package, threads=1)
    assert translator.generation.max_positions == POSITIONS and translator.vocab == 200
    assert translator.translate(["A man is riding a bike."], beam=2)[0]


# ------------------------------------------------------------------------------ tokenizer.json
def _without_piece(data: dict, piece: str) -> dict:
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != piece]
    data["model"]["vocab"] = [v for v in data["model"]["vocab"] if v[0] != piece]
    return data


@pytest.mark.parametrize(
    "change, expect",
    [
        (lambda d: {"model": 5}, "not a tokenizer ("),
        (lambda d: _without_piece(d, "<s>"), "no '<s>' piece"),
        (lambda d: _without_piece(d, "</s>"), "no '</s>' piece"),
        (
            lambda d: {
                **d,
                "added_tokens": d["added_tokens"]
                + [{**d["added_tokens"][0], "id": 999999, "content": "zzz", "special": False}],
            },
            "holds id 200, beyond the graphs' vocabulary of 200 words",
        ),
        (lambda d: b"\xff\xfe not UTF-8", "unreadable"),
    ],
)
def test_a_tokenizer_without_its_pieces_or_malformed_is_refused(package, tmp_path, change, expect):
    copy = _copy(package, tmp_path)
    changed = change(json.loads((copy / "tokenizer.json").read_text()))
    _resign(copy, "tokenizer.json", changed if isinstance(changed, bytes) else json.dumps(changed).encode())
    with pytest.raises(PackageError, match="^" + str(copy / "tokenizer.json").replace(".", r"\.")) as caught:
        Translator(copy, threads=1)
    assert expect in str(caught.value) and "\n" not in str(caught.value)


def test_ids_handed_to_the_graphs_must_be_inside_the_vocabulary(package):
    translator = Translator(package, threads=1)  # int8: GatherBlockQuantized would read any row
    for ids in ([5, 200, 2], [-1, 2]):
        with pytest.raises(ValueError, match="outside the package's vocabulary"):
            translator.encode([[4, 2], ids], beam=1)
    with pytest.raises(ValueError, match="must be integers"):
        translator.encode([[2**70, 2]], beam=1)
    translator.encode([[4, 5, 2]], beam=1)
    with pytest.raises(ValueError, match="token id 999 is outside"):
        translator.step(np.array([1, 999]), None)
    assert translator.step(np.array([1]), None).shape == (1, 200)


# ----------------------------------------------------------------------------- shortlist.npz
def _inflating_shortlist(path: Path, vocab: int, words: int) -> None:
    """shortlist.npz whose `words` member inflates to `words` int64 zeros (512 MiB: 2.3 MB on disk)."""
    offsets = np.zeros(vocab + 1, np.int64)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for name, array in (("vocab_size", np.array(vocab, np.int64)), ("always", np.arange(4)), ("offsets", offsets)):
            with z.open(f"{name}.npy", "w") as f:
                np.lib.format.write_array(f, array)
        with z.open("words.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array_header_1_0(f, {"descr": "<i8", "fortran_order": False, "shape": (words,)})
            for _ in range(words * 8 >> 20):
                f.write(bytes(1 << 20))


def test_a_shortlist_that_inflates_to_gigabytes_is_refused_before_anything_is_allocated(package, tmp_path):
    copy = _copy(package, tmp_path)
    _inflating_shortlist(tmp_path / "bomb.npz", 200, 1 << 26)
    assert (tmp_path / "bomb.npz").stat().st_size < 3 << 20
    _resign(copy, "shortlist.npz", (tmp_path / "bomb.npz").read_bytes())
    code, peak, _, err = run_with_peak_rss(
        "pipeline.commands.cli", "translate", "--model", str(copy), "--store", str(tmp_path / "store")
    )
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err
    # Refused by its shape (at most 256 candidates a word); MAX_BYTES bounds a vocabulary past 262,144 words.
    assert "shortlist.npz: words: shape (67108864,) does not fit a vocabulary of 200 words" in lines[0], err
    assert peak < 250, f"peak RSS {peak:.0f} MB"  # 550 MB when the array was read before its size was checked


# ------------------------------------------------------------------------------ the command
def test_translate_passes_the_runtimes_line_through(package, tmp_path):
    copy = _copy(package, tmp_path)
    values = json.loads((copy / "generation.json").read_text())
    _resign(copy, "generation.json", json.dumps({**values, "max_positions": 1e12}).encode())
    line = _one_line(_cli("translate", "--model", str(copy), input=b"A man.\n"), 1)
    assert "generation.json: max_positions: must be an integer" in line
    (copy / "decoder.onnx").unlink()  # the runtime's message, not "not a model"
    line = _one_line(_cli("translate", "--model", str(copy), input=b"A man.\n"), 1)
    assert line.endswith("decoder.onnx: missing from the package") and "not a model" not in line


def test_closed_pipes_end_quietly(package, tmp_path):
    model = ["translate", "--model", str(package), "--beam", "1"]
    assert "standard input is closed" in _one_line(_cli(*model, input=None, shell="<&-"), 2)
    assert "standard output is closed" in _one_line(_cli(*model, input=b"A man.\n", shell=">&-"), 2)
    full = _one_line(_cli(*model, input=b"A man.\n" * 100, shell="> /dev/full"), 1)
    assert "cannot write the translations to standard output: No space left on device" in full
    # `| head -1`: the reader goes away after one line.
    lines = b"".join(b"A man rides a bike number %d.\n" % i for i in range(3000))
    (tmp_path / "in.txt").write_bytes(lines)
    with open(tmp_path / "in.txt", "rb") as stdin:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.commands.cli", *model, "--batch-size", "2"],
            cwd=REPO,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": SOURCE_PATH},
        )
        assert proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read().decode()
        proc.wait(120)
    assert proc.returncode == 141 and err == "", err  # 128 + SIGPIPE, as a shell shows a process SIGPIPE ended


def test_a_package_whose_pieces_decode_to_line_breaks_still_gives_one_line_per_line(package, tmp_path):
    copy = _copy(package, tmp_path)
    tokenizer = json.loads((copy / "tokenizer.json").read_text())
    tokenizer["decoder"] = {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": "\r\n\u2028\x85"},
            tokenizer["decoder"],
        ],
    }
    _resign(copy, "tokenizer.json", json.dumps(tokenizer).encode())
    proc = _cli("translate", "--model", str(copy), "--beam", "2", input=b"A man rides.\n\nTwo dogs\r play.\nA cat.\n")
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode()
    assert out.count("\n") == 4 and len(out.splitlines()) == 4 and out.splitlines()[1] == ""
    assert not any(c in out for c in "\r\u2028\x85")
