"""One content per artifact id (issue 57): a training killed with SIGKILL and resumed gives the
bytes an uninterrupted one gives; the speed switches a probe chose are recorded in the recipe's
lock and reused, so that a busy machine cannot make another model under the same id; a full disk
and markup in a store's path are one line or plain text, never a traceback."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.engine.lockfile import lock_path, read_lock
from pipeline.engine.machine import cpu_isa
from pipeline.training import speed_probe
from pipeline.training.loop import KILL_AFTER_STEP_ENV
from pipeline.training.speed_probe import SpeedChoice
from tests.helpers import REPO, SMOKE, cli


def _recipe(tmp_path: Path) -> Path:
    """The smoke recipe in a folder of the test's own, so that its lock file is the test's too."""
    recipe = tmp_path / "recipe" / "smoke.yaml"
    recipe.parent.mkdir()
    shutil.copy(SMOKE, recipe)
    return recipe


def _teacher(store: Path) -> Path:
    (folder,) = (store / "objects").glob("teacher-*")
    return folder


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# 2 epochs of 8 batches under an epoch-budget cooldown, a checkpoint after every step (the kill
# comes before its step's checkpoint).
KILLABLE = "--until teacher --set data.max_train=200 --set teacher.train.max_epochs=2 --set " + (
    "teacher.train.cooldown=0.5 --set teacher.train.checkpoint_every_minutes=0.000001"
)
KILLABLE = KILLABLE.split()


@pytest.mark.slow
def test_a_teacher_sigkilled_twice_and_resumed_is_the_uninterrupted_ones_bytes(tmp_path):
    recipe = _recipe(tmp_path)
    straight = cli("run", str(recipe), *KILLABLE, store=tmp_path / "a")
    assert straight.returncode == 0, straight.stderr.decode()[-2000:]
    for step in (5, 12):  # mid-epoch both: the cooldown's budget then counts the epoch's batches
        killed = cli("run", str(recipe), *KILLABLE, store=tmp_path / "b", env={KILL_AFTER_STEP_ENV: str(step)})
        assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    resumed = cli("run", str(recipe), *KILLABLE, store=tmp_path / "b")
    assert resumed.returncode == 0, resumed.stderr.decode()[-2000:]
    a, b = _teacher(tmp_path / "a"), _teacher(tmp_path / "b")
    metrics = json.loads((b / "manifest.json").read_text())["metrics"]
    assert metrics["resumed_from_steps"] == [4, 11]  # it did resume, twice, from the checkpoints before the kills
    assert a.name == b.name and _sha(a / "model.safetensors") == _sha(b / "model.safetensors")
    # Store b's first runs wrote the lock before its teacher existed: the row store a's build
    # recorded stayed, and the switches came from it.
    assert json.loads((b / "manifest.json").read_text())["choices_from"] == "lock"


def _build_teacher(recipe: Path, store: Path, monkeypatch, probe_gives: SpeedChoice) -> tuple[Path, list]:
    """The teacher built in this process, the probe answering `probe_gives` (as a machine whose
    load changed would); returns its folder and the choices the probe was asked for."""
    from pipeline.commands import plan_recipe
    from pipeline.engine.runner import run
    from pipeline.engine.store import Store

    asked = []

    def probe(*args, **kwargs):
        asked.append(probe_gives)
        return SpeedChoice(**{k: getattr(probe_gives, k) for k in speed_probe.RECORDED})

    monkeypatch.setattr(speed_probe, "choose", probe)
    run(plan_recipe(recipe, []), Store(store), until="teacher")
    return _teacher(store), asked


@pytest.mark.slow
def test_a_probe_that_chooses_otherwise_the_second_time_changes_neither_id_nor_weights(tmp_path, monkeypatch):
    recipe = _recipe(tmp_path)
    idle = SpeedChoice(bf16=False, attention="math", fused_optimizer=True, threads=1, isa=cpu_isa())
    busy = SpeedChoice(bf16=False, attention="default", fused_optimizer=False, threads=1, isa=cpu_isa())
    first, asked = _build_teacher(recipe, tmp_path / "a", monkeypatch, idle)
    assert asked == [idle]
    row = read_lock(recipe)["teacher"]
    assert row["choices"] == {"for": first.name, "speed": idle.record()}

    # Another store, a busier machine: the lock's choice is used, the probe not even asked.
    second, asked = _build_teacher(recipe, tmp_path / "b", monkeypatch, busy)
    assert asked == [] and second.name == first.name
    assert _sha(second / "model.safetensors") == _sha(first / "model.safetensors")
    manifest = json.loads((second / "manifest.json").read_text())
    assert manifest["metrics"]["speed"]["source"] == "recorded in the lock" and manifest["choices_from"] == "lock"
    status = cli("status", str(recipe), "--json", store=tmp_path / "b")
    teacher = next(r for r in map(json.loads, status.stdout.decode().splitlines()) if r["node"] == "teacher")
    assert teacher["choices"]["speed"] == idle.record() and teacher["choices_from"] == "lock"

    # Without the lock the probe decides again, and says so: the lock is what kept the weights.
    lock_path(recipe).unlink()
    third, asked = _build_teacher(recipe, tmp_path / "c", monkeypatch, busy)
    assert asked == [busy]
    metrics = json.loads((third / "manifest.json").read_text())["metrics"]
    assert metrics["speed"]["source"] == "probed" and metrics["choices"]["speed"] == busy.record()


def test_a_recorded_choice_is_measured_again_on_another_kind_of_machine():
    record = SpeedChoice(bf16=True, attention="math", fused_optimizer=True, threads=2, isa="AVX512-BF16").record()
    assert speed_probe.from_record(record, "AVX512-BF16", 2)[0].bf16 is True
    for isa, threads in (("AVX2", 2), ("AVX512-BF16", 1)):
        choice, why = speed_probe.from_record(record, isa, threads)
        assert choice is None and "measured again" in why
    assert speed_probe.from_record(None, "AVX2", 2) == (None, None)


def _one_error_line(proc: subprocess.CompletedProcess, code: int) -> str:
    err = proc.stderr.decode()
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert proc.returncode == code and "Traceback" not in err and len(lines) == 1, err[-3000:]
    return lines[0]


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_leaves_the_store_as_it_was(tmp_path):
    store = tmp_path / "store"
    assert cli("run", str(SMOKE), "--until", "tokenizer", store=store).returncode == 0
    # No file of over 40 KiB (RLIMIT_FSIZE; Python ignores SIGXFSZ, so the write fails with
    # EFBIG): the teacher's first checkpoint is the first file that large, written by safetensors.
    limit = 40 * 1024
    full = subprocess.run(
        [sys.executable, "-m", "pipeline.commands.cli", "run", str(SMOKE), "--until", "teacher", "--store", str(store)],
        cwd=REPO,
        capture_output=True,
        timeout=300,
        env={**_env(), "COLUMNS": "200"},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
    )
    line = _one_error_line(full, 1)
    assert "stage teacher failed: no room to write (File too large)" in line and "store is unchanged" in line
    assert not list((store / "objects").glob("teacher-*")) and not any((store / "tmp").iterdir())
    verify = cli("artifacts", "verify", store=store)
    assert verify.returncode == 0 and b"2 ok, 0 failed" in verify.stderr


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'model' / 'runtime'}"}


def test_markup_in_the_store_path_is_shown_as_it_is(tmp_path):
    store = tmp_path / "st[/bold]ore"
    listed = cli("artifacts", "list", store=store)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr.decode(), listed.stderr.decode()
    assert f"0artifactsin{store}" in "".join(listed.stderr.decode().split())  # the title, wrapped
    built = cli("run", str(SMOKE), "--until", "data", store=store)
    err = built.stderr.decode()
    assert built.returncode == 0 and "Traceback" not in err and f"store {store}" in err, err
    for args in (("artifacts", "list"), ("status", str(SMOKE))):
        proc = cli(*args, store=store)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr.decode(), proc.stderr.decode()
