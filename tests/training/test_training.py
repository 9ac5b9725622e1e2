"""Training: schedule, batching, exact resume from a checkpoint, several processes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from model.transformer import Transformer
from pipeline.corpora.encoded import Corpus
from pipeline.engine.context import progress_bar
from pipeline.training.loop import Trainer, cooldown_factor, inverse_sqrt_lr, make_batches
from pipeline.training.loss import label_smoothed_loss
from pipeline.training.settings import TrainConfig
from pipeline.training.speed_probe import SpeedChoice
from tests.helpers import SMOKE, cli
from tests.helpers.models import _setup


def test_inverse_sqrt_schedule():
    assert inverse_sqrt_lr(50, 1e-3, 100) == pytest.approx(5e-4)
    assert inverse_sqrt_lr(100, 1e-3, 100) == pytest.approx(1e-3)
    assert inverse_sqrt_lr(400, 1e-3, 100) == pytest.approx(5e-4)
    assert inverse_sqrt_lr(7, 1e-3, 0) == 1e-3


def test_cooldown_falls_linearly_over_the_end_of_the_budget():
    assert cooldown_factor(0.5, 0.0) == cooldown_factor(0.99, 0.0) == 1.0
    assert cooldown_factor(0.6, 0.3) == 1.0
    assert cooldown_factor(0.85, 0.3) == pytest.approx(0.5)
    assert cooldown_factor(1.0, 0.3) == pytest.approx(0.02)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_smoothed_loss_and_its_gradient_are_pytorchs(smoothing, dtype):
    torch.manual_seed(0)
    logits = (torch.randn(37, 501) * 4).to(dtype).requires_grad_()
    target = torch.randint(0, 501, (37,))
    target[:3] = target[3]  # repeated targets: their gradients must not collide
    ours = label_smoothed_loss(logits, target, smoothing) * 2.5
    (grad,) = torch.autograd.grad(ours, logits)
    theirs = torch.nn.functional.cross_entropy(logits.float(), target, label_smoothing=smoothing) * 2.5
    (expected,) = torch.autograd.grad(theirs, logits)
    assert ours.dtype == torch.float32 and grad.dtype == dtype
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)
    torch.testing.assert_close(grad.float(), expected.float(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_loss_with_cached_teacher_probabilities_is_the_mixed_cross_entropy(alpha):
    """(1 - alpha) label-smoothed CE + alpha CE against sparse teacher probabilities (the label
    alone on rows without them), its gradient included, as PyTorch computes them from the formula."""
    torch.manual_seed(0)
    logits = (torch.randn(23, 301) * 3).requires_grad_()
    target = torch.randint(0, 301, (23,))
    ids = torch.stack([torch.randperm(301)[:5] for _ in range(23)])
    ids[:, 0] = target  # the hard target among the teacher's words, as usual: gradients add up
    probs = torch.rand(23, 5).softmax(-1)
    probs[-4:] = 0  # pairs without stored distributions: their labels alone
    ours = label_smoothed_loss(logits, target, 0.1, (ids, probs, alpha)) * 1.5
    (grad,) = torch.autograd.grad(ours, logits)
    log_q = logits.log_softmax(-1)
    has = (probs.sum(-1) > 0).float()
    theirs = (
        (
            (1 - alpha * has) * torch.nn.functional.cross_entropy(logits, target, label_smoothing=0.1, reduction="none")
        ).mean()
        - alpha * (log_q.gather(1, ids) * probs).sum(-1).mean()
    ) * 1.5
    (expected,) = torch.autograd.grad(theirs, logits)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)
    torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-7)


def test_batches_respect_budget_and_cover_the_corpus_once():
    rng = np.random.default_rng(0)
    corpus = Corpus([[1] * int(n) for n in rng.integers(2, 40, 500)], [[1] * int(n) for n in rng.integers(1, 40, 500)])
    batches = make_batches(corpus, 300, seed=1, epoch=0)
    seen = np.concatenate(batches)
    assert sorted(seen.tolist()) == list(range(500))
    for b in batches:
        longest = max(max(len(corpus.src[i]), len(corpus.tgt[i]) + 1) for i in b)
        assert len(b) * longest <= 300 or len(b) == 1
    again = make_batches(corpus, 300, seed=1, epoch=0)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again))
    assert not all(np.array_equal(a, b) for a, b in zip(batches, make_batches(corpus, 300, seed=1, epoch=1)))
    shards = [make_batches(corpus, 300, seed=1, epoch=0, rank=r, world=2) for r in (0, 1)]
    assert len(shards[0]) == len(shards[1])
    assert not set(np.concatenate(shards[0]).tolist()) & set(np.concatenate(shards[1]).tolist())


def test_resumed_training_is_identical_to_uninterrupted(smoke, tmp_path):
    tok, train, valid, cfg = _setup(smoke)
    # One set of speed switches for both trainings (a probe on a busy machine may pick others).
    switches = SpeedChoice(bf16=False, attention="math", fused_optimizer=True, threads=1, isa="test")

    def trainer(work, steps, speed=switches):
        torch.manual_seed(0)
        model = Transformer(cfg)
        tc = TrainConfig(
            lr=3e-3, warmup_steps=5, batch_tokens=400, max_epochs=3, max_steps=steps, valid_bleu_sentences=5, seed=7
        )
        return Trainer(model, tc, train, valid, tok, work, lambda m: None, progress_bar, speed=speed)

    straight = trainer(tmp_path / "a", 20).fit()
    first = trainer(tmp_path / "b", 9).fit()  # stops mid-epoch, as a kill after a checkpoint would
    # The resumed run keeps the checkpoint's switches, whatever it would have chosen itself.
    other = SpeedChoice(bf16=False, attention="default", fused_optimizer=False, threads=1, isa="test")
    resumed = trainer(tmp_path / "b", 20, speed=other).fit()
    assert resumed["speed"]["attention"] == "math" and resumed["speed"]["fused_optimizer"] is True
    assert first["steps"] == 9 and resumed["steps"] == 20 and resumed["resumed_from_steps"] == [9]
    a = load_file(str(tmp_path / "a" / "checkpoint" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "checkpoint" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert straight["train_tokens"] == resumed["train_tokens"]


@pytest.mark.slow
def test_two_processes_train_the_smoke_teacher(tmp_path):
    store = tmp_path / "store"
    proc = cli("run", str(SMOKE), "--until", "teacher", "--nproc", "2", store=store, timeout=600)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    teacher = next(p for p in (store / "objects").iterdir() if p.name.startswith("teacher-"))
    metrics = json.loads((teacher / "manifest.json").read_text())["metrics"]
    assert metrics["processes"] == 2 and metrics["steps"] > 0
    assert metrics["best_valid_loss"] < 6.0
