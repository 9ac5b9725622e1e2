"""The prune stage on the smoke recipe's student: fewer heads, a smaller file, a loadable model,
and a fine-tune that resumes after a kill."""

from __future__ import annotations

import json

import pytest
import torch

from model.torch_decoder import TorchTranslator
from model.transformer import load_model
from pipeline.engine.context import StageContext
from pipeline.engine.recipe import dump_config
from pipeline.stages.prune import STAGE, PruneConfig, PruneFinetune, PruneInputs
from pipeline.training import prune_steps
from pipeline.training.loop import Trainer


@pytest.mark.slow
def test_prune_stage_through_smoke_recipe(smoke):
    store, arts = smoke.build("pruned")
    pruned, student = arts["pruned"], arts["student"]
    m = pruned.metrics
    assert pruned.manifest["inputs"]["model"] == student.id
    assert pruned.manifest["inputs"]["kd_corpus"] == arts["kd_corpus"].id and m["finetune_data"] == "kd_corpus"
    # smoke: 2 encoder + 1 decoder layer, 2 heads each (8 heads); target 0.5, min 1 per layer.
    assert m["heads_before"] == {"enc_self": [2, 2], "dec_self": [2], "dec_cross": [2]}
    assert m["heads_total_before"] == student.metrics["heads"] == 8
    assert m["heads"] == m["heads_total_after"] == 4 and m["heads_removed"] == 4 and m["fraction_removed"] == 0.5
    assert all(n >= 1 for counts in m["heads_after"].values() for n in counts)
    assert m["params"] == m["params_after"] < m["params_before"] == student.metrics["params"]
    files = pruned.manifest["files"]
    student_bytes = student.manifest["files"]["model.safetensors"]["bytes"]
    assert m["model_bytes"] == m["model_bytes_after"] == files["model.safetensors"]["bytes"] < student_bytes
    assert m["model_bytes_before"] == student_bytes
    assert set(files) == {"model.safetensors", "config.json", "tokenizer.json", "importance.json"}
    for key in (
        "valid_bleu_before",
        "valid_bleu_pruned",
        "valid_bleu_after",
        "sentence_ms_unpruned",
        "sentence_ms_pruned",
        "decoder_step_ms_unpruned",
        "decoder_step_ms_pruned",
    ):
        assert isinstance(m[key], (int, float)), key
    assert m["sentence_ms_pruned"] > 0 and m["decoder_step_ms_pruned"] > 0
    # The same pair timed in onnxruntime, each model exported as the export stage does.
    ort_figures = m["onnxruntime"]
    for name in ("unpruned", "pruned"):
        assert ort_figures[f"sentence_ms_{name}"] > 0 and ort_figures[f"decoder_step_ms_{name}"] > 0
        assert ort_figures[f"decoder_steps_per_sentence_{name}"] >= 1
    assert ort_figures["decoder_step_speedup"] == round(
        ort_figures["decoder_step_ms_unpruned"] / ort_figures["decoder_step_ms_pruned"], 3
    )

    # The importance table: every original head once, the lowest-scoring ones pruned.
    table = json.loads(pruned.file("importance.json").read_text())["heads"]
    assert table == m["importance"] and len(table) == 8
    assert sum(r["pruned"] for r in table) == 4
    for row in table:
        assert set(row) >= {"step", "layer", "kind", "head", "original_head", "score", "pruned"}

    # An ordinary model folder: loads with the pruned shapes and translates.
    model = load_model(pruned.path)
    assert model.cfg.enc_heads == m["heads_after"]["enc_self"]
    assert model.cfg.dec_cross_heads == m["heads_after"]["dec_cross"]
    assert model.num_parameters() == m["params"]
    out = TorchTranslator.load(pruned.path).translate(["A man is riding a bike.", ""], beam=2)
    assert len(out) == 2 and out[1] == ""


@pytest.mark.slow
def test_prune_resumes_after_a_kill(smoke, tmp_path, monkeypatch):
    """Uniform ranking, FFN pruning and two steps; killed during step 2's fine-tune, then rerun."""
    _, arts = smoke.build("pruned")
    settings = PruneConfig(
        ranking="uniform",
        target_fraction=0.5,
        steps=2,
        ffn_fraction=0.25,
        importance_batches=2,
        valid_bleu_sentences=2,
        latency_sentences=1,
        latency_repeats=1,
        # one batch per epoch, so the Trainer checkpoints after every step
        finetune=PruneFinetune(steps=2, batch_tokens=100_000),
    )
    inputs = PruneInputs(data=arts["data"], model=arts["student"], kd_corpus=arts["kd_corpus"])

    def context(name):
        (tmp_path / name).mkdir()
        return StageContext(
            name="pruned",
            settings=settings,
            config=dump_config(settings),
            inputs=inputs,
            out=tmp_path / name,
            work=tmp_path / "work",
        )

    real_step = Trainer._train_step

    def killed_in_step2(self, index, step):
        if "step2" in str(self.ckpt.dir) and step == 2:
            raise KeyboardInterrupt
        return real_step(self, index, step)

    monkeypatch.setattr(Trainer, "_train_step", killed_in_step2)
    with pytest.raises(KeyboardInterrupt):
        STAGE.load()(context("first"))
    assert (tmp_path / "work" / "step1" / "done" / "record.json").is_file()
    assert (tmp_path / "work" / "step2" / "train" / "checkpoint" / "state.json").is_file()
    monkeypatch.undo()

    ctx = context("second")
    m = STAGE.load()(ctx)
    said = [e["message"] for e in ctx.events]
    assert any(s.startswith("step 1: already done") for s in said)
    assert "step 2: resuming its fine-tune" in said
    assert any(s.startswith("resumed from checkpoint at step 1") for s in said)
    assert [s["finetune"]["steps"] for s in m["steps"]] == [2, 2]
    # uniform: one head count everywhere; FFN: a quarter of the 96 hidden units gone.
    counts = [n for layers in m["heads_after"].values() for n in layers]
    assert counts == [1, 1, 1, 1] and m["neurons_removed"] == 24
    model = load_model(ctx.out)
    assert sum(model.cfg.enc_ffn) + sum(model.cfg.dec_ffn) == 96 - 24
    assert json.loads((ctx.out / "importance.json").read_text())["neurons"]


@pytest.mark.slow
def test_max_bleu_drop_rolls_back_the_step_past_the_tolerance(smoke, tmp_path, monkeypatch):
    """The schedule's decision, with the valid BLEU figures scripted (the model and fine-tune are real):
    step 1 loses 0.2 (kept), step 2 would lose 1.0 > 0.5 (rolled back), so step 1's model ships."""
    _, arts = smoke.build("pruned")
    settings = PruneConfig(
        target_fraction=0.5,
        steps=2,
        max_bleu_drop=0.5,
        importance_batches=1,
        valid_bleu_sentences=2,
        latency_sentences=1,
        latency_repeats=1,
        finetune=PruneFinetune(steps=1, batch_tokens=100_000),
    )
    scripted = iter([30.0, 29.0, 29.8, 28.0, 29.0])  # before; per step: pruned, fine-tuned
    monkeypatch.setattr(prune_steps, "greedy_bleu", lambda *args: next(scripted))
    (tmp_path / "out").mkdir()
    ctx = StageContext(
        name="pruned",
        settings=settings,
        config=dump_config(settings),
        inputs=PruneInputs(data=arts["data"], model=arts["student"]),
        out=tmp_path / "out",
        work=tmp_path / "work",
    )
    m = STAGE.load()(ctx)
    assert [s["accepted"] for s in m["steps"]] == [True, False]
    assert m["stopped_by"].startswith("max_bleu_drop: step 2 would lose 1.00 BLEU")
    assert m["heads"] == m["steps"][0]["heads_left"] == 6 and m["finetune_data"] == "train split"
    assert (m["valid_bleu_before"], m["valid_bleu_pruned"], m["valid_bleu_after"]) == (30.0, 29.0, 29.8)
    assert load_model(ctx.out).cfg.total_heads() == 6


@pytest.mark.slow
def test_prune_finetunes_on_what_the_student_learnt_from(smoke):
    """A student trained on KD + references is fine-tuned on the same mix after pruning."""
    _, arts = smoke.build("pruned", "distill.student.reference_mix=0.5", "distill.student.train.max_epochs=1")
    mixed = arts["student"].metrics["reference_pairs_mixed"]
    assert mixed > 0 and arts["pruned"].metrics["finetune_data"] == f"kd_corpus + {mixed} references"


@pytest.mark.slow
def test_the_same_recipe_prunes_to_the_same_weights_and_another_seed_to_others(smoke, tmp_path, monkeypatch):
    """Pruning is a function of its inputs, its config and the speed switches the probe chose:
    rerun, it gives the same heads and the same weights bit for bit; another fine-tune seed the
    same heads and other weights. The switches are pinned here (math attention, foreach Adam, all
    threads): at the smoke model's size their timings are a coin toss, and each is another sum."""
    from safetensors.torch import load_file

    from pipeline.training import speed_probe

    monkeypatch.setattr(speed_probe, "SWITCH_MARGIN", 0.0)  # never leave math attention or the threads set
    monkeypatch.setattr(speed_probe, "MARGIN", float("inf"))  # never take fused Adam
    _, arts = smoke.build("pruned")

    def pruned_with(seed: int, name: str) -> tuple[dict, dict]:
        settings = PruneConfig(
            target_fraction=0.5,
            steps=1,
            importance_batches=2,
            valid_bleu_sentences=2,
            latency_sentences=1,
            latency_repeats=1,
            finetune=PruneFinetune(steps=3, batch_tokens=1200, seed=seed, bf16="off"),
        )
        (tmp_path / name / "out").mkdir(parents=True)
        ctx = StageContext(
            name="pruned",
            settings=settings,
            config=dump_config(settings),
            inputs=PruneInputs(data=arts["data"], model=arts["student"]),
            out=tmp_path / name / "out",
            work=tmp_path / name / "work",
        )
        metrics = STAGE.load()(ctx)
        return metrics["heads_after"], load_file(str(ctx.out / "model.safetensors"))

    heads, weights = pruned_with(1, "first")
    speed = json.loads((tmp_path / "first" / "work" / "step1" / "done" / "record.json").read_text())["finetune"][
        "speed"
    ]
    assert (speed["attention"], speed["fused_optimizer"]) == ("math", False)
    heads_again, weights_again = pruned_with(1, "again")
    heads_other, weights_other = pruned_with(2, "other")
    assert heads == heads_again == heads_other
    assert all(torch.equal(weights[k], weights_again[k]) for k in weights)
    assert any(not torch.equal(weights[k], weights_other[k]) for k in weights)
