"""Hardening, third round (issue 48), what is on disk: work folders are checked like artifacts
(encoded shards and offsets, KD corpus chunks, the top-k store, checkpoints and snapshots carry
sizes and digests written last; a resumed run rebuilds what fails, or says in one line which
folder to remove), decompression is bounded for every codec, and YAML aliases in a recipe are
counted before anything walks them."""

from __future__ import annotations

import bz2
import lzma
import time
import zlib
from pathlib import Path

import pytest

from pipeline.errors import RecipeError
from pipeline.recipe import MAX_ALIAS_VALUES, load_recipe

from .conftest import SMOKE, cli, run_with_peak_rss

# ------------------------------------------------------------------------ 1. bounded decompression
_READ_ALL = """
import sys
from pathlib import Path
from pipeline.corpus_files import text_lines
from pipeline.errors import DataError
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
    bombs = {"bomb.zst": _zeros(zstandard.ZstdCompressor(level=1).compressobj(), 2048),  # 2 GiB in 65 KB
             "bomb.gz": _zeros(zlib.compressobj(1, zlib.DEFLATED, 31), 64),
             "bomb.xz": _zeros(lzma.LZMACompressor(preset=0), 64),
             "bomb.bz2": _zeros(bz2.BZ2Compressor(1), 64)}
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
    from pipeline.corpus_files import text_lines
    from pipeline.errors import DataError

    compress = zstandard.ZstdCompressor().compress
    many = b"".join(compress(b"line %d\n" % i) for i in range(50))  # frames far smaller than a read
    (tmp_path / "many.zst").write_bytes(many)
    assert list(text_lines(tmp_path / "many.zst")) == [f"line {i}" for i in range(50)]
    (tmp_path / "junk.zst").write_bytes(many + b"not zstd at all")
    with pytest.raises(DataError, match=r"junk\.zst: after line 50: cannot read the zstandard data"):
        list(text_lines(tmp_path / "junk.zst"))


# ---------------------------------------------------------------------------- 2. recipe aliases
def _laughs(depth: int) -> str:
    """A recipe of nested aliases: ten of the level below at each level (10**(depth + 1) values)."""
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, depth + 1)]
    return "\n".join(lines + [f"teacher: {{train: {{note: *a{depth}}}}}"]) + "\n"


@pytest.mark.parametrize("depth", [3, 11])
def test_nested_yaml_aliases_are_refused_before_anything_walks_them(tmp_path, depth):
    path = tmp_path / "laughs.yaml"
    path.write_text(_laughs(depth))
    assert len(path.read_bytes()) < 1000
    started = time.monotonic()
    with pytest.raises(RecipeError, match="YAML aliases repeat more than"):
        load_recipe(path)
    assert time.monotonic() - started < 1  # depth 7 took 18 s, depth 11 over a minute
    if depth == 11:
        for command, store in (("validate", None), ("status", tmp_path / "store")):
            proc = cli(command, str(path), store=store, timeout=60)
            err = proc.stderr.decode()
            assert proc.returncode == 2 and err.count("error:") == 1 and "Traceback" not in err, err


def test_yaml_aliases_within_the_bound_and_recursive_ones(tmp_path):
    reused = tmp_path / "reused.yaml"
    reused.write_text(f"extends: {SMOKE}\nteacher: {{train: &train {{lr: 0.002, warmup_steps: 10}}}}\n"
                      "distill: {student: {train: *train}}\n")
    raw = load_recipe(reused)[1]
    assert raw["teacher"]["train"]["lr"] == raw["distill"]["student"]["train"]["lr"] == 0.002
    (tmp_path / "self.yaml").write_text("a: &a [1, *a]\n")
    with pytest.raises(RecipeError, match="a YAML alias inside the value it names"):
        load_recipe(tmp_path / "self.yaml")
    big = "[" + ", ".join(["&b [" + ", ".join(["1"] * 100) + "]"] + ["*b"] * (MAX_ALIAS_VALUES // 100 + 1)) + "]"
    with pytest.raises(RecipeError, match=r"--set teacher.note: YAML aliases repeat more than"):
        load_recipe(SMOKE, [f"teacher.note={big}"])
