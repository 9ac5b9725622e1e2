"""Data stage: Multi30k lookup, checksums, download, user files, cleaning, clear errors."""

from __future__ import annotations

import bz2
import gzip
import http.server
import lzma
import re
import shutil
import threading
from collections import Counter
from pathlib import Path

import pytest

from pipeline.commands import read_recipe
from pipeline.corpora import multi30k
from pipeline.corpora.cleaning import clean_pairs
from pipeline.corpora.splits import reservoir_sample
from pipeline.corpora.user_files import MAX_LINE_BYTES, pairs_of, text_lines, tsv_pairs
from pipeline.engine.context import StageContext
from pipeline.engine.errors import DataError, RecipeError
from pipeline.engine.recipe import dump_config
from pipeline.stages.data import STAGE, CleanConfig, DataConfig, DataInputs, FileSplit
from tests.helpers import run_with_peak_rss


def multi30k_config(**kw) -> DataConfig:
    return DataConfig(test_sets=["test_2016_flickr"], **kw)


WANTED = [f"{s}.{lang}.gz" for s in ("train", "val", "test_2016_flickr") for lang in ("en", "fr")]


def test_finds_local_copy_and_verifies_checksums(data_dir, tmp_path, monkeypatch):
    folder = multi30k.locate_multi30k(multi30k_config(), WANTED)
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
        multi30k.locate_multi30k(multi30k_config(), WANTED)


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
    folder = multi30k.locate_multi30k(multi30k_config(url=server), WANTED)
    assert folder == multi30k.cache_dir()
    assert all((folder / n).is_file() for n in WANTED)
    assert not list(folder.glob("*.part"))


@pytest.mark.parametrize("mode,message", [("truncate", "truncated"), ("garble", "sha256 mismatch")])
def test_bad_downloads_are_rejected(server, monkeypatch, mode, message):
    monkeypatch.delenv("PIPELINE_DATA")
    _Handler.corrupt = {"val.en.gz": mode}
    with pytest.raises(DataError, match=message):
        multi30k.locate_multi30k(multi30k_config(url=server), WANTED)
    assert not (multi30k.cache_dir() / "val.en.gz").exists()


def test_offline_without_files_says_where_to_put_them(monkeypatch):
    monkeypatch.delenv("PIPELINE_DATA")
    with pytest.raises(DataError, match="set PIPELINE_DATA"):
        multi30k.locate_multi30k(multi30k_config(url="http://127.0.0.1:9/none"), WANTED)


def _pairs(split):
    pairs, _ = pairs_of(split)
    return [list(side) for side in zip(*pairs)]


def test_user_files_plain_tsv_and_compressed(tmp_path):
    (tmp_path / "a.en").write_text("Hello world\nA cat .\n", encoding="utf-8")
    with gzip.open(tmp_path / "a.fr.gz", "wt", encoding="utf-8") as f:
        f.write("Bonjour le monde\nUn chat .\n")
    (tmp_path / "v.tsv").write_text("One\tUn\nTwo\tDeux\n", encoding="utf-8")
    src, tgt = _pairs(FileSplit(src=str(tmp_path / "a.en"), tgt=str(tmp_path / "a.fr.gz")))
    assert src == ["Hello world", "A cat ."] and tgt[0] == "Bonjour le monde"
    assert _pairs(FileSplit(tsv=str(tmp_path / "v.tsv"))) == [["One", "Two"], ["Un", "Deux"]]
    # .xz and .bz2 as they come; a BOM and CRLF line ends are not part of the text.
    text = "\ufeffOne\tUn\r\nTwo\tDeux\r\n".encode("utf-8")
    (tmp_path / "v.tsv.xz").write_bytes(lzma.compress(text))
    (tmp_path / "v.tsv.bz2").write_bytes(bz2.compress(text))
    for name in ("v.tsv.xz", "v.tsv.bz2"):
        assert _pairs(FileSplit(tsv=str(tmp_path / name))) == [["One", "Two"], ["Un", "Deux"]]


@pytest.mark.parametrize(
    "content,message",
    [
        (b"ok\n\xff\xfebad\n", r"line 2: not valid UTF-8 \(byte 0xff at column 1\)"),
        (b"", "file is empty"),
        (b"fine\n\x00\x01\x02binary", r"line 2: NUL bytes: binary data"),
        (b"a" * (MAX_LINE_BYTES + 10), r"line 1: longer than 1 MiB"),
    ],
)
def test_bad_files_are_named_with_the_line(tmp_path, content, message):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(DataError, match=f"{re.escape(str(path))}: .*{message}"):
        list(text_lines(path))


def test_zstd_frames_are_read_and_a_cut_one_is_named(tmp_path):
    zstandard = pytest.importorskip("zstandard")  # the optional reader of .zst corpora
    compress = zstandard.ZstdCompressor().compress
    text = "".join(f"line {i * 7919 % 10007}\tligne {i}\n" for i in range(30000)).encode()
    (tmp_path / "a.tsv.zst").write_bytes(compress(text) + compress(b"last\tdernier\n"))  # two frames
    pairs = list(tsv_pairs(tmp_path / "a.tsv.zst"))
    assert len(pairs) == 30001 and pairs[-1] == ("last", "dernier")
    whole = (tmp_path / "a.tsv.zst").read_bytes()
    (tmp_path / "cut.zst").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataError, match=r"cut\.zst: after line \d+: .*ends inside a frame"):
        list(text_lines(tmp_path / "cut.zst"))


def test_a_damaged_compressed_file_is_named(tmp_path):
    path = tmp_path / "cut.gz"
    whole = gzip.compress("".join(f"line {i * 7919 % 10007}\n" for i in range(20000)).encode())
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataError, match=r"cut\.gz: after line \d+: cannot read the gzip data"):
        list(text_lines(path))


def test_mismatched_line_counts_name_both_files(tmp_path):
    (tmp_path / "s").write_text("a\nb\nc\n")
    (tmp_path / "t").write_text("a\nb\n")
    with pytest.raises(DataError, match=r"s has 3 lines but .*t has 2"):
        _pairs(FileSplit(src=str(tmp_path / "s"), tgt=str(tmp_path / "t")))
    with pytest.raises(DataError, match=r"t has 2 lines but .*s has 3"):
        _pairs(FileSplit(src=str(tmp_path / "t"), tgt=str(tmp_path / "s")))
    for bad in ("no tab here", "a\tb\tc"):
        (tmp_path / "x.tsv").write_text(f"a\tb\n{bad}\n")
        with pytest.raises(DataError, match=r"x\.tsv: line 2: expected 2 tab-separated fields"):
            _pairs(FileSplit(tsv=str(tmp_path / "x.tsv")))
    with pytest.raises(DataError, match=r"nowhere\.tsv: file not found"):
        pairs_of(FileSplit(tsv=str(tmp_path / "nowhere.tsv")))  # before any reading


def test_cleaning_counts_what_it_drops():
    src = ["A cat.", "A cat.", "", "one two three four five six seven eight nine ten", "Cafe\u0301\tbar", "x " * 120]
    tgt = ["Un chat.", "Un chat.", "vide", "un", "Café bar", "y " * 120]
    dropped = Counter()
    kept = list(clean_pairs(zip(src, tgt), CleanConfig(max_words=100, max_ratio=3.0), dropped))
    assert kept == [("A cat.", "Un chat."), ("Café bar", "Café bar")]
    assert dropped == {"duplicate": 1, "empty": 1, "length_ratio": 1, "too_long": 1}


def test_reservoir_sample_is_uniform_bounded_and_seeded():
    import random

    sample = reservoir_sample(map(str, range(1000)), 100, random.Random(0))
    assert len(sample) == 100 == len(set(sample))
    assert sample == reservoir_sample(map(str, range(1000)), 100, random.Random(0))
    assert sum(int(x) >= 500 for x in sample) in range(35, 66)  # both halves of the stream drawn from
    assert reservoir_sample(["a", "b"], 5, random.Random(0)) == ["a", "b"]


# ------------------------------------------------------------------ a user's corpus, end to end
def _files_recipe(tmp_path, train: Path | str, name: str = "own", extra: str = "") -> Path:
    """A recipe whose data is the user's files: `train` a TSV file, or the YAML of `data.files.train`."""
    valid = tmp_path / "valid.tsv"
    valid.write_text("".join(f"valid sentence {i} .\tphrase de validation {i} .\n" for i in range(20)))
    recipe = tmp_path / f"{name}.yaml"
    train = f"{{tsv: {train}}}" if isinstance(train, Path) else train
    recipe.write_text(
        f"name: {name}\ndata:\n  source: files\n  files: {{train: {train}, valid: {{tsv: {valid}}}}}\n{extra}"
    )
    return recipe


def _peak_rss_mb(args: list[str], store: Path) -> tuple[int, float, str]:
    """Run the CLI in a fresh process: its exit code, peak RSS (conftest.run_with_peak_rss), stderr."""
    code, peak, _, err = run_with_peak_rss("pipeline.commands.cli", *args, "--store", str(store))
    return code, peak, err


def test_a_bad_line_in_a_users_corpus_fails_the_run_with_one_line_and_leaves_nothing(tmp_path):
    train = tmp_path / "train.tsv"
    train.write_text("".join(f"a cat {i} .\tun chat {i} .\n" for i in range(500)) + "three\tcolumns\there\n")
    code, _, err = _peak_rss_mb(["run", str(_files_recipe(tmp_path, train)), "--until", "data"], tmp_path / "s")
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(lines) == 1, err
    assert f"{train}: line 501: expected 2 tab-separated fields" in lines[0]
    assert not list((tmp_path / "s" / "objects").glob("data-*"))  # nothing half-written in the store


@pytest.mark.slow
def test_the_data_stage_streams_memory_does_not_grow_with_the_corpus(tmp_path, data_dir):
    """Ten times the pairs, about the same peak memory: only the 8-byte digests of kept pairs
    are held (holding the text, as the stage once did, costs ~100 MB more at 300k pairs)."""
    with (
        gzip.open(data_dir / "multi30k" / "train.en.gz", "rt") as en,
        gzip.open(data_dir / "multi30k" / "train.fr.gz", "rt") as fr,
    ):
        pairs = [(s.strip(), t.strip()) for s, t in zip(en, fr)]
    peaks = {}
    for n in (30_000, 300_000):
        train = tmp_path / f"train{n}.tsv"
        with open(train, "w", encoding="utf-8") as f:
            for i in range(n):
                s, t = pairs[i % len(pairs)]
                f.write(f"{s} #{i}\t{t} #{i}\n")
        code, peaks[n], err = _peak_rss_mb(
            ["run", str(_files_recipe(tmp_path, train, f"own{n}")), "--until", "data"], tmp_path / f"s{n}"
        )
        assert code == 0, err
    kept = (tmp_path / "s300000" / "objects").glob("data-*/train.src")
    assert sum(1 for _ in open(next(kept), encoding="utf-8")) == 300_000
    assert peaks[300_000] - peaks[30_000] < 40, peaks


# ---------------------------------------------------------------- several weighted training corpora
def _tsv(path: Path, pairs) -> Path:
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return path


def _numbered(tag: str, n: int) -> list[tuple[str, str]]:
    return [(f"{tag} sentence {i} .", f"{tag} phrase {i} .") for i in range(n)]


def _run_data(tmp_path, train: Path | str, out: str = "out", extra: str = "") -> tuple[dict, list[str], list[str]]:
    """The data stage on a recipe's `data` section, in this process: (metrics, train.src lines, log lines)."""
    recipe, _ = read_recipe(_files_recipe(tmp_path, train, extra=extra))
    folder = tmp_path / out
    folder.mkdir()
    ctx = StageContext(
        name="data",
        settings=recipe.data,
        config=dump_config(recipe.data),
        inputs=DataInputs(),
        out=folder,
        work=tmp_path / "work",
    )
    metrics = STAGE.load()(ctx)
    src = (folder / "train.src").read_text(encoding="utf-8").splitlines()
    tgt = (folder / "train.tgt").read_text(encoding="utf-8").splitlines()
    assert len(src) == len(tgt) == metrics["train_pairs"]
    assert [t.replace("phrase", "sentence") for t in tgt] == src  # the sides stay aligned
    return metrics, src, [event["message"] for event in ctx.events]


def test_weights_one_and_two_write_each_kept_pair_once_and_twice(tmp_path):
    a = _tsv(tmp_path / "a.tsv", _numbered("a", 30))
    b = _tsv(tmp_path / "b.tsv", _numbered("b", 20))
    metrics, src, log = _run_data(tmp_path, f"[{{tsv: {a}}}, {{tsv: {b}, weight: 2, name: books}}]")
    assert src[:30] == [s for s, _ in _numbered("a", 30)]
    assert src[30:] == [s for s, _ in _numbered("b", 20) for _ in range(2)]  # the copies adjacent
    assert metrics["train_pairs"] == 70 and metrics["train_raw_pairs"] == 50 and metrics["dropped"] == {}
    assert metrics["train_corpora"] == [
        {"name": "a", "weight": 1.0, "raw_pairs": 30, "kept_pairs": 30, "written_pairs": 30, "dropped": {}},
        {"name": "books", "weight": 2.0, "raw_pairs": 20, "kept_pairs": 20, "written_pairs": 40, "dropped": {}},
    ]
    assert any(line.startswith("a (weight 1): 30 pairs read, 30 kept, 30 written") for line in log)
    assert any(line.startswith("books (weight 2): 20 pairs read, 20 kept, 40 written") for line in log)


def test_a_fractional_weight_keeps_the_same_hashed_share_every_run(tmp_path):
    pairs = _numbered("c", 2000)
    c = _tsv(tmp_path / "c.tsv", pairs)
    first = _run_data(tmp_path, f"[{{tsv: {c}, weight: 0.5}}]", out="one")
    again = _run_data(tmp_path, f"[{{tsv: {c}, weight: 0.5}}]", out="two")
    assert first[1] == again[1] and first[0] == again[0]  # the same recipe, the same file
    kept = first[1]
    assert 900 <= len(kept) <= 1100, len(kept)  # about half
    assert len(set(kept)) == len(kept) and kept == [s for s, _ in pairs if s in set(kept)]  # a subset, in order
    assert first[0]["train_corpora"][0]["kept_pairs"] == 2000
    # 2.5: every pair twice, and a third time for about half of them; 0.5's half among those.
    metrics, src, _ = _run_data(tmp_path, f"[{{tsv: {c}, weight: 2.5}}]", out="three")
    counts = Counter(src)
    assert set(counts.values()) == {2, 3} and 4900 <= len(src) <= 5100, len(src)
    assert {s for s, n in counts.items() if n == 3} == set(kept)
    assert metrics["train_corpora"][0]["written_pairs"] == metrics["train_pairs"] == len(src)


def test_duplicates_are_found_across_corpora_and_max_train_counts_over_all(tmp_path):
    a_pairs = _numbered("a", 10) + [("Café sentence .", "Café phrase .")]
    a = _tsv(tmp_path / "a.tsv", a_pairs)
    # b repeats five of a's pairs (one of them only the same after NFC) and one of its own.
    b_pairs = (
        _numbered("a", 4)
        + [("Cafe\u0301 sentence .", "Cafe\u0301 phrase .")]
        + _numbered("b", 6)
        + [("b sentence 0 .", "b phrase 0 .")]
    )
    b = _tsv(tmp_path / "b.tsv", b_pairs)
    metrics, src, _ = _run_data(tmp_path, f"[{{tsv: {a}}}, {{tsv: {b}, weight: 3}}]")
    assert src == [s for s, _ in a_pairs] + [s for s, _ in _numbered("b", 6) for _ in range(3)]
    assert [c["dropped"] for c in metrics["train_corpora"]] == [{}, {"duplicate": 6}]
    assert [c["kept_pairs"] for c in metrics["train_corpora"]] == [11, 6]
    assert metrics["dropped"] == {"duplicate": 6} and metrics["train_raw_pairs"] == 23
    # The first 14 raw pairs: all of a's and three of b's (all duplicates): b adds none, and says so.
    metrics, src, log = _run_data(
        tmp_path, f"[{{tsv: {a}}}, {{tsv: {b}, weight: 3}}]", out="cut", extra="  max_train: 14\n"
    )
    assert [c["raw_pairs"] for c in metrics["train_corpora"]] == [11, 3] and len(src) == 11
    assert metrics["train_raw_pairs"] == 14
    assert any(line.startswith("warning: training corpus b") for line in log)
    # A later corpus that max_train never reaches is not read, and is named too.
    _, src, log = _run_data(tmp_path, f"[{{tsv: {a}}}, {{tsv: {b}}}]", out="short", extra="  max_train: 5\n")
    assert len(src) == 5 and any("warning: training corpus b" in line and "max_train (5)" in line for line in log)


def test_errors_name_the_corpus_file_and_an_empty_split(tmp_path):
    a = _tsv(tmp_path / "a.tsv", _numbered("a", 3))
    with pytest.raises(DataError, match=r"nowhere\.tsv: file not found"):
        _run_data(tmp_path, f"[{{tsv: {a}}}, {{tsv: {tmp_path / 'nowhere.tsv'}}}]")
    empty = _tsv(tmp_path / "e.tsv", [("", "x")])
    with pytest.raises(DataError, match=r"e\.tsv: no sentence pairs left in split 'train'"):
        _run_data(tmp_path, f"[{{tsv: {empty}, weight: 2}}]", out="empty")


@pytest.mark.parametrize(
    "train,message",
    [
        ("[{tsv: a.tsv, weight: 0}]", r"data\.files\.train\.0\.weight: must be > 0, got 0"),
        ("[{tsv: a.tsv}, {tsv: b.tsv, weight: -1.5}]", r"data\.files\.train\.1\.weight: must be > 0, got -1\.5"),
        ("[]", r"data\.files\.train: must be one split or a list of at least one corpus"),
        ("[{tsv: a.tsv, name: x}, {tsv: b.tsv, name: x}]", r"data\.files\.train: corpus names must be unique \('x'"),
        (
            "[{tsv: one/a.tsv}, {src: two/a.en.gz, tgt: two/a.fr.gz}]",  # two default names: the stems
            r"data\.files\.train: corpus names must be unique \('a'",
        ),
        ("[{tsv: a.tsv, wieght: 2}]", r"data\.files\.train\.0: unknown key 'wieght' \(did you mean 'weight'\?\)"),
        ("{tsv: a.tsv, weight: 2}", r"data\.files\.train: 'name' and 'weight' are keys of a list of corpora"),
        ("[{src: a.en}]", r"data\.files\.train\.0: give either 'tsv' or both 'src' and 'tgt'"),
    ],
)
def test_the_recipe_refuses_bad_corpus_lists(tmp_path, train, message):
    with pytest.raises(RecipeError) as exc:
        read_recipe(_files_recipe(tmp_path, train))
    assert len(exc.value.lines) == 1 and re.search(message, exc.value.lines[0]), exc.value.lines


def test_one_split_writes_what_it_always_did(tmp_path):
    """A single split: the cleaned pairs in order, once each, and the metrics as before this
    change (no per-corpus list); a list of that one corpus at weight 1 writes the same lines."""
    pairs = _numbered("a", 8) + [("a sentence 1 .", "a phrase 1 ."), ("", "vide")] + _numbered("b", 4)
    train = _tsv(tmp_path / "t.tsv", pairs)
    metrics, src, log = _run_data(tmp_path, train)
    assert src == [s for s, _ in _numbered("a", 8) + _numbered("b", 4)]
    assert metrics == {
        "src_lang": "en",
        "tgt_lang": "fr",
        "source": "files",
        "test_sets": [],
        "dropped": {"duplicate": 1, "empty": 1},
        "train_raw_pairs": 14,
        "train_pairs": 12,
        "valid_pairs": 20,
    }
    assert log == ["12 training pairs kept of 14 (dropped: {'duplicate': 1, 'empty': 1}); valid 20; test none"]
    listed, listed_src, _ = _run_data(tmp_path, f"[{{tsv: {train}}}]", out="listed")
    assert listed_src == src and listed["train_pairs"] == 12 and listed["dropped"] == metrics["dropped"]
