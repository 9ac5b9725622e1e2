"""Distillation: the teacher's translations are their own artifact, students learn from them."""

from __future__ import annotations

import json

from pipeline.runner import make_plan, node_status
from pipeline.stages.data import read_split

from .conftest import SMOKE


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


def test_changing_only_the_student_reuses_the_kd_corpus(smoke):
    store, _ = smoke.build("student")
    plan = make_plan(SMOKE, ["distill.student.train.lr=0.002"])
    rows = {r["node"]: r for r in node_status(store, plan)}
    assert rows["kd_corpus"]["state"] == "cached" and rows["teacher"]["state"] == "cached"
    assert rows["student"]["state"] == "stale" and "train.lr" in rows["student"]["reason"]
    assert rows["student_ref"]["state"] == "stale"


def test_word_level_distillation_trains_against_the_teacher(smoke):
    store, arts = smoke.build("student", "distill.student.word_level.enabled=true",
                              "distill.student.word_level.alpha=0.5", "distill.student.train.max_epochs=1")
    student = arts["student"]
    assert student.manifest["inputs"]["teacher"] == arts["teacher"].id
    history = json.loads((student.path / "training.json").read_text())["history"]
    assert history and history[-1]["valid_loss"] > 0


def test_the_ablation_may_have_its_own_dropout(smoke):
    """Same shape, its own regularization; changing it touches the ablation only."""
    store, _ = smoke.build("student")
    plan = make_plan(SMOKE, ["distill.ablation_dropout=0.3"])
    ref, student = (next(n for n in plan.nodes if n.name == name) for name in ("student_ref", "student"))
    assert ref.config["model"]["dropout"] == 0.3 != student.config["model"]["dropout"]
    assert {**ref.config["model"], "dropout": 0} == {**student.config["model"], "dropout": 0}
    rows = {r["node"]: r for r in node_status(store, plan)}
    assert rows["student"]["state"] == "cached" and rows["kd_corpus"]["state"] == "cached"
    assert rows["student_ref"]["state"] == "stale"
