"""A shipped package is untrusted input to its runtime (issues 27, 48): every generation.json
field and the tokenizer are checked against the graphs (the author may have re-signed
package.json, so the digests pass), a shortlist's sizes before it is inflated, ids handed in; a
package holds regular files only and no graph reads external data from outside it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from mt_runtime.files import (
    UnsafeFile,
    check_external_data,
    external_data_locations,
    member_problem,
    read_bounded,
    verify_package,
)
from mt_runtime.translator import PackageError, Translator

from tests.helpers import cli, run_with_peak_rss
from tests.helpers.files import _one_error_line, _point_outside, _private, _rehash
from tests.helpers.packages import POSITIONS, _copy, _resign, streamed_shortlist


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
    streamed_shortlist(path, vocab, np.zeros(vocab + 1, np.int64), "<i8", words, compresslevel=1)


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


# -------------------------------------------------------------- regular files, no way out (issue 27)


@pytest.mark.slow
def test_package_with_a_link_is_refused_by_the_runtime(exported, tmp_path):
    private = _private(tmp_path)
    package = tmp_path / "pkg"
    shutil.copytree(exported.path / "fp32", package)
    (package / "extra").mkdir()
    (package / "extra" / "keys").symlink_to(private)
    with pytest.raises(PackageError, match="symbolic link"):
        verify_package(package)


def test_the_rule_refuses_every_way_out(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "ok.bin").write_bytes(b"x")
    (tmp_path / "outside.txt").write_text("secret")
    (root / "link").symlink_to(tmp_path / "outside.txt")
    (root / "dirlink").symlink_to(root / "sub")
    os.mkfifo(root / "fifo")
    assert member_problem(root, "sub/ok.bin") is None
    for rel, why in [
        ("../outside.txt", ".."),
        ("/etc/passwd", "absolute"),
        ("link", "symbolic link"),
        ("dirlink/ok.bin", "symbolic link"),
        ("fifo", "fifo"),
        ("sub", "folder"),
        ("sub//ok.bin", "empty part"),
        ("nothere", "missing"),
        ("a\\b", "backslash"),
    ]:
        problem = member_problem(root, rel)
        assert problem and why in problem, (rel, problem)
    with pytest.raises(UnsafeFile, match="fifo"):
        read_bounded(root / "fifo", 10)  # refused without blocking on the fifo
    with pytest.raises(UnsafeFile, match="character device"):
        read_bounded("/dev/zero", 10)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink", "subgraph"])
def test_a_graph_naming_a_file_outside_its_package_is_refused_before_onnxruntime(exported, tmp_path, how):
    from mt_runtime.translator import Translator

    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"s" * 100_000)
    package = tmp_path / "pkg"
    shutil.copytree(exported.path / "fp32", package)
    graph, location = package / "encoder.onnx", "../secret.txt"
    if how == "absolute":
        location = str(secret)
    elif how == "symlink":
        (package / "weights.bin").symlink_to(secret)
        location = "weights.bin"
    elif how == "subgraph":
        graph = package / "generate.onnx"
    _point_outside(graph, location, subgraph=how == "subgraph")
    assert location in external_data_locations(graph.read_bytes())
    _rehash(package, graph.name, "package.json")
    with pytest.raises(UnsafeFile, match="external data"):
        check_external_data(graph)
    with pytest.raises(PackageError, match="external data|symbolic link"):
        Translator(package)
    proc = cli("translate", "--model", str(package), input=b"A dog.\n", timeout=60)
    err = _one_error_line(proc)
    assert "external data" in err or "symbolic link" in err
