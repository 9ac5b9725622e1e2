"""What a training's budget was and whether a time cap cut it short, in words (no torch: the
runner's status and the report read these from manifests)."""

from __future__ import annotations


def budget_text(max_steps: int | None, max_epochs: int | None, max_minutes: float | None) -> str:
    parts = [f"{max_steps} steps"] if max_steps is not None else []
    if max_epochs is not None:
        parts.append(f"{max_epochs} epochs")
    return " or ".join(parts) + (f", capped at {max_minutes:g} min" if max_minutes is not None else "")


def cut_text(step: int, max_steps: int | None, max_epochs: int | None) -> str:
    of = f" of {max_steps}" if max_steps is not None else f" (budget {max_epochs} epochs)"
    return f"cut by time at step {step}{of}"


def training_cut(metrics: dict) -> str | None:
    """"cut by time at step N of M" where a max_minutes cap stopped a training, or one of a
    pruning's fine-tunes, before its budget: that model is not the one the recipe trains."""
    cuts = [metrics.get("cut_by_time")]
    if isinstance(metrics.get("steps"), list):  # pruning: a fine-tune per step
        cuts += [(step.get("finetune") or {}).get("cut_by_time") for step in metrics["steps"]]
    return "; ".join(c for c in cuts if c) or None
