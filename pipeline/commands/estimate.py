"""`pipeline run --dry-run`: how long the recipe's missing stages will take on this machine,
before the user commits an hour.

Trainings, which are most of a run, are measured: each one's model is built at its shapes, the
speed probe chooses its switches as the training will, and a few full steps at its batch size
are timed; their budget (steps, or epochs of the corpus) gives the time, plus its validations.
Other stages take what they took when this store last built them on a CPU of the same model and
instruction level, or, never built here, are shown as not estimated.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass

from ..engine.graph import Node
from ..engine.machine import machine_info, usable_cores
from ..engine.store import Store

# Multi30k's training split: the corpus size where the data stage has not run yet.
MULTI30K_TRAIN_PAIRS = 29000
# A Multi30k pair is about this many subword tokens a side (en and fr, 8000 pieces); padding
# within length-bucketed batches adds little.
TOKENS_PER_SIDE = 16


@dataclass
class Estimate:
    node: str
    seconds: float | None  # None: no estimate
    how: str


def estimate(plan, store: Store, selected: list[Node], log=print) -> list[Estimate]:
    past = _past_durations(store, machine_info(), plan.name)
    pairs = _train_pairs(plan, store)
    rows = []
    for node in selected:
        if store.exists(node.id):
            rows.append(Estimate(node.name, 0.0, "cached"))
        elif node.stage in ("train", "prune", "kd_corpus"):
            log(f"  probing {node.name} ...")
            rows.append(_PROBES[node.stage](node, plan, pairs))
        elif node.name in past:
            seconds, run = past[node.name]
            rows.append(Estimate(node.name, seconds, f"as built in run {run} on this CPU"))
        else:
            rows.append(Estimate(node.name, None, "never built on this CPU: not estimated"))
    return rows


def _model(plan, spec):
    from model.transformer import Transformer, TransformerConfig

    vocab = plan.recipe.tokenizer.vocab_size
    return Transformer(TransformerConfig.from_spec(spec, vocab, {"pad": 0, "bos": 1, "eos": 2}))


def _model_spec(plan, node_name: str):
    """The node's ModelSpec."""
    if node_name == "teacher":
        return plan.recipe.teacher.model
    return plan.recipe.distill.student.model


def _kd_corpus(node: Node, plan, pairs: int | None) -> Estimate:
    """The teacher's decoding of the training sources: 128 sentences of TOKENS_PER_SIDE steps
    timed, times the beam."""
    import torch

    sizes = [x for x in (node.config.get("max_sentences"), pairs) if x]
    sentences = min(sizes) if sizes else None
    if not sentences:
        return Estimate(node.name, None, "the corpus size is not known yet")
    if plan.recipe.teacher.pretrained is not None:  # the probe decodes with our model, not theirs
        return Estimate(node.name, None, f"{sentences} sentences by an imported teacher: not estimated")
    before = torch.get_num_threads()
    torch.set_num_threads(usable_cores())
    try:
        seconds = _decode_s(_model(plan, _model_spec(plan, "teacher")), sentences, rows=128) * node.config["beam"]
    finally:
        torch.set_num_threads(before)
    return Estimate(node.name, seconds, f"{sentences} sentences, beam {node.config['beam']}, by a decoding probe")


def _prune(node: Node, plan, pairs: int | None) -> Estimate:
    """Its fine-tunes as trainings of the unpruned model's shape (an upper bound), plus two
    validations a step."""
    cfg = plan.recipe.prune
    source = "student" if plan.recipe.distill is not None else "teacher"
    train = {
        "lr": cfg.finetune.lr,
        "warmup_steps": cfg.finetune.warmup_steps,
        "batch_tokens": cfg.finetune.batch_tokens,
        "max_steps": cfg.finetune.steps * cfg.steps,
        "max_epochs": None,
        "max_minutes": cfg.finetune.max_minutes,
        "valid_bleu_sentences": cfg.valid_bleu_sentences or 1014,
    }
    row = _training(node, plan, pairs, spec=_model_spec(plan, source), train=train, validations=2 * cfg.steps)
    return Estimate(row.node, row.seconds, row.how.replace("validations", "validations (unpruned shape)"))


def _training(
    node: Node, plan, pairs: int | None, spec=None, train: dict | None = None, validations: int | None = None
) -> Estimate:
    import torch

    from ..training import speed_probe
    from ..training.loss import label_smoothed_loss
    from ..training.settings import TrainConfig

    cfg = TrainConfig.model_validate(train or node.config["train"])
    vocab = plan.recipe.tokenizer.vocab_size
    model = _model(plan, spec or node.settings.model)
    share = usable_cores() // max(1, len(node.side_by_side)) if node.side_by_side else usable_cores()
    before = torch.get_num_threads()
    torch.set_num_threads(cfg.num_threads or max(1, share))
    try:
        rows = max(1, cfg.batch_tokens // TOKENS_PER_SIDE)
        gen = torch.Generator().manual_seed(0)
        src, tin, tout = (torch.randint(3, vocab, (rows, TOKENS_PER_SIDE), generator=gen) for _ in range(3))
        loss = lambda logits: label_smoothed_loss(logits, tout.reshape(-1), cfg.label_smoothing)  # noqa: E731
        quarter = tuple(t[: max(1, rows // 4)] for t in (src, tin, tout))
        probe_threads = [share, share // 2] if cfg.num_threads is None and share > 1 else None
        choice = speed_probe.choose(
            model,
            quarter,
            lambda logits: label_smoothed_loss(logits, quarter[2].reshape(-1), cfg.label_smoothing),
            torch.device("cpu"),
            cfg.bf16,
            torch.get_num_threads(),
            probe_threads,
        )
        torch.set_num_threads(choice.threads)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, fused=choice.fused_optimizer or None)
        step_s = speed_probe.interleaved(
            {"step": lambda: _step(model, optimizer, (src, tin, tout), loss, choice)}, rounds=2
        )["step"]
        batches_per_epoch = math.ceil(pairs * TOKENS_PER_SIDE / cfg.batch_tokens) if pairs else None
        budgets = [cfg.max_steps] if cfg.max_steps else []
        if cfg.max_epochs and batches_per_epoch:
            budgets.append(cfg.max_epochs * batches_per_epoch)
        if not budgets:
            return Estimate(node.name, None, f"{step_s:.2f} s a step; the corpus size is not known yet")
        steps = min(budgets)
        epochs = validations or (math.ceil(steps / batches_per_epoch) if batches_per_epoch else 1)
        validation = epochs * _decode_s(model, cfg.valid_bleu_sentences, rows=32)
        seconds = steps * step_s + validation
        if cfg.max_minutes is not None and seconds > cfg.max_minutes * 60:
            return Estimate(
                node.name,
                cfg.max_minutes * 60,
                f"{steps} steps at {step_s:.2f} s would take {seconds / 60:.0f} min: the "
                f"{cfg.max_minutes:g}-minute cap would cut it near step {int(cfg.max_minutes * 60 / step_s)}",
            )
        return Estimate(
            node.name,
            seconds,
            f"{steps} steps at {step_s:.2f} s ({choice.precision}, "
            f"{choice.threads} thread{'s' if choice.threads != 1 else ''}) "
            f"+ {epochs} validation{'s' if epochs != 1 else ''}",
        )
    finally:
        torch.set_num_threads(before)


_PROBES = {"train": _training, "prune": _prune, "kd_corpus": _kd_corpus}


def _step(model, optimizer, batch, loss_fn, choice) -> float:
    import torch

    from ..training import speed_probe

    start = time.perf_counter()
    with (
        speed_probe.attention_context(choice.attention),
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=choice.bf16),
    ):
        loss = loss_fn(model(*batch))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return time.perf_counter() - start


def _decode_s(model, sentences: int, rows: int) -> float:
    """Greedy decoding of `sentences` sentences, from `rows` of them decoded TOKENS_PER_SIDE steps
    (an untrained model would not stop by itself)."""
    if not sentences:
        return 0.0
    import torch

    from model.torch_decoder import TorchDecoder

    model.eval()
    decoder = TorchDecoder(model, torch.device("cpu"))
    rows = min(rows, sentences)
    src = [[5 + i % 50] * TOKENS_PER_SIDE + [2] for i in range(rows)]
    start = time.perf_counter()
    with torch.no_grad():
        decoder.encode(src, 1)
        tokens = torch.ones(rows, dtype=torch.long).numpy()
        for _ in range(TOKENS_PER_SIDE):
            tokens = decoder.step(tokens, None).argmax(-1)
    model.train()
    return (time.perf_counter() - start) * sentences / rows


def _train_pairs(plan, store: Store) -> int | None:
    data = next((n for n in plan.nodes if n.name == "data"), None)
    if data is not None and store.exists(data.id):
        return store.get(data.id).metrics.get("train_pairs")
    if plan.recipe.data.source == "multi30k":
        return min(MULTI30K_TRAIN_PAIRS, plan.recipe.data.max_train or MULTI30K_TRAIN_PAIRS)
    return None


def _past_durations(store: Store, machine: dict, recipe: str) -> dict[str, tuple[float, str]]:
    """Node name -> (seconds, run id) of its latest build in this store's run logs of the recipe,
    on a machine with the same CPU model and instruction level."""
    out: dict[str, tuple[float, str]] = {}
    if not store.runs.is_dir():
        return out
    for path in sorted(store.runs.glob("*.json")):  # ids start with the date: oldest first
        try:
            run = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        ran_on = run.get("machine") or {}
        if run.get("recipe") != recipe or (ran_on.get("cpu"), ran_on.get("isa")) != (
            machine.get("cpu"),
            machine.get("isa"),
        ):
            continue
        for record in run.get("nodes", []):
            if record.get("action") == "built" and record.get("duration_s"):
                out[record["node"]] = (float(record["duration_s"]), run.get("run", path.stem))
    return out
