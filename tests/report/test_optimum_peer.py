"""Optimum, the peer of an imported teacher (pipeline/measure/optimum_peer.py): its rows are
skipped with the reason where its environment is missing, and, where scripts/optimum_env.sh made
one, Optimum's export of a tiny Marian writes the transformers model's own greedy outputs."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

from pipeline.commands import plan_recipe  # noqa: E402
from pipeline.engine.runner import run  # noqa: E402
from pipeline.engine.store import Store  # noqa: E402
from pipeline.measure import optimum_peer  # noqa: E402
from pipeline.measure.jobs import Engine, LatencyJob, ScoreSpec  # noqa: E402
from pipeline.measure.process import run_process  # noqa: E402
from tests.helpers.marian import make_marian  # noqa: E402

RECIPE = """name: optimum_peer
data: {{source: multi30k, src_lang: en, tgt_lang: fr, max_train: 20, max_valid: 4, max_test: 3}}
teacher:
  pretrained: {{path: {path}}}
evaluate: {{beam: 1, greedy_too: false}}
benchmark: {{sentences: 2, batch_size: 2, min_repeats: 1, max_repeats: 1, threads: [1], paired_rounds: 0,
            runtimes: [optimum]}}
report: {{}}
"""


@pytest.fixture(scope="module")
def marian(tmp_path_factory, data_dir):
    return make_marian(tmp_path_factory.mktemp("marian") / "opus-mt-tiny", data_dir)


def test_the_optimum_rows_say_how_to_make_the_environment_they_lack(marian, tmp_path, monkeypatch):
    monkeypatch.setenv("OPTIMUM_VENV", str(tmp_path / "no-such-venv"))
    recipe = tmp_path / "optimum.yaml"
    recipe.write_text(RECIPE.format(path=marian), encoding="utf-8")
    store = Store(tmp_path / "store")
    plan = plan_recipe(recipe, [])
    run(plan, store)
    arts = {n.name: store.get(n.id) for n in plan.nodes if store.exists(n.id)}
    rows = {r["name"]: r for r in arts["benchmark"].metrics["results"]}
    reason = f"no Optimum environment at $OPTIMUM_VENV ({tmp_path / 'no-such-venv'}): run scripts/optimum_env.sh"
    for ct in ("int8", "float32"):
        assert rows[f"optimum_teacher_{ct}"]["runtime"] == "optimum"
        assert rows[f"optimum_teacher_{ct}"]["skipped"].startswith(reason)
    report = (arts["report"].path / "report.md").read_text(encoding="utf-8")
    assert f"- optimum_teacher_int8 (optimum, cpu, int8): skipped: {reason}" in report


@pytest.mark.slow
def test_optimum_exports_a_marian_that_writes_its_greedy_outputs(marian, tmp_path, data_dir):
    if optimum_peer.missing(optimum_peer.env_versions()):
        pytest.skip(optimum_peer.missing(None))
    from model.hf_translator import HFTranslator
    from tests.helpers import multi30k_head

    sentences = multi30k_head(data_dir, "en", 12)
    facts = optimum_peer.export(marian, tmp_path / "optimum-float32", "float32")
    # The export writes an encoder and three decoders; the folder keeps what ORTModelForSeq2SeqLM loads.
    assert set(facts["export_files"]) == {
        "encoder_model.onnx",
        "decoder_model.onnx",
        "decoder_with_past_model.onnx",
        "decoder_model_merged.onnx",
    }
    assert sorted(p.name for p in (tmp_path / "optimum-float32").glob("*.onnx")) == [
        "decoder_model_merged.onnx",
        "encoder_model.onnx",
    ]
    greedy = facts["session_runs"]["beam1"]
    assert greedy["calls_per_sentence"] == greedy["tokens_per_sentence"] + 2  # the encoder, a step a token, EOS

    # The measurement process of every row, with the Optimum environment's interpreter.
    (tmp_path / "src").write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
    score = ScoreSpec(str(tmp_path / "src"), str(tmp_path / "src"), [1], "t", str(tmp_path / "hyp"))
    job = LatencyJob(
        Engine("optimum", "cpu", "float32", str(tmp_path / "optimum-float32"), 1),
        sentences[:2],
        2,
        4,
        1,
        1,
        0.05,
        score,
    )
    result = run_process(tmp_path / "jobs", "optimum", job, 1, python=optimum_peer.python())
    assert "skipped" not in result, result
    assert result["latency_ms"]["greedy_b1"]["p50"] > 0 and result["versions"]["optimum-onnx"]
    written = (tmp_path / "hyp" / "t.beam1.hyp").read_text(encoding="utf-8").splitlines()
    assert written == HFTranslator(marian, threads=1).translate(sentences, beam=1)

    int8 = optimum_peer.export(marian, tmp_path / "optimum-int8", "int8")
    assert int8["quantization"]["preset"] in ("avx2", "avx512", "avx512_vnni", "arm64")
    onnx_bytes = {
        ct: sum(p.stat().st_size for p in (tmp_path / f"optimum-{ct}").glob("*.onnx")) for ct in ("int8", "float32")
    }
    assert onnx_bytes["int8"] < onnx_bytes["float32"]  # (a model this small is mostly what int8 leaves alone)
    assert json.loads((tmp_path / "optimum-int8" / "optimum.json").read_text())["compute_type"] == "int8"
