"""Training batches made on the host (and ahead, in a thread), no waits for the device per step,
validation's greedy search on the device: the same batches, weights and words as before."""

from __future__ import annotations

import gzip
import threading

import numpy as np
import pytest
import torch
from mt_runtime.search import GenerationConfig, greedy_search
from mt_runtime.subword import SubwordTokenizer
from safetensors.torch import load_file

from model.subword_training import train_subword
from model.torch_decoder import TorchDecoder
from model.torch_greedy import greedy_hypotheses, greedy_on_device
from model.transformer import Transformer, load_model
from pipeline.corpora.distilled import TopKStore, TopKWriter
from pipeline.corpora.encoded import encode_corpus, encode_to_disk, make_batches
from pipeline.corpora.splits import read_split
from pipeline.engine.context import progress_bar
from pipeline.training.batches import BatchFeed, prepare_batch
from pipeline.training.loop import Trainer, collate, collate_soft
from pipeline.training.settings import TrainConfig
from pipeline.training.speed_probe import SpeedChoice
from pipeline.training.validation import ValidationSet
from tests.helpers import one_layer_config

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
SWITCHES = SpeedChoice(bf16=False, attention="math", fused_optimizer=True, threads=1, isa="test")


@pytest.fixture(scope="module")
def taught(data_dir, tmp_path_factory):
    """300 Multi30k pairs on disk, 200 of them with a stored top 3 (random) per target position."""
    folder = tmp_path_factory.mktemp("taught")
    with (
        gzip.open(data_dir / "multi30k" / "train.en.gz", "rt") as en,
        gzip.open(data_dir / "multi30k" / "train.fr.gz", "rt") as fr,
    ):
        pairs = [(s.strip(), t.strip()) for _, s, t in zip(range(300), en, fr)]
    tok = train_subword([s for s, _ in pairs] + [t for _, t in pairs], 300)
    lengths = [len(t) + 1 for t in tok.encode_target([t for _, t in pairs[:200]])]
    rng = np.random.default_rng(0)
    writer = TopKWriter(folder, lengths, 3, np.int16)
    for r, n in enumerate(lengths):
        probs = rng.random((n, 3))
        writer.put(r, rng.integers(4, tok.vocab_size, (n, 3)), probs / probs.sum(-1, keepdims=True))
    writer.close()
    corpus, _ = encode_to_disk(
        tok,
        ((s, t, r if r < 200 else -1) for r, (s, t) in enumerate(pairs)),
        folder / "enc",
        64,
        top_k=TopKStore(folder),
    )
    return tok, corpus


def _row_by_row(corpus, index, pad, bos, eos):
    """What a step learned from before its batches were vectorised: the rows one at a time."""
    src = [corpus.src[i] for i in index]
    tgt = [corpus.tgt[i] for i in index]
    t_len = max(map(len, tgt)) + 1
    src_t = np.full((len(index), max(map(len, src))), pad, dtype=np.int64)
    tin, tout = np.full((len(index), t_len), pad, dtype=np.int64), np.full((len(index), t_len), pad, dtype=np.int64)
    ids, probs = np.zeros((len(index), t_len, 3), np.int64), np.zeros((len(index), t_len, 3), np.float32)
    for row, (s, t, i) in enumerate(zip(src, tgt, index)):
        src_t[row, : len(s)] = s
        tin[row, 0], tin[row, 1 : len(t) + 1] = bos, t
        tout[row, : len(t)], tout[row, len(t)] = t, eos
        if corpus.soft[i] is not None:
            ids[row, : len(t) + 1], probs[row, : len(t) + 1] = corpus.soft[i]
    keep = tout != pad
    return src_t, tin, tout, ids[keep], probs[keep]


def test_a_prepared_batch_holds_what_the_rows_one_by_one_give(taught):
    tok, corpus = taught
    batches = make_batches(corpus, 400, seed=1, epoch=0)
    mixed = [b for b in batches if 0 < (corpus.soft.rows[b] >= 0).sum() < len(b)]
    assert mixed  # batches with and without stored distributions
    for index in batches:
        src, tin, tout, ids, probs = _row_by_row(corpus, index, tok.pad_id, tok.bos_id, tok.eos_id)
        batch = prepare_batch(corpus, index, tok.pad_id, tok.bos_id, tok.eos_id, soft=True)
        assert np.array_equal(batch.src.numpy(), src) and np.array_equal(batch.tgt_in.numpy(), tin)
        assert np.array_equal(batch.keep.numpy(), np.flatnonzero(tout != tok.pad_id))
        assert np.array_equal(batch.target.numpy(), tout[tout != tok.pad_id]) and batch.tokens == len(batch.target)
        assert np.array_equal(batch.soft_ids.numpy(), ids) and np.array_equal(batch.soft_probs.numpy(), probs)
        assert [t.numpy().tolist() for t in collate(corpus, index, tok.pad_id, tok.bos_id, tok.eos_id, "cpu")] == [
            src.tolist(),
            tin.tolist(),
            tout.tolist(),
        ]
        soft_ids, soft_probs = collate_soft(corpus, index, tout.shape[1], "cpu")
        assert torch.equal(soft_ids[torch.from_numpy(tout != tok.pad_id)], batch.soft_ids)
    references_only = np.flatnonzero(corpus.soft.rows < 0)[:20]  # no pair with a distribution: k is 1
    batch = prepare_batch(corpus, references_only, tok.pad_id, tok.bos_id, tok.eos_id, soft=True)
    assert batch.soft_ids.shape == (batch.tokens, 1) and not batch.soft_probs.any()


def test_the_model_scores_kept_positions_as_it_scores_a_mask():
    """keep (positions made on the host) gives the boolean mask's logits and gradients, bit for bit."""
    cfg = one_layer_config(50, max_positions=32, dropout=0.0)
    torch.manual_seed(0)
    model = Transformer(cfg)
    src, tin = torch.randint(3, 50, (4, 7)), torch.randint(3, 50, (4, 9))
    tout = torch.randint(3, 50, (4, 9))
    tout[1, 5:], tout[3, 2:] = cfg.pad_id, cfg.pad_id
    grads = []
    for kwargs in ({"tgt_out": tout}, {"keep": torch.nonzero((tout != cfg.pad_id).reshape(-1))[:, 0]}):
        model.zero_grad()
        logits = model(src, tin, **kwargs)
        (logits * torch.arange(logits.numel()).view_as(logits).sin()).sum().backward()
        grads.append([logits.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert all(torch.equal(a, b) for a, b in zip(*grads)) and len(grads[0]) == len(grads[1])


def test_the_loader_thread_gives_the_same_batches_in_the_same_order(taught):
    tok, corpus = taught
    batches = make_batches(corpus, 400, seed=2, epoch=1)

    def prepare(index):
        return prepare_batch(corpus, index, tok.pad_id, tok.bos_id, tok.eos_id, soft=True)

    made_here = list(BatchFeed(prepare, batches))
    with BatchFeed(prepare, batches, ahead=2) as feed:
        ahead = list(feed)
    assert len(ahead) == len(made_here) == len(batches)
    for a, b in zip(made_here, ahead):
        assert all(
            torch.equal(x, y)
            for x, y in zip(
                (a.src, a.tgt_in, a.keep, a.target, a.soft_ids, a.soft_probs),
                (b.src, b.tgt_in, b.keep, b.target, b.soft_ids, b.soft_probs),
            )
        )
    # Left early (a budget reached mid-epoch): the thread stops, and nothing is left running.
    with BatchFeed(prepare, batches, ahead=2) as feed:
        next(feed)
        thread = feed._thread
    assert thread is not None and not thread.is_alive()
    assert not [t for t in threading.enumerate() if t.name == "batch-loader"]


def test_an_error_in_the_loader_thread_is_raised_once_as_itself():
    made = []

    def prepare(index):
        if index == 3:
            raise ValueError("pair 3 is damaged")
        made.append(index)
        return index

    feed = BatchFeed(prepare, list(range(8)), ahead=2)
    got = [next(feed) for _ in range(3)]
    with pytest.raises(ValueError, match="pair 3 is damaged") as raised:
        next(feed)
    assert got == [0, 1, 2] and made == [0, 1, 2]  # nothing made after the failure
    assert any("batch loader thread, making batch 4 of 8" in note for note in raised.value.__notes__)
    assert list(feed) == []  # once: the feed is over
    assert not [t for t in threading.enumerate() if t.name == "batch-loader"]


def _trainer(taught, work, steps, **kwargs):
    tok, corpus = taught
    cfg = one_layer_config(tok.vocab_size, max_positions=64, dropout=0.1)
    torch.manual_seed(0)
    tc = TrainConfig(
        lr=3e-3, warmup_steps=5, batch_tokens=400, max_epochs=None, max_steps=steps, valid_bleu_sentences=5, seed=7
    )
    valid = encode_corpus(tok, ["A man.", "Two dogs run."], ["Un homme.", "Deux chiens courent."], 64)
    return Trainer(
        Transformer(cfg),
        tc,
        corpus,
        ValidationSet(valid, valid.src.rows(2), ["Un homme.", "Deux chiens"]),
        tok,
        work,
        lambda m: None,
        progress_bar,
        kd_alpha=0.5,
        speed=SWITCHES,
        **kwargs,
    )


def test_training_with_the_loader_thread_ends_in_the_same_weights(taught, tmp_path):
    """Across an epoch's end, with dropout and the stored distributions: the same batches in the
    same order, so the same model, whether the batches are made ahead or by the step."""
    steps = len(make_batches(taught[1], 400, seed=7, epoch=0)) + 3
    runs = {}
    for prefetch in (False, True):
        trainer = _trainer(taught, tmp_path / str(prefetch), steps, prefetch=prefetch)
        assert trainer.prefetch is prefetch
        runs[prefetch] = trainer.fit()
    history = {p: [{k: v for k, v in h.items() if k != "validation_s"} for h in r["history"]] for p, r in runs.items()}
    assert runs[True]["epochs"] == 1 and len(history[True]) == 2 and history[True] == history[False]
    a, b = (load_file(str(tmp_path / str(p) / "checkpoint" / "model.safetensors")) for p in (False, True))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _trainer(taught, tmp_path / "c", 1).prefetch is False  # on the CPU the step makes its own


def test_a_training_step_does_not_wait_for_the_device(taught, tmp_path, monkeypatch):
    """No .item() or boolean-mask selection per step (each makes a CUDA host wait): a run of 6
    steps and one of 12 make as many; the loss for the progress line is read from the device
    only when LOSS_EVERY_S has passed."""
    waits = {"read": 0, "mask": 0}
    for name in ("item", "tolist", "cpu", "__float__", "__int__", "__bool__"):

        def counted(self, *args, _original=getattr(torch.Tensor, name), **kwargs):
            waits["read"] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    getitem = torch.Tensor.__getitem__

    def counted_getitem(self, index):
        if torch.is_tensor(index) and index.dtype == torch.bool:
            waits["mask"] += 1
        return getitem(self, index)

    monkeypatch.setattr(torch.Tensor, "__getitem__", counted_getitem)
    monkeypatch.setattr(Trainer, "LOSS_EVERY_S", 3600.0)
    counts = []
    for steps in (6, 12):
        waits.update(read=0, mask=0)
        _trainer(taught, tmp_path / str(steps), steps).fit()
        counts.append(dict(waits))
    assert counts[0] == counts[1] and counts[0]["read"] > 0  # the validation's reads, the first loss figure
    monkeypatch.setattr(Trainer, "LOSS_EVERY_S", 0.0)  # a figure every step: read every step
    lines = []
    trainer = _trainer(taught, tmp_path / "every", 12)
    trainer.progress = lambda *a, **k: _Recording(lines)
    trainer.fit()
    assert sum(" loss " in f" {line}" for line in lines) == 12


class _Recording:
    def __init__(self, lines):
        self.lines = lines

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def advance(self, amount=1.0, postfix=None):
        if postfix is not None:
            self.lines.append(postfix)


@pytest.mark.slow
def test_greedy_search_on_the_device_finds_the_host_searchs_words(smoke):
    """The smoke teacher's greedy translations of the validation sentences: the loop on the
    device (ended rows dropped every few steps) gives mt_runtime/search.py's words."""
    _, arts = smoke.build("teacher")
    model = load_model(arts["teacher"].path).eval()
    tok = SubwordTokenizer.load(arts["teacher"].path / "tokenizer.json")
    src, tgt = read_split(arts["data"].path, "valid")
    sources = encode_corpus(tok, src, tgt, model.cfg.max_positions, drop_long=False).src.rows(150)
    cfg = model.cfg
    gen = GenerationConfig(
        beam=1, bos_id=cfg.bos_id, eos_id=cfg.eos_id, pad_id=cfg.pad_id, max_positions=cfg.max_positions
    )
    on_host = greedy_search(TorchDecoder(model), sources, gen)
    lengths = {len(h) for h in on_host}
    assert len(lengths) > 5  # sentences end at many different steps
    for check_every in (1, 3, 8):
        assert greedy_on_device(model, sources, gen, "cpu", check_every=check_every) == on_host
    assert greedy_hypotheses(model, sources, "cpu", on_device=True) == greedy_hypotheses(model, sources, "cpu")


@pytest.mark.gpu
@needs_cuda
def test_pinned_batches_reach_the_gpu_unchanged(taught):
    tok, corpus = taught
    index = make_batches(corpus, 400, seed=1, epoch=0)[0]
    host = prepare_batch(corpus, index, tok.pad_id, tok.bos_id, tok.eos_id, soft=True, pin=True)
    assert host.src.is_pinned() and host.soft_probs.is_pinned()
    on_gpu = host.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert on_gpu.src.is_cuda and torch.equal(on_gpu.soft_ids.cpu(), host.soft_ids)


@pytest.mark.gpu
@needs_cuda
def test_a_gpu_training_makes_its_batches_ahead_and_learns_as_without(taught, tmp_path):
    runs = {}
    for prefetch in (None, False):
        trainer = _trainer(taught, tmp_path / str(prefetch), 12, device="cuda", prefetch=prefetch)
        assert trainer.prefetch is (prefetch is None)  # on CUDA: ahead, by default
        runs[prefetch] = (trainer.fit(), {k: v.cpu() for k, v in trainer.model.state_dict().items()})
    assert runs[None][0]["history"][-1]["valid_loss"] == pytest.approx(
        runs[False][0]["history"][-1]["valid_loss"], rel=1e-3
    )
    for k, v in runs[None][1].items():  # CUDA's own kernels may add in another order: close, not equal
        torch.testing.assert_close(v, runs[False][1][k], rtol=1e-3, atol=1e-4)


@pytest.mark.slow
@pytest.mark.gpu
@needs_cuda
def test_greedy_search_on_the_gpu_finds_the_host_searchs_words(smoke):
    _, arts = smoke.build("teacher")
    model = load_model(arts["teacher"].path).to("cuda").eval()
    tok = SubwordTokenizer.load(arts["teacher"].path / "tokenizer.json")
    src, tgt = read_split(arts["data"].path, "valid")
    sources = encode_corpus(tok, src, tgt, model.cfg.max_positions, drop_long=False).src.rows(150)
    assert greedy_hypotheses(model, sources, "cuda") == greedy_hypotheses(model, sources, "cuda", on_device=False)
