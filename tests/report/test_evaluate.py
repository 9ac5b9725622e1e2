"""The evaluate stage on the smoke recipe: scores with their signature, and a package's batched
translations checked against each sentence alone."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow  # each test runs the smoke recipe to an evaluate stage


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
