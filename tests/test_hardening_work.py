"""Hardening, third round (issue 48), what is on disk: work folders are checked like artifacts
(encoded shards and offsets, KD corpus chunks, the top-k store, checkpoints and snapshots carry
sizes and digests written last; a resumed run rebuilds what fails, or says in one line which
folder to remove), decompression is bounded for every codec, and YAML aliases in a recipe are
counted before anything walks them."""

from __future__ import annotations

import bz2
import json
import lzma
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from model.subword_training import train_subword
from model.transformer import Transformer, TransformerConfig
from pipeline.commands import read_recipe
from pipeline.corpora.distilled import (
    TOP_K_FILE,
    TopKStore,
    TrainingText,
    chunk_problem,
    encoded_training_set,
    write_top_k,
)
from pipeline.corpora.encoded import encode_to_disk
from pipeline.engine.errors import IntegrityError, PipelineError, RecipeError
from pipeline.engine.recipe import MAX_ALIAS_VALUES
from pipeline.engine.store import file_record
from pipeline.training.loop import Checkpoints

from .conftest import SMOKE, cli, multi30k_head, run_with_peak_rss

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
        read_recipe(path)
    assert time.monotonic() - started < 1  # depth 7 took 18 s, depth 11 over a minute
    if depth == 11:
        for command, store in (("validate", None), ("status", tmp_path / "store")):
            proc = cli(command, str(path), store=store, timeout=60)
            err = proc.stderr.decode()
            assert proc.returncode == 2 and err.count("error:") == 1 and "Traceback" not in err, err


def test_yaml_aliases_within_the_bound_and_recursive_ones(tmp_path):
    reused = tmp_path / "reused.yaml"
    reused.write_text(
        f"extends: {SMOKE}\nteacher: {{train: &train {{lr: 0.002, warmup_steps: 10}}}}\n"
        "distill: {student: {train: *train}}\n"
    )
    raw = read_recipe(reused)[1]
    assert raw["teacher"]["train"]["lr"] == raw["distill"]["student"]["train"]["lr"] == 0.002
    (tmp_path / "self.yaml").write_text("a: &a [1, *a]\n")
    with pytest.raises(RecipeError, match="a YAML alias inside the value it names"):
        read_recipe(tmp_path / "self.yaml")
    big = "[" + ", ".join(["&b [" + ", ".join(["1"] * 100) + "]"] + ["*b"] * (MAX_ALIAS_VALUES // 100 + 1)) + "]"
    with pytest.raises(RecipeError, match=r"--set teacher.note: YAML aliases repeat more than"):
        read_recipe(SMOKE, [f"teacher.note={big}"])


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
def _checkpoint(work: Path) -> tuple[Checkpoints, Transformer, torch.optim.Optimizer]:
    cfg = TransformerConfig(
        vocab_size=50,
        d_model=8,
        head_dim=4,
        enc_heads=[2],
        dec_self_heads=[2],
        dec_cross_heads=[2],
        enc_ffn=[16],
        dec_ffn=[16],
        max_positions=16,
    )
    model = Transformer(cfg)
    optimizer = torch.optim.Adam(model.parameters())
    ckpt = Checkpoints(work)
    snapshot = ckpt.save_snapshot(model, "epoch1")
    ckpt.save(
        model,
        optimizer,
        {
            "step": 3,
            "epoch": 1,
            "batch": 0,
            "elapsed_s": 1.0,
            "history": [],
            "tokens": 9,
            "resumed_from": [],
            "kept": [{"name": "epoch1", "snapshot": snapshot}],
        },
    )
    return ckpt, model, optimizer


@pytest.mark.parametrize("how", ["model_truncated", "state_not_json", "snapshot_changed", "optimizer_gone"])
def test_a_damaged_checkpoint_says_which_folder_to_remove(tmp_path, how):
    ckpt, model, optimizer = _checkpoint(tmp_path / "work")
    assert ckpt.load(model, optimizer)["step"] == 3  # whole, it resumes
    if how == "model_truncated":
        (ckpt.dir / "model.safetensors").write_bytes((ckpt.dir / "model.safetensors").read_bytes()[:64])
    elif how == "state_not_json":
        (ckpt.dir / "state.json").write_text("{")
    elif how == "snapshot_changed":
        data = bytearray((ckpt.snapshots / "epoch1.safetensors").read_bytes())
        data[-1] ^= 1
        (ckpt.snapshots / "epoch1.safetensors").write_bytes(bytes(data))
    else:
        (ckpt.dir / "optimizer.safetensors").unlink()
    with pytest.raises(PipelineError) as caught:
        Checkpoints(tmp_path / "work").saved_state()
    message = str(caught.value)
    assert "\n" not in message and message.endswith(f"remove {tmp_path / 'work'} and run again to train from the start")
