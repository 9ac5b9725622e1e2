"""Training under faults: a killed --nproc run takes its torchrun workers down, a kill around a
checkpoint never leaves one naming a deleted snapshot, a damaged checkpoint says which folder to
remove, and an untrusted model config is checked before anything is allocated."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from model.transformer import ModelConfigError, Transformer, TransformerConfig, load_model
from pipeline.engine.context import progress_bar
from pipeline.engine.errors import PipelineError
from pipeline.engine.store import work_dir_holder
from pipeline.training.loop import Checkpoints, Trainer
from pipeline.training.settings import TrainConfig
from tests.helpers import REPO, SMOKE, SOURCE_PATH, _one_error_line, cli
from tests.helpers.models import _setup


def _processes_naming(text: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline:
                found.append(int(pid))
    return found


@pytest.mark.slow
def test_sigkilled_nproc_run_takes_its_torchrun_workers_down(tmp_path):
    store = tmp_path / "store"
    assert cli("run", str(SMOKE), "--until", "tokenizer", store=store).returncode == 0
    cmd = [
        sys.executable,
        "-m",
        "pipeline.commands.cli",
        "run",
        str(SMOKE),
        "--until",
        "teacher",
        "--nproc",
        "2",
        "--set",
        "teacher.train.max_epochs=50",
        "--store",
        str(store),
    ]
    runner = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": SOURCE_PATH},
    )
    try:
        deadline = time.monotonic() + 120
        work = None
        while time.monotonic() < deadline:
            works = list((store / "work").glob("teacher-*"))
            if works and work_dir_holder(works[0]) is not None:
                work = works[0]
                break
            time.sleep(0.2)
        assert work is not None, "the workers never started"
        workers = _processes_naming(str(work / "job.json"))
        assert len(workers) >= 2  # torchrun and its workers
        runner.kill()
        runner.wait(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _processes_naming(str(work / "job.json")):
            time.sleep(0.2)
        assert _processes_naming(str(work / "job.json")) == [], "workers outlived the killed runner"
        assert work_dir_holder(work) is None
    finally:
        if runner.poll() is None:
            runner.kill()
        for pid in _processes_naming(str(store)):
            if pid != os.getpid():
                os.kill(pid, signal.SIGKILL)


class _Killed(BaseException):
    pass


@pytest.mark.parametrize("moment", ["after_snapshot", "before_rename", "after_checkpoint"])
def test_a_kill_around_a_checkpoint_never_leaves_one_naming_a_deleted_snapshot(smoke, tmp_path, monkeypatch, moment):
    tok, train, valid, cfg = _setup(smoke)
    work = tmp_path / "work"

    def trainer():
        torch.manual_seed(0)
        tc = TrainConfig(
            lr=3e-3,
            warmup_steps=5,
            batch_tokens=400,
            max_epochs=4,
            valid_bleu_sentences=5,
            average_checkpoints=1,
            checkpoint_every_minutes=1000,
            seed=7,
        )
        return Trainer(Transformer(cfg), tc, train, valid, tok, work, lambda m: None, progress_bar)

    save, snapshot, drop = Checkpoints.save, Checkpoints.save_snapshot, Checkpoints.drop_unkept
    calls = {"save": 0, "snapshot": 0, "drop": 0}

    def kill_at(name, n):
        calls[name] += 1
        if calls[name] == n:
            raise _Killed()

    def patched_save(self, model, optimizer, state):
        if moment == "before_rename":
            kill_at("save", 2)
        save(self, model, optimizer, state)

    def patched_snapshot(self, model, name):
        snapshot(self, model, name)
        if moment == "after_snapshot":
            kill_at("snapshot", 2)

    def patched_drop(self, kept):
        if moment == "after_checkpoint":
            kill_at("drop", 3)  # the first call is at the start of fit
        drop(self, kept)

    monkeypatch.setattr(Checkpoints, "save", patched_save)
    monkeypatch.setattr(Checkpoints, "save_snapshot", patched_snapshot)
    monkeypatch.setattr(Checkpoints, "drop_unkept", patched_drop)
    with pytest.raises(_Killed):
        trainer().fit()
    monkeypatch.undo()
    ckpt = Checkpoints(work)
    state = json.loads((ckpt.dir / "state.json").read_text())
    for entry in state["kept"]:
        assert (ckpt.snapshots / f"{entry['name']}.safetensors").is_file(), (moment, entry["name"])
    result = trainer().fit()  # resumes, cleans what the checkpoint does not name, finishes
    assert result["resumed_from_steps"] and result["epochs"] == 4
    assert {p.name for p in ckpt.snapshots.iterdir()} == {
        f"{k['name']}.safetensors" for k in json.loads((ckpt.dir / "state.json").read_text())["kept"]
    }


def _checkpoint(work: Path) -> tuple[Checkpoints, Transformer, torch.optim.Optimizer]:
    cfg = TransformerConfig(
        vocab_size=50,
        d_model=8,
        head_dim=4,
        enc_heads=[2],
        dec_self_heads=[2],
        dec_cross_heads=[2],
        enc_ffn=[16],
        dec_ffn=[16],
        max_positions=16,
    )
    model = Transformer(cfg)
    optimizer = torch.optim.Adam(model.parameters())
    ckpt = Checkpoints(work)
    snapshot = ckpt.save_snapshot(model, "epoch1")
    ckpt.save(
        model,
        optimizer,
        {
            "step": 3,
            "epoch": 1,
            "batch": 0,
            "elapsed_s": 1.0,
            "history": [],
            "tokens": 9,
            "resumed_from": [],
            "kept": [{"name": "epoch1", "snapshot": snapshot}],
        },
    )
    return ckpt, model, optimizer


@pytest.mark.parametrize("how", ["model_truncated", "state_not_json", "snapshot_changed", "optimizer_gone"])
def test_a_damaged_checkpoint_says_which_folder_to_remove(tmp_path, how):
    ckpt, model, optimizer = _checkpoint(tmp_path / "work")
    assert ckpt.load(model, optimizer)["step"] == 3  # whole, it resumes
    if how == "model_truncated":
        (ckpt.dir / "model.safetensors").write_bytes((ckpt.dir / "model.safetensors").read_bytes()[:64])
    elif how == "state_not_json":
        (ckpt.dir / "state.json").write_text("{")
    elif how == "snapshot_changed":
        data = bytearray((ckpt.snapshots / "epoch1.safetensors").read_bytes())
        data[-1] ^= 1
        (ckpt.snapshots / "epoch1.safetensors").write_bytes(bytes(data))
    else:
        (ckpt.dir / "optimizer.safetensors").unlink()
    with pytest.raises(PipelineError) as caught:
        Checkpoints(tmp_path / "work").saved_state()
    message = str(caught.value)
    assert "\n" not in message and message.endswith(f"remove {tmp_path / 'work'} and run again to train from the start")


@pytest.mark.slow
def test_an_untrusted_model_config_is_checked_before_anything_is_allocated(smoke, tmp_path):
    _, arts = smoke.build("teacher")
    model = tmp_path / "model"
    shutil.copytree(arts["teacher"].path, model)
    (model / "manifest.json").unlink()
    config = json.loads((model / "config.json").read_text())
    for bad, why in [
        ({"d_model": 2**20}, "d_model"),
        ({"enc_ffn": [65536] * 1000, "d_model": 8192}, "parameters"),
        ({"vocab_size": 10**12}, "vocab_size"),
        ({"enc_heads": "x"}, "encoder heads"),
    ]:
        (model / "config.json").write_text(json.dumps({**config, **bad}))
        with pytest.raises(ModelConfigError, match=why):
            load_model(model)
    (model / "config.json").write_text('{"d_model": ' + "1" * 5000 + "}")
    with pytest.raises(ModelConfigError, match="unreadable model config"):
        load_model(model)
    (model / "config.json").write_text(json.dumps({**config, "d_model": 2**20}))
    err = _one_error_line(cli("translate", "--model", str(model), input=b"hi\n", timeout=60), 2)
    assert "d_model" in err
