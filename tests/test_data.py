"""Data stage: Multi30k lookup, checksums, download, user files, cleaning, clear errors."""

from __future__ import annotations

import gzip
import http.server
import shutil
import threading
from pathlib import Path

import pytest

from pipeline.errors import DataError
from pipeline.recipe import CleanConfig, DataConfig
from pipeline.stages import data as data_stage


def multi30k_config(**kw) -> DataConfig:
    return DataConfig(test_sets=["test_2016_flickr"], **kw)


WANTED = [f"{s}.{l}.gz" for s in ("train", "val", "test_2016_flickr") for l in ("en", "fr")]


def test_finds_local_copy_and_verifies_checksums(data_dir, tmp_path, monkeypatch):
    folder = data_stage.locate_multi30k(multi30k_config(), WANTED)
    assert (folder / "train.en.gz").is_file()
    # A damaged copy is named, never used.
    bad = tmp_path / "bad" / "multi30k"
    bad.mkdir(parents=True)
    for name in WANTED:
        shutil.copy(data_dir / "multi30k" / name, bad / name)
    with gzip.open(bad / "val.fr.gz", "ab") as f:
        f.write(b"extra line\n")
    monkeypatch.setenv("PIPELINE_DATA", str(tmp_path / "bad"))
    with pytest.raises(DataError, match=r"val\.fr\.gz: sha256 does not match"):
        data_stage.locate_multi30k(multi30k_config(), WANTED)


class _Handler(http.server.SimpleHTTPRequestHandler):
    corrupt: dict = {}

    def log_message(self, *args):
        pass

    def do_GET(self):
        name = self.path.rsplit("/", 1)[-1]
        body = (Path(self.directory) / name).read_bytes() if (Path(self.directory) / name).is_file() else None
        if body is None:
            self.send_error(404)
            return
        mode = self.corrupt.get(name)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if mode == "truncate":
            self.wfile.write(body[: len(body) // 2])
        elif mode == "garble":
            self.wfile.write(body[:-1] + bytes([body[-1] ^ 0xFF]))
        else:
            self.wfile.write(body)


@pytest.fixture
def server(data_dir):
    handler = lambda *a, **k: _Handler(*a, directory=str(data_dir / "multi30k"), **k)  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    _Handler.corrupt = {}
    httpd.shutdown()


def test_download_from_local_server(server, tmp_path, monkeypatch):
    monkeypatch.delenv("PIPELINE_DATA")
    folder = data_stage.locate_multi30k(multi30k_config(url=server), WANTED)
    assert folder == data_stage.cache_dir()
    assert all((folder / n).is_file() for n in WANTED)
    assert not list(folder.glob("*.part"))


@pytest.mark.parametrize("mode,message", [("truncate", "truncated"), ("garble", "sha256 mismatch")])
def test_bad_downloads_are_rejected(server, monkeypatch, mode, message):
    monkeypatch.delenv("PIPELINE_DATA")
    _Handler.corrupt = {"val.en.gz": mode}
    with pytest.raises(DataError, match=message):
        data_stage.locate_multi30k(multi30k_config(url=server), WANTED)
    assert not (data_stage.cache_dir() / "val.en.gz").exists()


def test_offline_without_files_says_where_to_put_them(monkeypatch):
    monkeypatch.delenv("PIPELINE_DATA")
    with pytest.raises(DataError, match="set PIPELINE_DATA"):
        data_stage.locate_multi30k(multi30k_config(url="http://127.0.0.1:9/none"), WANTED)


def test_user_files_plain_tsv_and_gz(tmp_path):
    (tmp_path / "a.en").write_text("Hello world\nA cat .\n", encoding="utf-8")
    with gzip.open(tmp_path / "a.fr.gz", "wt", encoding="utf-8") as f:
        f.write("Bonjour le monde\nUn chat .\n")
    (tmp_path / "v.tsv").write_text("One\tUn\nTwo\tDeux\n", encoding="utf-8")
    from pipeline.recipe import FileSplit

    src, tgt, _ = data_stage.read_pair(FileSplit(src=str(tmp_path / "a.en"), tgt=str(tmp_path / "a.fr.gz")))
    assert src == ["Hello world", "A cat ."] and tgt[0] == "Bonjour le monde"
    src, tgt, _ = data_stage.read_pair(FileSplit(tsv=str(tmp_path / "v.tsv")))
    assert (src, tgt) == (["One", "Two"], ["Un", "Deux"])


@pytest.mark.parametrize("content,message", [
    (b"ok\n\xff\xfebad\n", r"line 2: not valid UTF-8"),
    (b"", "file is empty"),
    (b"\x00\x01\x02binary", "binary data"),
])
def test_bad_files_are_named(tmp_path, content, message):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(DataError, match=f"{path}: .*{message}" if message != "file is empty" else message):
        data_stage.read_text_lines(path)


def test_mismatched_line_counts_name_both_files(tmp_path):
    from pipeline.recipe import FileSplit

    (tmp_path / "s").write_text("a\nb\nc\n")
    (tmp_path / "t").write_text("a\nb\n")
    with pytest.raises(DataError, match=r"s has 3 lines but .*t has 2"):
        data_stage.read_pair(FileSplit(src=str(tmp_path / "s"), tgt=str(tmp_path / "t")))
    (tmp_path / "x.tsv").write_text("a\tb\nno tab here\n")
    with pytest.raises(DataError, match=r"x\.tsv: line 2: expected 2 tab-separated fields"):
        data_stage.read_pair(FileSplit(tsv=str(tmp_path / "x.tsv")))


def test_cleaning_counts_what_it_drops():
    src = ["A cat.", "A cat.", "", "one two three four five six seven eight nine ten", "Cafe\u0301\tbar", "x " * 120]
    tgt = ["Un chat.", "Un chat.", "vide", "un", "Café bar", "y " * 120]
    s, t, dropped = data_stage.clean_pairs(src, tgt, CleanConfig(max_words=100, max_ratio=3.0))
    assert s == ["A cat.", "Café bar"] and t == ["Un chat.", "Café bar"]
    assert dropped == {"duplicate": 1, "empty": 1, "length_ratio": 1, "too_long": 1}
