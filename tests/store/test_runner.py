"""The runner and CLI on the smoke recipe's first stages: caching, invalidation, integrity."""

from __future__ import annotations

import json
import shutil

import pytest

from pipeline.engine.lockfile import content_digest
from tests.helpers import REPO, SMOKE, cli


def last_run(store):
    newest = max((store / "runs").glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
    return json.loads(newest.read_text())


def test_rerun_reuses_everything_fast_and_changes_rebuild_only_dependants(tmp_path):
    store = tmp_path / "store"
    first = cli("run", str(SMOKE), "--until", "tokenizer", store=store)
    assert first.returncode == 0, first.stderr.decode()

    # Fast by construction, not by a stopwatch (a loaded machine made a 3 s bound flaky): a
    # cached re-run never imports what building needs (torch, onnxruntime, tokenizers).
    second = cli("run", str(SMOKE), "--until", "tokenizer", store=store, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert second.returncode == 0
    assert [n["action"] for n in last_run(store)["nodes"]] == ["reused", "reused"]
    err = second.stderr.decode()
    assert "building" not in err
    imported = {line.rsplit("|", 1)[1].strip() for line in err.splitlines() if line.startswith("import time:")}
    assert imported and not imported & {"torch", "onnxruntime", "tokenizers"}, sorted(imported & {"torch"})

    status = cli("status", str(SMOKE), "--set", "tokenizer.vocab_size=450", "--json", store=store)
    rows = {r["node"]: r for r in map(json.loads, status.stdout.decode().splitlines())}
    assert rows["data"]["state"] == "cached"
    assert rows["tokenizer"]["state"] == "stale" and "vocab_size" in rows["tokenizer"]["reason"]
    assert rows["teacher"]["state"] == "missing"

    third = cli("run", str(SMOKE), "--until", "tokenizer", "--set", "tokenizer.vocab_size=450", store=store)
    err = third.stderr.decode()
    assert third.returncode == 0, err
    assert "data                   reused" in err and "tokenizer              building" in err

    log = last_run(store)
    assert log["overrides"] == ["tokenizer.vocab_size=450"] and log["status"] == "ok"
    assert [n["action"] for n in log["nodes"]] == ["reused", "built"]


def test_modified_artifact_is_flagged_and_rebuilt(tmp_path):
    store = tmp_path / "store"
    assert cli("run", str(SMOKE), "--until", "tokenizer", store=store).returncode == 0
    listing = [
        json.loads(line) for line in cli("artifacts", "list", "--json", store=store).stdout.decode().splitlines()
    ]
    tok = next(a for a in listing if a["stage"] == "tokenizer")
    assert tok["complete"] and set(tok) >= {"id", "stage", "path", "created", "complete"}
    target = next(p for p in (store / "objects" / tok["id"]).iterdir() if p.name == "tokenizer.json")
    data = bytearray(target.read_bytes())
    data[100] ^= 0x20
    target.write_bytes(bytes(data))

    verify = cli("artifacts", "verify", store=store)
    assert verify.returncode == 1 and "tokenizer.json: content changed" in verify.stderr.decode()

    rerun = cli("run", str(SMOKE), "--until", "tokenizer", store=store)
    err = rerun.stderr.decode()
    assert rerun.returncode == 0 and "failed verification" in err and "tokenizer              building" in err
    assert cli("artifacts", "verify", store=store).returncode == 0


def test_until_and_force_errors_are_user_errors(tmp_path):
    proc = cli("run", str(SMOKE), "--until", "nonsense", store=tmp_path)
    assert proc.returncode == 2 and "no such stage" in proc.stderr.decode()
    proc = cli("run", str(SMOKE), "--until", "data", "--force", "nothing", store=tmp_path)
    assert proc.returncode == 2


@pytest.mark.slow
def test_force_rebuilds_under_new_ids_and_leaves_the_old_artifacts_as_they_were(tmp_path):
    store = tmp_path / "store"
    assert cli("run", str(SMOKE), "--until", "tokenizer", store=store).returncode == 0
    first = {n["node"]: n["id"] for n in last_run(store)["nodes"]}
    manifests = {aid: (store / "objects" / aid / "manifest.json").read_bytes() for aid in first.values()}

    proc = cli("run", str(SMOKE), "--until", "tokenizer", "--force", "data", store=store)
    assert proc.returncode == 0, proc.stderr.decode()
    log = last_run(store)
    assert [n["action"] for n in log["nodes"]] == ["built", "built"]
    second = {n["node"]: n["id"] for n in log["nodes"]}
    assert set(second.values()).isdisjoint(first.values())
    assert log["nodes"][0]["rebuild_of"] == first["data"]
    assert "rebuild_of" not in log["nodes"][1]  # a new fingerprint (its input is another build)
    for aid, manifest in manifests.items():
        assert (store / "objects" / aid / "manifest.json").read_bytes() == manifest
    assert cli("artifacts", "verify", store=store).returncode == 0
    listing = {
        a["id"]: a
        for a in map(json.loads, cli("artifacts", "list", "--json", store=store).stdout.decode().splitlines())
    }
    assert listing[second["data"]]["rebuild_of"] == first["data"] and listing[first["data"]]["rebuild_of"] is None

    # A plain re-run and `status` take the rebuilds.
    assert cli("run", str(SMOKE), "--until", "tokenizer", store=store).returncode == 0
    log = last_run(store)
    assert [(n["action"], n["id"]) for n in log["nodes"]] == [
        ("reused", second["data"]),
        ("reused", second["tokenizer"]),
    ]

    # Rebuilding the data alone leaves the tokenizer built from the earlier data stale, not reused.
    assert cli("run", str(SMOKE), "--until", "data", "--force", "data", store=store).returncode == 0
    third = last_run(store)["nodes"][0]["id"]
    assert third not in (first["data"], second["data"])
    status = cli("status", str(SMOKE), "--json", store=store)
    rows = {r["node"]: r for r in map(json.loads, status.stdout.decode().splitlines())}
    assert rows["data"] == {**rows["data"], "state": "cached", "id": third}
    assert rows["tokenizer"]["state"] == "stale" and "input changed: data" in rows["tokenizer"]["reason"]
    assert cli("run", str(SMOKE), "--until", "tokenizer", store=store).returncode == 0
    log = last_run(store)
    assert [n["action"] for n in log["nodes"]] == ["reused", "built"]
    latest = {n["node"]: n["id"] for n in log["nodes"]}
    assert latest["tokenizer"] not in (first["tokenizer"], second["tokenizer"])

    # gc removes the earlier builds; the recipe still resolves to the ones it last used.
    assert cli("artifacts", "gc", store=store).returncode == 0
    assert {p.name for p in (store / "objects").iterdir()} == set(latest.values())
    status = cli("status", str(SMOKE), "--json", store=store)
    rows = {r["node"]: r for r in map(json.loads, status.stdout.decode().splitlines())}
    assert {name: (rows[name]["state"], rows[name]["id"]) for name in latest} == {
        name: ("cached", aid) for name, aid in latest.items()
    }


@pytest.mark.slow
def test_gc_keeps_what_latest_runs_use(tmp_path):
    store = tmp_path / "store"
    assert cli("run", str(SMOKE), "--until", "tokenizer", store=store).returncode == 0
    assert (
        cli("run", str(SMOKE), "--until", "tokenizer", "--set", "tokenizer.vocab_size=450", store=store).returncode == 0
    )
    before = {p.name for p in (store / "objects").iterdir()}
    assert len(before) == 3
    assert cli("artifacts", "gc", store=store).returncode == 0
    after = {p.name for p in (store / "objects").iterdir()}
    assert len(after) == 2 and after < before


def _status(store, code=REPO) -> dict[str, dict]:
    out = cli("status", str(SMOKE), "--json", store=store, code=code)
    assert out.returncode == 0, out.stderr.decode()
    return {r["node"]: r for r in map(json.loads, out.stdout.decode().splitlines())}


@pytest.mark.slow
def test_a_code_change_makes_what_runs_that_code_stale_and_names_the_file(tmp_path):
    store, code = tmp_path / "store", tmp_path / "code"
    assert cli("run", str(SMOKE), "--until", "tokenizer", store=store).returncode == 0
    for folder in ("model", "pipeline"):
        shutil.copytree(REPO / folder, code / folder, ignore=shutil.ignore_patterns("__pycache__"))
    before = _status(store, code)
    assert before["tokenizer"]["state"] == "cached"

    # Comments, blank lines and docstrings are not code: nothing to rebuild.
    tokenizer_py = code / "model" / "runtime" / "mt_runtime" / "subword.py"
    source = tokenizer_py.read_text()
    tokenizer_py.write_text(source.replace('"""', '"""Reworded. ', 1) + "\n\n# a new comment\n")
    assert {n: r["id"] for n, r in _status(store, code).items()} == {n: r["id"] for n, r in before.items()}

    tokenizer_py.write_text(source + "\nTOKENIZER_CHANGED = True\n")
    after = _status(store, code)
    assert after["data"]["state"] == "cached" and after["data"]["id"] == before["data"]["id"]
    assert after["tokenizer"]["state"] == "stale"
    assert after["tokenizer"]["reason"] == "code changed: model/runtime/mt_runtime/subword.py"

    # The int8 code alone: quantize and what is built from it get new ids, nothing upstream does.
    tokenizer_py.write_text(source)
    quantize_py = code / "model" / "onnx_quantize" / "rows.py"
    quantize_py.write_text(quantize_py.read_text() + "\nQUANTIZE_CHANGED = True\n")
    moved = {n for n, r in _status(store, code).items() if r["id"] != before[n]["id"]}
    assert moved == {"quantize", "evaluate.int8_dynamic", "evaluate.int8_static", "benchmark", "report"}


@pytest.mark.slow
def test_the_lock_file_beside_the_recipe_names_what_each_node_was_built_from(tmp_path):
    store, recipe = tmp_path / "store", tmp_path / "smoke.yaml"
    shutil.copyfile(SMOKE, recipe)
    assert cli("run", str(recipe), "--until", "tokenizer", store=store).returncode == 0
    first = (tmp_path / "smoke.lock").read_text()
    entries = {
        line.split(":", 1)[0]: json.loads(line.split(":", 1)[1])
        for line in first.splitlines()
        if not line.startswith("#")
    }
    assert list(entries) == ["data", "tokenizer"]
    ids = {n: r["id"] for n, r in _status_of(recipe, store).items()}
    assert entries["tokenizer"]["id"] == ids["tokenizer"] and entries["tokenizer"]["inputs"] == {"data": ids["data"]}
    manifest = json.loads((store / "objects" / ids["tokenizer"] / "manifest.json").read_text())
    assert entries["tokenizer"]["content"] == content_digest(manifest)

    # Another vocabulary: the diff of the two lock files is the tokenizer's line alone.
    assert (
        cli("run", str(recipe), "--until", "tokenizer", "--set", "tokenizer.vocab_size=450", store=store).returncode
        == 0
    )
    second = (tmp_path / "smoke.lock").read_text().splitlines()
    changed = [line.split(":", 1)[0] for line in second if line not in first.splitlines()]
    assert changed == ["tokenizer"]


def _status_of(recipe, store) -> dict[str, dict]:
    out = cli("status", str(recipe), "--json", store=store)
    return {r["node"]: r for r in map(json.loads, out.stdout.decode().splitlines())}
