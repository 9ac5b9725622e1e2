"""Evaluate stage: translate each test set with the variant's translator, score BLEU and chrF
(pipeline/measure/evaluation.py), keep the hypotheses and scores.json."""

from __future__ import annotations

import json

from ...corpora.data_output import DataOutput
from ...engine.context import StageContext
from ...engine.errors import UserInputError
from ...measure.evaluation import evaluation_metrics, score_test_sets
from ...measure.translators import open_model
from . import EvaluateInputs, EvaluateNode


def run(ctx: StageContext) -> dict:
    cfg: EvaluateNode = ctx.settings
    inputs: EvaluateInputs = ctx.inputs
    data, model = inputs.data, inputs.model
    available = DataOutput.of(data.metrics, data.id).test_sets
    test_sets = cfg.test_sets or available
    unknown = [t for t in test_sets if t not in available]
    if unknown:
        raise UserInputError(f"evaluate.test_sets: {unknown} not produced by the data stage (it has {available})")
    translator = open_model(model.path / cfg.package if cfg.package else model.path, device=cfg.device)
    results = score_test_sets(translator, data.path, test_sets, cfg, ctx.out, ctx.progress, ctx.log)
    (ctx.out / "scores.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return evaluation_metrics(results, test_sets, cfg, translator, model.id)
