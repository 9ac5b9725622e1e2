"""Attention-head and FFN-neuron pruning that really removes weights.

Importance is the score of Michel, Levy & Neubig (2019), "Are Sixteen Heads Really Better than
One?": put a gate xi_h (= 1) on every head's output and take the expected absolute gradient of
the loss with respect to it, I_h = E_x |dL/dxi_h|, over held-out batches. By a first-order
Taylor expansion this is how much the loss would move if the head were removed. The paper then
L2-normalises the scores within each layer before ranking globally; that is an option here
(`normalize="layer"`), not the default: on small models with 4 heads a layer it erases the real
differences between layers (see ranking_scores). The same machinery scores FFN neurons with a
gate on each hidden unit.

Pruning slices the removed heads' rows out of the fused input projections and the matching
columns out of the output projection (FFN: fc1 rows and bias, fc2 columns), and writes the new
per-layer head counts / FFN widths into the model's config. The result is an ordinary, smaller
Transformer: it saves, loads, trains, decodes and exports like any other.

Names used throughout: attention kinds "enc_self", "dec_self", "dec_cross"; FFN kinds "enc_ffn",
"dec_ffn". A `Scores` maps a kind to one 1-D tensor per layer; a `Plan` maps a kind to one list
of unit indices (heads or neurons) per layer.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .transformer import CrossAttention, FeedForward, SelfAttention, Transformer

HEAD_KINDS = ("enc_self", "dec_self", "dec_cross")
FFN_KINDS = ("enc_ffn", "dec_ffn")
# Where each kind's per-layer size lives in TransformerConfig.
CONFIG_FIELD = {
    "enc_self": "enc_heads",
    "dec_self": "dec_self_heads",
    "dec_cross": "dec_cross_heads",
    "enc_ffn": "enc_ffn",
    "dec_ffn": "dec_ffn",
}

Scores = dict[str, list[Tensor]]
Plan = dict[str, list[list[int]]]


def attention_modules(model: Transformer) -> dict[str, list[nn.Module]]:
    return {
        "enc_self": [layer.attn for layer in model.encoder],
        "dec_self": [layer.self_attn for layer in model.decoder],
        "dec_cross": [layer.cross_attn for layer in model.decoder],
    }


def ffn_modules(model: Transformer) -> dict[str, list[FeedForward]]:
    return {"enc_ffn": [layer.ffn for layer in model.encoder], "dec_ffn": [layer.ffn for layer in model.decoder]}


def head_counts(model: Transformer) -> dict[str, list[int]]:
    return {kind: list(getattr(model.cfg, CONFIG_FIELD[kind])) for kind in HEAD_KINDS}


def ffn_widths(model: Transformer) -> dict[str, list[int]]:
    return {kind: list(getattr(model.cfg, CONFIG_FIELD[kind])) for kind in FFN_KINDS}


# ----------------------------------------------------------------------- importance
def importance(
    model: Transformer, batches: Iterable[tuple[Tensor, Tensor, Tensor]], neurons: bool = False
) -> tuple[Scores, Scores | None, int]:
    """Raw scores E|dL/dgate| for every head (and FFN neuron if asked), over `batches` of
    (src, tgt_in, tgt_out) as made by pipeline.training.batches.collate. Returns (head scores, neuron
    scores or None, batches used). The loss is plain token-level cross-entropy, in eval mode
    (no dropout), so the scores are deterministic; the model's weights are not changed."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    attn, ffn = attention_modules(model), ffn_modules(model)
    gates: list[tuple[str, int, nn.Module]] = []
    for kind, mods in attn.items():
        for i, m in enumerate(mods):
            m.head_gate = torch.ones(m.heads, device=device, requires_grad=True)
            gates.append((kind, i, m))
    if neurons:
        for kind, mods in ffn.items():
            for i, m in enumerate(mods):
                m.neuron_gate = torch.ones(m.fc1.out_features, device=device, requires_grad=True)
                gates.append((kind, i, m))
    tensors = [m.head_gate if kind in HEAD_KINDS else m.neuron_gate for kind, _, m in gates]
    totals = [torch.zeros_like(t) for t in tensors]
    count = 0
    try:
        for src, tgt_in, tgt_out in batches:
            logits = model(src, tgt_in, tgt_out)
            loss = F.cross_entropy(logits.float(), tgt_out[tgt_out != model.cfg.pad_id])
            # Only the gates' gradients: the weights' .grad stay untouched.
            for total, grad in zip(totals, torch.autograd.grad(loss, tensors)):
                total += grad.abs()
            count += 1
    finally:
        for kind, _, m in gates:
            if kind in HEAD_KINDS:
                m.head_gate = None
            else:
                m.neuron_gate = None
        model.train(was_training)
    if count == 0:
        raise ValueError("no batches to measure importance on")
    heads: Scores = {kind: [None] * len(attn[kind]) for kind in HEAD_KINDS}
    ffn_scores: Scores = {kind: [None] * len(ffn[kind]) for kind in FFN_KINDS}
    for (kind, i, _), total in zip(gates, totals):
        (heads if kind in HEAD_KINDS else ffn_scores)[kind][i] = (total / count).detach().cpu()
    return heads, (ffn_scores if neurons else None), count


def normalize_per_layer(scores: Scores, exponent: float = 2.0) -> Scores:
    """Divide each layer's scores by their L_p norm (p = 2 in the paper), so that every layer has
    the same total importance and a global ranking compares heads by their share of their layer."""
    return {kind: [s / (s.norm(p=exponent) + 1e-20) for s in layers] for kind, layers in scores.items()}


def ranking_scores(raw: Scores, normalize: str = "none") -> Scores:
    """The scores a ranking uses: raw E|dL/dgate| ("none") or normalised per layer ("layer").

    Raw scores already compare across layers (each is a first-order estimate of the same loss
    change). On our 4-head-per-layer models the per-layer normalisation discards exactly that:
    a layer whose heads all matter little gets the same total as one whose heads all matter a
    lot, and a global ranking then prunes about as well as a random one."""
    if normalize == "none":
        return raw
    if normalize == "layer":
        return normalize_per_layer(raw)
    raise ValueError(f"normalize must be 'none' or 'layer', got {normalize!r}")


def importance_table(raw: Scores, normalize: str = "none", origins: Plan | None = None) -> list[dict]:
    """Rows (layer, kind, head, score): `score` is what the ranking uses (see ranking_scores),
    `raw` the expected |gradient| and `normalized` its share of the layer's L2 norm; with
    `origins`, also each head's index in the unpruned model."""
    used, normed = ranking_scores(raw, normalize), normalize_per_layer(raw)
    rows = []
    for kind, layers in raw.items():
        for layer, s in enumerate(layers):
            for head in range(len(s)):
                row = {
                    "layer": layer,
                    "kind": kind,
                    "head": head,
                    "score": _round(used[kind][layer][head]),
                    "raw": _round(s[head]),
                    "normalized": _round(normed[kind][layer][head]),
                }
                if origins is not None:
                    row["original_head"] = origins[kind][layer][head]
                rows.append(row)
    return rows


def _round(x: Tensor) -> float:
    return float(f"{x.item():.6g}")  # significant digits: raw scores can be ~1e-4


# ------------------------------------------------------------------------ selection
def select_lowest(scores: Scores, remove: int, min_per_layer: int = 1, ranking: str = "global") -> Plan:
    """Which units (heads or neurons) to remove: the `remove` lowest-scoring ones, never leaving a
    layer with fewer than `min_per_layer` (layers already at the floor are skipped).

    global:  one ranking over every layer of every kind; the result may leave layers with
             different counts.
    uniform: every layer ends with the same count K (what runtimes that need one head count per
             model want): K = total left / layers, rounded down so at least `remove` go, and each
             layer drops its lowest-scoring units down to K.
    May remove fewer than asked when the floor forbids more."""
    if ranking not in ("global", "uniform"):
        raise ValueError(f"ranking must be 'global' or 'uniform', got {ranking!r}")
    plan: Plan = {kind: [[] for _ in layers] for kind, layers in scores.items()}
    if remove <= 0:
        return plan
    if ranking == "uniform":
        sizes = [len(s) for layers in scores.values() for s in layers]
        keep = max(min_per_layer, (sum(sizes) - remove) // len(sizes))
        for kind, layers in scores.items():
            for i, s in enumerate(layers):
                order = torch.argsort(s, stable=True).tolist()
                plan[kind][i] = sorted(order[: max(0, len(s) - keep)])
        return plan
    left = {(kind, i): len(s) for kind, layers in scores.items() for i, s in enumerate(layers)}
    candidates = sorted(
        (value, kind, i, unit)
        for kind, layers in scores.items()
        for i, s in enumerate(layers)
        for unit, value in enumerate(s.tolist())
    )
    removed = 0
    for _, kind, i, unit in candidates:
        if removed == remove:
            break
        if left[(kind, i)] > min_per_layer:
            plan[kind][i].append(unit)
            left[(kind, i)] -= 1
            removed += 1
    return {kind: [sorted(units) for units in layers] for kind, layers in plan.items()}


def plan_size(plan: Plan) -> int:
    return sum(len(units) for layers in plan.values() for units in layers)


def surviving(origins: Plan, plan: Plan) -> Plan:
    """Track which original units remain: drop the planned indices from each layer's list."""
    return {
        kind: [
            [u for j, u in enumerate(layer) if j not in set(plan.get(kind, [[]] * len(layers))[i])]
            for i, layer in enumerate(layers)
        ]
        for kind, layers in origins.items()
    }


# ------------------------------------------------------------------ physical pruning
def _sliced(linear: nn.Linear, rows: Tensor | None = None, cols: Tensor | None = None) -> nn.Linear:
    """A new Linear holding only the given output rows (with their bias) and input columns."""
    weight, bias = linear.weight.detach(), linear.bias.detach()
    if rows is not None:
        weight, bias = weight.index_select(0, rows), bias.index_select(0, rows)
    if cols is not None:
        weight = weight.index_select(1, cols)
    new = nn.Linear(weight.shape[1], weight.shape[0], device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        new.weight.copy_(weight)
        new.bias.copy_(bias)
    return new


def _head_index(keep: list[int], heads: int, head_dim: int, parts: int, device) -> Tensor:
    """Row indices of the kept heads in a projection made of `parts` blocks of heads*head_dim rows
    (e.g. [all Q heads | all K heads | all V heads] has 3 parts)."""
    index = [p * heads * head_dim + h * head_dim + j for p in range(parts) for h in keep for j in range(head_dim)]
    return torch.tensor(index, dtype=torch.long, device=device)


def prune_heads(model: Transformer, plan: Plan) -> None:
    """Remove the planned heads (per kind, per layer: head indices) in place and update the config."""
    counts = head_counts(model)
    for kind, mods in attention_modules(model).items():
        for i, m in enumerate(mods):
            drop = set(plan.get(kind, [[]] * len(mods))[i])
            if not drop:
                continue
            if not drop <= set(range(m.heads)):
                raise ValueError(f"{kind} layer {i} has {m.heads} heads; cannot remove {sorted(drop)}")
            keep = [h for h in range(m.heads) if h not in drop]
            if not keep:
                raise ValueError(f"{kind} layer {i}: removing every head is not allowed")
            device, d = m.out.weight.device, m.head_dim
            cols = _head_index(keep, m.heads, d, 1, device)
            if isinstance(m, SelfAttention):
                m.qkv = _sliced(m.qkv, rows=_head_index(keep, m.heads, d, 3, device))
            elif isinstance(m, CrossAttention):
                m.q = _sliced(m.q, rows=cols)
                m.kv = _sliced(m.kv, rows=_head_index(keep, m.heads, d, 2, device))
            m.out = _sliced(m.out, cols=cols)
            if m.head_gate is not None:
                m.head_gate = m.head_gate.detach()[keep]
            m.heads = len(keep)
            counts[kind][i] = len(keep)
    model.cfg = dataclasses.replace(model.cfg, **{CONFIG_FIELD[k]: v for k, v in counts.items()})


def prune_neurons(model: Transformer, plan: Plan) -> None:
    """Remove the planned FFN hidden units in place (fc1 rows and bias, fc2 columns); update the config."""
    widths = ffn_widths(model)
    for kind, mods in ffn_modules(model).items():
        for i, m in enumerate(mods):
            drop = set(plan.get(kind, [[]] * len(mods))[i])
            if not drop:
                continue
            width = m.fc1.out_features
            if not drop <= set(range(width)):
                raise ValueError(f"{kind} layer {i} has {width} neurons; cannot remove index {max(drop)}")
            keep = [u for u in range(width) if u not in drop]
            if not keep:
                raise ValueError(f"{kind} layer {i}: removing every neuron is not allowed")
            index = torch.tensor(keep, dtype=torch.long, device=m.fc1.weight.device)
            m.fc1 = _sliced(m.fc1, rows=index)
            m.fc2 = _sliced(m.fc2, cols=index)
            if m.neuron_gate is not None:
                m.neuron_gate = m.neuron_gate.detach()[keep]
            widths[kind][i] = len(keep)
    model.cfg = dataclasses.replace(model.cfg, **{CONFIG_FIELD[k]: v for k, v in widths.items()})


def gate_off(model: Transformer, heads: Plan | None = None, neurons: Plan | None = None) -> None:
    """Set gates that zero the planned units instead of removing them (and ones elsewhere): the
    model computes exactly what the pruned one would. For checking pruning, and for trying a plan
    without copying the model. `clear_gates` undoes it."""
    device = next(model.parameters()).device
    for kind, mods in attention_modules(model).items():
        for i, m in enumerate(mods):
            gate = torch.ones(m.heads, device=device)
            gate[list((heads or {}).get(kind, [[]] * len(mods))[i])] = 0.0
            m.head_gate = gate
    for kind, mods in ffn_modules(model).items():
        for i, m in enumerate(mods):
            gate = torch.ones(m.fc1.out_features, device=device)
            gate[list((neurons or {}).get(kind, [[]] * len(mods))[i])] = 0.0
            m.neuron_gate = gate


def clear_gates(model: Transformer) -> None:
    for mods in attention_modules(model).values():
        for m in mods:
            m.head_gate = None
    for mods in ffn_modules(model).values():
        for m in mods:
            m.neuron_gate = None
