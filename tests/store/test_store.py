"""The artifact store: atomic commits, verification, locking, write errors."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time

import pytest

from pipeline.engine.errors import IntegrityError, PipelineError, StoreLockedError
from pipeline.engine.store import Store, artifact_id, fingerprint, verify_folder
from tests.helpers import REPO, SOURCE_PATH


def make_artifact(store: Store, name: str = "demo", payload: bytes = b"hello world\n"):
    aid = artifact_id(name, fingerprint(name, 1, "code", {"x": 1}, {}))
    with store.writing(aid) as out:
        (out / "weights.bin").write_bytes(payload)
        (out / "sub").mkdir()
        (out / "sub" / "notes.txt").write_text("ok", encoding="utf-8")
        art = store.commit(aid, out, {"stage": name, "metrics": {"m": 1}})
    return art


def test_commit_is_complete_and_verifiable(tmp_path):
    store = Store(tmp_path)
    art = make_artifact(store)
    manifest = json.loads((art.path / "manifest.json").read_text())
    assert set(manifest["files"]) == {"weights.bin", "sub/notes.txt"}
    assert manifest["files"]["weights.bin"]["bytes"] == 12
    assert store.verify(art.id) == []
    assert not any(store.tmp.iterdir())


def test_flipped_byte_truncation_and_extra_files_are_reported(tmp_path):
    store = Store(tmp_path)
    art = make_artifact(store)
    target = art.path / "weights.bin"
    data = bytearray(target.read_bytes())
    data[3] ^= 0x01
    target.write_bytes(bytes(data))
    problems = store.verify(art.id)
    assert len(problems) == 1 and "weights.bin" in problems[0] and "sha256" in problems[0]
    target.write_bytes(b"hel")
    assert "size 3 bytes" in store.verify(art.id)[0]
    (art.path / "stray.txt").write_text("x")
    assert any("stray.txt: not in the manifest" in p for p in store.verify(art.id))


def test_manifest_cannot_point_outside_the_artifact(tmp_path):
    (tmp_path / "a").mkdir()
    problems = verify_folder(tmp_path / "a", {"files": {"../secret": {"sha256": "0", "bytes": 1}}})
    assert problems and "outside the artifact" in problems[0]


def test_a_rebuild_keeps_its_id_until_committed_and_never_reuses_one(tmp_path):
    store = Store(tmp_path)
    original = make_artifact(store)
    assert store.current_build(original.id) == original.id
    first = store.next_build(original.id)
    # Until a rebuild is committed and recorded, forcing again names the same id (and work folder),
    # so a crashed rebuild resumes.
    assert first != original.id and store.next_build(original.id) == first
    with store.writing(first) as out:
        (out / "weights.bin").write_bytes(b"rebuilt\n")
        store.commit(first, out, {"stage": "demo"})
    store.record_build(original.id, first, "run-1")
    store.record_build(original.id, first, "run-1")  # idempotent
    assert store.current_build(original.id) == first
    second = store.next_build(original.id)
    assert second not in (original.id, first)
    assert (original.path / "weights.bin").read_bytes() == b"hello world\n"
    # The rebuild removed (gc): the fingerprint falls back to its own artifact, and the next
    # rebuild still gets an id that was never used.
    import shutil

    shutil.rmtree(store.path_of(first))
    assert store.current_build(original.id) == original.id
    assert store.next_build(original.id) == second
    (store.builds / f"{original.id}.json").write_text('{"rebuilds": [{"id": "../../etc"}]}')
    with pytest.raises(IntegrityError, match="unreadable record of rebuilds"):
        store.current_build(original.id)


def test_failed_stage_leaves_nothing(tmp_path):
    store = Store(tmp_path)
    aid = artifact_id("demo", "0" * 64)
    with pytest.raises(RuntimeError):
        with store.writing(aid) as out:
            (out / "partial.bin").write_bytes(b"x" * 100)
            raise RuntimeError("stage crashed")
    assert not store.exists(aid)
    assert not any(store.tmp.iterdir())


def test_disk_full_during_commit_leaves_store_unchanged(tmp_path, monkeypatch):
    store = Store(tmp_path)
    aid = artifact_id("demo", "1" * 64)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(PipelineError, match="disk full while writing artifact demo-1111"):
        with store.writing(aid) as out:
            (out / "w.bin").write_bytes(b"abc")
            monkeypatch.setattr("pipeline.engine.store.commit.write_json_atomic", full)
            store.commit(aid, out, {"stage": "demo"})
    assert not store.exists(aid)
    assert not (store.objects / aid).exists()
    assert not any(store.tmp.iterdir())


def test_bad_artifact_ids_are_refused(tmp_path):
    store = Store(tmp_path)
    for bad in ("../../etc", "teacher-../../x", "/abs-0123456789abcdef", "Teacher-0123456789abcdef"):
        with pytest.raises(PipelineError):
            store.path_of(bad)


HOLD_LOCK = """
import sys, time
from pipeline.engine.store import Store
with Store(sys.argv[1]).lock():
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _holder(tmp_path, seconds):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(tmp_path), str(seconds)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": SOURCE_PATH},
    )
    assert proc.stdout.readline().strip() == b"locked"
    return proc


def test_second_writer_fails_with_holder_pid_or_waits(tmp_path):
    store = Store(tmp_path)
    holder = _holder(tmp_path, 1.5)
    try:
        with pytest.raises(StoreLockedError, match=f"in use by pid {holder.pid}"):
            with store.lock():
                pass
        waited = []
        t0 = time.monotonic()
        with store.lock(wait=True, on_wait=waited.append):
            assert time.monotonic() - t0 > 0.5
        assert waited and waited[0]["pid"] == holder.pid
    finally:
        holder.wait(10)


def test_stale_lock_from_dead_process_is_taken_over(tmp_path):
    store = Store(tmp_path)
    holder = _holder(tmp_path, 60)
    holder.kill()
    holder.wait(10)
    stale = []
    with store.lock(on_stale=stale.append):
        pass
    assert stale and stale[0]["pid"] == holder.pid


def test_no_module_of_the_store_enters_a_stage_code_digest():
    # The store is how a stage is called, not what it computes (code_digest.PLUMBING_PACKAGES):
    # an edit to any of its modules must rebuild nothing, though stages import it.
    from pipeline.engine.code_digest import stage_code
    from pipeline.stages import STAGES

    reached = {f for s in STAGES for f in (*stage_code(s.declaration), *stage_code(s.build))}
    assert "pipeline/stages/kd_corpus/build.py" in reached  # imports file_record from the store
    assert not {f for f in reached if f.startswith("pipeline/engine/store")}
