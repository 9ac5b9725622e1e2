"""Distillation: the teacher's translations are their own artifact, students learn from them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from sacrebleu.metrics import BLEU

from model.torch_decoder import TorchTranslator
from model.transformer import load_model
from pipeline.commands import plan_recipe
from pipeline.corpora.distilled import TopKStore
from pipeline.corpora.kd_chunks import closest_to_reference
from pipeline.corpora.splits import read_split
from pipeline.engine.errors import RecipeError, UserInputError
from pipeline.engine.runner import node_status
from pipeline.training.from_teacher import project_embedding
from tests.helpers import SMOKE, SOURCE_PATH, cli

# The smoke teacher writes "eeee..." after its 3 epochs; 15 give it real (poor) sentences. Tests
# that need those share this one teacher (the smoke store builds it once).
TAUGHT = ("teacher.train.max_epochs=15",)


@pytest.mark.slow
def test_kd_corpus_and_students(smoke):
    smoke.build("student")
    store, arts = smoke.build("student_ref")
    kd = arts["kd_corpus"]
    src, tgt = read_split(kd.path, "kd")
    assert len(src) == len(tgt) == kd.metrics["sentences"] > 150
    data_src, data_tgt = read_split(arts["data"].path, "train")
    assert src == [s for s in data_src[:200] if s in set(src)]  # teacher translated the training sources
    assert tgt != data_tgt[: len(tgt)]  # ... into its own translations, not the references
    assert kd.metrics["sentences_per_s"] > 0 and kd.metrics["beam"] == 2

    student, ref = arts["student"].metrics, arts["student_ref"].metrics
    assert student["source"] == "kd_corpus" and ref["source"] == "references"
    assert student["params"] == ref["params"] < arts["teacher"].metrics["params"] / 3
    # The ablation's budget is the student's step count (the same compute), not its own epochs:
    # the student's two epochs over 200 pairs are one and a bit over the 400 references.
    assert ref["steps"] == student["steps"] and ref["stopped_by"].startswith("max_steps")
    assert ref["steps_matched_to"] == {"model": arts["student"].id, "steps": student["steps"]}
    assert ref["epochs"] < 2 == student["epochs"]


@pytest.mark.slow
def test_two_processes_translate_the_same_kd_corpus_in_the_same_order(smoke, tmp_path):
    """Under torchrun the corpus's chunks are shared out by rank and merged by chunk index: the
    result is the one process's corpus, line for line."""
    store, _ = smoke.build("kd_corpus")
    copy = tmp_path / "store"
    shutil.copytree(store.root, copy)
    corpora = []
    for nproc in ("1", "2"):  # 200 sentences in 4 chunks: ranks take 0, 2 and 1, 3
        proc = cli(
            "run",
            str(SMOKE),
            "--until",
            "kd_corpus",
            "--force",
            "kd_corpus",
            "--nproc",
            nproc,
            store=copy,
            timeout=600,
            env={"PIPELINE_KD_CHUNK": "64"},
        )
        assert proc.returncode == 0, proc.stderr.decode()[-3000:]
        built = [n for n in _latest_run(copy)["nodes"] if n["node"] == "kd_corpus"][0]
        folder = copy / "objects" / built["id"]
        assert json.loads((folder / "manifest.json").read_text())["metrics"]["processes"] == int(nproc)
        corpora.append(read_split(folder, "kd"))
    assert len(corpora[0][0]) > 150
    assert corpora[1] == corpora[0]


@pytest.mark.slow
def test_the_ablation_may_keep_its_own_budget(smoke):
    plan = plan_recipe(SMOKE, ["distill.ablation_budget=own"])
    ref = next(n for n in plan.nodes if n.name == "student_ref")
    assert "steps_of" not in ref.inputs and ref.config["train"]["max_epochs"] == 2


def _latest_run(store) -> dict:
    return json.loads(max((store / "runs").glob("*.json"), key=lambda p: p.stat().st_mtime_ns).read_text())


def _workers_of(store) -> list[str]:
    """Command lines of live processes that work in this store (Linux /proc)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(store) in text and "pipeline.stages.train.build" in text:
            found.append(text)
    return found


# The student and its ablation, side by side, trained for 6 epochs of the smoke recipe.
SIDE_BY_SIDE = (
    "run",
    str(SMOKE),
    "--until",
    "train",
    "--set",
    "distill.ablation_budget=side_by_side",
    "--set",
    "distill.student.train.max_epochs=6",
)


@pytest.mark.slow
def test_side_by_side_trains_the_student_and_its_ablation_at_once(smoke, tmp_path):
    """Each in its own process on its share of the cores, at the same time, for the same budget;
    their log lines reach the run log as if they had run in the runner."""
    plan = plan_recipe(SMOKE, ["distill.ablation_budget=side_by_side"])
    nodes = {n.name: n for n in plan.nodes}
    assert nodes["student"].side_by_side == nodes["student_ref"].side_by_side == ("student", "student_ref")
    assert "steps_of" not in nodes["student_ref"].inputs
    default = {n.name: n for n in plan_recipe(SMOKE).nodes}
    assert nodes["student"].fingerprint != default["student"].fingerprint  # trained on a share of the cores

    store, _ = smoke.build("kd_corpus")
    copy = tmp_path / "store"
    shutil.copytree(store.root, copy)
    proc = cli(
        *SIDE_BY_SIDE,
        store=copy,
        timeout=600,
    )
    err = proc.stderr.decode()
    assert proc.returncode == 0, err[-3000:]
    assert "student and student_ref side by side" in err
    records = {r["node"]: r for r in _latest_run(copy)["nodes"]}
    assert records["teacher"]["action"] == "reused"
    manifests = {
        name: json.loads((copy / "objects" / records[name]["id"] / "manifest.json").read_text())
        for name in ("student", "student_ref")
    }
    student, ref = (manifests[n] for n in ("student", "student_ref"))
    assert student["started"] < ref["created"] and ref["started"] < student["created"]  # they overlapped
    cores = len(os.sched_getaffinity(0))
    for name, manifest in manifests.items():
        assert records[name]["action"] == "built"
        assert manifest["metrics"]["threads"] == max(1, cores // 2)
        assert manifest["metrics"]["stopped_by"].startswith("max_epochs")
        assert any("parameters" in e["message"] for e in records[name]["events"])  # relayed from its process
    assert "steps_matched_to" not in ref["metrics"]
    # Run again unchanged: both are reused, nothing is trained.
    again = cli(
        *SIDE_BY_SIDE,
        store=copy,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr.decode()[-3000:]
    rerun = {r["node"]: r for r in _latest_run(copy)["nodes"]}
    assert {rerun[n]["action"] for n in ("student", "student_ref")} == {"reused"}
    assert {rerun[n]["id"] for n in ("student", "student_ref")} == {
        records[n]["id"] for n in ("student", "student_ref")
    }
    assert "side by side" not in again.stderr.decode()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="dying with the parent is Linux's prctl")
def test_a_killed_runner_takes_its_side_by_side_workers_with_it(smoke, tmp_path):
    """No orphan goes on writing checkpoints into the work folders that the next run resumes from."""
    store, _ = smoke.build("kd_corpus")
    copy = tmp_path / "store"
    shutil.copytree(store.root, copy)
    args = [*SIDE_BY_SIDE, "--set", "distill.student.train.checkpoint_every_minutes=0.01"]
    runner = subprocess.Popen(
        [sys.executable, "-m", "pipeline.commands.cli", *args, "--store", str(copy)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": SOURCE_PATH},
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(copy.glob("work/*/checkpoint/state.json"))) < 2:
        time.sleep(0.05)
    assert len(_workers_of(copy)) == 2
    runner.kill()
    runner.wait(30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _workers_of(copy):
        time.sleep(0.05)
    assert _workers_of(copy) == []
    again = cli(*args, store=copy, timeout=600)
    err = again.stderr.decode()
    assert again.returncode == 0, err[-3000:]
    assert err.count("resumed from checkpoint at step") == 2


@pytest.mark.slow
def test_changing_only_the_student_reuses_the_kd_corpus(smoke):
    store, _ = smoke.build("student")
    plan = plan_recipe(SMOKE, ["distill.student.train.lr=0.002"])
    rows = {r["node"]: r for r in node_status(store, plan)}
    assert rows["kd_corpus"]["state"] == "cached" and rows["teacher"]["state"] == "cached"
    assert rows["student"]["state"] == "stale" and "train.lr" in rows["student"]["reason"]
    assert rows["student_ref"]["state"] == "stale"


@pytest.mark.slow
def test_word_level_distillation_trains_against_the_teacher(smoke):
    store, arts = smoke.build(
        "student",
        "distill.student.word_level.enabled=true",
        "distill.student.word_level.alpha=0.5",
        "distill.student.train.max_epochs=1",
    )
    student = arts["student"]
    assert student.manifest["inputs"]["teacher"] == arts["teacher"].id
    history = json.loads((student.path / "training.json").read_text())["history"]
    assert history and history[-1]["valid_loss"] > 0


@pytest.mark.slow
def test_word_level_distillation_from_the_distributions_the_kd_corpus_stored(smoke):
    """The corpus keeps the teacher's top k per target position as it decodes; they line up with the
    student's encoding of each translation and are the teacher's teacher-forced distributions;
    the student (and the pruning fine-tune after it) learn from them without the teacher in the loop."""
    overrides = (
        *TAUGHT,
        "distill.corpus.beam=1",
        "distill.corpus.top_k=4",
        "distill.student.word_level.enabled=true",
        "distill.student.word_level.from_kd_corpus=true",
        "distill.student.word_level.alpha=0.7",
        "distill.student.reference_mix=0.5",
    )
    store, arts = smoke.build("pruned", *overrides)
    kd = arts["kd_corpus"]
    assert kd.metrics["top_k"]["k"] == 4
    stored = TopKStore(kd.path)
    src, tgt = read_split(kd.path, "kd")
    assert len(stored) == len(tgt)
    teacher = load_model(arts["teacher"].path)
    translator = TorchTranslator.load(arts["teacher"].path)
    tok = translator.tokenizer
    present = [i for i in range(len(stored)) if stored[i] is not None]
    assert len(present) == len(stored) - kd.metrics["top_k"]["pairs_without"] >= 20  # a weak teacher: few canonical
    for i in present[:20]:
        ids, probs = stored[i]
        target = tok.encode([tgt[i]])[0]
        assert ids.shape == (len(target) + 1, 4)
        np.testing.assert_allclose(probs.astype(np.float32).sum(1), 1.0, atol=2e-3)
        with torch.no_grad():
            src_ids = torch.tensor([tok.encode([src[i]])[0] + [tok.eos_id]])
            logits = teacher(src_ids, torch.tensor([[tok.bos_id] + target]))[0]
        forced_p, forced_ids = logits.softmax(-1).topk(4, -1)
        assert (forced_ids[:, 0].numpy() == ids[:, 0]).all()  # the greedy choice at every step
        assert ids[:-1, 0].tolist() == target  # ... which is the translation itself
        np.testing.assert_allclose(
            probs.astype(np.float32), (forced_p / forced_p.sum(-1, keepdim=True)).numpy(), atol=3e-3
        )

    student = arts["student"]
    assert "teacher" in student.manifest["inputs"]  # the vocabulary check
    assert student.metrics["word_level_pairs"] == len(present) < student.metrics["train_pairs"]
    assert arts["pruned"].metrics["finetune_data"].endswith("with the teacher's distributions")


def test_stored_distributions_need_a_greedy_corpus_that_keeps_them():
    with pytest.raises(RecipeError, match="distill.corpus.top_k"):
        plan_recipe(
            SMOKE,
            [
                "distill.corpus.beam=1",
                "distill.student.word_level.enabled=true",
                "distill.student.word_level.from_kd_corpus=true",
            ],
        )
    with pytest.raises(RecipeError, match="beam: 1"):
        plan_recipe(SMOKE, ["distill.corpus.top_k=4"])
    with pytest.raises(RecipeError, match="temperature: 1"):
        plan_recipe(
            SMOKE,
            [
                "distill.corpus.beam=1",
                "distill.corpus.top_k=4",
                "distill.student.word_level.enabled=true",
                "distill.student.word_level.from_kd_corpus=true",
                "distill.student.word_level.temperature=2",
            ],
        )


@pytest.mark.slow
def test_the_ablation_may_have_its_own_dropout(smoke):
    """Same shape, its own regularization; changing it touches the ablation only."""
    store, _ = smoke.build("student_ref")  # (the ablation needs the student: its step budget)
    plan = plan_recipe(SMOKE, ["distill.ablation_dropout=0.3"])
    ref, student = (next(n for n in plan.nodes if n.name == name) for name in ("student_ref", "student"))
    assert ref.config["model"]["dropout"] == 0.3 != student.config["model"]["dropout"]
    assert {**ref.config["model"], "dropout": 0} == {**student.config["model"], "dropout": 0}
    rows = {r["node"]: r for r in node_status(store, plan)}
    assert rows["student"]["state"] == "cached" and rows["kd_corpus"]["state"] == "cached"
    assert rows["student_ref"]["state"] == "stale"


def test_closest_to_reference_takes_the_beam_hypothesis_nearest_the_reference():
    reference = "un homme en chemise bleue est assis sur une chaise ."
    nbest = [
        ["un homme est assis .", "un homme en chemise bleue est assis sur une chaise .", "un homme assis ."],
        ["deux chiens courent .", "deux chiens courent ."],  # a tie: the teacher's order decides
        ["une femme lit un livre ."],
    ]
    part = closest_to_reference(nbest, [reference, "deux chiens jouent dans la neige .", "une femme lit un livre ."])
    assert part["hyps"] == [nbest[0][1], nbest[1][0], nbest[2][0]]
    assert part["not_top"] == 1
    assert part["sentence_bleu_selected"] - part["sentence_bleu_top"] == pytest.approx(
        100 - BLEU(effective_order=True).sentence_score(nbest[0][0], [reference]).score
    )


@pytest.mark.slow
def test_a_seq_inter_corpus_holds_the_beam_hypothesis_nearest_each_reference(smoke):
    # Four hypotheses per sentence from the taught teacher: about a third of the nearest are not its best.
    taught = [*TAUGHT, "distill.corpus.beam=4", "distill.corpus.max_sentences=100"]
    _, top = smoke.build("kd_corpus", *taught)
    _, inter = smoke.build("kd_corpus", *taught, "distill.corpus.selection=closest_to_reference")
    assert inter["kd_corpus"].id != top["kd_corpus"].id and inter["teacher"].id == top["teacher"].id
    chosen = inter["kd_corpus"].metrics["selection"]
    assert 0.05 < chosen["not_top_fraction"] < 1
    assert chosen["mean_sentence_bleu_selected"] > chosen["mean_sentence_bleu_top"]

    refs = dict(zip(*read_split(top["data"].path, "train")))
    src, top_tgt = read_split(top["kd_corpus"].path, "kd")
    inter_src, inter_tgt = read_split(inter["kd_corpus"].path, "kd")
    assert inter_src == src
    nbest = TorchTranslator.load(top["teacher"].path).translate_nbest(src, beam=4, batch_tokens=6000)
    assert top_tgt == [hyps[0] for hyps in nbest]
    assert inter_tgt == closest_to_reference(nbest, [refs[s] for s in src])["hyps"]
    # Each changed target is strictly nearer its reference (a tie keeps the teacher's best); the
    # corpus BLEU need not rise with it (brevity and n-gram totals are pooled), so not asserted.
    sentence = BLEU(effective_order=True)
    nearer = [
        sentence.sentence_score(a, [refs[s]]).score - sentence.sentence_score(b, [refs[s]]).score
        for s, a, b in zip(src, inter_tgt, top_tgt)
        if a != b
    ]
    assert nearer and min(nearer) > 0


def test_seq_inter_needs_a_beam_to_choose_from():
    with pytest.raises(RecipeError, match="needs beam >= 2"):
        plan_recipe(SMOKE, ["distill.corpus.selection=closest_to_reference", "distill.corpus.beam=1"])


def test_the_projected_embedding_keeps_the_words_dot_products():
    torch.manual_seed(0)
    low_rank = torch.randn(50, 6) @ torch.randn(6, 24)  # 50 words, width 24, rank 6
    projected, kept = project_embedding(low_rank, 6, std=0.1)
    assert projected.shape == (50, 6) and kept == pytest.approx(1.0)
    assert float(projected.std()) == pytest.approx(0.1, rel=1e-4)
    gram, want = projected @ projected.T, low_rank @ low_rank.T
    torch.testing.assert_close(gram / gram.norm(), want / want.norm(), atol=1e-5, rtol=0)
    _, kept = project_embedding(torch.randn(50, 24), 6, std=0.1)
    assert 6 / 24 < kept < 1  # the top directions hold more than their share of a random table
    with pytest.raises(UserInputError, match="wider than the teacher"):
        project_embedding(low_rank, 32, std=0.1)


@pytest.mark.slow
def test_the_student_may_start_from_the_teachers_embedding(smoke):
    # At a vanishing learning rate the trained student still holds its starting point.
    store, arts = smoke.build(
        "student",
        "distill.student.embeddings_from_teacher=true",
        "distill.student.train.lr=1e-9",
        "distill.student.train.max_epochs=1",
    )
    student = arts["student"]
    assert student.manifest["inputs"]["teacher"] == arts["teacher"].id
    assert 0 < student.metrics["embeddings_from_teacher"]["variance_kept"] < 1
    teacher_table = load_model(arts["teacher"].path).embed.weight.detach()
    table = load_model(student.path).embed.weight.detach()
    want, _ = project_embedding(teacher_table, table.shape[1], float(table.std()))
    torch.testing.assert_close(table, want, atol=1e-5, rtol=1e-4)
    plan = plan_recipe(
        SMOKE,
        [
            "distill.student.embeddings_from_teacher=false",
            "distill.student.train.lr=1e-9",
            "distill.student.train.max_epochs=1",
        ],
    )
    rows = {r["node"]: r for r in node_status(store, plan)}
    assert rows["kd_corpus"]["state"] == "cached" and rows["student"]["state"] == "stale"


def test_a_student_wider_than_its_teacher_cannot_take_its_embedding():
    with pytest.raises(RecipeError, match="wider than the teacher's"):
        plan_recipe(SMOKE, ["distill.student.embeddings_from_teacher=true", "distill.student.model.d_model=64"])


def test_the_ablation_may_start_from_the_teachers_embedding_too():
    plain, both = (
        plan_recipe(SMOKE, overrides) for overrides in ([], ["distill.ablation_embeddings_from_teacher=true"])
    )
    ref_plain, ref_both = (next(n for n in plan.nodes if n.name == "student_ref") for plan in (plain, both))
    assert ref_plain.config["embeddings_from_teacher"] is False and "teacher" not in ref_plain.inputs
    assert ref_both.config["embeddings_from_teacher"] is True and ref_both.inputs["teacher"] == "teacher"
    student_plain, student_both = (next(n for n in plan.nodes if n.name == "student") for plan in (plain, both))
    assert student_plain.fingerprint == student_both.fingerprint != ""
