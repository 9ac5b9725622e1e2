"""Host-side cost of a training step at a recipe's shapes, on the CPU, with the model's compute taken out.

    PIPELINE_DATA=../shared/data python scripts/train_host_cost.py [--recipe recipes/distill_int8.yaml]
        [--roles teacher,student,student_ref] [--steps 300] [--work /tmp/train_host_cost] [--json OUT]

The real loop (pipeline.training.loop.Trainer.fit) trains each role's real training set, at the
recipe's batch_tokens, with a stand-in for the model whose forward pass selects the target
positions as the model does and costs nothing else, and a loss that costs nothing: what is left
of a step is what the host spends on it, which a GPU waits for unless it is hidden. The student's
set is the recipe's (the KD corpus with its reference mix, the teacher's top k per position read
from a memory-mapped store): the KD corpus here is a stand-in built once under --work, the
references as the teacher's translations and random top-k rows of the right lengths (the store's
layout and sizes are the real ones; its values do not matter to the host). The data and
tokenizer stages are built under --work with the recipe's settings.

Per step, after a warm-up: the main thread's CPU time (time.thread_time: what the thread that
drives the device spends), the process's CPU time (time.process_time: a loader thread's work
included) and the wall time, median and p90; where the main thread's time goes (the functions
named below, wrapped; "rest of the loop" is what no wrapped function took); and the calls per
step that make a CUDA host wait for the device (.item(), tensor-to-Python conversions, boolean
mask indexing), counted in a separate, untimed pass. Measured on the CPU, so a copy to the
device costs nothing here; on the CPU the "compute" row is the stand-in's, not the model's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's code, not an installed copy

import numpy as np  # noqa: E402
import torch  # noqa: E402
from mt_runtime.subword import SubwordTokenizer  # noqa: E402

from model.transformer import TransformerConfig  # noqa: E402
from pipeline import context, train_loop  # noqa: E402
from pipeline.corpora.distilled import TOP_K_FILE, TopKWriter, encoded_training_set, training_pairs  # noqa: E402
from pipeline.corpora.encoded import Corpus  # noqa: E402
from pipeline.corpora.splits import split_lines  # noqa: E402
from pipeline.engine.recipe import dump_config  # noqa: E402
from pipeline.training.settings import TrainConfig  # noqa: E402
from pipeline.training.speed_probe import SpeedChoice  # noqa: E402

WARMUP = 10  # steps left out of the figures
COMPUTE = "compute (stand-in model, loss, backward, optimizer)"


class NoCompute(torch.nn.Module):
    """The model's interface at no cost: [N, 1] 'logits' at the target positions the model keeps
    (selected as Transformer.forward selects them), from one parameter."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.scale = torch.nn.Parameter(torch.ones(1))

    def forward(self, src, tgt_in, tgt_out=None, **kept):
        x = self.scale.expand(tgt_in.shape).unsqueeze(-1)
        if kept.get("keep") is not None:
            return x.reshape(-1, 1).index_select(0, kept["keep"])
        if tgt_out is not None:
            x = x[tgt_out != self.cfg.pad_id]
        return x


def no_loss(logits, target, smoothing, soft=None):
    return logits.float().mean()


def plain_progress(description, total=None, unit=""):
    """The progress lines a relayed worker writes (not a terminal's live bar), every 30 s."""
    return contextlib.nullcontext(context.ProgressHandle(None, None, description, total, unit, log_every_s=30.0))


# ------------------------------------------------------------------------------- inputs
def build_inputs(recipe: Path, work: Path) -> tuple[dict, Path, Path]:
    """The recipe's data and tokenizer artifacts (built under work/store) and a stand-in KD corpus."""
    from pipeline.commands import plan_recipe
    from pipeline.engine.runner import run
    from pipeline.engine.store import Store

    work.mkdir(parents=True, exist_ok=True)
    copy = work / recipe.name  # planned from a copy, so the run's lock file is written there, not beside the recipe
    copy.write_bytes(recipe.read_bytes())
    plan = plan_recipe(copy)
    store = Store(work / "store")
    run(plan, store, until="tokenizer")
    nodes = {n.name: n for n in plan.nodes}
    data = store.get(nodes["data"].id).path
    tokenizer = store.get(nodes["tokenizer"].id).file("tokenizer.json")
    return nodes, data, tokenizer


def stand_in_kd_corpus(data: Path, tokenizer: SubwordTokenizer, k: int, folder: Path) -> Path:
    """kd.src/kd.tgt (the training split's references) and a top-k store with one row per target
    token plus EOS for each, random ids and probabilities, in the kd_corpus stage's format."""
    if (folder / f"{TOP_K_FILE}.probs.npy").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    src, tgt = list(split_lines(data, "train", "src")), list(split_lines(data, "train", "tgt"))
    for name, lines in (("kd.src", src), ("kd.tgt", tgt)):
        (folder / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    lengths = np.array([len(ids) + 1 for ids in tokenizer.encode_target(tgt)], dtype=np.int64)
    rng = np.random.default_rng(0)
    writer = TopKWriter(folder, lengths, k, np.int16)
    for row, n in enumerate(lengths):
        probs = rng.random((n, k), dtype=np.float32)
        writer.put(row, rng.integers(0, tokenizer.vocab_size, (n, k)), probs / probs.sum(-1, keepdims=True))
    writer.close()
    return folder


# ------------------------------------------------------------------------------ timing
class Sections:
    """Per wrapped function, the CPU time of the thread that ran it (time.thread_time), less that
    of the wrapped functions it called (each section's own time)."""

    def __init__(self):
        self.spent: dict[tuple[str, str], float] = {}
        self.undo: list = []
        self.local = threading.local()

    def wrap(self, owner, name: str, label: str) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return
        sections = self

        def timed(*args, **kwargs):
            stack = getattr(sections.local, "stack", None)
            if stack is None:
                stack = sections.local.stack = []
            stack.append(0.0)  # the time of the sections called from this one
            start = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                took = time.thread_time() - start
                inner = stack.pop()
                if stack:
                    stack[-1] += took
                where = "main" if threading.current_thread() is threading.main_thread() else "loader"
                key = (label, where)
                sections.spent[key] = sections.spent.get(key, 0.0) + took - inner

        setattr(owner, name, timed)
        self.undo.append((owner, name, original))

    def restore(self) -> None:
        for owner, name, original in reversed(self.undo):
            setattr(owner, name, original)
        self.undo.clear()


SECTIONS = [  # (module or class, attribute, label), before and after issue 49's changes; missing ones are skipped
    ("pipeline.training.loop", "collate", "collation"),
    ("pipeline.training.loop", "collate_soft", "top-k gather"),
    ("pipeline.training.batches", "collate_arrays", "collation"),
    ("pipeline.training.batches", "_soft_at", "top-k gather"),
    ("pipeline.training.loop", "prepare_batch", "batch assembly (positions, targets, tensors, pinning)"),
    ("pipeline.training.batches.BatchFeed", "__next__", "batch feed (the loader's queue, when there is one)"),
    ("pipeline.training.batches.Batch", "to", "copy to the device"),
    ("pipeline.training.loop._RunningLoss", "add", "loss bookkeeping"),
    ("pipeline.training.loop._RunningLoss", "text", "loss bookkeeping"),
    ("pipeline.engine.context.ProgressHandle", "advance", "progress and logging"),
    ("pipeline.training.loop._Forecast", "update", "progress and logging"),
    ("pipeline.training.loop.Trainer", "_budget_reached", "budget check"),
    ("pipeline.training.loop.Trainer", "_save_checkpoint", "checkpoints"),
    ("__main__.NoCompute", "forward", COMPUTE),
    ("pipeline.training.loop", "label_smoothed_loss", COMPUTE),
    ("torch.Tensor", "backward", COMPUTE),
    ("torch.optim.Adam", "step", COMPUTE),
    ("torch.optim.Optimizer", "zero_grad", COMPUTE),
    ("torch.nn.utils", "clip_grad_norm_", COMPUTE),
]


def _resolve(path: str):
    import importlib

    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = (
                sys.modules["__main__"]
                if parts[:cut] == ["__main__"]
                else importlib.import_module(".".join(parts[:cut]))
            )
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr, None)
            if obj is None:
                return None
        return obj
    return None


SYNCS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")


@contextlib.contextmanager
def counting_syncs(counts: dict):
    """Count the calls that make a CUDA host wait: Tensor.item and friends, and boolean-mask indexing."""
    originals = {name: getattr(torch.Tensor, name) for name in SYNCS + ("__getitem__",)}

    def counter(name):
        original = originals[name]

        def counted(self, *args, **kwargs):
            if name != "__getitem__":
                counts[name] = counts.get(name, 0) + 1
            else:
                index = args[0]
                items = index if isinstance(index, tuple) else (index,)
                if any(torch.is_tensor(i) and i.dtype == torch.bool for i in items):
                    counts["boolean mask"] = counts.get("boolean mask", 0) + 1
            return original(self, *args, **kwargs)

        return counted

    for name in originals:
        setattr(torch.Tensor, name, counter(name))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


# --------------------------------------------------------------------------------- run
def role_setup(role: str, nodes: dict, data: Path, tokenizer_path: Path, kd: Path, work: Path):
    node = nodes[role]
    job = {
        **dump_config(node.settings),
        "data": str(data),
        "tokenizer": str(tokenizer_path),
        "kd_corpus": str(kd) if "kd_corpus" in node.inputs else None,
    }
    tok = SubwordTokenizer.load(tokenizer_path)
    model_cfg = TransformerConfig.from_spec(node.settings.model, tok.vocab_size, tok.special_ids())
    word_level = node.settings.word_level
    text = training_pairs(
        data,
        Path(job["kd_corpus"]) if job["kd_corpus"] else None,
        node.settings.reference_mix,
        node.settings.train.seed,
        bool(word_level and word_level.enabled and word_level.from_kd_corpus),
        lambda m: None,
    )
    train, _ = encoded_training_set(text, tok, model_cfg.max_positions, work / role, lambda m: None, plain_progress)
    return job, tok, model_cfg, train


def fit(job: dict, tok, model_cfg, train, work: Path, steps: int, prefetch, sections: "Sections | None" = None) -> dict:
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    cfg = TrainConfig.model_validate({**job["train"], "max_steps": steps, "max_epochs": None, "max_minutes": None})
    valid = train_loop.ValidationSet(Corpus([], []), [], [])
    speed = SpeedChoice(bf16=False, attention="default", fused_optimizer=True, threads=1, isa="stand-in")
    word_level = job.get("word_level") or {}
    extra = {} if prefetch is None else {"prefetch": prefetch}
    trainer = train_loop.Trainer(
        NoCompute(model_cfg),
        cfg,
        train,
        valid,
        tok,
        work,
        lambda m: None,
        plain_progress,
        kd_alpha=word_level.get("alpha", 0.0) if word_level.get("enabled") else 0.0,
        speed=speed,
        **extra,
    )
    marks: list[tuple[float, float, float]] = []
    spent: list[dict] = []  # the sections' totals at each mark
    original = train_loop.Trainer._train_step

    def marked(self, *args, **kwargs):
        marks.append((time.thread_time(), time.process_time(), time.perf_counter()))
        spent.append(dict(sections.spent) if sections is not None else {})
        return original(self, *args, **kwargs)

    train_loop.Trainer._train_step = marked
    try:
        trainer.fit()
    finally:
        train_loop.Trainer._train_step = original
    return {"marks": marks, "spent": spent}


def per_step(marks: list, column: int) -> list[float]:
    values = [b[column] - a[column] for a, b in zip(marks[WARMUP:], marks[WARMUP + 1 :])]
    return [v * 1000 for v in values]


def figures(values: list[float]) -> dict:
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered), 3),
        "p90": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 3),
    }


def measure_role(role: str, args, nodes, data, tokenizer_path, kd) -> dict:
    work = Path(args.work)
    job, tok, model_cfg, train = role_setup(role, nodes, data, tokenizer_path, kd, work / "encoded")
    with_soft = train.soft is not None and bool((job.get("word_level") or {}).get("enabled"))
    result = {
        "role": role,
        "batch_tokens": job["train"]["batch_tokens"],
        "pairs": len(train),
        "top_k": int(train.soft.k) if with_soft else None,
        "modes": {},
    }
    modes = [None] if args.prefetch == "default" else [{"on": True, "off": False}[m] for m in args.prefetch.split(",")]
    for mode in modes:
        sections = Sections()
        train_loop.label_smoothed_loss, real_loss = no_loss, train_loop.label_smoothed_loss
        try:
            # Syncs per step: the counts of a run of 2N steps less those of a run of N (untimed).
            counts = [{}, {}]
            for steps, count in zip((args.sync_steps, 2 * args.sync_steps), counts):
                with counting_syncs(count):
                    fit(job, tok, model_cfg, train, work / "run" / role, steps, mode)
            syncs = {k: (counts[1].get(k, 0) - counts[0].get(k, 0)) / args.sync_steps for k in counts[1]}
            for owner, name, label in SECTIONS:
                target = _resolve(owner)
                if target is not None:
                    sections.wrap(target, name, label)
            run = fit(job, tok, model_cfg, train, work / "run" / role, args.steps + WARMUP + 1, mode, sections)
        finally:
            sections.restore()
            train_loop.label_smoothed_loss = real_loss
        marks, first, last = run["marks"], run["spent"][WARMUP], run["spent"][-1]
        timed_steps = len(marks) - 1 - WARMUP  # the steps between the marks after the warm-up
        main_ms = per_step(marks, 0)
        breakdown = {}
        for (label, where), seconds in last.items():
            key = label if where == "main" else f"{label} [loader thread]"
            ms = (seconds - first.get((label, where), 0.0)) * 1000 / timed_steps
            breakdown[key] = round(breakdown.get(key, 0.0) + ms, 3)
        main_total = sum(main_ms) / timed_steps
        compute_ms = [
            1000 * (b.get((COMPUTE, "main"), 0.0) - a.get((COMPUTE, "main"), 0.0))
            for a, b in zip(run["spent"][WARMUP:], run["spent"][WARMUP + 1 :])
        ]
        host_ms = [m - c for m, c in zip(main_ms, compute_ms)]
        order_s = time.thread_time()
        batches = train_loop.make_batches(train, job["train"]["batch_tokens"], 1, 0)
        order_s = time.thread_time() - order_s
        named = sum(v for k, v in breakdown.items() if not k.endswith("[loader thread]"))
        breakdown["rest of the loop (step bookkeeping, lr, masks, autograd glue)"] = round(main_total - named, 3)
        name = {None: "default", True: "prefetch on", False: "prefetch off"}[mode]
        result["modes"][name] = {
            "steps_timed": len(main_ms),
            "main_thread_ms": figures(main_ms),
            "process_cpu_ms": figures(per_step(marks, 1)),
            "wall_ms": figures(per_step(marks, 2)),
            "host_ms": figures(host_ms),
            "batch_order_ms_per_step": round(order_s * 1000 / len(batches), 3),
            "batches_per_epoch": len(batches),
            "breakdown_ms_per_step": dict(sorted(breakdown.items(), key=lambda kv: -kv[1])),
            "host_syncs_per_step": {k: round(v, 2) for k, v in sorted(syncs.items()) if v},
        }
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default=str(ROOT / "recipes" / "distill_int8.yaml"))
    ap.add_argument("--roles", default="teacher,student,student_ref")
    ap.add_argument("--steps", type=int, default=300, help="steps timed per role (after a warm-up of 10)")
    ap.add_argument("--sync-steps", type=int, default=30, help="steps of the untimed pass that counts host syncs")
    ap.add_argument("--prefetch", default="default", help="default (the Trainer's own choice), or on,off")
    ap.add_argument("--work", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "train_host_cost"))
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    work = Path(args.work)
    nodes, data, tokenizer_path = build_inputs(Path(args.recipe), work)
    tok = SubwordTokenizer.load(tokenizer_path)
    kd = stand_in_kd_corpus(data, tok, 8, work / "kd_corpus")
    results = [measure_role(role, args, nodes, data, tokenizer_path, kd) for role in args.roles.split(",")]
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, recipe {Path(args.recipe).name}; ms per step, "
        f"after {WARMUP} warm-up steps"
    )
    for r in results:
        print(
            f"\n{r['role']}: batch_tokens {r['batch_tokens']}, {r['pairs']} pairs"
            + (f", top {r['top_k']} from the KD store" if r["top_k"] else "")
        )
        for mode, m in r["modes"].items():
            print(
                f"  [{mode}] host cost (the main thread's CPU time less the stand-in's compute): median "
                f"{m['host_ms']['median']:.2f} ms, p90 {m['host_ms']['p90']:.2f} ms over {m['steps_timed']} steps"
            )
            print(
                f"      main thread {m['main_thread_ms']['median']:.2f} / p90 {m['main_thread_ms']['p90']:.2f} ms;"
                f" process CPU {m['process_cpu_ms']['median']:.2f} / {m['process_cpu_ms']['p90']:.2f};"
                f" wall {m['wall_ms']['median']:.2f} / {m['wall_ms']['p90']:.2f}; the batch order"
                f" (make_batches, once an epoch of {m['batches_per_epoch']}) {m['batch_order_ms_per_step']:.3f} a step"
            )
            print("      mean per step, main thread unless named:")
            for label, ms in m["breakdown_ms_per_step"].items():
                print(f"      {ms:8.3f}  {label}")
            syncs = ", ".join(f"{k} {v:g}" for k, v in m["host_syncs_per_step"].items()) or "none"
            print(f"      host syncs per step: {syncs}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
