"""The training data on disk as untrusted (issue 48): decompression is bounded for every codec;
work folders are checked like artifacts (encoded shards and offsets, KD corpus chunks, the top-k
store carry sizes and digests written last; a resumed run rebuilds what fails, or says in one
line what is wrong); files a stage reads side by side must have as many lines."""

from __future__ import annotations

import bz2
import hashlib
import json
import lzma
import shutil
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from model.subword_training import train_subword
from pipeline.corpora.distilled import (
    TOP_K_FILE,
    TopKStore,
    TrainingText,
    chunk_problem,
    encoded_training_set,
    write_top_k,
)
from pipeline.corpora.encoded import encode_to_disk
from pipeline.corpora.splits import check_aligned
from pipeline.engine.errors import IntegrityError, PipelineError, StageFailed
from pipeline.engine.store import Store, file_record
from tests.helpers import SMOKE, _one_error, cli, multi30k_head, run_with_peak_rss

# ------------------------------------------------------------------------ 1. bounded decompression
_READ_ALL = """
import sys
from pathlib import Path
from pipeline.corpora.user_files import text_lines
from pipeline.engine.errors import DataError
for name in sys.argv[1:]:
    try:
        sum(1 for _ in text_lines(Path(name)))
        print(name, "read")
    except DataError as exc:
        print(str(exc))
"""


def _zeros(compressor, mib: int) -> bytes:
    chunk, out = bytes(1 << 20), []
    for _ in range(mib):
        out.append(compressor.compress(chunk))
    return b"".join(out) + compressor.flush()


def test_every_codec_decompresses_in_bounded_pieces(tmp_path):
    """Files of zeros that expand a thousandfold and more, one "line" each: refused at the line
    bound, with memory flat (a 65 KB .zst expanding to 2 GiB took 3 GB in 10 s: each 64 KiB read
    was decompressed whole)."""
    zstandard = pytest.importorskip("zstandard")
    bombs = {
        "bomb.zst": _zeros(zstandard.ZstdCompressor(level=1).compressobj(), 2048),  # 2 GiB in 65 KB
        "bomb.gz": _zeros(zlib.compressobj(1, zlib.DEFLATED, 31), 64),
        "bomb.xz": _zeros(lzma.LZMACompressor(preset=0), 64),
        "bomb.bz2": _zeros(bz2.BZ2Compressor(1), 64),
    }
    for name, data in bombs.items():
        (tmp_path / name).write_bytes(data)
    assert len(bombs["bomb.zst"]) < 100_000
    script = tmp_path / "read.py"
    script.write_text(_READ_ALL)
    started = time.monotonic()
    code, peak, out, err = run_with_peak_rss(str(script), *(str(tmp_path / n) for n in bombs), timeout=60)
    assert code == 0, err
    assert out.count("line 1: longer than 1 MiB") == 4, out
    assert peak < 150, f"peak RSS {peak:.0f} MB"
    assert time.monotonic() - started < 30


def test_zstd_frames_after_the_first_and_bytes_that_are_not_zstd(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    from pipeline.corpora.user_files import text_lines
    from pipeline.engine.errors import DataError

    compress = zstandard.ZstdCompressor().compress
    many = b"".join(compress(b"line %d\n" % i) for i in range(50))  # frames far smaller than a read
    (tmp_path / "many.zst").write_bytes(many)
    assert list(text_lines(tmp_path / "many.zst")) == [f"line {i}" for i in range(50)]
    (tmp_path / "junk.zst").write_bytes(many + b"not zstd at all")
    with pytest.raises(DataError, match=r"junk\.zst: after line 50: cannot read the zstandard data"):
        list(text_lines(tmp_path / "junk.zst"))


# ---------------------------------------------------------------------------- 2. recipe aliases


# ----------------------------------------------------------------------------- 3. encoded shards
@pytest.fixture(scope="module")
def encoded_inputs(tmp_path_factory, data_dir):
    en, fr = multi30k_head(data_dir, "en", 300), multi30k_head(data_dir, "fr", 300)
    return train_subword(en + fr, vocab_size=300), list(zip(en, fr))


def _damage(folder: Path, how: str) -> None:
    if how == "ids_truncated":
        (folder / "src.ids").write_bytes((folder / "src.ids").read_bytes()[:100])
    elif how == "ids_0xffff":  # same size, every id beyond the vocabulary
        (folder / "tgt.ids").write_bytes(b"\xff" * (folder / "tgt.ids").stat().st_size)
    elif how == "offsets_cut":
        data = (folder / "src.offsets.npy").read_bytes()
        (folder / "src.offsets.npy").write_bytes(data[: len(data) // 2])
    elif how == "record_not_json":
        (folder / "encoded.json").write_text("{not json")
    elif how == "record_gone":  # a build killed before its record
        (folder / "encoded.json").unlink()


@pytest.mark.parametrize("how", ["ids_truncated", "ids_0xffff", "offsets_cut", "record_not_json", "record_gone"])
def test_a_damaged_encoded_folder_is_encoded_again(encoded_inputs, tmp_path, how):
    tok, pairs = encoded_inputs
    folder = tmp_path / "work" / "encoded"
    first, record = encode_to_disk(tok, ((s, t, -1) for s, t in pairs), folder, 64)
    expected = [first.src[i].tolist() for i in range(len(first))], [first.tgt[i].tolist() for i in range(len(first))]
    del first
    _damage(folder, how)
    # A process that only opens what another encoded: one line naming the folder to remove.
    with pytest.raises(PipelineError, match=f"^{folder}: .*; remove the folder and run again"):
        encode_to_disk(tok, None, folder, 64)
    # The resumed run's own path: the training pairs encoded again, with a line saying why.
    logged = []
    text = TrainingText(lambda: ((s, t, -1) for s, t in pairs), None, {"train_pairs": len(pairs)})
    from pipeline.engine.context import progress_bar

    corpus, info = encoded_training_set(text, tok, 64, tmp_path / "work", logged.append, progress_bar)
    assert any("encoding the training pairs again" in line for line in logged), logged
    assert (
        [corpus.src[i].tolist() for i in range(len(corpus))],
        [corpus.tgt[i].tolist() for i in range(len(corpus))],
    ) == expected
    assert len(corpus) == record["pairs"] > 0 and min(corpus.src.lengths()) > 0


def test_a_whole_encoded_folder_is_opened_as_it_is(encoded_inputs, tmp_path):
    tok, pairs = encoded_inputs
    folder = tmp_path / "encoded"
    encode_to_disk(tok, ((s, t, -1) for s, t in pairs), folder, 64)
    record = json.loads((folder / "encoded.json").read_text())
    assert set(record["files"]) == {"src.ids", "tgt.ids", "src.offsets.npy", "tgt.offsets.npy"}
    logged = []
    encode_to_disk(tok, None, folder, 64, log=logged.append)
    assert logged == []
    with pytest.raises(PipelineError, match="encoded for max_positions 64, not 32"):  # another model's folder
        encode_to_disk(tok, None, folder, 32)


# ------------------------------------------------------------------ 4. KD chunks, the top-k store
def test_a_kd_chunk_counts_as_done_only_when_it_is_whole(tmp_path):
    rng = np.random.default_rng(0)
    index = [4, 1, 7]
    tops = [(rng.integers(0, 50, (n, 3)), rng.random((n, 3)).astype(np.float16)) for n in (2, 5, 3)]
    write_top_k(tmp_path / "00000.npz", tops)
    part = {"index": index, "hyps": ["a", "b", "c"], "top_k_file": file_record(tmp_path / "00000.npz")}
    (tmp_path / "00000.json").write_text(json.dumps(part))
    assert chunk_problem(tmp_path, 0, index, top_k=True) is None
    assert "00001.json is unreadable" in chunk_problem(tmp_path, 1, index, top_k=False)  # never written
    assert "one translation for each of its 2" in chunk_problem(tmp_path, 0, index[:2], top_k=False)
    data = (tmp_path / "00000.npz").read_bytes()
    (tmp_path / "00000.npz").write_bytes(data[:-10])
    assert "00000.npz: size" in chunk_problem(tmp_path, 0, index, top_k=True)
    (tmp_path / "00000.json").write_text('{"index": [4, 1')
    assert "00000.json is unreadable" in chunk_problem(tmp_path, 0, index, top_k=False)


def test_a_top_k_store_whose_arrays_disagree_is_one_line(tmp_path):
    np.save(tmp_path / f"{TOP_K_FILE}.lengths.npy", np.array([2, 3], np.int64))
    np.save(tmp_path / f"{TOP_K_FILE}.ids.npy", np.zeros((5, 4), np.int16))
    np.save(tmp_path / f"{TOP_K_FILE}.probs.npy", np.zeros((5, 4), np.float16))
    assert len(TopKStore(tmp_path)) == 2
    np.save(tmp_path / f"{TOP_K_FILE}.ids.npy", np.zeros((4, 4), np.int16))
    with pytest.raises(IntegrityError, match=r"lengths \(2,\), ids \(4, 4\) and probs \(5, 4\) do not fit"):
        TopKStore(tmp_path)
    (tmp_path / f"{TOP_K_FILE}.probs.npy").write_bytes(b"\x93NUMPY junk")
    with pytest.raises(IntegrityError, match="unreadable"):
        TopKStore(tmp_path)


# ------------------------------------------------------------------------------- 5. checkpoints


# ------------------------------------------------------------------ files read side by side


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
