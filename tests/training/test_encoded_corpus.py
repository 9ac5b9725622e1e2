"""The training set on disk: encoded in blocks, memory-mapped, the same batches as in memory."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import torch
from mt_runtime.subword import SubwordTokenizer

from model.subword_training import train_subword
from pipeline.corpora import encoded as encoded_corpus
from pipeline.corpora.distilled import TopKStore, TopKWriter
from pipeline.corpora.encoded import encode_corpus, encode_to_disk
from pipeline.corpora.splits import LineIndex, read_split
from pipeline.training.loop import collate, collate_soft, make_batches
from tests.helpers import run_with_peak_rss


def _tokenizer(data_dir, tmp_path) -> SubwordTokenizer:
    with (
        gzip.open(data_dir / "multi30k" / "train.en.gz", "rt") as en,
        gzip.open(data_dir / "multi30k" / "train.fr.gz", "rt") as fr,
    ):
        lines = [line.strip() for _, line in zip(range(2000), en)] + [line.strip() for _, line in zip(range(2000), fr)]
    tok = train_subword(lines, 400)
    tok.save(tmp_path / "tokenizer.json")
    return tok


def _pairs(data_dir, n: int):
    with (
        gzip.open(data_dir / "multi30k" / "train.en.gz", "rt") as en,
        gzip.open(data_dir / "multi30k" / "train.fr.gz", "rt") as fr,
    ):
        return [(s.strip(), t.strip()) for _, s, t in zip(range(n), en, fr)]


def test_the_corpus_encoded_to_disk_is_the_one_encoded_in_memory(tmp_path, data_dir, monkeypatch):
    tok = _tokenizer(data_dir, tmp_path)
    pairs = _pairs(data_dir, 1000)
    monkeypatch.setattr(encoded_corpus, "ENCODE_BLOCK", 37)  # many blocks, the last one short
    in_memory = encode_corpus(tok, [s for s, _ in pairs], [t for _, t in pairs], 24)  # some too long: dropped
    on_disk, record = encode_to_disk(tok, ((s, t, -1) for s, t in pairs), tmp_path / "enc", 24)
    assert record["pairs_read"] == 1000 and record["pairs"] == len(in_memory) < 1000
    assert record["dropped_too_long"] == 1000 - len(in_memory)
    assert isinstance(on_disk.src.ids, np.memmap) and on_disk.src.ids.dtype == np.uint16
    for i in range(len(in_memory)):
        assert on_disk.src[i].tolist() == in_memory.src[i].tolist()
        assert on_disk.tgt[i].tolist() == in_memory.tgt[i].tolist()
    memory_batches, disk_batches = (make_batches(c, 400, seed=3, epoch=1) for c in (in_memory, on_disk))
    assert all(np.array_equal(a, b) for a, b in zip(memory_batches, disk_batches))
    for a, b in zip(
        collate(in_memory, memory_batches[0], 0, 1, 2, "cpu"), collate(on_disk, disk_batches[0], 0, 1, 2, "cpu")
    ):
        assert a.dtype == torch.long and torch.equal(a, b)

    # Encoded once: a resumed training opens the folder and reads no text.
    def no_text():
        raise AssertionError("encoded again")
        yield

    reopened, again = encode_to_disk(tok, no_text(), tmp_path / "enc", 24)
    assert again == record and np.array_equal(reopened.tgt.offsets, on_disk.tgt.offsets)


def test_stored_distributions_follow_their_pairs_where_they_fit(tmp_path, data_dir):
    tok = _tokenizer(data_dir, tmp_path)
    pairs = _pairs(data_dir, 60)
    targets = tok.encode([t for _, t in pairs])
    rng = np.random.default_rng(0)
    # Row r belongs to pair r; a third of them have one position too many (a teacher whose text
    # the tokenizer splits another way) and must not be used; the last ten pairs have no row.
    lengths = [len(t) + 1 + (r % 3 == 0) for r, t in enumerate(targets[:50])]
    rows = {r: (rng.integers(4, 400, (n, 3)), rng.random((n, 3)).astype(np.float16)) for r, n in enumerate(lengths)}
    writer = TopKWriter(tmp_path, lengths, 3, np.int16)
    for r in rng.permutation(50):  # rows arrive in any order (the KD corpus merges length-sorted chunks)
        writer.put(int(r), *rows[int(r)])
    writer.close()
    store = TopKStore(tmp_path)
    assert len(store) == 50 and store.k == 3
    assert all(np.array_equal(store[r][0], rows[r][0]) and np.array_equal(store[r][1], rows[r][1]) for r in rows)

    corpus, _ = encode_to_disk(
        tok, ((s, t, r if r < 50 else -1) for r, (s, t) in enumerate(pairs)), tmp_path / "enc", 256, top_k=store
    )
    fitting = [r for r in range(50) if r % 3]
    assert corpus.soft.present() == len(fitting)
    assert all((corpus.soft[r] is None) == (r not in fitting) for r in range(60))
    ids, probs = collate_soft(corpus, np.array([1, 3, 55]), positions=max(lengths) + 2, device="cpu")
    assert ids.shape[2] == 3
    assert torch.equal(ids[0, : lengths[1]], torch.from_numpy(rows[1][0].astype(np.int64)))
    assert probs[1].sum() == 0 and probs[2].sum() == 0  # pair 3 does not fit, pair 55 has none
    assert float(probs[0, lengths[1] :].sum()) == 0  # nothing past the target's end


def test_line_index_reads_any_line_as_split_lines_does(tmp_path):
    path = tmp_path / "lines.txt"
    lines = ["première", "", "tab\tinside", "a\rcarriage", "last without newline"]
    path.write_text("\n".join(lines), encoding="utf-8")
    with LineIndex(path) as index:
        assert len(index) == 5 and [index[i] for i in (4, 0, 3, 2, 1)] == [lines[i] for i in (4, 0, 3, 2, 1)]
        with pytest.raises(IndexError):
            index[5]
    with LineIndex(path, limit=2) as first_two:
        assert len(first_two) == 2
    (tmp_path / "x.src").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "x.tgt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with LineIndex(tmp_path / "x.src") as index:
        assert [index[i] for i in range(len(index))] == read_split(tmp_path, "x")[0]


_CHILD = """
import gzip, json, sys
from mt_runtime.subword import SubwordTokenizer
from pipeline.corpora import encoded as encoded_corpus
assert "torch" not in sys.modules  # a child of its own size: no torch to start
encoded_corpus.ENCODE_BLOCK = 2000  # both sizes many blocks: what grows is what is kept, not one block's lists
n, data, work = int(sys.argv[1]), sys.argv[2], sys.argv[3]
with gzip.open(data + "/multi30k/train.en.gz", "rt") as en, gzip.open(data + "/multi30k/train.fr.gz", "rt") as fr:
    base = [(s.strip(), t.strip()) for s, t in zip(en, fr)]
tok = SubwordTokenizer.load(work + "/tokenizer.json")
pairs = ((*base[i % len(base)], -1) for i in range(n))  # untagged: the tokenizer's word cache stays one size
corpus, record = encoded_corpus.encode_to_disk(tok, pairs, work + f"/enc{n}", 128)
batches = encoded_corpus.make_batches(corpus, 2000, seed=1, epoch=0)
touched = sum(int(corpus.src[i].sum()) + int(corpus.tgt[i].sum()) for b in batches[:20] for i in b)
print(json.dumps({"pairs": record["pairs"], "batches": len(batches)}))
"""


@pytest.mark.slow
def test_encoding_memory_does_not_grow_with_the_corpus(tmp_path, data_dir):
    """Ten times the pairs, about the same peak memory: the ids go to disk block by block, and
    batching needs only the offsets (holding the ids as Python lists costs ~100 MB more at 100k)."""
    _tokenizer(data_dir, tmp_path)
    script = tmp_path / "child.py"
    script.write_text(_CHILD, encoding="utf-8")
    peaks = {}
    for n in (10_000, 100_000):
        code, peaks[n], out, err = run_with_peak_rss(str(script), str(n), str(data_dir), str(tmp_path))
        assert code == 0, err[-2000:]
        assert json.loads(out)["pairs"] == n
    assert peaks[100_000] - peaks[10_000] < 30, peaks
