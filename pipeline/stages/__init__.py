"""The stage registry: stage kind -> the module whose `run(ctx)` builds its artifact.

A stage's fingerprint takes the digest of the code it runs (pipeline.engine.code_digest), so a code
change rebuilds what it affects by itself. `version` is an override for what the digest cannot
see (a changed dependency's behaviour, a data file): bumping it rebuilds that stage's artifacts.
Modules are imported only when their stage runs, so planning a run never imports torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from ..engine.errors import PipelineError


@dataclass(frozen=True)
class StageInfo:
    module: str
    version: int
    summary: str


STAGES: dict[str, StageInfo] = {
    "data": StageInfo("pipeline.stages.data.build", 1, "fetch, verify and clean the parallel corpus"),
    "tokenizer": StageInfo("pipeline.stages.tokenizer.build", 1, "train the joint subword tokenizer"),
    "train": StageInfo("pipeline.stages.train.build", 3, "train a Transformer (teacher, student, ablation)"),
    "import_teacher": StageInfo("pipeline.stages.import_teacher.build", 1, "import a Hugging Face seq2seq checkpoint"),
    "kd_corpus": StageInfo("pipeline.stages.kd_corpus.build", 1, "translate the training sources with the teacher"),
    "prune": StageInfo("pipeline.stages.prune.build", 5, "remove attention heads (and FFN neurons), fine-tune"),
    "export": StageInfo("pipeline.stages.export.build", 8, "export to ONNX, optimise, check parity"),
    "quantize": StageInfo("pipeline.stages.quantize.build", 14, "int8 dynamic and static quantization with a guard"),
    "evaluate": StageInfo("pipeline.stages.evaluate.build", 2, "translate the test sets, score BLEU and chrF"),
    "benchmark": StageInfo("pipeline.stages.benchmark.build", 6, "latency and throughput of every variant"),
    "report": StageInfo("pipeline.stages.report.build", 8, "BLEU against latency: table, JSON and plot"),
}


def load(stage: str) -> Callable:
    info = STAGES[stage]
    try:
        module = importlib.import_module(info.module)
    except ModuleNotFoundError as exc:
        if exc.name == info.module:
            raise PipelineError(f"stage '{stage}' is not implemented yet ({info.summary})") from None
        raise
    return module.run
