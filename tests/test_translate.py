"""`pipeline translate` and the evaluate stage on the smoke teacher."""

from __future__ import annotations

import json
import re

from pipeline.engine.machine import usable_cores

from .conftest import cli


def _teacher(smoke):
    store, arts = smoke.build("teacher")
    return store, arts["teacher"]


def test_translate_keeps_one_line_per_input_line_whatever_it_gets(smoke):
    store, teacher = _teacher(smoke)
    lines = [
        b"A man is riding a bicycle.",
        b"",
        b"Two dogs\x01 play\x7f in the \x1b[31msnow.",
        b"caf\xe9 \xff\xfe broken utf-8",
        b"x" * 100_000,
        b"word " * 5000,
        b"   ",
    ]
    proc = cli(
        "translate",
        "--model",
        teacher.id,
        "--beam",
        "2",
        store=store.root,
        input=b"\n".join(lines) + b"\n",
        timeout=240,
    )
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    out = proc.stdout.decode().split("\n")
    assert out[-1] == "" and len(out) - 1 == len(lines)
    assert out[1] == "" and out[6] == ""  # empty and blank inputs stay empty
    assert out[0].strip()  # real input gets a translation
    assert "truncated" in err and "not valid UTF-8" in err
    assert "Traceback" not in err
    # The last word on stderr: how fast, and how (all cores unless --threads says otherwise).
    assert re.search(
        rf"^7 lines in [\d.]+ s: [\d.]+ sentences/s \([\d.]+ while translating; runtime torch, "
        rf"threads {usable_cores()}, beam 2, batch 32\)$",
        err,
        re.M,
    ), err


def test_translate_accepts_a_folder_and_empty_input(smoke):
    store, teacher = _teacher(smoke)
    proc = cli("translate", "--model", str(teacher.path), input=b"", store=store.root)
    assert proc.returncode == 0 and proc.stdout == b""
    bad = cli("translate", "--model", "teacher-0000000000000000", input=b"hi\n", store=store.root)
    assert bad.returncode == 2 and "no artifact" in bad.stderr.decode()


def test_evaluate_stage_scores_with_a_signature(smoke):
    store, arts = smoke.build("evaluate.teacher")
    ev = arts["evaluate.teacher"]
    m = ev.metrics
    assert m["runtime"] == "torch" and m["variant"] == "teacher"
    assert 0.0 <= m["bleu"] <= 100.0 and 0.0 <= m["chrf"] <= 100.0
    assert "nrefs:1|case:mixed|eff:no|tok:13a" in m["bleu_signature"]
    assert set(m["results"]) == {"test_2016_flickr", "test_2017_flickr"}
    hyps = (ev.path / "test_2016_flickr.beam2.hyp").read_text(encoding="utf-8").split("\n")
    assert len(hyps) - 1 == 40
    scores = json.loads((ev.path / "scores.json").read_text())
    assert scores["test_2016_flickr"]["beam1"]["sentences"] == 40


def test_evaluate_stage_checks_a_package_gives_each_sentence_its_batched_translation_alone(smoke):
    """An ONNX package is scored on batches and every sentence is translated again alone: each comes
    out the same (the package format's promise), so one BLEU holds for every batch size; the
    report says so per row. A torch model is not checked (not a shipped path)."""
    from pipeline.report.markdown import alone_lines

    for variant in ("int8_dynamic", "int8_static"):
        _, arts = smoke.build(f"evaluate.{variant}")
        m = arts[f"evaluate.{variant}"].metrics
        assert m["batch_invariant"] is True, m["alone_identical"]
        assert set(m["alone_identical"]) == {
            f"{t}.beam{b}" for t in ("test_2016_flickr", "test_2017_flickr") for b in (2, 1)
        }
        assert all(v["identical"] == v["sentences"] == 40 and v["differ"] == [] for v in m["alone_identical"].values())
    assert "alone_identical" not in smoke.build("evaluate.teacher")[1]["evaluate.teacher"].metrics
    lines = alone_lines(
        [
            {"name": "int8_dynamic", "alone_identical": m["alone_identical"]},
            {"name": "pruned_onnx", "alone_identical": {"test.beam4": {"identical": 39, "sentences": 40}}},
            {"name": "teacher"},
        ]
    )
    assert lines[1].startswith("**One sentence, one translation**") and len(lines) == 5
    assert (
        lines[3].startswith("- int8_dynamic: ")
        and "test_2016_flickr, beam 2 40/40" in lines[3]
        and lines[3].endswith("one BLEU for every batch size")
    )
    assert lines[4] == "- pruned_onnx: test, beam 4 39/40: the BLEU is that of the batches"


def test_an_artifacts_default_package_is_the_faster_int8(tmp_path):
    """Without --package, an artifact's int8_static goes first (docs/results.md: the faster int8
    at every point), then int8_dynamic, fp32, fp16; a folder that is itself a model is itself."""
    from pipeline.commands.translate import resolve_model
    from pipeline.engine.store import Store

    folder = tmp_path / "quantize"
    for name in ("fp32", "int8_dynamic", "int8_static"):
        (folder / name).mkdir(parents=True)
        (folder / name / "package.json").write_text("{}")
    store = Store(tmp_path / "store")
    assert resolve_model(store, str(folder), None) == folder / "int8_static"
    (folder / "int8_static" / "package.json").unlink()
    assert resolve_model(store, str(folder), None) == folder / "int8_dynamic"
    assert resolve_model(store, str(folder / "fp32"), None) == folder / "fp32"
