"""Hardening, second round (issue 27), runs and input: killed --nproc runs leave no workers, work
folders are locked, gc keeps resume checkpoints, translate reads bounded lines and writes one line
per line, checkpoints record before they delete, every recipe number is bounded."""

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

from model.transformer import ModelConfigError, Transformer, load_model
from pipeline.commands.translate import bounded_lines, one_line
from pipeline.engine.context import progress_bar
from pipeline.engine.errors import PipelineError
from pipeline.engine.store import Store, hold_work_dir, work_dir_holder
from pipeline.training.loop import Checkpoints, Trainer
from pipeline.training.settings import TrainConfig

from .conftest import REPO, SMOKE, cli
from .test_training import _setup


def _one_error_line(proc, code: int | None = None) -> str:
    err = proc.stderr.decode()
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode in ((code,) if code else (1, 2)), err
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: "), err
    return err


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


# ------------------------------------------------------------- 4. no orphans, locked work folders
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
        cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO)}
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


def test_a_work_folder_held_by_a_live_worker_is_refused_and_kept_by_gc(tmp_path):
    store = Store(tmp_path / "store")
    work = store.work_dir("teacher-0123456789abcdef")
    (work / "checkpoint").mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; sys.path.insert(0, sys.argv[1]); "
            "from pipeline.engine.store import hold_work_dir; hold_work_dir(__import__('pathlib').Path(sys.argv[2]), "
            "'teacher worker'); print('held', flush=True); time.sleep(60)",
            str(REPO),
            str(work),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline().strip() == b"held"
        with pytest.raises(PipelineError, match=f"in use by pid {holder.pid} \\(teacher worker\\)"):
            store.work_dir("teacher-0123456789abcdef")
        proc = cli("artifacts", "gc", "--drop-checkpoints", store=store.root)
        assert proc.returncode == 0 and "in use by a live process" in proc.stderr.decode()
        assert (work / "checkpoint").is_dir()
    finally:
        holder.kill()
        holder.wait()
    assert store.work_dir("teacher-0123456789abcdef") == work  # free once its holder is gone
    hold_work_dir(work, "this test")  # a process's own lock never refuses itself
    assert store.work_dir("teacher-0123456789abcdef") == work


# ---------------------------------------------------------------- 5, 6. bounded lines, one line out
def test_bounded_lines_cut_long_lines_at_a_character_and_keep_the_count():
    import io

    data = b"short\n" + "é".encode() * 30 + b"\n" + b"x" * 1_000_000 + b"\nlast"
    lines = list(bounded_lines(io.BytesIO(data), 9))
    assert [(raw, cut) for raw, cut in lines] == [
        (b"short", False),
        ("é".encode() * 4, True),
        (b"x" * 9, True),
        (b"last", False),
    ]
    assert one_line("a\nb\rc\u2028d\u2029e\x85f\x0bg\x0ch\x1ci") == "a b c d e f g h i"


def test_translate_cuts_a_10mb_line_and_stays_within_memory(smoke, tmp_path):
    store, arts = smoke.build("teacher")
    text = b"A man.\n" + b"word " * 2_000_000 + b"\nTwo dogs.\n"
    proc = subprocess.run(
        [
            "/usr/bin/time",
            "-f",
            "%M",
            sys.executable,
            "-m",
            "pipeline.commands.cli",
            "translate",
            "--model",
            arts["teacher"].id,
            "--beam",
            "1",
            "--store",
            str(store.root),
        ],
        cwd=REPO,
        input=text,
        capture_output=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert len(proc.stdout.decode().split("\n")) == 4
    assert err.count("longer than 16384 bytes") == 1 and "Traceback" not in err
    peak_kb = int(err.strip().splitlines()[-1])
    assert peak_kb < 1_000_000, f"peak RSS {peak_kb} KB"  # 2.3 GB before the line bound
    small = cli(
        "translate",
        "--model",
        arts["teacher"].id,
        "--max-line-bytes",
        "3",
        store=store.root,
        input=b"A man is riding.\n",
        timeout=120,
    )
    assert small.returncode == 0 and len(small.stdout.splitlines()) == 1 and b"longer than 3 bytes" in small.stderr


def test_a_decoder_that_emits_line_breaks_still_gives_one_line_per_line(smoke, tmp_path):
    store, arts = smoke.build("teacher")
    model = tmp_path / "model"
    shutil.copytree(arts["teacher"].path, model)
    (model / "manifest.json").unlink()  # a plain model folder, as someone might hand one over
    tok = json.loads((model / "tokenizer.json").read_text())
    tok["decoder"] = {
        "type": "Sequence",
        "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": "\n\r\u2028"}, tok["decoder"]],
    }
    (model / "tokenizer.json").write_text(json.dumps(tok))
    lines = b"A man is riding a bicycle.\nTwo dogs play.\n\nA woman sings.\n"
    proc = cli("translate", "--model", str(model), "--beam", "1", input=lines, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode()
    assert out.count("\n") == 4 and len(out.splitlines()) == 4 and "\r" not in out and "\u2028" not in out


# ---------------------------------------------------------------------- 7. gc and latest pointers
def test_gc_keeps_resume_checkpoints_unless_asked(tmp_path):
    store = Store(tmp_path / "store")
    work = store.work_dir("teacher-0123456789abcdef")
    (work / "checkpoint").mkdir()
    (work / "checkpoint" / "state.json").write_text("{}")
    proc = cli("artifacts", "gc", store=store.root)
    assert proc.returncode == 0 and "--drop-checkpoints" in proc.stderr.decode()
    assert (work / "checkpoint" / "state.json").is_file()
    proc = cli("artifacts", "gc", "--drop-checkpoints", store=store.root)
    assert proc.returncode == 0 and not work.exists()


def test_gc_waits_for_a_reader(tmp_path):
    (tmp_path / "store").mkdir()  # a store that exists (reading one that does not takes no lock)
    store = Store(tmp_path / "store")
    with store.reading():
        gc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.commands.cli", "artifacts", "gc", "--store", str(store.root)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        time.sleep(3)
        assert gc.poll() is None  # gc does not delete while an artifact is being read
    _, err = gc.communicate(timeout=60)
    assert gc.returncode == 0 and b"waiting for commands reading" in err


def test_two_recipes_with_one_stem_keep_two_latest_pointers(tmp_path):
    store = tmp_path / "store"
    paths = []
    for folder, n in (("a", 50), ("b", 60)):
        (tmp_path / folder).mkdir()
        path = tmp_path / folder / "exp.yaml"
        path.write_text(f"data: {{max_train: {n}, max_valid: 5, max_test: 5}}\n")
        assert cli("run", str(path), store=store).returncode == 0
        paths.append(path)
    s = Store(store)
    first, second = (s.latest("exp", p) for p in paths)
    assert first["nodes"]["data"]["id"] != second["nodes"]["data"]["id"]
    assert cli("artifacts", "gc", store=store).returncode == 0
    assert s.exists(first["nodes"]["data"]["id"]) and s.exists(second["nodes"]["data"]["id"])


# ------------------------------------------------------------------- 8. record before delete
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


# --------------------------------------------------------------------------- 9. bounded recipes
@pytest.mark.parametrize(
    "text, expect",
    [
        ("teacher: {train: {seed: " + "1" * 5000 + "}}\n", "more digits than a recipe takes"),
        ("teacher: {train: {seed: 0x" + "f" * 3000 + "}}\n", "integer too large"),
        ("extends: /dev/zero\n", "character device, not a regular file"),
        ("teacher: {train: {lr: .inf}}\n", "lr: must be a finite number"),
        ("teacher: {train: {warmup_steps: .nan}}\n", "warmup_steps: must be"),
        ("teacher: {train: {seed: 1.0e+23}}\n", "seed: must be an integer of a sane size"),
        ("teacher: {train: {seed: 1.0e+12}}\n", "seed: must be <= 4294967295"),
        ("teacher: {model: {d_model: 1.0e+9}}\n", "d_model: must be <= 65536"),
        ("teacher: {model: {d_model: 4096, ffn_dim: 65536, encoder_layers: 1000}}\n", "parameters, more than"),
        ("distill: {corpus: {length_penalty: -.inf}}\n", "length_penalty: must be"),
        (
            "data: {source: files, files: {train: {src: /dev/zero, tgt: /dev/zero}, valid: {tsv: /dev/zero}}}\n",
            "/dev/zero: a character device",
        ),
    ],
)
def test_unbounded_recipe_input_is_one_line(tmp_path, text, expect):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    err = _one_error_line(cli("validate", str(path), timeout=30), 2)
    assert expect in err, err


def test_recipe_files_are_bounded_regular_files(tmp_path):
    os.mkfifo(tmp_path / "fifo.yaml")
    (tmp_path / "f.yaml").write_text("extends: fifo.yaml\n")
    assert "a fifo" in _one_error_line(cli("validate", str(tmp_path / "f.yaml"), timeout=30), 2)
    (tmp_path / "big.yaml").write_bytes(b"#" * (2 << 20))
    assert "larger than 1048576 bytes" in _one_error_line(cli("validate", str(tmp_path / "big.yaml"), timeout=30), 2)
    proc = cli("validate", str(SMOKE), "--set", "teacher.train.seed=" + "9" * 5000, timeout=30)
    assert "more digits" in _one_error_line(proc, 2)


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
