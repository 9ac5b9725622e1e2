"""kd_corpus stage: the teacher translates the training sources once (sequence-level knowledge
distillation), in this process or, with --nproc N, in torchrun workers sharing the chunks: the job
is pipeline/training/kd_corpus.py's."""

from __future__ import annotations

from ...engine.context import StageContext
from ...engine.recipe import dump_config
from ...engine.workers import launch
from ...training.kd_corpus import translate_job
from ...training.settings import KDCorpusConfig
from . import KDCorpusInputs


def run(ctx: StageContext) -> dict:
    cfg: KDCorpusConfig = ctx.settings
    inputs: KDCorpusInputs = ctx.inputs
    job = {
        **dump_config(cfg),
        "role": "kd_corpus",
        "data": str(inputs.data.path),
        "teacher": str(inputs.teacher.path),
        "out": str(ctx.out),
        "work": str(ctx.work),
        "decoder": (inputs.teacher.config or {}).get("decoder", "auto"),
    }  # an imported teacher's
    if ctx.nproc > 1:
        return launch(ctx, "pipeline.training.kd_corpus", job)
    return translate_job(job, ctx.log, ctx.progress)
