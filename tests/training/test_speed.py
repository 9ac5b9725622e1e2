"""Speed switches chosen by measurement, budgets that do not depend on the clock, a time cap that
says when it cut a training, the CPU's instruction level in every record, and the dry run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from model.transformer import Transformer, TransformerConfig
from pipeline.engine import machine
from pipeline.engine.context import progress_bar
from pipeline.training.loop import Trainer, _Forecast
from pipeline.training.loss import label_smoothed_loss
from pipeline.training.settings import TrainConfig
from pipeline.training.speed_probe import choose
from tests.helpers import REPO, SMOKE, SOURCE_PATH, cli
from tests.helpers.models import _setup

AVX2_ONLY = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


def _teacher_sized(layers: int = 1) -> tuple[Transformer, tuple]:
    """The default teacher's width (d_model 256, FFN 1024), fewer layers: its matrices, in a second."""
    torch.manual_seed(0)
    cfg = TransformerConfig(
        vocab_size=500,
        d_model=256,
        head_dim=64,
        enc_heads=[4] * layers,
        dec_self_heads=[4] * layers,
        dec_cross_heads=[4] * layers,
        enc_ffn=[1024] * layers,
        dec_ffn=[1024] * layers,
    )
    batch = tuple(torch.randint(3, 500, (40, 16), generator=torch.Generator().manual_seed(i)) for i in range(3))
    return Transformer(cfg), batch


@pytest.mark.slow
def test_probe_chooses_float32_where_bf16_is_emulated_and_warns_when_forced():
    """torch capped to AVX2 (as an AVX2-only CPU runs it): bf16 autocast is emulated there, many
    times slower; auto must keep float32, and a recipe's bf16: on must say what it costs."""
    script = textwrap.dedent("""
        import json, torch
        from tests.training.test_speed import _teacher_sized
        from pipeline.training.speed_probe import choose
        from pipeline.training.loss import label_smoothed_loss
        torch.set_num_threads(1)
        model, batch = _teacher_sized()
        loss = lambda logits: label_smoothed_loss(logits, batch[2].reshape(-1), 0.1)
        out = {"capability": torch.backends.cpu.get_cpu_capability()}
        for asked in ("auto", "on"):
            choice = choose(model, batch, loss, torch.device("cpu"), asked, 1, steps=1800, pass_to_step=4.4)
            out[asked] = choice.to_dict()
        print(json.dumps(out))
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **AVX2_ONLY, "PYTHONPATH": SOURCE_PATH},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["capability"] == "AVX2"
    auto, forced = out["auto"], out["on"]
    assert auto["bf16"] is False and "auto:" in auto["reasons"]["bf16"]
    assert auto["isa"].endswith("AVX2") and auto["warning"] is None
    assert auto["probe_ms"]["matmul_bf16"] > auto["probe_ms"]["matmul_float32"]
    assert forced["bf16"] is True  # as asked, but said once, with the measured slowdown and what it costs
    assert "slower than float32" in forced["warning"] and "for its 1800 steps" in forced["warning"]
    assert auto["probe_s"] < 30  # a probe, not a benchmark (seconds even on a loaded 2-core VM)


def test_probe_leaves_weights_gradients_and_random_state_as_they_were():
    model, batch = _teacher_sized()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    choice = choose(
        model,
        batch,
        lambda logits: label_smoothed_loss(logits, batch[2].reshape(-1), 0.1),
        torch.device("cpu"),
        "auto",
        1,
        probe_threads=[1],
    )
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(rng, torch.get_rng_state())
    assert set(choice.reasons) == {"bf16", "attention", "fused_optimizer", "threads"}
    assert choice.precision in ("bf16", "float32") and choice.attention in ("math", "default")


def test_cpu_instruction_level_from_flags_and_caps(monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    for flags, level in (
        ({"avx", "avx2", "fma"}, "AVX2"),
        ({"avx2", "avx512f"}, "AVX-512"),
        ({"avx2", "avx512f", "avx512_bf16"}, "AVX512-BF16"),
        ({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}, "AMX"),
        ({"sse4_2"}, "SSE"),
    ):
        monkeypatch.setattr(machine, "_cpu_flags", lambda flags=flags: flags)
        assert machine.cpu_isa() == level
    monkeypatch.setattr(machine, "_cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16"})
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert machine.cpu_isa() == "AVX512-BF16, capped to AVX2"
    assert machine.effective_isa(machine.cpu_isa()) == "AVX2"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")  # a cap above the CPU changes nothing
    assert machine.cpu_isa() == "AVX512-BF16"


def test_time_never_moves_the_schedule(smoke, tmp_path):
    """The cooldown follows the budget in steps; a minute cap, however near, does not change the
    learning rate a step gets: one recipe trains the same model on a fast machine and a slow one."""
    tok, train, valid, cfg = _setup(smoke)
    tc = TrainConfig(
        lr=3e-3,
        warmup_steps=5,
        batch_tokens=400,
        max_epochs=None,
        max_steps=10,
        max_minutes=1.0,
        cooldown=0.5,
        valid_bleu_sentences=5,
        seed=7,
    )
    trainer = Trainer(Transformer(cfg), tc, train, valid, tok, tmp_path, lambda m: None, progress_bar)
    state = {"step": 5, "epoch": 0}
    assert trainer._budget_reached(state, elapsed_s=59.0, epoch_fraction=0.1) is None
    assert trainer.budget_used == pytest.approx(0.5)  # 5 of 10 steps, though 59 of 60 seconds are gone
    assert trainer._budget_reached(state, elapsed_s=61.0, epoch_fraction=0.1) == "max_minutes (1)"


def test_training_forecasts_its_time_and_records_its_switches(smoke, tmp_path, monkeypatch):
    tok, train, valid, cfg = _setup(smoke)
    monkeypatch.setattr(_Forecast, "FIRST_AFTER_S", 0.0)  # the forecast after the first step, not minute
    lines: list[str] = []
    tc = TrainConfig(
        lr=3e-3, warmup_steps=5, batch_tokens=400, max_epochs=None, max_steps=12, valid_bleu_sentences=5, seed=7
    )
    result = Trainer(Transformer(cfg), tc, train, valid, tok, tmp_path, lines.append, progress_bar).fit()
    assert result["steps"] == 12 and result["budget"] == "12 steps" and "cut_by_time" not in result
    assert result["precision"] == ("bf16" if result["speed"]["bf16"] else "float32")
    assert any(line.startswith("speed: ") and "probe" in line for line in lines)
    forecast = [line for line in lines if "s a step: the budget's" in line]
    assert len(forecast) == 1 and "11 steps left" in forecast[0]


@pytest.mark.slow
def test_a_time_cap_cuts_a_training_and_every_record_says_so(tmp_path):
    store = tmp_path / "store"
    args = ("--until", "student", "--set", "teacher.train.max_epochs=40", "--set", "teacher.train.max_minutes=0.004")
    proc = cli("run", str(SMOKE), *args, store=store)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err[-2000:]
    assert "warning: cut by time at step" in err
    teacher = next((store / "objects").glob("teacher-*"))
    metrics = json.loads((teacher / "manifest.json").read_text())["metrics"]
    assert metrics["cut_by_time"].startswith("cut by time at step ") and "(budget 40 epochs)" in metrics["cut_by_time"]
    assert metrics["steps"] < 40 * 10 and metrics["speed"]["isa"] == machine.cpu_isa()
    run_log = json.loads(max((store / "runs").glob("*.json")).read_text())
    record = next(r for r in run_log["nodes"] if r["node"] == "teacher")
    assert record["metrics"]["cut_by_time"] == metrics["cut_by_time"] and run_log["machine"]["isa"]
    status = cli("status", str(SMOKE), "--json", *args[2:], store=store)
    rows = {r["node"]: r for r in map(json.loads, status.stdout.decode().splitlines())}
    assert rows["teacher"]["state"] == "cached" and rows["teacher"]["reason"] == metrics["cut_by_time"]
    assert rows["student"]["reason"].endswith("cut by time")  # built from a cut teacher: said too
    assert rows["data"]["reason"] == ""


@pytest.mark.slow
def test_dry_run_estimates_from_a_probe_and_builds_nothing(tmp_path):
    store = tmp_path / "store"
    proc = cli(
        "run",
        str(SMOKE),
        "--dry-run",
        "--set",
        "teacher.train.max_steps=30",
        "--set",
        "teacher.train.max_epochs=null",
        store=store,
    )
    out = proc.stderr.decode() + proc.stdout.decode()
    assert proc.returncode == 0, out[-2000:]
    assert "nothing is built" in out and machine.cpu_isa().split(",")[0] in out
    assert "30 steps at" in out  # the teacher: its budget at its probed step time
    assert "not estimated" in out  # the data stage, never built here: said, not guessed
    assert not (store / "objects").exists() or not any((store / "objects").iterdir())
